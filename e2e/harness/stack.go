package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Env is one fleet: a hub and its workers, each worker with its own Kueue, ClusterQueue
// "worker-cq" and ResourceFlavor "default-flavor", and deploy/examples/worker-rbac applied
// (the identity credbroker's credentials carry there).
type Env struct {
	Peers        *Peers
	Kueue        KueuePeer
	Content      string // the image content (scripts/image-content.sh)
	TokenPlugin  string
	Hub          *Cluster
	Workers      []*Cluster
	WorkerKueues []*Kueue
	Dir          string
	// Rendered is what the hub's manager pod is made of: the overlay (EnvOptions.Overlay)
	// rendered over this Kueue's release manifests.
	Rendered []byte
	// HubIdentity is the manager pod's ServiceAccount on the hub, for Kueue and the broker.
	HubIdentity *ServiceAccountVolume
	release     []byte // the workers' Kueue release manifests, rendered
}

// EnvOptions: what one fleet runs. The framework gives it the peers, the image content and
// the token plugin (Framework.StartEnv).
type EnvOptions struct {
	// Kueue is the version of the Kueue peer every cluster of the fleet runs.
	Kueue string
	// Workers is how many worker clusters the fleet has.
	Workers int
	// Prefix is put before every cluster's name ("" for the suite's fleet); the fleet's
	// directory under the scratch directory is "fleet" followed by it.
	Prefix string
	// Overlay is the kustomization the hub's manager pod comes from: ShippedOverlay, or
	// CredentialsProvidersOverlay for Kueue v0.15–v0.18.
	Overlay string
}

const workerSetup = `apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default-flavor}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: worker-cq}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors:
    - name: default-flavor
      resources:
      - {name: cpu, nominalQuota: 100}
      - {name: memory, nominalQuota: 100Gi}
`

// startEnv starts the hub and the workers (in parallel), gives each Kueue its release
// manifests' ServiceAccount and RBAC, applies the worker RBAC on each worker, and starts a
// Kueue on each worker.
func startEnv(ctx context.Context, f *Framework, kueue KueuePeer, o EnvOptions) (*Env, error) {
	dir := f.Dir("fleet" + strings.TrimSuffix("-"+o.Prefix, "-"))
	e := &Env{Peers: f.Peers, Kueue: kueue, Content: f.Content, TokenPlugin: f.TokenPlugin, Dir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var err error
	if e.Rendered, err = RenderDeploy(kueue, dir, o.Overlay); err != nil {
		return nil, err
	}
	release, err := RenderKueueRelease(kueue)
	if err != nil {
		return nil, err
	}
	n := o.Workers
	e.Workers = make([]*Cluster, n)
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	wg.Add(n + 1)
	go func() {
		defer wg.Done()
		e.Hub, errs[n] = StartCluster(ctx, ClusterOptions{Name: o.Prefix + "hub", Peers: f.Peers, Kueue: kueue, Hub: true, Dir: filepath.Join(dir, o.Prefix+"hub")})
	}()
	for i := 0; i < n; i++ {
		go func(i int) {
			defer wg.Done()
			name := fmt.Sprintf("%sworker-%d", o.Prefix, i+1)
			e.Workers[i], errs[i] = StartCluster(ctx, ClusterOptions{Name: name, Peers: f.Peers, Kueue: kueue, Dir: filepath.Join(dir, name)})
		}(i)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			e.Stop()
			return nil, err
		}
	}
	fail := func(err error) (*Env, error) { e.Stop(); return nil, err }
	if err := e.Hub.InstallKueueRBAC(e.Rendered); err != nil {
		return fail(err)
	}
	if e.HubIdentity, err = e.Hub.ServiceAccountVolume(ctx, filepath.Join(dir, "hub-serviceaccount"), KueueNamespace, KueueServiceAccount); err != nil {
		return fail(err)
	}
	e.release = release
	for _, w := range e.Workers {
		k, err := e.setupWorker(ctx, w)
		if err != nil {
			return fail(err)
		}
		e.WorkerKueues = append(e.WorkerKueues, k)
	}
	return e, nil
}

// setupWorker makes w a worker of the fleet: deploy/examples/worker-rbac, Kueue's release
// RBAC and ServiceAccount, Kueue started with its release configuration (the host-process
// changes), its ClusterQueue and ResourceFlavor.
func (e *Env) setupWorker(ctx context.Context, w *Cluster) (*Kueue, error) {
	if err := w.ApplyWorkerRBAC(); err != nil {
		return nil, err
	}
	if err := w.InstallKueueRBAC(e.release); err != nil {
		return nil, err
	}
	id, err := w.ServiceAccountVolume(ctx, filepath.Join(e.Dir, w.Name, "serviceaccount"), KueueNamespace, KueueServiceAccount)
	if err != nil {
		return nil, err
	}
	cfg, err := KueueConfigOf(e.release)
	if err != nil {
		return nil, err
	}
	hp, _ := FreePort()
	mp, _ := FreePort()
	HostProcessOverrides(cfg, w, hp, mp)
	k, err := StartKueue(ctx, KueueOptions{Name: "kueue-" + w.Name, Peer: e.Kueue, Cluster: w, Config: cfg, Dir: filepath.Join(e.Dir, w.Name, "kueue"), Identity: id}, hp)
	if err != nil {
		return nil, err
	}
	if err := Apply(ctx, w.Client, workerSetup); err != nil {
		_ = k.Stop(DaemonStopGrace)
		return nil, fmt.Errorf("%s: %w", w.Name, err)
	}
	return k, nil
}

// ExtraWorker is a worker started for one scenario beside the fleet's (StartWorker).
type ExtraWorker struct {
	Cluster *Cluster
	Kueue   *Kueue
}

// Stop stops its Kueue, then its control plane.
func (w *ExtraWorker) Stop() {
	if w.Kueue != nil {
		_ = w.Kueue.Stop(DaemonStopGrace)
	}
	_ = w.Cluster.Stop()
}

// StartWorker starts one more worker of the fleet, set up as the fleet's are (setupWorker),
// whose kube-apiserver gets flags besides envtest's: a cloud-like worker's authentication.
func (e *Env) StartWorker(ctx context.Context, name string, flags map[string]string) (*ExtraWorker, error) {
	c, err := StartCluster(ctx, ClusterOptions{Name: name, Peers: e.Peers, Kueue: e.Kueue, Dir: filepath.Join(e.Dir, name), APIServerFlags: flags})
	if err != nil {
		return nil, err
	}
	w := &ExtraWorker{Cluster: c}
	if w.Kueue, err = e.setupWorker(ctx, c); err != nil {
		w.Stop()
		return nil, err
	}
	return w, nil
}

// KueueConfig is a fresh copy of the hub's Kueue configuration as rendered (before the
// host-process overrides).
func (e *Env) KueueConfig() (map[string]any, error) { return KueueConfigOf(e.Rendered) }

// Stop stops every process of the fleet.
func (e *Env) Stop() {
	for _, k := range e.WorkerKueues {
		_ = k.Stop(DaemonStopGrace)
	}
	for _, w := range e.Workers {
		_ = w.Stop()
	}
	if e.Hub != nil {
		_ = e.Hub.Stop()
	}
}

// Stack is what one scenario runs on the hub: credbroker (optional) and Kueue's manager,
// sharing the socket directory as the pod's emptyDir, and the objects the scenario creates.
type Stack struct {
	Env       *Env
	Broker    *Broker
	Kueue     *Kueue
	Dir       string
	SocketDir string // /var/run/credbroker
	TokenDir  string // /var/run/secrets/credbroker/clusters (the onprem file provider)
	RunDir    string // /var/run/e2e in the broker: tokens/ for the token plugin, runs.log
	KueueCfg  map[string]any
	kueueOpts KueueOptions
	hp        int
	created   []*unstructured.Unstructured
	forwards  []*Forwarder
}

// StackOptions: BrokerConfig nil runs no broker.
type StackOptions struct {
	BrokerConfig map[string]any
	BrokerEnv    []string
	// BrokerMounts are volumes only the broker's container mounts (a cloud identity's
	// projected token, a credential configuration, a CA bundle).
	BrokerMounts []Mount
	KueueConfig  map[string]any // before the host-process overrides
}

// StartStack starts the broker (if any) and then Kueue's manager on the hub.
func (e *Env) StartStack(ctx context.Context, dir string, o StackOptions) (*Stack, error) {
	s := &Stack{Env: e, Dir: dir, SocketDir: filepath.Join(dir, "socket"), TokenDir: filepath.Join(dir, "tokens"), RunDir: filepath.Join(dir, "run")}
	for _, d := range []string{s.SocketDir, s.TokenDir, filepath.Join(s.RunDir, "tokens")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{s.SocketDir, s.RunDir} {
		if err := os.Chown(d, 65532, 65532); err != nil {
			return nil, err
		}
	}
	var err error
	if o.BrokerConfig != nil {
		s.Broker, err = StartBroker(ctx, BrokerOptions{
			Content: e.Content, Config: o.BrokerConfig, SocketDir: s.SocketDir, TokenDir: s.TokenDir,
			Dir: filepath.Join(dir, "broker"), Env: o.BrokerEnv, Identity: e.HubIdentity,
			Mounts: append(append(e.secretreaderMount(), []Mount{
				{Src: e.TokenPlugin, Dst: "/opt/e2e/bin/tokenplugin"},
				{Src: s.RunDir, Dst: "/var/run/e2e", RW: true},
			}...), o.BrokerMounts...),
		})
		if err != nil {
			return nil, err
		}
	}
	s.KueueCfg = o.KueueConfig
	s.hp, _ = FreePort()
	mp, _ := FreePort()
	HostProcessOverrides(s.KueueCfg, e.Hub, s.hp, mp)
	s.kueueOpts = KueueOptions{
		Name: "kueue-hub", Peer: e.Kueue, Cluster: e.Hub, Config: s.KueueCfg, Dir: filepath.Join(dir, "kueue"), Identity: e.HubIdentity,
		Mounts: append(e.secretreaderMount(), []Mount{
			{Src: filepath.Join(e.Content, "plugins"), Dst: "/plugins"}, // the image volume, subPath plugins
			{Src: s.SocketDir, Dst: "/var/run/credbroker"},              // the socket emptyDir, read-only
		}...),
	}
	if err := s.StartKueue(ctx); err != nil {
		s.Stop(ctx)
		return nil, err
	}
	return s, nil
}

// StartKueue (re)starts the hub's Kueue manager with the stack's configuration.
func (s *Stack) StartKueue(ctx context.Context) error {
	k, err := StartKueue(ctx, s.kueueOpts, s.hp)
	if err != nil {
		return err
	}
	s.Kueue, s.hp = k, k.HealthPort
	return nil
}

func (e *Env) secretreaderMount() []Mount {
	if e.Peers.Secretreader == "" {
		return nil
	}
	if _, err := os.Stat(e.Peers.Secretreader); err != nil {
		return nil
	}
	return []Mount{{Src: e.Peers.Secretreader, Dst: "/opt/e2e/bin/secretreader"}}
}

// Stop deletes the scenario's hub objects (so the next scenario's Kueue does not connect
// to them), then stops Kueue and the broker.
func (s *Stack) Stop(ctx context.Context) {
	for i := len(s.created) - 1; i >= 0; i-- {
		_ = s.Env.Hub.Client.Delete(ctx, s.created[i])
	}
	if s.Kueue != nil {
		_ = s.Kueue.Stop(StopGrace)
	}
	if s.Broker != nil {
		_ = s.Broker.Stop(StopGrace)
	}
	for _, f := range s.forwards {
		f.Close()
	}
}

// Worker is one ClusterProfile the scenario creates: its name (also the MultiKueueCluster's),
// the access provider name, and the address it names.
type Worker struct {
	Name      string
	Provider  string
	Cluster   *Cluster
	Forward   *Forwarder // the address in the ClusterProfile (test-cut connections)
	Extension map[string]any
}

// Server is the https URL the ClusterProfile names.
func (w *Worker) Server() string { return "https://" + w.Forward.Addr }

// NewWorker makes the worker entry with its own forwarder to cluster.
func (s *Stack) NewWorker(name, provider string, c *Cluster, ext map[string]any) (*Worker, error) {
	f, err := StartForwarder(strings.TrimPrefix(c.Server, "https://"))
	if err != nil {
		return nil, err
	}
	s.forwards = append(s.forwards, f)
	return &Worker{Name: name, Provider: provider, Cluster: c, Forward: f, Extension: ext}, nil
}

// Setup creates, on the hub: the namespace, ClusterQueue, LocalQueue, AdmissionCheck and
// MultiKueueConfig of the set (the shape of deploy/examples/multikueue-setup), and on each
// worker cluster the namespace and a LocalQueue of the same name.
func (s *Stack) Setup(ctx context.Context, set string, workers []*Worker) error {
	var names []string
	for _, w := range workers {
		names = append(names, w.Name)
	}
	clusters, _ := json.Marshal(names)
	hub := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: MultiKueueConfig
metadata: {name: %[1]s}
spec:
  clusters: %[2]s
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: AdmissionCheck
metadata: {name: %[1]s}
spec:
  controllerName: kueue.x-k8s.io/multikueue
  parameters: {apiGroup: kueue.x-k8s.io, kind: MultiKueueConfig, name: %[1]s}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: %[1]s}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors:
    - name: default-flavor
      resources:
      - {name: cpu, nominalQuota: 9}
      - {name: memory, nominalQuota: 36Gi}
  admissionChecksStrategy:
    admissionChecks:
    - name: %[1]s
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {namespace: %[1]s, name: user-queue}
spec:
  clusterQueue: %[1]s
`, set, clusters)
	if _, err := Get(ctx, s.Env.Hub.Client, "kueue.x-k8s.io/v1beta2", "ResourceFlavor", "", "default-flavor"); err != nil {
		if err := Apply(ctx, s.Env.Hub.Client, "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: default-flavor}\n"); err != nil {
			return err
		}
	}
	if err := s.apply(ctx, s.Env.Hub.Client, hub, true); err != nil {
		return err
	}
	seen := map[*Cluster]bool{}
	for _, w := range workers {
		if seen[w.Cluster] {
			continue
		}
		seen[w.Cluster] = true
		worker := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {namespace: %[1]s, name: user-queue}
spec:
  clusterQueue: worker-cq
`, set)
		if err := s.apply(ctx, w.Cluster.Client, worker, false); err != nil {
			return fmt.Errorf("%s: %w", w.Cluster.Name, err)
		}
	}
	return nil
}

func (s *Stack) apply(ctx context.Context, c client.Client, text string, track bool) error {
	if err := Apply(ctx, c, text); err != nil {
		return err
	}
	if track {
		for _, doc := range strings.Split(text, "\n---\n") {
			obj := &unstructured.Unstructured{}
			if err := yamlToObj(doc, obj); err == nil && obj.GetKind() != "Namespace" && obj.GetKind() != "LocalQueue" && obj.GetKind() != "ClusterQueue" {
				s.created = append(s.created, obj)
			}
		}
	}
	return nil
}

// CreateProfiles creates each worker's ClusterProfile (status through the status subresource,
// in field: accessProviders, or credentialProviders for older Kueue) and its MultiKueueCluster,
// and returns when each was created.
func (s *Stack) CreateProfiles(ctx context.Context, field string, workers []*Worker) (map[string]time.Time, error) {
	created := map[string]time.Time{}
	for _, w := range workers {
		ext, _ := json.Marshal(w.Extension)
		extBlock := ""
		if w.Extension != nil {
			extBlock = fmt.Sprintf("\n        extensions:\n        - name: client.authentication.k8s.io/exec\n          extension: %s", ext)
		}
		text := fmt.Sprintf(`apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ClusterProfile
metadata: {name: %[1]s, namespace: kueue-system, labels: {x-k8s.io/cluster-manager: credbroker-e2e}}
spec:
  displayName: %[1]s
  clusterManager: {name: credbroker-e2e}
status:
  %[2]s:
    - name: %[3]s
      cluster:
        server: %[4]s
        certificate-authority-data: %[5]s%[6]s
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: MultiKueueCluster
metadata: {name: %[1]s}
spec:
  clusterSource:
    clusterProfileRef: {name: %[1]s}
`, w.Name, field, w.Provider, w.Server(), b64(w.Cluster.CAData), extBlock)
		created[w.Name] = time.Now()
		if err := s.apply(ctx, s.Env.Hub.Client, text, true); err != nil {
			return nil, err
		}
	}
	return created, nil
}

// ActiveCondition is the Active condition of a MultiKueueCluster.
func (s *Stack) ActiveCondition(ctx context.Context, name string) (status, reason, message string) {
	obj, err := Get(ctx, s.Env.Hub.Client, "kueue.x-k8s.io/v1beta2", "MultiKueueCluster", "", name)
	if err != nil {
		return "", "", err.Error()
	}
	return Condition(obj, "Active")
}

// SubmitJob creates a suspended batch/v1 Job in the set's LocalQueue.
func (s *Stack) SubmitJob(ctx context.Context, set, name string) error {
	return Apply(ctx, s.Env.Hub.Client, fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata:
  name: %[2]s
  namespace: %[1]s
  labels: {kueue.x-k8s.io/queue-name: user-queue}
spec:
  suspend: true
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: registry.example.com/e2e/sleep:1
        resources: {requests: {cpu: 100m, memory: 64Mi}}
`, set, name))
}

// Admission is what the hub's Workload of a Job says once MultiKueue placed it.
type Admission struct {
	Workload, ClusterName, CheckState, CheckMessage string
	At                                              time.Time
}

// Admission looks once at the hub's Workload of the Job: admitted once it has
// status.clusterName, its MultiKueue admission check Ready and Admitted=True; otherwise the
// error says what it shows.
func (s *Stack) Admission(ctx context.Context, set, job string) (*Admission, error) {
	wls, err := s.JobWorkloads(ctx, set, job)
	if err != nil {
		return nil, err
	}
	state := fmt.Sprintf("no Workload of Job %s/%s", set, job)
	for _, wl := range wls {
		var a Admission
		a.Workload = wl.GetName()
		a.ClusterName, _, _ = unstructured.NestedString(wl.Object, "status", "clusterName")
		checks, _, _ := unstructured.NestedSlice(wl.Object, "status", "admissionChecks")
		for _, c := range checks {
			m, _ := c.(map[string]any)
			if m["name"] == set {
				a.CheckState, _ = m["state"].(string)
				a.CheckMessage, _ = m["message"].(string)
			}
		}
		adm, _, _ := Condition(&wl, "Admitted")
		if a.ClusterName != "" && a.CheckState == "Ready" && adm == "True" {
			a.At = time.Now()
			return &a, nil
		}
		state = fmt.Sprintf("workload %s clusterName=%q check=%q (%s) Admitted=%q", a.Workload, a.ClusterName, a.CheckState, a.CheckMessage, adm)
	}
	return nil, fmt.Errorf("job %s/%s not admitted on a worker: %s", set, job, state)
}

// JobWorkloads are the hub's Workloads in namespace set owned by Job job.
func (s *Stack) JobWorkloads(ctx context.Context, set, job string) ([]unstructured.Unstructured, error) {
	wls, err := List(ctx, s.Env.Hub.Client, "kueue.x-k8s.io/v1beta2", "Workload", set)
	if err != nil {
		return nil, err
	}
	var owned []unstructured.Unstructured
	for _, wl := range wls {
		for _, o := range wl.GetOwnerReferences() {
			if o.Kind == "Job" && o.Name == job {
				owned = append(owned, wl)
				break
			}
		}
	}
	return owned, nil
}

// WorkerHasWorkload checks the worker cluster holds the Workload copy.
func WorkerHasWorkload(ctx context.Context, c *Cluster, ns, name string) error {
	_, err := Get(ctx, c.Client, "kueue.x-k8s.io/v1beta2", "Workload", ns, name)
	return err
}
