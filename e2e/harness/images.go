package harness

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The images the suite's node runs, each an OCI archive that Registry.Push serves to it.
//
// Kueue's image and the pod sandbox ("pause") image are made here, with buildah in a
// temporary storage root (as scripts/build-image.sh does: `buildah from scratch`, one layer
// added from a tar this file writes, so owners and modes are exact, `buildah config`,
// `buildah commit` to an oci-archive), and cached under CacheDir()/images by the digest of
// what goes in: the layer's bytes and the image configuration. The credbroker image is
// scripts/build-image.sh's own archive, what users push (docs/deploy.md, section 1).

// imageTimestamp is the creation time of the images built here and the mtime of every file in
// their layer: fixed (2025-01-01T00:00:00Z, an arbitrary date), so that one input always gives
// the same archive and digests.
const imageTimestamp = 1735689600

// imageRecipe changes whenever the way an image is put together here changes in a way its
// inputs do not show (buildah's flags, the archive's layout): it is part of every cache key.
const imageRecipe = "credbroker-e2e-images/1"

// distrolessPasswd and distrolessGroup are gcr.io/distroless/static's /etc/passwd and
// /etc/group (GoogleContainerTools/distroless common/BUILD.bazel: root, nobody 65534,
// nonroot 65532, and the groups tty and staff).
const (
	distrolessPasswd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	distrolessGroup = "root:x:0:\n" +
		"nobody:x:65534:\n" +
		"tty:x:5:\n" +
		"staff:x:50:\n" +
		"nonroot:x:65532:\n"
)

// imagePath is the PATH distroless sets, and every Containerfile build gets.
const imagePath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// caBundle is the host's CA bundle, the one scripts/image-content.sh ships too.
const caBundle = "/etc/ssl/certs/ca-certificates.crt"

// layerEntry is one file or directory of an image's single layer.
type layerEntry struct {
	path     string // without a leading slash; a directory ends in "/"
	mode     int64
	uid, gid int
	src      string // a regular file's bytes come from this host path...
	data     []byte // ...or from here
}

// imageSpec is everything an image built here is made of.
type imageSpec struct {
	name   string // the cache file's prefix, e.g. "kueue-v0.19.2"
	ref    string // the reference stored in the archive, e.g. "kueue:v0.19.2"
	layer  []layerEntry
	config []string // buildah config flags
}

// KueueImage is Kueue's manager image as Kueue's own Dockerfile makes it (k.Dir/Dockerfile):
// `FROM gcr.io/distroless/static:nonroot`, `WORKDIR /`, `USER 65532:65532`,
// `ENTRYPOINT ["/manager"]`, `COPY --from=builder /workspace/bin/manager /manager` (root-owned,
// 0755), linux/amd64, with k.Binary, the peer e2e/peers.sh built from the same module version,
// as /manager.
//
// The base cannot be pulled here, so what the manager uses of it is reproduced: /etc/passwd
// and /etc/group as distroless has them, /tmp (1777), /root (0700), /home and /home/nonroot
// (0700, 65532's), the CA bundle at /etc/ssl/certs/ca-certificates.crt (the host's, as the
// credbroker image ships) and distroless's environment (PATH, SSL_CERT_FILE); no shell, no
// libc. What distroless/static has and this image lacks: tzdata (/usr/share/zoneinfo), netbase
// (/etc/services, /etc/protocols), /etc/nsswitch.conf, /etc/os-release, the C.UTF-8 locale
// and the packages' licences and dpkg status files. None of it changes what the manager does:
// it is a static Go program, which without TZ and /etc/localtime (distroless has no
// /etc/localtime either) runs in UTC; Go's resolver without nsswitch.conf looks up hosts in
// files, then DNS, the order distroless's file names; Go resolves the few service names it
// needs from a table of its own when /etc/services is missing; and nothing reads the rest,
// which only tells scanners what the image is.
func KueueImage(ctx context.Context, k KueuePeer) (string, error) {
	if k.Binary == "" || k.Version == "" {
		return "", fmt.Errorf("kueue image: the Kueue peer names no binary or version (run e2e/peers.sh)")
	}
	if _, err := os.Stat(k.Binary); err != nil {
		return "", fmt.Errorf("kueue image: %w (run e2e/peers.sh)", err)
	}
	spec := imageSpec{
		name: "kueue-" + k.Version,
		ref:  "kueue:" + k.Version,
		layer: []layerEntry{
			{path: "etc/", mode: 0o755},
			{path: "etc/group", mode: 0o644, data: []byte(distrolessGroup)},
			{path: "etc/passwd", mode: 0o644, data: []byte(distrolessPasswd)},
			{path: "etc/ssl/", mode: 0o755},
			{path: "etc/ssl/certs/", mode: 0o755},
			{path: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, src: caBundle},
			{path: "home/", mode: 0o755},
			{path: "home/nonroot/", mode: 0o700, uid: 65532, gid: 65532},
			{path: "manager", mode: 0o755, src: k.Binary},
			{path: "root/", mode: 0o700},
			{path: "tmp/", mode: 0o1777},
		},
		config: []string{
			"--os", "linux", "--arch", "amd64",
			"--env", imagePath,
			"--env", "SSL_CERT_FILE=" + caBundle,
			"--workingdir", "/",
			"--user", "65532:65532",
			"--entrypoint", `["/manager"]`,
			"--created-by", "e2e/harness KueueImage: Kueue " + k.Version + "'s Dockerfile on a stand-in for distroless/static:nonroot",
		},
	}
	return buildImage(ctx, spec)
}

// PauseImage is the pod sandbox image the suite's node gives containerd: cmd/pause at /pause
// on an empty base, configured as Kubernetes' own (build/pause/Dockerfile: `FROM scratch`,
// `USER 65535:65535`, `ENTRYPOINT ["/pause"]`), linux/amd64.
func PauseImage(ctx context.Context) (string, error) {
	tmp, err := os.MkdirTemp("", "credbroker-e2e-pause-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "pause")
	// -trimpath and no VCS stamp: the same source gives the same bytes, so the cache hits.
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-o", bin, "./cmd/pause")
	cmd.Dir = filepath.Join(RepoRoot(), "e2e")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTOOLCHAIN=local")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("pause image: go build ./cmd/pause: %w\n%s", err, out)
	}
	spec := imageSpec{
		name:  "pause",
		ref:   "pause:e2e",
		layer: []layerEntry{{path: "pause", mode: 0o755, src: bin}},
		config: []string{
			"--os", "linux", "--arch", "amd64",
			"--user", "65535:65535",
			"--entrypoint", `["/pause"]`,
			"--created-by", "e2e/harness PauseImage: e2e/cmd/pause as Kubernetes' pause image",
		},
	}
	return buildImage(ctx, spec)
}

// CredbrokerImage is exactly the image users push: `scripts/build-image.sh --out OUT` (release
// binaries from scripts/image-content.sh, built in target/image-build, which cargo keeps
// between runs; the commit's time as the creation time). It is not cached here: the script
// rebuilds the archive, and cargo only what changed.
func CredbrokerImage(ctx context.Context, out string) (string, error) {
	root := RepoRoot()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "build-image.sh"), "--out", out)
	cmd.Dir = root
	var log bytes.Buffer
	cmd.Stdout = &log
	cmd.Stderr = &log
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("credbroker image: scripts/build-image.sh --out %s: %w\n%s", out, err, Tail(log.String(), 40))
	}
	if _, err := os.Stat(out); err != nil {
		return "", fmt.Errorf("credbroker image: scripts/build-image.sh succeeded but %w", err)
	}
	return out, nil
}

// buildImage returns the cached archive of spec, building it first when no archive of the
// same inputs is there. A new archive replaces the older ones of the same name.
func buildImage(ctx context.Context, spec imageSpec) (string, error) {
	dir := filepath.Join(CacheDir(), "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// The key is hashed from the layer as it streams by, so a cache hit writes nothing.
	key, err := writeLayer(io.Discard, spec)
	if err != nil {
		return "", fmt.Errorf("%s image: %w", spec.name, err)
	}
	out := filepath.Join(dir, spec.name+"-"+key[:16]+".tar")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	tmp, err := os.MkdirTemp(dir, ".build-"+spec.name+"-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	layer := filepath.Join(tmp, "layer.tar")
	f, err := os.Create(layer)
	if err != nil {
		return "", err
	}
	again, err := writeLayer(f, spec)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("%s image: %w", spec.name, err)
	}
	if again != key {
		return "", fmt.Errorf("%s image: an input changed while the image was built; try again", spec.name)
	}
	partial := filepath.Join(tmp, "image.tar")
	if err := buildahCommit(ctx, tmp, layer, spec, partial); err != nil {
		return "", fmt.Errorf("%s image: %w", spec.name, err)
	}
	if err := os.Rename(partial, out); err != nil {
		return "", err
	}
	// Older builds of this image (other inputs) only take space.
	old, _ := filepath.Glob(filepath.Join(dir, spec.name+"-*.tar"))
	for _, o := range old {
		key := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(o), spec.name+"-"), ".tar")
		if _, err := hex.DecodeString(key); o != out && len(key) == 16 && err == nil {
			_ = os.Remove(o)
		}
	}
	return out, nil
}

// writeLayer writes spec's layer as a tar to w (root-owned unless said otherwise, every mtime
// the fixed timestamp) and returns the hex SHA-256 of the recipe, the configuration and the
// layer: the cache key.
func writeLayer(w io.Writer, spec imageSpec) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%d\n%q\n", imageRecipe, spec.ref, imageTimestamp, spec.config)
	tw := tar.NewWriter(io.MultiWriter(w, h))
	mtime := time.Unix(imageTimestamp, 0).UTC()
	for _, e := range spec.layer {
		hdr := &tar.Header{Name: e.path, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: mtime, Format: tar.FormatPAX}
		if strings.HasSuffix(e.path, "/") {
			hdr.Typeflag = tar.TypeDir
			if err := tw.WriteHeader(hdr); err != nil {
				return "", err
			}
			continue
		}
		if err := writeLayerFile(tw, hdr, e); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeLayerFile writes one regular file of the layer.
func writeLayerFile(tw *tar.Writer, hdr *tar.Header, e layerEntry) error {
	hdr.Typeflag = tar.TypeReg
	var r io.Reader = bytes.NewReader(e.data)
	hdr.Size = int64(len(e.data))
	if e.src != "" {
		src, err := os.Open(e.src)
		if err != nil {
			return err
		}
		defer src.Close()
		st, err := src.Stat()
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%s (for /%s) is not a regular file", e.src, e.path)
		}
		hdr.Size, r = st.Size(), src
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if n, err := io.Copy(tw, r); err != nil {
		return fmt.Errorf("/%s from %s: %w", e.path, e.src, err)
	} else if n != hdr.Size {
		return fmt.Errorf("/%s: %s changed size while read", e.path, e.src)
	}
	return nil
}

// buildahCommit makes the image with buildah in a storage root under tmp (vfs: no overlay
// mount), removed with tmp: nothing is left in /var/lib/containers.
func buildahCommit(ctx context.Context, tmp, layer string, spec imageSpec, out string) error {
	storage := filepath.Join(tmp, "storage")
	bh := func(args ...string) (string, error) {
		full := append([]string{"--root", filepath.Join(storage, "root"), "--runroot", filepath.Join(storage, "runroot"), "--storage-driver", "vfs"}, args...)
		cmd := exec.CommandContext(ctx, "buildah", full...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("buildah %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
		}
		return strings.TrimSpace(stdout.String()), nil
	}
	ctr, err := bh("from", "--quiet", "scratch")
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			_, _ = bh("rm", ctr)
		}
	}()
	// `buildah add` extracts a local tar keeping its owners and modes.
	if _, err := bh("add", "--quiet", ctr, layer, "/"); err != nil {
		return err
	}
	if _, err := bh(append(append([]string{"config"}, spec.config...), ctr)...); err != nil {
		return err
	}
	if _, err := bh("commit", "--quiet", "--format", "oci", "--timestamp", fmt.Sprint(imageTimestamp), "--rm", ctr, "oci-archive:"+out+":"+spec.ref); err != nil {
		return err
	}
	committed = true
	return nil
}
