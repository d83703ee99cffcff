package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// The delivery variants the node runs, as shipped: deploy/kueue/<overlay>.
const (
	ImageVolumeOverlay = "kueue/image-volume"
	InitCopyOverlay    = "kueue/init-copy"
)

// Image is one entry of a kustomization's `images:`.
type Image struct {
	Name    string `json:"name"`
	NewName string `json:"newName"`
	NewTag  string `json:"newTag"`
}

// NodeHub is a hub whose Kueue runs as a pod on a node: the hub control plane, the node and
// the registry it pulls from, and the images pushed there. Workers are another Env's.
type NodeHub struct {
	*Env
	Node     *Node
	Registry *Registry
	// Images: the credbroker image users pull (scripts/build-image.sh) and Kueue's, in Registry.
	CredbrokerImage, KueueImage Image
}

// NodeHubOptions: which workers the hub dispatches to (the framework gives it the peers,
// the Kueue and its directory: Framework.StartNodeHub).
type NodeHubOptions struct {
	Workers []*Cluster // already running, with their Kueue (another Env's; not stopped here)
}

// startNodeHub starts a registry with the images, the hub control plane and the node.
func startNodeHub(ctx context.Context, dir string, peers *Peers, kueue KueuePeer, o NodeHubOptions) (h *NodeHub, err error) {
	h = &NodeHub{Env: &Env{Peers: peers, Kueue: kueue, Dir: dir, Workers: o.Workers}}
	defer func() {
		if err != nil {
			h.Stop()
			h = nil
		}
	}()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if h.Registry, err = StartRegistry(ctx, filepath.Join(dir, "registry"), peers.Crane); err != nil {
		return nil, err
	}
	kueueArchive, err := KueueImage(ctx, kueue)
	if err != nil {
		return nil, err
	}
	pauseArchive, err := PauseImage(ctx)
	if err != nil {
		return nil, err
	}
	credbrokerArchive, err := CredbrokerImage(ctx, filepath.Join(dir, "credbroker-image.tar"))
	if err != nil {
		return nil, err
	}
	pause, err := h.Registry.Push(ctx, pauseArchive, "pause", "e2e")
	if err != nil {
		return nil, err
	}
	if _, err := h.Registry.Push(ctx, kueueArchive, "kueue", kueue.Version); err != nil {
		return nil, err
	}
	version, err := credbrokerVersion()
	if err != nil {
		return nil, err
	}
	if _, err := h.Registry.Push(ctx, credbrokerArchive, "credbroker", version); err != nil {
		return nil, err
	}
	h.KueueImage = Image{Name: kueueManifestImage, NewName: h.Registry.Addr + "/kueue", NewTag: kueue.Version}
	h.CredbrokerImage = Image{Name: "credbroker", NewName: h.Registry.Addr + "/credbroker", NewTag: version}

	if h.Hub, err = StartCluster(ctx, ClusterOptions{Name: "node-hub", Peers: peers, Kueue: kueue, Hub: true, Node: true, Dir: filepath.Join(dir, "hub")}); err != nil {
		return nil, err
	}
	if h.Node, err = StartNode(ctx, NodeOptions{Dir: filepath.Join(dir, "node"), Peers: peers, Hub: h.Hub, Registry: h.Registry.Addr, Pause: pause}); err != nil {
		return nil, err
	}
	return h, nil
}

// kueueManifestImage is the image Kueue's config/default names (its manager kustomization's
// `images:`; the release manifest names registry.k8s.io/kueue/kueue:VERSION instead).
const kueueManifestImage = "us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue"

// credbrokerVersion is the workspace's version (Cargo.toml's [workspace.package]), the tag
// users push (docs/deploy.md section 1).
func credbrokerVersion() (string, error) {
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "Cargo.toml"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^version = "([^"]+)"`).FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("no version in Cargo.toml")
	}
	return string(m[1]), nil
}

// Stop stops the node, the hub and the registry (not the workers).
func (h *NodeHub) Stop() {
	if h.Node != nil {
		h.Node.Stop()
	}
	if h.Hub != nil {
		_ = h.Hub.Stop()
	}
	if h.Registry != nil {
		h.Registry.Stop()
	}
}

// Deploy renders the shipped overlay (ImageVolumeOverlay or InitCopyOverlay) over the hub
// Kueue's release manifests with the images in the registry (the overlay's `images:` is the
// one thing changed) and extra components listed last (a user's credbroker-config, docs/deploy.md
// section 3), applies it with `kubectl apply --server-side`, and waits for the manager's
// Deployment to be rolled out (every pod of the new template available, no old one).
func (h *NodeHub) Deploy(ctx context.Context, overlay string, components map[string]map[string]string) ([]byte, error) {
	rendered, err := RenderDeployWith(h.Kueue, h.Dir, overlay, []Image{h.CredbrokerImage, h.KueueImage}, components)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(h.Dir, "rendered-"+filepath.Base(overlay)+".yaml")
	if err := os.WriteFile(path, rendered, 0o644); err != nil {
		return nil, err
	}
	if out, err := h.Hub.Kubectl(nil, "apply", "--server-side", "-f", path); err != nil {
		return nil, fmt.Errorf("kubectl apply --server-side %s: %w\n%s", overlay, err, out)
	}
	if err := Eventually(ctx, KueueDeployTimeout, SlowInterval, func() error {
		var d appsv1.Deployment
		if err := h.Hub.Client.Get(ctx, client.ObjectKey{Namespace: KueueNamespace, Name: "kueue-controller-manager"}, &d); err != nil {
			return err
		}
		// Rolled out (kubectl rollout status): the new template's pods all available, no old
		// pod counted any more.
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		st := d.Status
		if st.ObservedGeneration >= d.Generation && st.UpdatedReplicas == want && st.Replicas == want && st.AvailableReplicas == want {
			return nil
		}
		return fmt.Errorf("deployment not rolled out (%d updated, %d available of %d; %d pods):%s", st.UpdatedReplicas, st.AvailableReplicas, want, st.Replicas, h.PodSummary(ctx))
	}); err != nil {
		return nil, err
	}
	return rendered, nil
}

// PodSummary describes the manager pods: phase, each container's state and restarts.
func (h *NodeHub) PodSummary(ctx context.Context) string {
	var pods corev1.PodList
	if err := h.Hub.Client.List(ctx, &pods, client.InNamespace(KueueNamespace)); err != nil {
		return err.Error()
	}
	out := ""
	for _, p := range pods.Items {
		out += fmt.Sprintf("\n  pod %s %s", p.Name, p.Status.Phase)
		for _, s := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
			state := "running"
			switch {
			case s.State.Waiting != nil:
				state = "waiting " + s.State.Waiting.Reason + ": " + s.State.Waiting.Message
			case s.State.Terminated != nil:
				state = fmt.Sprintf("terminated %s (exit %d)", s.State.Terminated.Reason, s.State.Terminated.ExitCode)
			}
			out += fmt.Sprintf("\n    %s: %s, ready=%v, restarts=%d", s.Name, state, s.Ready, s.RestartCount)
		}
	}
	return out
}

// ManagerPod is the running manager pod (there is one replica).
func (h *NodeHub) ManagerPod(ctx context.Context) (*corev1.Pod, error) {
	var pods corev1.PodList
	if err := h.Hub.Client.List(ctx, &pods, client.InNamespace(KueueNamespace), client.MatchingLabels{"control-plane": "controller-manager"}); err != nil {
		return nil, err
	}
	var found []*corev1.Pod
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			found = append(found, &pods.Items[i])
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("%d manager pods:%s", len(found), h.PodSummary(ctx))
	}
	return found[0], nil
}

// ContainerLog is the current log of a container of a pod on the node (the kubelet's file
// under the node's pod-logs directory; no kubelet API needed).
func (h *NodeHub) ContainerLog(pod *corev1.Pod, container string) (string, error) {
	dir := filepath.Join(h.Node.o.Dir, "pod-logs", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), container)
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("no log of %s in %s", container, dir)
	}
	var out string
	for _, f := range files { // 0.log, 1.log, ...: every run's, oldest first
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		out += string(b)
	}
	return out, nil
}

// RenderDeployWith is RenderDeploy with the overlay's `images:` replaced by images and
// extra components (directory name → files) added to the copied tree and listed last in
// the overlay, as docs/deploy.md section 3 adds a user's credbroker-config.
func RenderDeployWith(k KueuePeer, scratch, overlay string, images []Image, components map[string]map[string]string) ([]byte, error) {
	tree, err := copyDeploy(k, scratch)
	if err != nil {
		return nil, err
	}
	kpath := filepath.Join(tree, overlay, "kustomization.yaml")
	b, err := os.ReadFile(kpath)
	if err != nil {
		return nil, err
	}
	kust := map[string]any{}
	if err := yaml.Unmarshal(b, &kust); err != nil {
		return nil, fmt.Errorf("%s: %w", overlay, err)
	}
	kust["images"] = images
	comps, _ := kust["components"].([]any)
	for name, files := range components {
		dir := filepath.Join(tree, overlay, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		for f, text := range files {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(text), 0o644); err != nil {
				return nil, err
			}
		}
		comps = append(comps, name)
	}
	kust["components"] = comps
	if b, err = yaml.Marshal(kust); err != nil {
		return nil, err
	}
	if err := os.WriteFile(kpath, b, 0o644); err != nil {
		return nil, err
	}
	return kustomize(k, tree, overlay)
}

// Stack holds a scenario's objects on this hub (Setup, CreateProfiles, SubmitJob, ...):
// Kueue and the broker are the manager pod's, so it starts no process.
func (h *NodeHub) Stack(dir string) *Stack { return &Stack{Env: h.Env, Dir: dir} }
