package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// The node: one kubelet with containerd, Debian's runc and the CNI bridge, joined to a hub
// that runs kube-controller-manager, kube-scheduler and kube-proxy beside it, all in the
// suite's network namespace (RunInSuiteNetwork). Everything it creates lives under its Dir
// (containerd's root and state, the kubelet's root, pod logs, the CNI range's leases, the
// pods' network namespaces) or is undone by Stop: the cgroups under its own cgroup root,
// the kernel settings the kubelet changes, the mounts its pods leave.
const (
	// NodeName is the node's name (its kubelet's identity is system:node:NodeName).
	NodeName = "e2e-node"
	// runcPath is Debian's runc (scripts/test.sh installs it).
	runcPath = "/usr/sbin/runc"
	// cniBinDir holds Debian's CNI plugins (containernetworking-plugins).
	cniBinDir = "/usr/lib/cni"
	// shimSocketRoot is where containerd's shims put their sockets, a fixed path (containerd's
	// defaults.DefaultStateDir) whatever the configured state directory.
	shimSocketRoot = "/run/containerd"
)

// kernelTunables are the settings the kubelet writes at start
// (pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables): global, not per network
// namespace, so Stop puts back what the host had.
var kernelTunables = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// NodeOptions say what the node runs and where it pulls from.
type NodeOptions struct {
	Dir      string
	Peers    *Peers
	Hub      *Cluster // started with ClusterOptions.Node
	Registry string   // host:port of the registry the node pulls from (plain HTTP, loopback)
	Pause    string   // the sandbox image, a reference in Registry
}

// Node is a running node.
type Node struct {
	o          NodeOptions
	Containerd *Daemon
	Kubelet    *Daemon
	Proxy      *Daemon
	Controller *Daemon // kube-controller-manager
	Scheduler  *Daemon
	// CRISocket is containerd's socket (the CRI the kubelet speaks).
	CRISocket string

	cgroupRoot string
	cgroupDirs []string // created by Start, removed by Stop
	host       *HostState
}

// StartNode starts containerd, the control plane's controllers, kube-proxy and the kubelet,
// and waits for the node to be Ready.
func StartNode(ctx context.Context, o NodeOptions) (n *Node, err error) {
	n = &Node{o: o, CRISocket: filepath.Join(o.Dir, "containerd", "containerd.sock")}
	defer func() {
		if err != nil {
			n.Stop()
			n = nil
		}
	}()
	if n.host, err = SaveHost(); err != nil {
		return nil, err
	}
	for _, d := range []string{"containerd", "kubelet", "pod-logs", "cni/net.d", "cni/ipam", "kubeconfigs"} {
		if err := os.MkdirAll(filepath.Join(o.Dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := n.makeCgroupRoot(); err != nil {
		return nil, err
	}
	kubeconfigs := map[string]string{}
	for name, user := range map[string]envtest.User{
		"kubelet":                 {Name: "system:node:" + NodeName, Groups: []string{"system:nodes"}},
		"kube-controller-manager": {Name: "system:kube-controller-manager"},
		"kube-scheduler":          {Name: "system:kube-scheduler"},
		"kube-proxy":              {Name: "system:kube-proxy"},
	} {
		if kubeconfigs[name], err = n.kubeconfig(name, user); err != nil {
			return nil, err
		}
	}
	caFile := filepath.Join(o.Dir, "kubeconfigs", "hub-ca.crt")
	if err := os.WriteFile(caFile, o.Hub.CAData, 0o644); err != nil {
		return nil, err
	}

	if err := n.startContainerd(ctx); err != nil {
		return nil, err
	}
	port := func() string { p, _ := FreePort(); return strconv.Itoa(p) }
	n.Controller = &Daemon{Name: "kube-controller-manager", Log: filepath.Join(o.Dir, "kube-controller-manager.log"), Argv: []string{
		o.Peers.KubeControllerManager, "--kubeconfig=" + kubeconfigs["kube-controller-manager"],
		"--authentication-kubeconfig=" + kubeconfigs["kube-controller-manager"],
		"--authorization-kubeconfig=" + kubeconfigs["kube-controller-manager"],
		"--use-service-account-credentials=true", "--leader-elect=false",
		"--root-ca-file=" + caFile, "--service-cluster-ip-range=" + ServiceCIDR,
		"--bind-address=127.0.0.1", "--secure-port=" + port(), "--v=1",
	}}
	n.Scheduler = &Daemon{Name: "kube-scheduler", Log: filepath.Join(o.Dir, "kube-scheduler.log"), Argv: []string{
		o.Peers.KubeScheduler, "--kubeconfig=" + kubeconfigs["kube-scheduler"],
		"--authentication-kubeconfig=" + kubeconfigs["kube-scheduler"],
		"--authorization-kubeconfig=" + kubeconfigs["kube-scheduler"],
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=" + port(), "--v=1",
	}}
	proxyConfig := filepath.Join(o.Dir, "kube-proxy.yaml")
	if err := os.WriteFile(proxyConfig, []byte(fmt.Sprintf(kubeProxyConfig,
		kubeconfigs["kube-proxy"], PodCIDR, NodeName, port(), port())), 0o644); err != nil {
		return nil, err
	}
	n.Proxy = &Daemon{Name: "kube-proxy", Log: filepath.Join(o.Dir, "kube-proxy.log"), Argv: []string{
		o.Peers.KubeProxy, "--config=" + proxyConfig, "--v=1",
	}}
	kubeletConfig := filepath.Join(o.Dir, "kubelet.yaml")
	resolv := filepath.Join(o.Dir, "resolv.conf")
	if err := os.WriteFile(resolv, nil, 0o644); err != nil { // no DNS: nothing here needs a name
		return nil, err
	}
	if err := os.WriteFile(kubeletConfig, []byte(fmt.Sprintf(kubeletConfigTemplate,
		caFile, port(), n.CRISocket, filepath.Join(o.Dir, "pod-logs"), n.cgroupRoot, resolv)), 0o644); err != nil {
		return nil, err
	}
	n.Kubelet = &Daemon{Name: "kubelet", Log: filepath.Join(o.Dir, "kubelet.log"), Argv: []string{
		o.Peers.Kubelet, "--config=" + kubeletConfig, "--kubeconfig=" + kubeconfigs["kubelet"],
		"--root-dir=" + filepath.Join(o.Dir, "kubelet"), "--hostname-override=" + NodeName,
		"--node-ip=" + NodeIP, "--v=1",
	}}
	for _, d := range []*Daemon{n.Controller, n.Scheduler, n.Proxy, n.Kubelet} {
		if err := d.Start(); err != nil {
			return nil, err
		}
	}
	if err := Eventually(ctx, NodeStartTimeout, Interval, func() error {
		for _, d := range []*Daemon{n.Containerd, n.Controller, n.Scheduler, n.Proxy, n.Kubelet} {
			if !d.Running() {
				return StopTrying(fmt.Errorf("%s exited:\n%s", d.Name, Tail(d.LogText(), 30)))
			}
		}
		var node corev1.Node
		if err := o.Hub.Client.Get(ctx, client.ObjectKey{Name: NodeName}, &node); err != nil {
			return err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("node %s: Ready=%s %s: %s", NodeName, c.Status, c.Reason, c.Message)
			}
		}
		return fmt.Errorf("node %s: no Ready condition yet", NodeName)
	}); err != nil {
		return nil, fmt.Errorf("node: %w\nkubelet log:\n%s", err, Tail(n.Kubelet.LogText(), 30))
	}
	return n, nil
}

// kubeconfig writes a kubeconfig of the hub for one of the node's identities (a client
// certificate of the hub's CA, as kubeadm issues them).
func (n *Node) kubeconfig(name string, user envtest.User) (string, error) {
	u, err := n.o.Hub.Env.AddUser(user, nil)
	if err != nil {
		return "", fmt.Errorf("%s's identity: %w", name, err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(n.o.Dir, "kubeconfigs", name+".kubeconfig")
	return path, os.WriteFile(path, kc, 0o600)
}

// containerd's configuration (version 3, containerd 2.x; `containerd config default` lists
// every key). Beyond the paths of the node's own (sockets, root, state, /opt, NRI off, so
// that nothing lands in the host's /run/containerd, /opt/containerd or /var/run/nri):
//   - restrict_oom_score_adj: this machine's root lacks CAP_SYS_RESOURCE, and runc's attempt
//     to lower a sandbox's oom_score_adj fails every pod ("can't get final child's PID from
//     pipe: EOF"); restricted, it never lowers it.
//   - SystemdCgroup false: no systemd here; the kubelet's cgroupDriver is cgroupfs too.
//   - netns_mounts_under_state_dir: the pods' network namespaces under the node's state
//     directory, not /run/netns.
//   - the registry on loopback over plain HTTP (certs.d/HOST/hosts.toml, for the CRI's pulls
//     and the transfer service's), the sandbox image from it.
const containerdConfig = `version = 3
root = %[1]q
state = %[2]q

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = %[3]q
  [plugins.'io.containerd.server.v1.ttrpc']
    address = %[4]q
  [plugins.'io.containerd.internal.v1.opt']
    path = %[11]q
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.transfer.v1.local']
    config_path = %[6]q

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = %[5]q
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = %[6]q

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = %[7]q
          Root = %[8]q
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%[9]q]
      conf_dir = %[10]q

  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
`

// The pods' network: a bridge whose .1 is their gateway, leases kept under the node's Dir.
const cniConfig = `{
  "cniVersion": "1.0.0",
  "name": "e2e",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// kube-proxy in iptables mode, in the suite's network namespace: pods reach the `kubernetes`
// Service (in-cluster configuration) through it. conntrack maxPerCore 0 and the zero
// timeouts leave the host's conntrack settings alone.
const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
mode: iptables
clusterCIDR: %s
hostnameOverride: %s
healthzBindAddress: 127.0.0.1:%s
metricsBindAddress: 127.0.0.1:%s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`

// The kubelet's configuration. What this machine needs, and why:
//   - failCgroupV1 false: the host has cgroup v1 (hybrid); kubelets of 1.35+ refuse it unless
//     told (KEP-5573). cgroupDriver cgroupfs: no systemd. cgroupRoot: the node's own
//     hierarchy, removed at the end.
//   - failSwapOn false, makeIPTablesUtilChains false (kube-proxy owns the rules),
//     localStorageCapacityIsolation false and no eviction thresholds: the suite's disk is
//     the host's, and a full disk must fail a test, not evict Kueue.
//   - The kubelet's API on loopback, client certificates of the hub's CA only.
//   - syncFrequency 10s (default 1m): Kueue's certificate controller writes its webhook
//     certificate into a Secret the pod mounts, and Kueue waits until the kubelet's next
//     sync of the pod puts the files in place; a shorter wait, nothing else.
const kubeletConfigTemplate = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %s}
authorization: {mode: AlwaysAllow}
address: 127.0.0.1
port: %s
readOnlyPort: 0
healthzPort: 0
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
cgroupDriver: cgroupfs
cgroupRoot: %s
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
localStorageCapacityIsolation: false
evictionHard: {memory.available: "0%%", nodefs.available: "0%%", imagefs.available: "0%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: %s
registerNode: true
serializeImagePulls: false
syncFrequency: 10s
`

func (n *Node) startContainerd(ctx context.Context) error {
	o := n.o
	dir := filepath.Join(o.Dir, "containerd")
	certs := filepath.Join(dir, "certs.d")
	hostDir := filepath.Join(certs, o.Registry)
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		return err
	}
	hosts := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+o.Registry, "http://"+o.Registry)
	if err := os.WriteFile(filepath.Join(hostDir, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		return err
	}
	cni := filepath.Join(o.Dir, "cni", "net.d", "10-e2e.conflist")
	if err := os.WriteFile(cni, []byte(fmt.Sprintf(cniConfig, PodCIDR, filepath.Join(o.Dir, "cni", "ipam"))), 0o644); err != nil {
		return err
	}
	config := filepath.Join(dir, "config.toml")
	text := fmt.Sprintf(containerdConfig, filepath.Join(dir, "root"), filepath.Join(dir, "state"), n.CRISocket,
		filepath.Join(dir, "ttrpc.sock"), o.Pause, certs, runcPath, filepath.Join(dir, "runc"), cniBinDir, filepath.Dir(cni),
		filepath.Join(dir, "opt"))
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		return err
	}
	n.Containerd = &Daemon{Name: "containerd", Log: filepath.Join(o.Dir, "containerd.log"),
		Argv: []string{o.Peers.Containerd, "--config", config, "--log-level", "info"},
		// The shim is found on PATH, beside containerd.
		Env: []string{"PATH=" + filepath.Dir(o.Peers.ContainerdShim) + ":" + os.Getenv("PATH")}}
	if err := n.Containerd.Start(); err != nil {
		return err
	}
	return Eventually(ctx, ContainerdSocketTimeout, FastInterval, func() error {
		if !n.Containerd.Running() {
			return StopTrying(fmt.Errorf("containerd exited:\n%s", Tail(n.Containerd.LogText(), 30)))
		}
		_, err := os.Stat(n.CRISocket)
		return err
	})
}

// HostState is what a node changes on the host outside its directory, as it was before:
// the kernel settings the kubelet writes, the entries of /var/log/containers (the kubelet's
// fixed directory of log links) and whether /run/containerd (containerd's fixed directory of
// shim sockets) existed. Restore puts it back.
type HostState struct {
	tunables   map[string]string
	logLinks   map[string]bool
	madeLogDir bool
	madeRunDir bool
}

// SaveHost records the host's state.
func SaveHost() (*HostState, error) {
	h := &HostState{tunables: map[string]string{}, logLinks: map[string]bool{}}
	for _, t := range kernelTunables {
		b, err := os.ReadFile(filepath.Join("/proc/sys", t))
		if err != nil {
			continue // not on this kernel: the kubelet skips it too
		}
		h.tunables[t] = strings.TrimSpace(string(b))
	}
	if _, err := os.Stat(shimSocketRoot); os.IsNotExist(err) {
		h.madeRunDir = true
	}
	entries, err := os.ReadDir("/var/log/containers")
	if os.IsNotExist(err) {
		h.madeLogDir = true
		return h, nil
	}
	for _, e := range entries {
		h.logLinks[e.Name()] = true
	}
	return h, err
}

// Restore puts the recorded state back.
func (h *HostState) Restore() {
	if h == nil {
		return
	}
	if h.madeRunDir {
		_ = os.RemoveAll(shimSocketRoot)
	}
	for t, v := range h.tunables {
		_ = os.WriteFile(filepath.Join("/proc/sys", t), []byte(v), 0o644)
	}
	if entries, err := os.ReadDir("/var/log/containers"); err == nil {
		for _, e := range entries {
			if !h.logLinks[e.Name()] {
				_ = os.Remove(filepath.Join("/var/log/containers", e.Name()))
			}
		}
		if h.madeLogDir {
			_ = os.Remove("/var/log/containers")
		}
	}
}

// nodeCgroupRoot is the node's cgroup root for the suite process pid.
func nodeCgroupRoot(pid int) string { return fmt.Sprintf("/credbroker-e2e-node-%d", pid) }

// makeCgroupRoot creates the node's cgroup root in every hierarchy (the kubelet checks it
// exists in each one it uses): /credbroker-e2e-node-PID.
func (n *Node) makeCgroupRoot() error {
	n.cgroupRoot = nodeCgroupRoot(os.Getpid())
	hierarchies, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range hierarchies {
		d := filepath.Join(h, n.cgroupRoot)
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("cgroup root: %w", err)
		}
		n.cgroupDirs = append(n.cgroupDirs, d)
	}
	return nil
}

// cgroupHierarchies lists the mount points of the host's cgroup hierarchies (v1 and v2).
func cgroupHierarchies() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) && (fields[i+1] == "cgroup" || fields[i+1] == "cgroup2") {
				out = append(out, fields[4])
			}
		}
	}
	return out, sc.Err()
}

// Stop stops every daemon, removes every pod sandbox (containerd tears down its network),
// unmounts what the pods left under Dir, removes the node's cgroups and log links, and puts
// the kernel settings back. Safe on a node that failed to start.
func (n *Node) Stop() {
	for _, d := range []*Daemon{n.Scheduler, n.Controller, n.Kubelet} {
		if d != nil {
			_ = d.Stop(DaemonStopGrace)
		}
	}
	if n.Containerd != nil && n.Containerd.Running() {
		n.removeSandboxes()
	}
	if n.Containerd != nil {
		_ = n.Containerd.Stop(DaemonStopGrace)
	}
	if n.Proxy != nil {
		_ = n.Proxy.Stop(QuickStopGrace)
	}
	n.killShims()
	unmountUnder(n.o.Dir)
	for i := len(n.cgroupDirs) - 1; i >= 0; i-- {
		removeCgroupTree(n.cgroupDirs[i])
	}
	n.host.Restore()
}

// removeSandboxes stops and removes every pod sandbox through the CRI, as the kubelet does
// when it deletes a pod: containerd stops the containers, runs the CNI plugins' DEL and
// removes the network namespace.
func (n *Node) removeSandboxes() {
	ctx, cancel := context.WithTimeout(context.Background(), SandboxRemovalTimeout)
	defer cancel()
	rt, done, err := n.runtimeClient()
	if err != nil {
		return
	}
	defer done()
	list, err := rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return
	}
	for _, s := range list.Items {
		_, _ = rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: s.Id})
		_, _ = rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: s.Id})
	}
}

// killShims kills any containerd shim of this node left running (a shim leaves its parent's
// process group: it outlives containerd by design).
func (n *Node) killShims() {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		exe, err := os.Readlink(filepath.Join(p, "exe"))
		if err != nil || exe != n.o.Peers.ContainerdShim {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(p)); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// unmountUnder detaches every mount point under dir, deepest first (the pods' volumes, the
// containers' root filesystems, the network namespaces' bind mounts).
func unmountUnder(dir string) {
	if dir == "" {
		return
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, unescapeMount(f[4]))
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	out, err := strconv.Unquote(`"` + strings.ReplaceAll(s, `"`, `\"`) + `"`)
	if err != nil {
		return s
	}
	return out
}

// killCgroupTree kills every process in a cgroup and its children, a few rounds (a process
// may fork while the first round runs).
func killCgroupTree(root string) {
	for round := 0; round < 10; round++ {
		found := 0
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
					found++
				}
			}
			return nil
		})
		if found == 0 {
			return
		}
		time.Sleep(killRoundInterval)
	}
}

// removeCgroupTree removes a cgroup directory and its children, deepest first (a cgroup is
// removed with rmdir once empty of processes).
func removeCgroupTree(root string) {
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = syscall.Rmdir(dirs[i])
	}
}

// runtimeClient is a CRI client of the node's containerd (what the kubelet speaks).
func (n *Node) runtimeClient() (cri.RuntimeServiceClient, func(), error) {
	conn, err := grpc.NewClient("unix://"+n.CRISocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return cri.NewRuntimeServiceClient(conn), func() { conn.Close() }, nil
}

// ContainerPid is the host pid of the running container name in the pod podName (from the
// runtime's verbose status), for a scenario that kills it as a crash would.
func (n *Node) ContainerPid(ctx context.Context, podName, name string) (int, error) {
	rt, done, err := n.runtimeClient()
	if err != nil {
		return 0, err
	}
	defer done()
	list, err := rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{
		State:         &cri.ContainerStateValue{State: cri.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{"io.kubernetes.pod.name": podName, "io.kubernetes.container.name": name},
	}})
	if err != nil {
		return 0, err
	}
	if len(list.Containers) != 1 {
		return 0, fmt.Errorf("pod %s: %d running containers named %s", podName, len(list.Containers), name)
	}
	st, err := rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: list.Containers[0].Id, Verbose: true})
	if err != nil {
		return 0, err
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.Pid == 0 {
		return 0, fmt.Errorf("container %s of %s: no pid in the runtime's status (%v)", name, podName, err)
	}
	return info.Pid, nil
}

// KubeletDir is the kubelet's --root-dir (pods/UID/volumes/... hold the pods' volumes).
func (n *Node) KubeletDir() string { return filepath.Join(n.o.Dir, "kubelet") }

// Ctr runs containerd's ctr against the node's containerd (namespace k8s.io, the CRI's).
func (n *Node) Ctr(args ...string) ([]byte, error) {
	cmd := exec.Command(n.o.Peers.Ctr, append([]string{"--address", n.CRISocket, "--namespace", "k8s.io"}, args...)...)
	return cmd.CombinedOutput()
}
