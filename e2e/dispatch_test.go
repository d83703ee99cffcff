package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"credbroker.dev/e2e/harness"
)

// expectDispatch creates the ClusterProfiles and MultiKueueClusters of workers and asserts
// that they turn Active and that a Job submitted then is admitted on one of them, whose API
// server holds the Workload's copy. It returns the seconds from ClusterProfile created to
// MultiKueueCluster Active, per worker.
func expectDispatch(t *testing.T, s *harness.Stack, set, field string, workers []*harness.Worker) map[string]float64 {
	t.Helper()
	return expectDispatchVia(t, s, set, field, workers, workers)
}

// expectDispatchVia is expectDispatch with only queued (some of workers) in the set's
// MultiKueueConfig: profiles that all address one API server (the cloud scenarios' fan-out)
// would each get a copy of the Workload, the same object, and the copies Kueue deletes on the
// workers not chosen would delete the chosen one's.
func expectDispatchVia(t *testing.T, s *harness.Stack, set, field string, workers, queued []*harness.Worker) map[string]float64 {
	t.Helper()
	ctx := context.Background()
	if err := s.Setup(ctx, set, queued); err != nil {
		t.Fatal(err)
	}
	created, err := s.CreateProfiles(ctx, field, workers)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, w := range workers {
		names = append(names, w.Name)
	}
	active := expectClustersActive(t, s, harness.Timeout, names...)
	secs := map[string]float64{}
	for _, n := range names {
		secs[n] = active[n].Sub(created[n]).Seconds()
		st, reason, msg := s.ActiveCondition(ctx, n)
		t.Logf("%s: ClusterProfile created -> MultiKueueCluster Active in %.2fs (Active=%s reason=%s message=%q)", n, secs[n], st, reason, msg)
	}
	job := set + "-job"
	submitted := time.Now()
	if err := s.SubmitJob(ctx, set, job); err != nil {
		t.Fatal(err)
	}
	a := expectJobAdmitted(t, s, set, job, harness.Timeout)
	var on *harness.Cluster
	for _, w := range workers {
		if w.Name == a.ClusterName {
			on = w.Cluster
		}
	}
	if on == nil {
		t.Fatalf("workload %s placed on %q, not one of this scenario's clusters", a.Workload, a.ClusterName)
	}
	if err := harness.WorkerHasWorkload(ctx, on, set, a.Workload); err != nil {
		t.Fatalf("worker %s has no copy of workload %s: %v", on.Name, a.Workload, err)
	}
	t.Logf("job %s/%s: workload %s admitted on %s in %.2fs (admission check %s: %q)", set, job, a.Workload, a.ClusterName, a.At.Sub(submitted).Seconds(), a.CheckState, a.CheckMessage)
	return secs
}

// TestDispatchFile: the deploy/ config as shipped: the onprem access provider runs the shim,
// the broker's onprem provider is the file type reading /var/run/secrets/credbroker/clusters/{clusterName}.
func TestDispatchFile(t *testing.T) {
	ctx := context.Background()
	s := startStack(t, fw.Fleet, harness.StackOptions{BrokerConfig: brokerConfig(t), KueueConfig: kueueConfig(t)})
	var workers []*harness.Worker
	var tokens []string
	for i, c := range fw.Fleet.Workers {
		name := fmt.Sprintf("file-%d", i+1)
		tok := workerToken(t, c)
		tokens = append(tokens, tok)
		writeFile(t, filepath.Join(s.TokenDir, name), tok+"\n")
		w, err := s.NewWorker(name, "onprem", c, map[string]any{"clusterName": name})
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
	}
	expectDispatch(t, s, "file", "accessProviders", workers)
	c, err := s.Broker.CountsFor("onprem")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("broker onprem: %v GetToken calls (%v OK), %v upstream fetches, %v re-asks (%v confirmed rejections)", c.Requests, c.OK, c.Fetches, c.Reasks, c.Rejected)
	if c.Fetches != float64(len(workers)) {
		t.Errorf("upstream fetches = %v, want %d (one per cluster)", c.Fetches, len(workers))
	}
	noTokenIn(t, "the broker log", s.Broker.LogText(), tokens...)
	_ = ctx
}

// execProvider is README's `onprem` exec provider, wrapping the suite's token plugin (the
// upstream: it prints the token kept for the cluster and logs each run).
const execProvider = `
name: onprem
type: exec
exec:
  command: /opt/e2e/bin/tokenplugin
  args: [/var/run/e2e/tokens, /var/run/e2e/runs.log]
  timeout: 30s
`

// pluginRuns counts the token plugin's runs (upstream fetches of the exec provider).
func pluginRuns(s *harness.Stack) int {
	b, _ := os.ReadFile(filepath.Join(s.RunDir, "runs.log"))
	return strings.Count(string(b), "\n")
}

// execWorkers issues a token per worker cluster, hands it to the token plugin and makes the
// ClusterProfile entries (access provider onprem, extension {clusterName: NAME}).
func execWorkers(t *testing.T, s *harness.Stack, prefix string, clusters []*harness.Cluster) ([]*harness.Worker, []string) {
	t.Helper()
	var workers []*harness.Worker
	var tokens []string
	for i, c := range clusters {
		name := fmt.Sprintf("%s-%d", prefix, i+1)
		tok := workerToken(t, c)
		tokens = append(tokens, tok)
		writeFile(t, filepath.Join(s.RunDir, "tokens", name), tok+"\n")
		w, err := s.NewWorker(name, "onprem", c, map[string]any{"clusterName": name})
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
	}
	return workers, tokens
}

// TestDispatchExec: the onprem access provider of deploy/'s Kueue config, served by README's
// exec provider type.
func TestDispatchExec(t *testing.T) {
	s := startStack(t, fw.Fleet, harness.StackOptions{BrokerConfig: brokerConfig(t, execProvider), KueueConfig: kueueConfig(t)})
	workers, tokens := execWorkers(t, s, "exec", fw.Fleet.Workers)
	expectDispatch(t, s, "exec", "accessProviders", workers)
	c, err := s.Broker.CountsFor("onprem")
	if err != nil {
		t.Fatal(err)
	}
	runs := pluginRuns(s)
	t.Logf("broker onprem (exec): %v GetToken calls (%v OK), %v upstream fetches, %d plugin runs, %v re-asks (%v confirmed rejections)", c.Requests, c.OK, c.Fetches, runs, c.Reasks, c.Rejected)
	if runs != len(workers) {
		t.Errorf("plugin runs = %d, want %d (one per cluster)", runs, len(workers))
	}
	noTokenIn(t, "the broker log", s.Broker.LogText(), tokens...)
}

// secretsProvider is docs/providers/kubernetes-secret.md's secretreader-compatible provider.
const secretsProvider = `
name: secretreader
type: kubernetesSecret
kubernetesSecret: {namespace: kueue-system, labelSelector: credbroker.dev/credential=true}
`

func createTokenSecret(t *testing.T, name, token string) {
	t.Helper()
	err := harness.Apply(context.Background(), fw.Fleet.Hub.Client, fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: %s, namespace: kueue-system, labels: {credbroker.dev/credential: "true"}}
stringData: {token: %q}
`, name, token))
	if err != nil {
		t.Fatal(err)
	}
}

// TestDispatchKubernetesSecret: the kubernetesSecret provider watching Secrets on the real hub
// API server with the manager pod's ServiceAccount (in-cluster config, the provider's default)
// and the RBAC of Kueue's release manifests.
func TestDispatchKubernetesSecret(t *testing.T) {
	s := startStack(t, fw.Fleet, harness.StackOptions{
		BrokerConfig: brokerConfig(t, secretsProvider),
		KueueConfig:  kueueConfig(t, shimEntry("secretreader", "secretreader")),
	})
	var workers []*harness.Worker
	var tokens []string
	for i, c := range fw.Fleet.Workers {
		name := fmt.Sprintf("ksecret-%d", i+1)
		tok := workerToken(t, c)
		tokens = append(tokens, tok)
		createTokenSecret(t, name, tok)
		w, err := s.NewWorker(name, "secretreader", c, map[string]any{"clusterName": name})
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
	}
	expectDispatch(t, s, "ksecret", "accessProviders", workers)
	c, err := s.Broker.CountsFor("secretreader")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("broker secretreader (kubernetesSecret): %v GetToken calls (%v OK), %v upstream fetches, %v re-asks (%v confirmed rejections)", c.Requests, c.OK, c.Fetches, c.Reasks, c.Rejected)
	if c.OK < float64(len(workers)) {
		t.Errorf("OK calls = %v, want at least %d", c.OK, len(workers))
	}
	if c.Fetches != float64(len(workers)) {
		t.Errorf("upstream fetches (Secret reads) = %v, want %d (one per cluster)", c.Fetches, len(workers))
	}
	noTokenIn(t, "the broker log", s.Broker.LogText(), tokens...)
}

// TestSecretreaderDirectAndWrapped: cluster-inventory-api's own secretreader plugin run by
// Kueue directly, and the same plugin wrapped by credbroker's exec provider, side by side.
func TestSecretreaderDirectAndWrapped(t *testing.T) {
	wrapped := `
name: wrapped-secretreader
type: exec
exec:
  command: /opt/e2e/bin/secretreader
  passEnv: [KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT]
  timeout: 30s
`
	s := startStack(t, fw.Fleet, harness.StackOptions{
		BrokerConfig: brokerConfig(t, wrapped),
		KueueConfig: kueueConfig(t,
			execEntry("cia-secretreader", "/opt/e2e/bin/secretreader"),
			shimEntry("wrapped-secretreader", "wrapped-secretreader")),
	})
	times := map[string]map[string]float64{}
	for _, v := range []struct{ set, provider string }{{"srdirect", "cia-secretreader"}, {"srwrapped", "wrapped-secretreader"}} {
		var workers []*harness.Worker
		for i, c := range fw.Fleet.Workers {
			name := fmt.Sprintf("%s-%d", v.set, i+1)
			createTokenSecret(t, name, workerToken(t, c))
			w, err := s.NewWorker(name, v.provider, c, map[string]any{"clusterName": name})
			if err != nil {
				t.Fatal(err)
			}
			workers = append(workers, w)
		}
		times[v.set] = expectDispatch(t, s, v.set, "accessProviders", workers)
	}
	for i := range fw.Fleet.Workers {
		d, okd := times["srdirect"][fmt.Sprintf("srdirect-%d", i+1)]
		w, okw := times["srwrapped"][fmt.Sprintf("srwrapped-%d", i+1)]
		if !okd || !okw || d <= 0 || w <= 0 {
			t.Errorf("worker-%d: no ClusterProfile-to-Active time for both (direct %v %.2fs, wrapped %v %.2fs)", i+1, okd, d, okw, w)
		}
		t.Logf("worker-%d: ClusterProfile created -> Active: secretreader %.2fs | secretreader wrapped by credbroker exec %.2fs", i+1, d, w)
	}
	c, err := s.Broker.CountsFor("wrapped-secretreader")
	if err != nil {
		t.Fatalf("the broker's counters: %v", err)
	}
	t.Logf("broker wrapped-secretreader: %v GetToken calls, %v upstream fetches (secretreader runs), %v re-asks (%v confirmed rejections)", c.Requests, c.Fetches, c.Reasks, c.Rejected)
	if c.Fetches != float64(len(fw.Fleet.Workers)) || c.FetchErrors != 0 {
		t.Errorf("wrapped secretreader: %v upstream fetches (%v failed), want %d (one per cluster)", c.Fetches, c.FetchErrors, len(fw.Fleet.Workers))
	}
}

// TestSharedIdentityFanOut: twelve ClusterProfiles (twelve distinct server addresses, six
// relayed to each worker API server) whose extensions name two identities: clusterName
// shared-worker-1 and shared-worker-2. Upstream fetches must equal the identities.
func TestSharedIdentityFanOut(t *testing.T) {
	const perWorker = 6
	s := startStack(t, fw.Fleet, harness.StackOptions{BrokerConfig: brokerConfig(t), KueueConfig: kueueConfig(t)})
	var workers []*harness.Worker
	var names []string
	for _, c := range fw.Fleet.Workers {
		identity := "shared-" + c.Name
		writeFile(t, filepath.Join(s.TokenDir, identity), workerToken(t, c)+"\n")
		for j := 0; j < perWorker; j++ {
			name := fmt.Sprintf("fan-%s-%d", c.Name, j+1)
			w, err := s.NewWorker(name, "onprem", c, map[string]any{"clusterName": identity})
			if err != nil {
				t.Fatal(err)
			}
			workers = append(workers, w)
			names = append(names, name)
		}
	}
	ctx := context.Background()
	if err := s.Setup(ctx, "fanout", workers); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := s.CreateProfiles(ctx, "accessProviders", workers); err != nil {
		t.Fatal(err)
	}
	expectClustersActive(t, s, harness.FanOutTimeout, names...)
	c, err := s.Broker.CountsFor("onprem")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d ClusterProfiles, %d identities: all Active in %.2fs; %v GetToken calls, %v upstream fetches, %v re-asks (%v confirmed rejections)",
		len(workers), len(fw.Fleet.Workers), time.Since(start).Seconds(), c.Requests, c.Fetches, c.Reasks, c.Rejected)
	if c.Fetches != float64(len(fw.Fleet.Workers)) {
		t.Errorf("upstream fetches = %v, want %d (the number of identities)", c.Fetches, len(fw.Fleet.Workers))
	}
	if c.OK < float64(len(workers)) {
		t.Errorf("OK GetToken calls = %v, want at least %d (one per cluster)", c.OK, len(workers))
	}
}

// TestShimErrorInCondition: a cluster whose credential source is missing never connects: its
// MultiKueueCluster is Active=False with client-go's "exec: executable ... failed with exit
// code 1", and the shim's one line (stderr, which client-go passes through) is in Kueue's log.
func TestShimErrorInCondition(t *testing.T) {
	ctx := context.Background()
	s := startStack(t, fw.Fleet, harness.StackOptions{BrokerConfig: brokerConfig(t), KueueConfig: kueueConfig(t)})
	w, err := s.NewWorker("nocred-1", "onprem", fw.Fleet.Workers[0], map[string]any{"clusterName": "nocred-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateProfiles(ctx, "accessProviders", []*harness.Worker{w}); err != nil {
		t.Fatal(err)
	}
	reason, msg := expectClusterInactive(t, s, w.Name, "credbroker-shim failed with exit code 1", harness.ShortTimeout)
	t.Logf("%s: Active=False reason=%s message=%q", w.Name, reason, msg)
	line := expectKueueLogLine(t, s, "credbroker-shim: ", harness.LogLineTimeout)
	t.Logf("Kueue's log: %s", line)
	if !strings.Contains(line, "NOT_FOUND") {
		t.Errorf("the shim's line does not say NOT_FOUND: %q", line)
	}
}
