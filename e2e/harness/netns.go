package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
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
	cmd := exec.Command("unshare", append([]string{"--net", "--", os.Args[0]}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), suiteNetworkEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// If `go test` kills this process (its -timeout), the child goes too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), false, nil
	}
	if err != nil {
		return 1, false, fmt.Errorf("unshare --net: %w", err)
	}
	return 0, false, nil
}
