package harness

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
)

// Registry is an OCI registry on loopback that the suite's node pulls its images from: the
// manager Deployment says `imagePullPolicy: Always`, so the kubelet pulls even an image
// containerd holds, and no registry outside this machine is reachable. It is go-containerregistry's
// `crane registry serve` (the peer e2e/peers.sh builds), plain HTTP on 127.0.0.1, blobs on disk
// under the directory it is given (manifests are kept in its memory).
type Registry struct {
	// Addr is "127.0.0.1:PORT", the host part of every reference Push returns.
	Addr string
	// Log is the registry's combined output.
	Log string

	daemon *Daemon
}

// servingOn is crane's start-up line (cmd/crane/cmd/serve.go: `serving on port %s`), which
// names the port it bound: the registry binds port 0 itself, so no other process can take a
// port between our choosing it and crane binding it.
var servingOn = regexp.MustCompile(`serving on port ([0-9]+)`)

// StartRegistry starts `crane registry serve` on 127.0.0.1 with its blobs in dir/blobs and
// its log in dir/registry.log, and returns once `GET /v2/` answers 200. It runs in the
// suite's network namespace (RunInSuiteNetwork), where the node's containerd pulls from it.
func StartRegistry(ctx context.Context, dir string, crane string) (*Registry, error) {
	if crane == "" {
		return nil, fmt.Errorf("registry: no crane binary (peers.env has no CRANE=: run e2e/peers.sh)")
	}
	blobs := filepath.Join(dir, "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return nil, err
	}
	r := &Registry{Log: filepath.Join(dir, "registry.log")}
	r.daemon = &Daemon{Name: "registry", Log: r.Log,
		Argv: []string{crane, "registry", "serve", "--address", "127.0.0.1:0", "--disk", blobs}}
	if err := r.daemon.Start(); err != nil {
		return nil, err
	}
	// crane starts in milliseconds; RegistryStartTimeout covers a loaded machine.
	err := Eventually(ctx, RegistryStartTimeout, FastInterval, func() error {
		if !r.daemon.Running() {
			return StopTrying(fmt.Errorf("crane registry serve exited: %s", Tail(r.LogText(), 10)))
		}
		if r.Addr == "" {
			m := servingOn.FindStringSubmatch(r.LogText())
			if m == nil {
				return fmt.Errorf("no %q line in its log yet", "serving on port")
			}
			r.Addr = "127.0.0.1:" + m[1]
		}
		return probeV2(r.Addr)
	})
	if err != nil {
		r.Stop()
		return nil, fmt.Errorf("registry did not answer GET /v2/: %w (log %s)", err, r.Log)
	}
	return r, nil
}

// probeV2 asks GET /v2/ (the distribution API's version check).
func probeV2(addr string) error {
	c := http.Client{Timeout: RegistryProbeTimeout}
	resp, err := c.Get("http://" + addr + "/v2/")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET http://%s/v2/: %s", addr, resp.Status)
	}
	return nil
}

// LogText is the registry's log so far.
func (r *Registry) LogText() string { return logText(r.Log) }

// Stop ends the registry: SIGTERM to its process group, then SIGKILL after QuickStopGrace
// (its shutdown is an http.Server.Shutdown with nothing in flight). It returns once the
// process is reaped; calling it again does nothing.
func (r *Registry) Stop() {
	if r == nil || r.daemon == nil {
		return
	}
	_ = r.daemon.Stop(QuickStopGrace)
}

// Push copies an OCI archive (one image, or an index with every image it names) to
// ADDR/REPO:TAG and returns that reference. skopeo copies the manifests and blobs as they are
// (`--all` keeps an index, `--preserve-digests` refuses any change that would alter a digest),
// so what the node pulls has the archive's digests.
func (r *Registry) Push(ctx context.Context, archive, repo, tag string) (string, error) {
	ref := r.Addr + "/" + repo + ":" + tag
	cmd := exec.CommandContext(ctx, "skopeo", "copy", "--quiet", "--all", "--preserve-digests",
		"--dest-tls-verify=false", "oci-archive:"+archive, "docker://"+ref)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("push %s to %s: skopeo copy: %w: %s", archive, ref, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return ref, nil
}
