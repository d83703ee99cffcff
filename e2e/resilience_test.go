package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"credbroker.dev/e2e/harness"
)

// rotate makes the upstream hand out a fresh token for a cluster and revokes every other token
// of its worker: what an operator does after a leak.
func rotate(t *testing.T, s *harness.Stack, w *harness.Worker) string {
	t.Helper()
	fresh := "e2e-rotated-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	writeFile(t, filepath.Join(s.RunDir, "tokens", w.Name), fresh+"\n")
	auth.RevokeAll(w.Cluster.Name)
	auth.Allow(w.Cluster.Name, fresh)
	// kube-apiserver keeps a successful token authentication for 10 s whatever the webhook's
	// cache TTL (its --token-success-cache-ttl default, no flag): only then is the old token refused.
	time.Sleep(11 * time.Second)
	return fresh
}

// TestRevokedTokenRecovers: the worker revokes every token while Kueue runs; the connection
// is cut (Kueue must reconnect); Kueue gets a 401, client-go runs the shim again, the broker
// refreshes, and the cluster is usable again with no restart of anything.
func TestRevokedTokenRecovers(t *testing.T) {
	ctx := context.Background()
	s := startStack(t, fleet, harness.StackOptions{BrokerConfig: brokerConfig(t, execProvider), KueueConfig: kueueConfig(t)})
	workers, tokens := execWorkers(t, s, "revoke", fleet.Workers[:1])
	dispatch(t, s, "revoke", "accessProviders", workers)
	w := workers[0]
	runs0 := pluginRuns(s)
	c0, _ := s.Broker.CountsFor("onprem")
	pid := s.Kueue.Pid()
	rejected0 := auth.Rejected.Load()

	revoked := time.Now()
	tokens = append(tokens, rotate(t, s, w))
	cut := w.Forward.Cut()
	if err := harness.Poll(ctx, 2*time.Minute, 100*time.Millisecond, func() (bool, error) {
		return auth.Rejected.Load() > rejected0, nil
	}); err != nil {
		t.Fatalf("Kueue never presented the revoked token (cut %d connections): %v", cut, err)
	}
	firstRejection := time.Since(revoked)
	if err := s.SubmitJob(ctx, "revoke", "revoke-after"); err != nil {
		t.Fatal(err)
	}
	a, err := s.WaitAdmitted(ctx, "revoke", "revoke-after", 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WaitActive(ctx, time.Minute, w.Name); err != nil {
		t.Fatal(err)
	}
	recovered := time.Since(revoked)
	c1, _ := s.Broker.CountsFor("onprem")
	runs := pluginRuns(s) - runs0
	t.Logf("revoked all tokens of %s and cut %d connections: first 401 after %.2fs; Active with a new Job admitted (%s) after %.2fs; %d upstream fetches (plugin runs), %v re-asks, %v confirmed rejections, %v GetToken calls, %d TokenReviews refused",
		w.Cluster.Name, cut, firstRejection.Seconds(), a.Workload, recovered.Seconds(), runs, c1.Reasks-c0.Reasks, c1.Rejected-c0.Rejected, c1.Requests-c0.Requests, auth.Rejected.Load()-rejected0)
	if s.Kueue.Pid() != pid || !s.Kueue.Running() {
		t.Errorf("Kueue was restarted")
	}
	if runs < 1 || runs > 3 {
		t.Errorf("upstream fetches after the revocation = %d, want 1 (at most 3)", runs)
	}
	// The broker checked Kueue's re-ask with the worker's API server, which refused the token:
	// a confirmed rejection, logged with the server and never the token.
	if c1.Rejected-c0.Rejected < 1 || c1.Unchecked != c0.Unchecked {
		t.Errorf("confirmed rejections after the revocation = %v (unchecked %v); want at least 1 and no unchecked", c1.Rejected-c0.Rejected, c1.Unchecked-c0.Unchecked)
	}
	if len(s.Broker.LogLines("rejection confirmed")) == 0 {
		t.Errorf("no 'rejection confirmed' line in the broker log:\n%s", harness.Tail(s.Broker.LogText(), 30))
	}
	noTokenIn(t, "the broker log", s.Broker.LogText(), tokens...)
}

// steadyDuration is how long TestSteadyState watches (CREDBROKER_E2E_STEADY_SECS, default 180).
func steadyDuration() time.Duration {
	if v, err := strconv.Atoi(os.Getenv("CREDBROKER_E2E_STEADY_SECS")); err == nil && v > 0 {
		return time.Duration(v) * time.Second
	}
	return 180 * time.Second
}

// TestSteadyState: minutes of normal running with reconnects (every connection cut every 30 s,
// as load balancers and API server restarts do) and a client rebuild (each ClusterProfile
// changed, which makes Kueue reconcile its MultiKueueCluster): no confirmed rejection, no
// warning, no upstream fetch beyond the first per cluster.
func TestSteadyState(t *testing.T) {
	ctx := context.Background()
	s := startStack(t, fleet, harness.StackOptions{BrokerConfig: brokerConfig(t, execProvider), KueueConfig: kueueConfig(t)})
	workers, _ := execWorkers(t, s, "steady", fleet.Workers)
	dispatch(t, s, "steady", "accessProviders", workers)
	runs0 := pluginRuns(s)
	c0, _ := s.Broker.CountsFor("onprem")
	warn0 := len(s.Broker.LogLines(" WARN "))
	d := steadyDuration()
	start := time.Now()
	cuts, rebuilt := 0, false
	for time.Since(start) < d {
		time.Sleep(30 * time.Second)
		for _, w := range workers {
			cuts += w.Forward.Cut()
		}
		if !rebuilt && time.Since(start) > d/2 {
			rebuilt = true
			for _, w := range workers {
				cp, err := harness.Get(ctx, fleet.Hub.Client, "multicluster.x-k8s.io/v1alpha1", "ClusterProfile", "kueue-system", w.Name)
				if err != nil {
					t.Fatal(err)
				}
				_ = harnessSetDisplayName(cp, w.Name+"-renamed")
				if err := fleet.Hub.Client.Update(ctx, cp); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	var names []string
	for _, w := range workers {
		names = append(names, w.Name)
	}
	if _, err := s.WaitActive(ctx, time.Minute, names...); err != nil {
		t.Fatal(err)
	}
	if err := s.SubmitJob(ctx, "steady", "steady-after"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WaitAdmitted(ctx, "steady", "steady-after", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	c1, _ := s.Broker.CountsFor("onprem")
	runs := pluginRuns(s) - runs0
	warns := s.Broker.LogLines(" WARN ")[warn0:]
	t.Logf("steady state %s with %d connections cut and each ClusterProfile changed once: %v GetToken calls, %d extra upstream fetches, %v re-asks, %v confirmed rejections (%d warning lines)",
		d, cuts, c1.Requests-c0.Requests, runs, c1.Reasks-c0.Reasks, c1.Rejected-c0.Rejected, len(warns))
	for i, l := range warns {
		if i < 3 {
			t.Logf("warning: %s", l)
		}
	}
	if c1.Rejected != c0.Rejected || c1.Unchecked != c0.Unchecked || len(warns) > 0 {
		t.Errorf("rejections in steady state: %v confirmed, %v unchecked (%d warning lines); want 0", c1.Rejected-c0.Rejected, c1.Unchecked-c0.Unchecked, len(warns))
	}
	if runs != 0 {
		t.Errorf("extra upstream fetches in steady state: %d; want 0", runs)
	}
}

// TestBrokerRestart: the broker stops while Kueue runs and a cluster's token is revoked; the
// shim's one-line error reaches Kueue's log; the broker starts again and Kueue recovers with
// the Job submitted meanwhile admitted.
func TestBrokerRestart(t *testing.T) {
	ctx := context.Background()
	s := startStack(t, fleet, harness.StackOptions{BrokerConfig: brokerConfig(t, execProvider), KueueConfig: kueueConfig(t)})
	workers, _ := execWorkers(t, s, "bdown", fleet.Workers[:1])
	dispatch(t, s, "bdown", "accessProviders", workers)
	w := workers[0]
	if err := s.Broker.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	rotate(t, s, w)
	w.Forward.Cut()
	if err := s.SubmitJob(ctx, "bdown", "bdown-meanwhile"); err != nil {
		t.Fatal(err)
	}
	var line string
	if err := harness.Poll(ctx, 2*time.Minute, 250*time.Millisecond, func() (bool, error) {
		for _, l := range s.Kueue.LogLines("credbroker-shim: ") {
			line = l
			return true, nil
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no credbroker-shim error in Kueue's log: %v", err)
	}
	i := strings.Index(line, "credbroker-shim: ")
	shown := line[i:]
	if j := strings.IndexAny(shown, "\"\\"); j > 0 {
		shown = shown[:j]
	}
	t.Logf("after %.2fs Kueue's log shows: %s", time.Since(stopped).Seconds(), shown)
	if !strings.Contains(shown, "cannot connect to the broker") {
		t.Errorf("the shim's line does not say it cannot connect to the broker: %q", shown)
	}
	st, reason, msg := s.ActiveCondition(ctx, w.Name)
	t.Logf("while the broker is down: %s Active=%s reason=%s message=%.200q", w.Name, st, reason, msg)
	if a, err := s.WaitAdmitted(ctx, "bdown", "bdown-meanwhile", time.Second); err == nil {
		t.Errorf("the Job was admitted on %s while the broker was down and the token revoked", a.ClusterName)
	}
	if err := s.Broker.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	if _, err := s.WaitActive(ctx, 2*time.Minute, w.Name); err != nil {
		t.Fatal(err)
	}
	active := time.Since(restarted)
	// Kueue recovered: a Job submitted now is dispatched.
	if err := s.SubmitJob(ctx, "bdown", "bdown-after"); err != nil {
		t.Fatal(err)
	}
	after, err := s.WaitAdmitted(ctx, "bdown", "bdown-after", 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// The Job submitted during the outage is not lost. Kueue v0.19.2 dispatches it at once when
	// the worker was still connected when it got its quota; when no worker was connected it
	// nominates none and waits for the next event on that Workload (MultiKueue does not requeue
	// waiting workloads when a worker connects). Seen both ways here; an annotation on the
	// Workload is such an event.
	a, err := s.WaitAdmitted(ctx, "bdown", "bdown-meanwhile", 15*time.Second)
	nudged := false
	if err != nil {
		if err := nudge(ctx, s, "bdown", "bdown-meanwhile"); err != nil {
			t.Fatal(err)
		}
		nudged = true
		if a, err = s.WaitAdmitted(ctx, "bdown", "bdown-meanwhile", 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	c, _ := s.Broker.CountsFor("onprem")
	t.Logf("broker back: %s Active %.2fs after the restart; a new Job admitted on %s; the Job submitted while it was down (%s) admitted on %s (needed a Workload event: %v); %v GetToken calls, %v upstream fetches since the restart",
		w.Name, active.Seconds(), after.ClusterName, a.Workload, a.ClusterName, nudged, c.Requests, c.Fetches)
}

// nudge annotates the Workload of Job ns/job: an event for Kueue's MultiKueue controller.
func nudge(ctx context.Context, s *harness.Stack, ns, job string) error {
	wls, err := s.JobWorkloads(ctx, ns, job)
	if err != nil {
		return err
	}
	if len(wls) == 0 {
		return fmt.Errorf("no Workload of Job %s/%s", ns, job)
	}
	wl := wls[0]
	ann := wl.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann["e2e.credbroker.dev/nudge"] = time.Now().UTC().Format(time.RFC3339Nano)
	wl.SetAnnotations(ann)
	return fleet.Hub.Client.Update(ctx, &wl)
}

// TestKueueRestart: Kueue's manager restarts while the broker runs: every cluster is served
// from the broker's cache, no upstream fetch.
func TestKueueRestart(t *testing.T) {
	ctx := context.Background()
	s := startStack(t, fleet, harness.StackOptions{BrokerConfig: brokerConfig(t, execProvider), KueueConfig: kueueConfig(t)})
	workers, _ := execWorkers(t, s, "krestart", fleet.Workers)
	dispatch(t, s, "krestart", "accessProviders", workers)
	runs0 := pluginRuns(s)
	c0, _ := s.Broker.CountsFor("onprem")
	if err := s.Kueue.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.StartKueue(ctx); err != nil {
		t.Fatal(err)
	}
	if err := harness.Poll(ctx, 2*time.Minute, 200*time.Millisecond, func() (bool, error) {
		c, err := s.Broker.CountsFor("onprem")
		return err == nil && c.Requests-c0.Requests >= float64(len(workers)), err
	}); err != nil {
		t.Fatalf("the restarted Kueue did not ask the broker for every cluster: %v", err)
	}
	if err := s.SubmitJob(ctx, "krestart", "krestart-after"); err != nil {
		t.Fatal(err)
	}
	a, err := s.WaitAdmitted(ctx, "krestart", "krestart-after", 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c1, _ := s.Broker.CountsFor("onprem")
	runs := pluginRuns(s) - runs0
	t.Logf("Kueue restarted: Job admitted on %s %.2fs after the restart; %v GetToken calls, %d upstream fetches, %v re-asks (%v confirmed rejections)",
		a.ClusterName, a.At.Sub(start).Seconds(), c1.Requests-c0.Requests, runs, c1.Reasks-c0.Reasks, c1.Rejected-c0.Rejected)
	if runs != 0 || c1.Fetches != c0.Fetches {
		t.Errorf("upstream fetches after Kueue's restart = %d; want 0 (served from the cache)", runs)
	}
}
