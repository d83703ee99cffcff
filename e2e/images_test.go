package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"credbroker.dev/e2e/harness"
)

// TestImagesThroughTheRegistry pushes the three images the node runs (Kueue's manager, the
// pod sandbox, credbroker) to the suite's loopback registry and checks, through the registry,
// what the node will pull: each image's configuration and, for Kueue, the files of its layer.
func TestImagesThroughTheRegistry(t *testing.T) {
	if fw.Peers.Crane == "" {
		t.Fatal("peers.env has no CRANE= (run e2e/peers.sh)")
	}
	ctx := context.Background()
	dir := fw.Dir("images")
	reg, err := harness.StartRegistry(ctx, filepath.Join(dir, "registry"), fw.Peers.Crane)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Stop)

	k := fw.Peers.Kueue[kueueMain]
	start := time.Now()
	kueueArchive, err := harness.KueueImage(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	pauseArchive, err := harness.PauseImage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Kueue and pause images (cached when their inputs are unchanged) in %.2fs", time.Since(start).Seconds())
	start = time.Now()
	cbArchive, err := harness.CredbrokerImage(ctx, filepath.Join(dir, "credbroker-image.tar"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("credbroker image (scripts/build-image.sh, release) in %.2fs", time.Since(start).Seconds())

	push := func(archive, repo, tag string) string {
		t.Helper()
		st, err := os.Stat(archive)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		ref, err := reg.Push(ctx, archive, repo, tag)
		if err != nil {
			t.Fatal(err)
		}
		if want := reg.Addr + "/" + repo + ":" + tag; ref != want {
			t.Fatalf("Push returned %q, want %q", ref, want)
		}
		t.Logf("pushed %s (%.1f MB) in %.2fs", ref, float64(st.Size())/1e6, time.Since(start).Seconds())
		return ref
	}
	kueueRef := push(kueueArchive, "kueue/kueue", k.Version)
	pauseRef := push(pauseArchive, "pause", "e2e")
	cbRef := push(cbArchive, "credbroker", "e2e")

	t.Run("kueue", func(t *testing.T) {
		cfg := imageConfig(t, kueueRef)
		if cfg.Config.User != "65532:65532" || !slices.Equal(cfg.Config.Entrypoint, []string{"/manager"}) || cfg.Config.WorkingDir != "/" {
			t.Errorf("config: user %q, entrypoint %q, workdir %q; want 65532:65532, [/manager], / (Kueue's Dockerfile)",
				cfg.Config.User, cfg.Config.Entrypoint, cfg.Config.WorkingDir)
		}
		if cfg.OS != "linux" || cfg.Architecture != "amd64" {
			t.Errorf("platform %s/%s, want linux/amd64", cfg.OS, cfg.Architecture)
		}
		want := fileSHA256(t, k.Binary)
		files := exportedFiles(t, kueueRef)
		m, ok := files["manager"]
		switch {
		case !ok:
			t.Errorf("no /manager in the pulled filesystem")
		case m.sha256 != want:
			t.Errorf("/manager's SHA-256 %s differs from the Kueue peer %s's %s", m.sha256, k.Binary, want)
		case m.mode != 0o755 || m.uid != 0 || m.gid != 0:
			t.Errorf("/manager: mode %o owner %d:%d, want 0755 0:0 (COPY --from=builder)", m.mode, m.uid, m.gid)
		}
		for name, f := range files {
			if path.Base(name) == "sh" || strings.HasPrefix(name, "bin/") || strings.HasPrefix(name, "busybox") {
				t.Errorf("the image has %s (%c): distroless/static has no shell", name, f.typ)
			}
		}
		for name, want := range map[string]layerFile{
			"tmp":                               {typ: tar.TypeDir, mode: 0o1777},
			"home/nonroot":                      {typ: tar.TypeDir, mode: 0o700, uid: 65532, gid: 65532},
			"etc/ssl/certs/ca-certificates.crt": {typ: tar.TypeReg, mode: 0o644},
			"etc/passwd":                        {typ: tar.TypeReg, mode: 0o644},
			"etc/group":                         {typ: tar.TypeReg, mode: 0o644},
		} {
			got, ok := files[name]
			if !ok || got.typ != want.typ || got.mode != want.mode || got.uid != want.uid || got.gid != want.gid {
				t.Errorf("/%s: present %v, type %c mode %o owner %d:%d; want type %c mode %o owner %d:%d",
					name, ok, got.typ, got.mode, got.uid, got.gid, want.typ, want.mode, want.uid, want.gid)
			}
		}
		if p := string(files["etc/passwd"].data); !strings.Contains(p, "\nnonroot:x:65532:65532:") || !strings.HasPrefix(p, "root:x:0:0:") {
			t.Errorf("/etc/passwd lacks root or nonroot (65532):\n%s", p)
		}
		if g := string(files["etc/group"].data); !strings.Contains(g, "\nnonroot:x:65532:") {
			t.Errorf("/etc/group lacks nonroot (65532):\n%s", g)
		}
	})

	t.Run("credbroker", func(t *testing.T) {
		// The digest the node resolves the tag to is the archive's own: what users build is
		// what runs.
		raw, err := exec.Command("skopeo", "inspect", "--raw", "oci-archive:"+cbArchive).Output()
		if err != nil {
			t.Fatalf("skopeo inspect --raw %s: %v", cbArchive, err)
		}
		want := "sha256:" + hex.EncodeToString(sha256Of(raw))
		got := strings.TrimSpace(string(crane(t, "digest", cbRef)))
		if got != want {
			t.Errorf("%s resolves to %s, the archive's manifest is %s", cbRef, got, want)
		}
		if pulled := crane(t, "manifest", cbRef); !bytes.Equal(pulled, raw) {
			t.Errorf("the pulled manifest differs from the archive's:\n%s\n%s", pulled, raw)
		}
		cfg := imageConfig(t, cbRef)
		if cfg.OS != "linux" || cfg.Architecture != "amd64" {
			t.Errorf("platform %s/%s, want linux/amd64", cfg.OS, cfg.Architecture)
		}
		if cfg.Config.User != "65532:65532" || !slices.Equal(cfg.Config.Entrypoint, []string{"/bin/credbroker"}) {
			t.Errorf("config: user %q, entrypoint %q; want 65532:65532, [/bin/credbroker]", cfg.Config.User, cfg.Config.Entrypoint)
		}
		t.Logf("%s: %s, linux/amd64", cbRef, got)
	})

	t.Run("pause", func(t *testing.T) {
		cfg := imageConfig(t, pauseRef)
		if !slices.Equal(cfg.Config.Entrypoint, []string{"/pause"}) || cfg.Config.User != "65535:65535" {
			t.Errorf("config: entrypoint %q, user %q; want [/pause], 65535:65535 (Kubernetes' pause)", cfg.Config.Entrypoint, cfg.Config.User)
		}
		if cfg.OS != "linux" || cfg.Architecture != "amd64" {
			t.Errorf("platform %s/%s, want linux/amd64", cfg.OS, cfg.Architecture)
		}
		files := exportedFiles(t, pauseRef)
		if p, ok := files["pause"]; !ok || p.typ != tar.TypeReg || p.mode != 0o755 {
			t.Errorf("/pause: present %v, type %c mode %o; want a regular file, mode 0755", ok, p.typ, p.mode)
		}
		if len(files) != 1 {
			t.Errorf("the pause image holds %d entries, want /pause alone", len(files))
		}
	})

	t.Run("push errors name the archive and carry skopeo's words", func(t *testing.T) {
		missing := filepath.Join(dir, "no-such-archive.tar")
		_, err := reg.Push(ctx, missing, "missing", "e2e")
		if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "no such file or directory") {
			t.Errorf("pushing a missing archive: %v; want an error naming it with skopeo's message", err)
		}
	})

	t.Run("stop", func(t *testing.T) {
		reg.Stop()
		if c, err := net.DialTimeout("tcp", reg.Addr, harness.DialTimeout); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after Stop", reg.Addr)
		}
	})
}

// ociConfig is the part of an image configuration the node's runtime uses.
type ociConfig struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Config       struct {
		User       string   `json:"User"`
		Entrypoint []string `json:"Entrypoint"`
		WorkingDir string   `json:"WorkingDir"`
	} `json:"config"`
}

// crane runs the peer crane against the plain-HTTP registry and returns its stdout.
func crane(t *testing.T, args ...string) []byte {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(fw.Peers.Crane, append([]string{"--insecure"}, args...)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("crane %s: %v: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out
}

func imageConfig(t *testing.T, ref string) ociConfig {
	t.Helper()
	var cfg ociConfig
	if err := json.Unmarshal(crane(t, "config", "--platform", "linux/amd64", ref), &cfg); err != nil {
		t.Fatalf("crane config %s: %v", ref, err)
	}
	return cfg
}

// layerFile is one entry of an image's filesystem as pulled; small regular files keep their
// bytes.
type layerFile struct {
	typ      byte
	mode     int64
	uid, gid int
	sha256   string
	data     []byte
}

// exportedFiles pulls ref's flattened filesystem (`crane export`) and lists it by path
// (without a leading "/" or "./").
func exportedFiles(t *testing.T, ref string) map[string]layerFile {
	t.Helper()
	cmd := exec.Command(fw.Peers.Crane, "--insecure", "export", "--platform", "linux/amd64", ref, "-")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	files := map[string]layerFile{}
	tr := tar.NewReader(out)
	var readErr error
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			readErr = err
			break
		}
		name := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(hdr.Name, "./"), "/"), "/")
		if name == "" || name == "." {
			continue
		}
		f := layerFile{typ: hdr.Typeflag, mode: hdr.Mode & 0o7777, uid: hdr.Uid, gid: hdr.Gid}
		if hdr.Typeflag == tar.TypeReg {
			h := sha256.New()
			var small bytes.Buffer
			w := io.Writer(h)
			if hdr.Size <= 1<<20 {
				w = io.MultiWriter(h, &small)
			}
			if _, err := io.Copy(w, tr); err != nil {
				readErr = err
				break
			}
			f.sha256 = hex.EncodeToString(h.Sum(nil))
			f.data = small.Bytes()
		}
		files[name] = f
	}
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil || readErr != nil {
		t.Fatalf("crane export %s: %v %v: %s", ref, err, readErr, stderr.Bytes())
	}
	return files
}

func fileSHA256(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(fmt.Errorf("%s: %w", p, err))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func sha256Of(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}
