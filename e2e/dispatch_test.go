package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"credbroker.dev/e2e/harness"
)

// dispatch creates the ClusterProfiles and MultiKueueClusters of workers, waits until they are
// Active, submits a Job and waits until it is admitted on a worker. It returns the seconds from
// ClusterProfile created to MultiKueueCluster Active, per worker.
func dispatch(t *testing.T, s *harness.Stack, set, field string, workers []*harness.Worker) map[string]float64 {
	t.Helper()
	ctx := context.Background()
	if err := s.Setup(ctx, set, workers); err != nil {
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
	active, err := s.WaitActive(ctx, 2*time.Minute, names...)
	if err != nil {
		t.Fatal(err)
	}
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
	a, err := s.WaitAdmitted(ctx, set, job, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
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
	s := startStack(t, fleet, harness.StackOptions{BrokerConfig: brokerConfig(t), KueueConfig: kueueConfig(t)})
	var workers []*harness.Worker
	var tokens []string
	for i, c := range fleet.Workers {
		name := fmt.Sprintf("file-%d", i+1)
		tok := auth.Issue(c.Name)
		tokens = append(tokens, tok)
		writeFile(t, filepath.Join(s.TokenDir, name), tok+"\n")
		w, err := s.NewWorker(name, "onprem", c, map[string]any{"clusterName": name})
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
	}
	dispatch(t, s, "file", "accessProviders", workers)
	c, err := s.Broker.CountsFor("onprem")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("broker onprem: %v GetToken calls (%v OK), %v upstream fetches, %v suspected rejections", c.Requests, c.OK, c.Fetches, c.Suspected)
	if c.Fetches != float64(len(workers)) {
		t.Errorf("upstream fetches = %v, want %d (one per cluster)", c.Fetches, len(workers))
	}
	noTokenIn(t, "the broker log", s.Broker.LogText(), tokens...)
	_ = ctx
}
