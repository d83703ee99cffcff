package harness

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// The shipped overlay and section 3's kustomization for Kueue v0.15–v0.18 (docs/deploy.md):
// what a user renders and applies.
const (
	// ShippedOverlay is deploy/kueue/image-volume, as shipped.
	ShippedOverlay = "kueue/image-volume"
	// CredentialsProvidersOverlay is docs/deploy.md section 3's kustomization with
	// components/kueue-config-credentials-providers in place of components/kueue-config, as
	// that section tells users of Kueue v0.15–v0.18 to write it.
	CredentialsProvidersOverlay = "my-kueue"
)

const credentialsProvidersKustomization = `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../kueue/kueue-install
components:
  - ../kueue/components/credbroker-sidecar
  - ../kueue/components/shim-image-volume
  - ../kueue/components/kueue-config-credentials-providers
images:
  - {name: credbroker, newName: registry.example.com/credbroker, newTag: 0.1.0}
`

// RenderDeploy renders a kustomization of deploy/ as the user applies it (`kubectl kustomize`),
// over Kueue k's own release manifests. The shipped deploy/kueue/kueue-install names Kueue's
// release manifest by URL; here it names, in a copy of deploy/ under scratch, the Kueue
// module's own config/default (k.Dir), the source of that manifest, offline. overlay is
// ShippedOverlay or CredentialsProvidersOverlay.
func RenderDeploy(k KueuePeer, scratch, overlay string) ([]byte, error) {
	tree, err := copyDeploy(k, scratch)
	if err != nil {
		return nil, err
	}
	if overlay == CredentialsProvidersOverlay {
		dir := filepath.Join(tree, overlay)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(credentialsProvidersKustomization), 0o644); err != nil {
			return nil, err
		}
	}
	return kustomize(k, tree, overlay)
}

// copyDeploy copies deploy/ under scratch, its kueue-install naming Kueue k's own
// config/default instead of the release manifest's URL, and returns the copy's directory.
func copyDeploy(k KueuePeer, scratch string) (string, error) {
	tree, err := os.MkdirTemp(scratch, "deploy-")
	if err != nil {
		return "", err
	}
	if err := os.CopyFS(tree, os.DirFS(filepath.Join(RepoRoot(), "deploy"))); err != nil {
		return "", fmt.Errorf("copy deploy/: %w", err)
	}
	install := filepath.Join(tree, "kueue", "kueue-install")
	absInstall, err := filepath.EvalSymlinks(install)
	if err != nil {
		return "", err
	}
	absDefault, err := filepath.EvalSymlinks(filepath.Join(k.Dir, "config", "default"))
	if err != nil {
		return "", fmt.Errorf("kueue %s config/default: %w (run e2e/peers.sh)", k.Version, err)
	}
	rel, err := filepath.Rel(absInstall, absDefault) // kustomize refuses absolute resource paths
	if err != nil {
		return "", err
	}
	kust := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\n", rel)
	return tree, os.WriteFile(filepath.Join(install, "kustomization.yaml"), []byte(kust), 0o644)
}

// kustomize is `kubectl kustomize` of overlay in the copied tree.
func kustomize(k KueuePeer, tree, overlay string) ([]byte, error) {
	out, err := exec.Command("kubectl", "kustomize", filepath.Join(tree, overlay)).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("kubectl kustomize %s over kueue %s: %w\n%s", overlay, k.Version, err, out)
	}
	return out, nil
}

// RenderKueueRelease renders Kueue k's own release manifests (config/default): what a
// worker runs.
func RenderKueueRelease(k KueuePeer) ([]byte, error) {
	out, err := exec.Command("kubectl", "kustomize", filepath.Join(k.Dir, "config", "default")).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("kubectl kustomize kueue %s config/default: %w\n%s", k.Version, err, out)
	}
	return out, nil
}

// KueueConfigOf is controller_manager_config.yaml of ConfigMap kueue-manager-config in a
// rendered installation.
func KueueConfigOf(rendered []byte) (map[string]any, error) {
	for _, doc := range bytes.Split(rendered, []byte("\n---\n")) {
		var obj struct {
			Kind     string                `json:"kind"`
			Metadata struct{ Name string } `json:"metadata"`
			Data     map[string]string     `json:"data"`
		}
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			continue
		}
		if obj.Kind == "ConfigMap" && obj.Metadata.Name == "kueue-manager-config" {
			cfg := map[string]any{}
			if err := yaml.Unmarshal([]byte(obj.Data["controller_manager_config.yaml"]), &cfg); err != nil {
				return nil, err
			}
			return cfg, nil
		}
	}
	return nil, fmt.Errorf("no ConfigMap kueue-manager-config in the rendered installation")
}

// Sub returns the map at key in m, creating it.
func Sub(m map[string]any, key string) map[string]any {
	if v, ok := m[key].(map[string]any); ok {
		return v
	}
	v := map[string]any{}
	m[key] = v
	return v
}

// HostProcessOverrides are the only changes a Kueue manager needs to run as a host process
// beside other Kueues instead of in its own pod (e2e/README.md lists why each one):
// leader election off, loopback ports of its own, the webhook on 127.0.0.1, Kueue's internal
// certificate management off (certificates are mounted where its Secret volumes would be), and
// the visibility API server off (it binds :8082 on every address).
func HostProcessOverrides(cfg map[string]any, c *Cluster, healthPort, metricsPort int) {
	Sub(cfg, "leaderElection")["leaderElect"] = false
	Sub(cfg, "health")["healthProbeBindAddress"] = fmt.Sprintf("127.0.0.1:%d", healthPort)
	Sub(cfg, "metrics")["bindAddress"] = fmt.Sprintf("127.0.0.1:%d", metricsPort)
	wh := Sub(cfg, "webhook")
	wh["port"] = c.WebhookPort
	wh["host"] = "127.0.0.1"
	Sub(cfg, "internalCertManagement")["enable"] = false
	Sub(cfg, "featureGates")["VisibilityOnDemand"] = false
}

// Kueue is one Kueue manager process.
type Kueue struct {
	*Container
	HealthPort int
	Cluster    *Cluster
}

// KueueOptions: what one Kueue manager runs with.
type KueueOptions struct {
	Name    string
	Peer    KueuePeer
	Cluster *Cluster
	Config  map[string]any // already carrying the host-process overrides
	Dir     string
	// Manager-pod volumes beyond Kueue's own (hub: the shim and the broker's socket).
	Mounts []Mount
	// Identity is the pod's ServiceAccount (kueue-system/kueue-controller-manager), as the
	// kubelet projects it: Kueue reaches its API server with client-go's in-cluster config.
	Identity *ServiceAccountVolume
}

// StartKueue runs Kueue's manager as its pod would: /manager --config=/controller_manager_config.yaml,
// uid 65532, its ServiceAccount where the kubelet projects it, its certificates where its
// Secret volumes are, and waits until /readyz answers.
func StartKueue(ctx context.Context, o KueueOptions, healthPort int) (*Kueue, error) {
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	cfgYAML, err := yaml.Marshal(o.Config)
	if err != nil {
		return nil, err
	}
	cfgFile := filepath.Join(o.Dir, "controller_manager_config.yaml")
	if err := os.WriteFile(cfgFile, cfgYAML, 0o644); err != nil {
		return nil, err
	}
	metricsCerts := filepath.Join(o.Dir, "metrics-certs")
	mc, err := NewServingCert("kueue-metrics")
	if err != nil {
		return nil, err
	}
	if err := mc.WriteDir(metricsCerts); err != nil {
		return nil, err
	}
	mounts := append([]Mount{
		{Src: o.Peer.Binary, Dst: "/manager"},
		{Src: cfgFile, Dst: "/controller_manager_config.yaml"},
		{Src: o.Cluster.WebhookCertDir, Dst: "/tmp/k8s-webhook-server/serving-certs"},
		{Src: metricsCerts, Dst: "/etc/kueue/metrics/certs"},
		o.Identity.Mount,
	}, o.Mounts...)
	k := &Kueue{HealthPort: healthPort, Cluster: o.Cluster, Container: &Container{
		Name:  o.Name,
		Argv:  []string{"/manager", "--config=/controller_manager_config.yaml", "--zap-log-level=2"},
		Env:   append([]string{"HOME=/tmp"}, o.Identity.Env...),
		Mount: mounts,
		Dir:   filepath.Join(o.Dir, "container"),
		Log:   filepath.Join(o.Dir, "kueue.log"),
	}}
	for attempt := 1; ; attempt++ {
		if err := k.Start(); err != nil {
			return nil, err
		}
		err := k.WaitReady(ctx, KueueReadyTimeout)
		if err == nil {
			return k, nil
		}
		_ = k.Stop(DaemonStopGrace)
		// A port FreePort chose can be taken by another process before Kueue binds it (CI
		// runs other tests beside this suite): new health and metrics ports, and again.
		if attempt == portAttempts || !strings.Contains(k.LogText(), "address already in use") {
			return nil, err
		}
		hp, herr := FreePort()
		mp, merr := FreePort()
		if herr != nil || merr != nil {
			return nil, err
		}
		HostProcessOverrides(o.Config, o.Cluster, hp, mp)
		if cfgYAML, err = yaml.Marshal(o.Config); err != nil {
			return nil, err
		}
		if err := os.WriteFile(cfgFile, cfgYAML, 0o644); err != nil {
			return nil, err
		}
		k.HealthPort = hp
		k.Log = filepath.Join(o.Dir, fmt.Sprintf("kueue-%d.log", attempt+1))
	}
}

// portAttempts: how many times StartKueue starts a Kueue whose port was taken first.
const portAttempts = 3

// WaitReady waits until Kueue's /readyz answers 200 (its webhooks serve by then).
func (k *Kueue) WaitReady(ctx context.Context, timeout time.Duration) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", k.HealthPort)
	err := Eventually(ctx, timeout, Interval, func() error {
		if !k.Running() {
			return StopTrying(fmt.Errorf("kueue %s exited", k.Name))
		}
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("kueue %s not ready: %w; log tail:\n%s", k.Name, err, Tail(k.LogText(), 30))
	}
	return nil
}

// Tail is the last n lines of s, each cut to 600 bytes.
func Tail(s string, n int) string {
	lines := bytes.Split([]byte(s), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		if len(l) > 600 {
			lines[i] = append(l[:600:600], []byte("…")...)
		}
	}
	return string(bytes.Join(lines, []byte("\n")))
}
