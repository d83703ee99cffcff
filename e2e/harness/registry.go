package harness

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"syscall"
	"time"
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

	cmd  *exec.Cmd
	done chan struct{}
}

// Bounds of the registry's lifecycle. crane starts in milliseconds; the wait covers a loaded
// machine. Its shutdown is an http.Server.Shutdown with nothing in flight.
const (
	registryStartTimeout = 30 * time.Second
	registryStopGrace    = 5 * time.Second
)

// servingOn is crane's start-up line (cmd/crane/cmd/serve.go: `serving on port %s`), which
// names the port it bound: the registry binds port 0 itself, so no other process can take a
// port between our choosing it and crane binding it.
var servingOn = regexp.MustCompile(`serving on port ([0-9]+)`)

// StartRegistry starts `crane registry serve` on 127.0.0.1 with its blobs in dir/blobs and
// its log in dir/registry.log, and returns once `GET /v2/` answers 200.
//
// It runs in the network namespace of the calling thread: a caller that has locked its
// goroutine to a thread in a namespace of its own (setns) gets the registry there, as it gets
// the processes it starts itself. That namespace's loopback must be up.
func StartRegistry(ctx context.Context, dir string, crane string) (*Registry, error) {
	if crane == "" {
		return nil, fmt.Errorf("registry: no crane binary (peers.env has no CRANE=: run e2e/peers.sh)")
	}
	blobs := filepath.Join(dir, "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return nil, err
	}
	r := &Registry{Log: filepath.Join(dir, "registry.log")}
	logf, err := os.OpenFile(r.Log, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(crane, "registry", "serve", "--address", "127.0.0.1:0", "--disk", blobs)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, killed with the thread that started it (see root.go's Start).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	netns, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		logf.Close()
		return nil, err
	}
	started := make(chan error, 1)
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		defer logf.Close()
		defer netns.Close()
		// Pdeathsig fires when the forking thread exits, so fork from a thread that lives as
		// long as the registry, in the caller's network namespace.
		runtime.LockOSThread()
		if err := sameNetns(netns); err != nil {
			// The thread stays locked: it exits with this goroutine, and its namespace with it.
			started <- fmt.Errorf("registry: entering the caller's network namespace: %w", err)
			return
		}
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("registry: %w", err)
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	r.cmd = cmd
	err = Poll(ctx, registryStartTimeout, 50*time.Millisecond, func() (bool, error) {
		select {
		case <-r.done:
			return false, Fatal(fmt.Errorf("crane registry serve exited: %s", Tail(r.LogText(), 10)))
		default:
		}
		if r.Addr == "" {
			m := servingOn.FindStringSubmatch(r.LogText())
			if m == nil {
				return false, nil
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

// sameNetns puts the current (locked) thread into the network namespace fd names, unless it is
// there already.
func sameNetns(fd *os.File) error {
	want, err := fd.Stat()
	if err != nil {
		return err
	}
	have, err := os.Stat("/proc/thread-self/ns/net")
	if err != nil {
		return err
	}
	if os.SameFile(want, have) {
		return nil
	}
	if runtime.GOARCH != "amd64" {
		return fmt.Errorf("setns: the number of the system call is known here for amd64 only, not %s", runtime.GOARCH)
	}
	if _, _, errno := syscall.RawSyscall(sysSetnsAMD64, fd.Fd(), syscall.CLONE_NEWNET, 0); errno != 0 {
		return errno
	}
	return nil
}

// sysSetnsAMD64 is setns(2)'s number on linux/amd64 (arch/x86/entry/syscalls/syscall_64.tbl),
// which the syscall package does not name; golang.org/x/sys/unix would, at the cost of a
// direct requirement of this module for one call.
const sysSetnsAMD64 = 308

// probeV2 asks GET /v2/ (the distribution API's version check) on the calling goroutine's
// thread (an http.Client dials from goroutines of its own, whose threads may be in another
// network namespace than a caller's locked one).
func probeV2(addr string) (bool, error) {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET /v2/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", addr); err != nil {
		return false, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return false, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("GET http://%s/v2/: %s", addr, resp.Status)
	}
	return true, nil
}

// LogText is the registry's log so far.
func (r *Registry) LogText() string {
	b, _ := os.ReadFile(r.Log)
	return string(b)
}

// Stop ends the registry: SIGTERM to its process group, then SIGKILL after
// registryStopGrace. It returns once the process is reaped; calling it again does nothing.
func (r *Registry) Stop() {
	if r == nil || r.cmd == nil || r.cmd.Process == nil {
		return
	}
	select {
	case <-r.done:
		return // stopped already: its process group id may be another's by now
	default:
	}
	pgid := r.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(registryStopGrace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-r.done
	}
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
