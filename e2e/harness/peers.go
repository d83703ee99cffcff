package harness

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Peers are the binaries and manifests e2e/peers.sh built and located.
type Peers struct {
	KubeVersion, EtcdVersion string
	KubeAPIServer, Etcd      string
	Secretreader             string
	ClusterProfileCRDDir     string
	Crane                    string               // go-containerregistry's crane: the node's registry (StartRegistry)
	Kueue                    map[string]KueuePeer // by version, "v0.19.2"
	// The node's (StartNode): the same Kubernetes release's kubelet, kube-proxy,
	// kube-controller-manager and kube-scheduler, and containerd with its runc shim and ctr.
	Kubelet, KubeProxy, KubeControllerManager, KubeScheduler string
	ContainerdVersion, Containerd, ContainerdShim, Ctr       string
}

// KueuePeer is one Kueue version: its binary and its module directory (CRDs, webhooks, config).
type KueuePeer struct {
	Version, Binary, Dir string
	ClusterProfileCRDDir string // from the cluster-inventory-api version this Kueue requires
}

// CacheDir is where e2e/peers.sh keeps the peers.
func CacheDir() string {
	if d := os.Getenv("CREDBROKER_E2E_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "credbroker-e2e")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "credbroker-e2e")
}

// LoadPeers reads peers.env; a missing peer is an error naming the command that builds it.
func LoadPeers() (*Peers, error) {
	path := filepath.Join(CacheDir(), "peers.env")
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w (run e2e/peers.sh, or scripts/test.sh, first)", err)
	}
	defer f.Close()
	kv := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if ok {
			kv[k] = v
		}
	}
	p := &Peers{
		KubeVersion: kv["KUBE_VERSION"], EtcdVersion: kv["ETCD_VERSION"],
		KubeAPIServer: kv["KUBE_APISERVER"], Etcd: kv["ETCD"], Secretreader: kv["SECRETREADER"],
		ClusterProfileCRDDir: kv["CLUSTERPROFILE_CRD_DIR"], Crane: kv["CRANE"], Kueue: map[string]KueuePeer{},
		Kubelet: kv["KUBELET"], KubeProxy: kv["KUBE_PROXY"],
		KubeControllerManager: kv["KUBE_CONTROLLER_MANAGER"], KubeScheduler: kv["KUBE_SCHEDULER"],
		ContainerdVersion: kv["CONTAINERD_VERSION"], Containerd: kv["CONTAINERD"],
		ContainerdShim: kv["CONTAINERD_SHIM"], Ctr: kv["CTR"],
	}
	for k, v := range kv {
		if strings.HasPrefix(k, "KUEUE_") && !strings.HasSuffix(k, "_DIR") {
			ver := "v" + strings.ReplaceAll(strings.TrimPrefix(k, "KUEUE_"), "_", ".")
			p.Kueue[ver] = KueuePeer{Version: ver, Binary: v, Dir: kv[k+"_DIR"], ClusterProfileCRDDir: kv[k+"_CLUSTERPROFILE_CRD_DIR"]}
		}
	}
	for _, f := range []string{p.KubeAPIServer, p.Etcd, p.Secretreader, p.Kubelet, p.KubeProxy,
		p.KubeControllerManager, p.KubeScheduler, p.Containerd, p.ContainerdShim, p.Ctr, p.Crane} {
		if st, err := os.Stat(f); err != nil || st.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("peer %q is missing (run e2e/peers.sh)", f)
		}
	}
	return p, nil
}

// RepoRoot is the credbroker repository (the parent of e2e/).
func RepoRoot() string {
	wd, _ := os.Getwd()
	for d := wd; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "scripts", "image-content.sh")); err == nil {
			return d
		}
	}
	return filepath.Dir(wd)
}

// ImageContent lays out the credbroker image's root filesystem with
// scripts/image-content.sh --profile debug (the bytes a user deploys, debug-built for speed)
// into target/e2e/image-content and returns that directory.
//
// CREDBROKER_E2E_CONTENT names an existing content directory to use instead (one laid out by
// the same script, e.g. from another checkout).
func ImageContent() (string, error) {
	if d := os.Getenv("CREDBROKER_E2E_CONTENT"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "plugins/bin/credbroker-shim")); err != nil {
			return "", fmt.Errorf("CREDBROKER_E2E_CONTENT=%s: %w", d, err)
		}
		return d, nil
	}
	root := RepoRoot()
	out := filepath.Join(root, "target", "e2e", "image-content")
	cmd := exec.Command(filepath.Join(root, "scripts", "image-content.sh"), "--profile", "debug", "--out", out)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("scripts/image-content.sh: %w\n%s", err, b)
	}
	return out, nil
}

// BuildGo builds a package of this module (a static helper binary) into dir.
func BuildGo(pkg, out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTOOLCHAIN=local")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}
