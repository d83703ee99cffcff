package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// The suite's network: the whole test binary runs in a network namespace of its own, made by
// RunInSuiteNetwork. Its loopback carries what the process scenarios always used; NodeIP,
// on that loopback too, is the node's address: every API server, every relay in front of a
// worker, the kubelet and the registry's clients meet there, and the node's pods reach it
// through their bridge (PodCIDR's gateway). The namespace has no other interface and no
// route out, so no packet of the suite can leave it; it disappears with the process.
const (
	// NodeIP is the node's address (10.99.0.0/24 is in no range the suite uses otherwise:
	// not the Service range envtest gives kube-apiserver, 10.0.0.0/24, nor PodCIDR).
	NodeIP = "10.99.0.1"
	// PodCIDR is the node's pod range (the CNI bridge's host-local range; its .1 is the
	// bridge, the pods' gateway).
	PodCIDR = "10.244.0.0/24"
	// ServiceCIDR is envtest's --service-cluster-ip-range: the `kubernetes` Service is its .1.
	ServiceCIDR = "10.0.0.0/24"

	suiteNetworkEnv = "CREDBROKER_E2E_SUITE_NETNS"
)

// RunInSuiteNetwork runs this test binary again, with the same arguments, in a new network
// namespace, and returns its exit code with inChild false; in that child it sets the
// namespace up (loopback up, NodeIP on it) and returns inChild true, so that TestMain goes on.
func RunInSuiteNetwork() (code int, inChild bool, err error) {
	if os.Getenv(suiteNetworkEnv) == "1" {
		for _, args := range [][]string{
			{"link", "set", "lo", "up"},
			{"addr", "add", NodeIP + "/32", "dev", "lo"},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				return 1, true, fmt.Errorf("the suite's network namespace: ip %v: %w: %s", args, err, out)
			}
		}
		return 0, true, nil
	}
	if os.Geteuid() != 0 {
		return 1, false, errors.New("the e2e suite needs root (network, mount namespaces, chroot, the node)")
	}
	// The parent owns the scratch directory and the host's state: if the child dies without
	// its own cleanup (go test's -timeout panics, a kill), sweep() still leaves nothing.
	scratch, err := os.MkdirTemp("", "credbroker-e2e-")
	if err != nil {
		return 1, false, err
	}
	_ = os.Chmod(scratch, 0o755)
	host, err := SaveHost()
	if err != nil {
		return 1, false, err
	}
	cmd := exec.Command("unshare", append([]string{"--net", "--", os.Args[0]}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), suiteNetworkEnv+"=1", ScratchEnv+"="+scratch)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// If `go test` kills this process, the child goes too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return 1, false, fmt.Errorf("unshare --net: %w", err)
	}
	netns := childNetns(cmd.Process.Pid)
	err = cmd.Wait()
	sweep(cmd.Process.Pid, netns, scratch)
	host.Restore()
	if os.Getenv("CREDBROKER_E2E_KEEP") == "" {
		_ = os.RemoveAll(scratch)
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), false, nil
	}
	if err != nil {
		return 1, false, fmt.Errorf("unshare --net: %w", err)
	}
	return 0, false, nil
}

// ScratchEnv names the scratch directory the parent made for the child (TestMain's).
const ScratchEnv = "CREDBROKER_E2E_SCRATCH"

// childNetns is the network namespace of the child once unshare has made it ("" if the
// child is gone first).
func childNetns(pid int) string {
	own, _ := os.Readlink("/proc/self/ns/net")
	for i := 0; i < netnsWaitRounds; i++ {
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			return ""
		}
		if ns != own {
			return ns
		}
		time.Sleep(netnsPollInterval)
	}
	return ""
}

// sweep removes what a child that died without cleaning up leaves (a clean run leaves
// nothing, and this finds nothing): every process in the suite's network namespace (the
// API servers, Kueues, brokers, containerd and its shims, the kubelet), every process in the
// node's cgroups (the pods' containers) and those cgroups, every mount under scratch.
func sweep(pid int, netns, scratch string) {
	for round := 0; round < 20 && netns != ""; round++ {
		procs, _ := filepath.Glob("/proc/[0-9]*")
		found := 0
		for _, p := range procs {
			if ns, err := os.Readlink(filepath.Join(p, "ns", "net")); err == nil && ns == netns {
				if n, err := strconv.Atoi(filepath.Base(p)); err == nil {
					_ = syscall.Kill(n, syscall.SIGKILL)
					found++
				}
			}
		}
		if found == 0 {
			break
		}
		time.Sleep(killRoundInterval)
	}
	if hierarchies, err := cgroupHierarchies(); err == nil {
		for _, h := range hierarchies {
			root := filepath.Join(h, nodeCgroupRoot(pid))
			if _, err := os.Stat(root); err != nil {
				continue
			}
			killCgroupTree(root)
			removeCgroupTree(root)
		}
	}
	unmountUnder(scratch)
}
