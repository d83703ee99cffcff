package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"credbroker.dev/e2e/harness"
	"github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestNode runs Kueue's manager pod, with the credbroker sidecar, on a real node (kubelet,
// containerd, runc, the CNI bridge) from the shipped overlays, and dispatches Jobs to the
// fleet's first worker through it (e2e/README.md "The node"). Its steps share one node and
// one installation, in order: the image-volume overlay as shipped, the sidecar killed,
// switched to the init-copy overlay, a revoked token.
func TestNode(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	h, err := fw.StartNodeHub(ctx, harness.NodeHubOptions{Workers: fw.Fleet.Workers[:1]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	t.Logf("node: registry with the images, hub (kube-apiserver, kube-controller-manager, kube-scheduler), kube-proxy, containerd %s and kubelet %s Ready in %.1fs",
		fw.Peers.ContainerdVersion, fw.Peers.KubeVersion, time.Since(start).Seconds())
	worker := fw.Fleet.Workers[0]
	s := h.Stack(fw.Dir(filepath.Join("node", "objects")))
	t.Cleanup(func() { s.Stop(ctx) })

	// The credential the shipped example config's onprem provider reads: a file per cluster
	// from the Secret credbroker-cluster-tokens (docs/deploy.md section 6), made before the
	// pod so that the kubelet mounts it at once.
	tok := workerToken(t, worker)
	if err := harness.EnsureNamespace(ctx, h.Hub.Client, "kueue-system"); err != nil {
		t.Fatal(err)
	}
	setClusterTokens(t, h, map[string]string{"node-w1": tok, "node-w2": tok})

	var workers []*harness.Worker // node-w1, node-w2
	ok := t.Run("image-volume", func(t *testing.T) {
		explainNodeOnFailure(t, h)
		deployed := time.Now()
		if _, err := h.Deploy(ctx, harness.ImageVolumeOverlay, nil); err != nil {
			t.Fatal(err)
		}
		t.Logf("kubectl apply --server-side of deploy/kueue/image-volume -> Deployment Available in %.1fs", time.Since(deployed).Seconds())
		pod := managerPod(t, h)
		sidecarBeforeManager(t, h, pod)
		w, err := s.NewWorker("node-w1", "onprem", worker, map[string]any{"clusterName": "node-w1"})
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
		expectDispatch(t, s, "node-iv", "accessProviders", []*harness.Worker{w})
		webhooksServeFromThePod(t, h, pod)
		noTokenIn(t, "the broker's log", containerLog(t, h, pod, "credbroker"), tok)
	})
	if !ok {
		return
	}
	ok = t.Run("sidecar-killed", func(t *testing.T) {
		explainNodeOnFailure(t, h)
		pod := managerPod(t, h)
		pid, err := h.Node.ContainerPid(ctx, pod.Name, "credbroker")
		if err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// A cluster added while the broker is down or just back: its first credential comes
		// from the restarted sidecar.
		w, err := s.NewWorker("node-w2", "onprem", worker, map[string]any{"clusterName": "node-w2"})
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
		back := expectSidecarRestarted(t, h, pod)
		t.Logf("broker killed (SIGKILL to pid %d on the host) -> restarted by the kubelet and started (startupProbe) in %.1fs", pid, back.Sub(killed).Seconds())
		expectDispatch(t, s, "node-kill", "accessProviders", []*harness.Worker{w})
		p := managerPod(t, h)
		if m := status(p.Status.ContainerStatuses, "manager"); m == nil || m.RestartCount != 0 {
			t.Errorf("Kueue's manager restarted: %s", h.PodSummary(ctx))
		}
	})
	if !ok {
		return
	}
	ok = t.Run("init-copy", func(t *testing.T) {
		explainNodeOnFailure(t, h)
		old := managerPod(t, h)
		deployed := time.Now()
		if _, err := h.Deploy(ctx, harness.InitCopyOverlay, nil); err != nil {
			t.Fatal(err)
		}
		pod := managerPod(t, h)
		if pod.UID == old.UID {
			t.Fatalf("the init-copy overlay did not roll the pod")
		}
		t.Logf("kubectl apply --server-side of deploy/kueue/init-copy over image-volume -> new pod Available in %.1fs", time.Since(deployed).Seconds())
		install := status(pod.Status.InitContainerStatuses, "credbroker-shim-install")
		if install == nil || install.State.Terminated == nil || install.State.Terminated.ExitCode != 0 {
			t.Fatalf("the shim's install init container did not complete: %s", h.PodSummary(ctx))
		}
		for _, v := range pod.Spec.Volumes {
			if v.Image != nil {
				t.Errorf("the init-copy pod still has the image volume %s", v.Name)
			}
		}
		sidecarBeforeManager(t, h, pod)
		// The pod is new: Kueue connects the clusters again, with the shim from the emptyDir.
		expectClustersActive(t, s, harness.Timeout, "node-w1", "node-w2")
		nudged := expectSubmittedJobAdmitted(t, s, "node-iv", "node-ic-job")
		t.Logf("a Job dispatched through the init-copy pod (needed a Workload event: %v)", nudged)
	})
	if !ok {
		return
	}
	ok = t.Run("revoked-token", func(t *testing.T) {
		explainNodeOnFailure(t, h)
		// The shim runs in the manager's container and names its caller from that container's
		// /proc (Kueue's manager is pid 1 there); the broker, in another PID namespace, keys
		// re-asks on what the shim sends. A revoked token must still be found out and replaced.
		pod := managerPod(t, h)
		before := strings.Count(containerLog(t, h, pod, "credbroker"), "rejection confirmed")
		if err := worker.RevokeWorkerIdentity(ctx); err != nil {
			t.Fatal(err)
		}
		fresh := workerToken(t, worker)
		setClusterTokens(t, h, map[string]string{"node-w1": fresh, "node-w2": fresh})
		// The kubelet updates the mounted Secret at its next sync of the pod; the broker's
		// fetch after a confirmed rejection reads the file.
		mounted := filepath.Join(h.Node.KubeletDir(), "pods", string(pod.UID), "volumes", "kubernetes.io~secret", "credbroker-cluster-tokens", "node-w1")
		gomega.NewWithT(t).Eventually(func() error {
			b, err := os.ReadFile(mounted)
			if err == nil && string(b) != fresh {
				return fmt.Errorf("%s holds the old token", mounted)
			}
			return err
		}).WithTimeout(harness.MountedSecretTimeout).WithPolling(harness.Interval).Should(gomega.Succeed(), "the kubelet did not update the mounted Secret")
		// kube-apiserver keeps a successful token authentication for 10 s (README, below).
		time.Sleep(harness.TokenCacheWait)
		cut := time.Now()
		for _, w := range workers {
			w.Forward.Cut()
		}
		// Kueue reconnects, meets the 401, and client-go runs the shim again: the broker's check
		// confirms the rejection and fetches the new token.
		expectConfirmedRejections(t, h, pod, before+len(workers))
		expectClustersActive(t, s, harness.Timeout, "node-w1", "node-w2")
		nudged := expectSubmittedJobAdmitted(t, s, "node-iv", "node-revoked-job")
		t.Logf("the Job needed a Workload event: %v", nudged)
		log := containerLog(t, h, pod, "credbroker")
		var confirmed []string
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, "rejection confirmed") {
				confirmed = append(confirmed, l)
			}
		}
		t.Logf("revoked, connections cut -> a Job admitted %.1fs later; confirmed rejections: %d", time.Since(cut).Seconds(), len(confirmed)-before)
		if len(confirmed) <= before {
			t.Fatalf("no confirmed rejection in the broker's log")
		}
		if !strings.Contains(confirmed[len(confirmed)-1], "caller_pid=1 ") {
			t.Errorf("the re-ask's caller is not Kueue's manager as its container numbers it (pid 1): %s", confirmed[len(confirmed)-1])
		}
		if m := status(managerPod(t, h).Status.ContainerStatuses, "manager"); m == nil || m.RestartCount != 0 {
			t.Errorf("Kueue's manager restarted: %s", h.PodSummary(ctx))
		}
		noTokenIn(t, "the broker's log", log, tok, fresh)
	})
	if !ok {
		return
	}
	t.Run("kubernetes-secret", func(t *testing.T) {
		explainNodeOnFailure(t, h)
		// A user's broker config (docs/deploy.md section 3's credbroker-config component):
		// onprem as docs/providers/kubernetes-secret.md's provider, which reads Secrets from
		// the hub with the pod's projected ServiceAccount token (in-cluster configuration).
		tok := workerToken(t, worker)
		if err := harness.Apply(ctx, h.Hub.Client, fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: node-ks, namespace: kueue-system, labels: {credbroker.dev/credential: "true"}}
stringData: {token: %q}
`, tok)); err != nil {
			t.Fatal(err)
		}
		old := managerPod(t, h)
		if _, err := h.Deploy(ctx, harness.InitCopyOverlay, map[string]map[string]string{"credbroker-config": {
			"kustomization.yaml": userConfigComponent, "credbroker.yaml": userBrokerConfig,
		}}); err != nil {
			t.Fatal(err)
		}
		pod := managerPod(t, h)
		if pod.UID == old.UID {
			t.Fatalf("the new broker config did not roll the pod")
		}
		var projected bool
		for _, v := range pod.Spec.Volumes {
			projected = projected || (v.Projected != nil && strings.HasPrefix(v.Name, "kube-api-access-"))
		}
		if !projected {
			t.Errorf("the pod has no projected ServiceAccount token volume")
		}
		w, err := s.NewWorker("node-ks", "onprem", worker, map[string]any{"clusterName": "node-ks"})
		if err != nil {
			t.Fatal(err)
		}
		expectDispatch(t, s, "node-ks", "accessProviders", []*harness.Worker{w})
		log := containerLog(t, h, pod, "credbroker")
		if !strings.Contains(log, "onprem (kubernetesSecret)") {
			t.Errorf("the broker did not load the user's config: %s", harness.Tail(log, 5))
		}
		noTokenIn(t, "the broker's log", log, tok)
	})
}

// docs/deploy.md section 3's credbroker-config component, as written there.
const userConfigComponent = `apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
metadata:
  name: credbroker-config
configMapGenerator:
  - name: credbroker-config
    namespace: kueue-system
    behavior: replace
    files:
      - config.yaml=credbroker.yaml
`

// userBrokerConfig: the example's socket, onprem as docs/providers/kubernetes-secret.md's
// provider (in-cluster, the pod's ServiceAccount, Kueue's Role on Secrets in kueue-system).
const userBrokerConfig = `socket:
  path: /var/run/credbroker/broker.sock
  mode: "0660"
  allowedUids: [65532]
providers:
  - name: onprem
    type: kubernetesSecret
    kubernetesSecret: {namespace: kueue-system, labelSelector: credbroker.dev/credential=true}
`

// expectSubmittedJobAdmitted submits a Job and asserts its admission on a worker. As in
// TestRevokedTokenRecovers: a Job that gets its quota while MultiKueue is still (re)connecting
// (a new pod's Kueue, or connections just cut) is nominated nowhere and waits for the next
// event on its Workload (Kueue v0.19.2 does not requeue waiting workloads when a worker
// connects); after harness.NudgeAfter the test annotates the Workload and says so.
func expectSubmittedJobAdmitted(t *testing.T, s *harness.Stack, set, job string) (nudged bool) {
	t.Helper()
	if err := s.SubmitJob(context.Background(), set, job); err != nil {
		t.Fatal(err)
	}
	_, nudged = expectJobAdmittedNudging(t, s, set, job, harness.NudgeAfter, nil)
	return nudged
}

// expectSidecarRestarted asserts that the kubelet restarts the credbroker sidecar of pod, in
// the same pod, and its startup probe passes, within harness.SidecarRestartTimeout; it returns
// when that was seen.
func expectSidecarRestarted(t *testing.T, h *harness.NodeHub, pod *corev1.Pod) time.Time {
	t.Helper()
	ctx := context.Background()
	var back time.Time
	gomega.NewWithT(t).Eventually(func() error {
		p := managerPod(t, h)
		if p.UID != pod.UID {
			return harness.StopTrying(fmt.Errorf("the pod was replaced (%s -> %s): the kubelet was to restart the container", pod.UID, p.UID))
		}
		sc := status(p.Status.InitContainerStatuses, "credbroker")
		if sc == nil || sc.RestartCount < 1 || sc.Started == nil || !*sc.Started {
			return fmt.Errorf("sidecar not restarted yet:%s", h.PodSummary(ctx))
		}
		back = time.Now()
		return nil
	}).WithTimeout(harness.SidecarRestartTimeout).WithPolling(harness.Interval).Should(gomega.Succeed())
	return back
}

// expectConfirmedRejections asserts that the broker's log in pod holds at least n "rejection
// confirmed" lines within harness.Timeout.
func expectConfirmedRejections(t *testing.T, h *harness.NodeHub, pod *corev1.Pod, n int) {
	t.Helper()
	gomega.NewWithT(t).Eventually(func() error {
		if got := strings.Count(containerLog(t, h, pod, "credbroker"), "rejection confirmed"); got < n {
			return fmt.Errorf("%d confirmed rejections in the broker's log, want %d", got, n)
		}
		return nil
	}).WithTimeout(harness.Timeout).WithPolling(harness.Interval).Should(gomega.Succeed())
}

// setClusterTokens writes the Secret credbroker-cluster-tokens (one key per cluster name).
func setClusterTokens(t *testing.T, h *harness.NodeHub, tokens map[string]string) {
	t.Helper()
	var b strings.Builder
	for name, tok := range tokens {
		fmt.Fprintf(&b, "  %s: %q\n", name, tok)
	}
	doc := "apiVersion: v1\nkind: Secret\nmetadata: {name: credbroker-cluster-tokens, namespace: kueue-system}\nstringData:\n" + b.String()
	if out, err := h.Hub.Kubectl([]byte(doc), "apply", "--server-side", "--force-conflicts", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply the Secret credbroker-cluster-tokens: %v\n%s", err, out)
	}
}

func managerPod(t *testing.T, h *harness.NodeHub) *corev1.Pod {
	t.Helper()
	p, err := h.ManagerPod(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func status(list []corev1.ContainerStatus, name string) *corev1.ContainerStatus {
	for i := range list {
		if list[i].Name == name {
			return &list[i]
		}
	}
	return nil
}

func containerLog(t *testing.T, h *harness.NodeHub, pod *corev1.Pod, container string) string {
	t.Helper()
	text, err := h.ContainerLog(pod, container)
	if err != nil {
		t.Fatal(err)
	}
	return text
}

// explainNodeOnFailure has a failed step print what the node knows: the pods, the kubelet's
// log tail.
func explainNodeOnFailure(t *testing.T, h *harness.NodeHub) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pods:%s\nkubelet log tail:\n%s", h.PodSummary(context.Background()), harness.Tail(h.Node.Kubelet.LogText(), 20))
		}
	})
}

// firstLine is the CRI timestamp of the first line of a container's log holding sub ("" for
// the first line of all).
func firstLine(text, sub string) (time.Time, string, bool) {
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		// "2026-12-03T12:00:00.123456789Z stdout F message"
		ts, rest, ok := strings.Cut(sc.Text(), " ")
		if !ok || !strings.Contains(rest, sub) {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			continue
		}
		return at, rest, true
	}
	return time.Time{}, "", false
}

// sidecarBeforeManager shows the native sidecar's order: the kubelet started the broker,
// its startup probe passed, and only then did it start Kueue's manager, which ran the shim
// after; from the kubelet's events and both containers' logs (CRI timestamps).
func sidecarBeforeManager(t *testing.T, h *harness.NodeHub, pod *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	var events corev1.EventList
	if err := h.Hub.Client.List(ctx, &events, client.InNamespace(pod.Namespace)); err != nil {
		t.Fatal(err)
	}
	var lines []string
	var mine []corev1.Event
	for _, e := range events.Items {
		if e.InvolvedObject.UID == pod.UID && (e.Source.Component == "kubelet" || e.ReportingController == "kubelet") {
			mine = append(mine, e)
		}
	}
	// Their timestamps have whole seconds; the order the API server stored them in
	// (resourceVersion, etcd's revision) is the order the kubelet reported them in.
	rv := func(e corev1.Event) int64 { n, _ := strconv.ParseInt(e.ResourceVersion, 10, 64); return n }
	sort.SliceStable(mine, func(i, j int) bool { return rv(mine[i]) < rv(mine[j]) })
	startedBroker, startedManager := -1, -1
	for i, e := range mine {
		lines = append(lines, fmt.Sprintf("%s %s %s: %s", e.FirstTimestamp.Format("15:04:05"), e.InvolvedObject.FieldPath, e.Reason, e.Message))
		if e.Reason == "Started" && e.InvolvedObject.FieldPath == "spec.initContainers{credbroker}" && startedBroker < 0 {
			startedBroker = i
		}
		if e.Reason == "Started" && e.InvolvedObject.FieldPath == "spec.containers{manager}" && startedManager < 0 {
			startedManager = i
		}
	}
	t.Logf("kubelet events of %s:\n  %s", pod.Name, strings.Join(lines, "\n  "))
	if startedBroker < 0 || startedManager < 0 || startedBroker > startedManager {
		t.Errorf("events: the broker's Started (#%d) does not come before the manager's (#%d)", startedBroker, startedManager)
	}
	broker := containerLog(t, h, pod, "credbroker")
	manager := containerLog(t, h, pod, "manager")
	serving, line, ok := firstLine(broker, "serving")
	if !ok {
		t.Fatalf("no 'serving' line in the broker's log:\n%s", harness.Tail(broker, 10))
	}
	managerFirst, _, ok := firstLine(manager, "")
	if !ok {
		t.Fatalf("the manager's log is empty")
	}
	t.Logf("broker serving at %s (%s); manager's first line at %s (+%.3fs)", serving.Format("15:04:05.000000"),
		strings.TrimSpace(line), managerFirst.Format("15:04:05.000000"), managerFirst.Sub(serving).Seconds())
	if !serving.Before(managerFirst) {
		t.Errorf("the manager logged (%s) before the broker served (%s)", managerFirst, serving)
	}
	if firstCall, _, ok := firstLine(broker, "GetToken"); ok {
		t.Logf("the broker's first GetToken at %s (+%.3fs after serving)", firstCall.Format("15:04:05.000000"), firstCall.Sub(serving).Seconds())
		if firstCall.Before(managerFirst) {
			t.Errorf("a GetToken (%s) before the manager ran (%s)", firstCall, managerFirst)
		}
	}
}

// webhooksServeFromThePod shows Kueue's webhooks reached through their Service: the
// Service's EndpointSlice names the pod's address, ready (the sidecar's probes do not hold
// it back), and the API server called them for the Job just created (a Job in a queue is
// suspended by Kueue's mutating webhook).
func webhooksServeFromThePod(t *testing.T, h *harness.NodeHub, pod *corev1.Pod) {
	t.Helper()
	out, err := h.Hub.Kubectl(nil, "get", "endpointslices", "-n", "kueue-system", "-l", "kubernetes.io/service-name=kueue-webhook-service",
		"-o", `jsonpath={range .items[*].endpoints[*]}{.addresses[0]} {.conditions.ready}{"\n"}{end}`)
	if err != nil {
		t.Fatalf("endpointslices: %v\n%s", err, out)
	}
	want := pod.Status.PodIP + " true"
	if !strings.Contains(string(out), want) {
		t.Errorf("kueue-webhook-service's endpoints %q lack %q", strings.TrimSpace(string(out)), want)
	}
	t.Logf("kueue-webhook-service -> %s (pod %s, in %s)", strings.TrimSpace(string(out)), pod.Name, harness.PodCIDR)
}
