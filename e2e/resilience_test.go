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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// rotate does what an operator does after a leak: revokes every token of the worker identity
// (deletes its ServiceAccount and applies deploy/examples/worker-rbac again) and makes the
// upstream hand out a token of the new one.
func rotate(t *testing.T, s *harness.Stack, w *harness.Worker) string {
	t.Helper()
	if err := w.Cluster.RevokeWorkerIdentity(context.Background()); err != nil {
		t.Fatal(err)
	}
	fresh := workerToken(t, w.Cluster)
	writeFile(t, filepath.Join(s.RunDir, "tokens", w.Name), fresh+"\n")
	// kube-apiserver keeps a successful token authentication for 10 s whatever the webhook's
	// cache TTL (its --token-success-cache-ttl default, no flag): only then is the old token refused.
	time.Sleep(harness.TokenCacheWait)
	return fresh
}

// TestRevokedTokenRecovers: the worker revokes every token while Kueue runs; the connection
// is cut (Kueue must reconnect); Kueue gets a 401, client-go runs the shim again, the broker
// refreshes, and the cluster is usable again with no restart of anything.
func TestRevokedTokenRecovers(t *testing.T) {
	ctx := context.Background()
	s := startStack(t, fw.Fleet, harness.StackOptions{BrokerConfig: brokerConfig(t, execProvider), KueueConfig: kueueConfig(t)})
	workers, tokens := execWorkers(t, s, "revoke", fw.Fleet.Workers[:1])
	expectDispatch(t, s, "revoke", "accessProviders", workers)
	w := workers[0]
	runs0 := pluginRuns(s)
	c0, _ := s.Broker.CountsFor("onprem")
	pid := s.Kueue.Pid()
	rejected0, err := w.Cluster.AuthFailures(ctx)
	if err != nil {
		t.Fatal(err)
	}

	revoked := time.Now()
	tokens = append(tokens, rotate(t, s, w))
	cut := w.Forward.Cut()
	rejected := expectAuthFailures(t, w.Cluster, rejected0, harness.Timeout, fmt.Sprintf("Kueue never presented the revoked token (cut %d connections)", cut))
	firstRejection := time.Since(revoked)
	if err := s.SubmitJob(ctx, "revoke", "revoke-after"); err != nil {
		t.Fatal(err)
	}
	// As in TestBrokerRestart: a Job that gets its quota while MultiKueue is reconnecting to
	// its only worker is nominated nowhere and waits for the next event on its Workload
	// (Kueue v0.19.2 does not requeue waiting workloads when a worker connects).
	a, nudged := expectJobAdmittedNudging(t, s, "revoke", "revoke-after", harness.NudgeAfter, func() {
		expectClustersActive(t, s, harness.ShortTimeout, w.Name)
	})
	expectClustersActive(t, s, harness.ShortTimeout, w.Name)
	recovered := time.Since(revoked)
	t.Logf("the Job submitted after the first 401 needed a Workload event: %v", nudged)
	c1, _ := s.Broker.CountsFor("onprem")
	runs := pluginRuns(s) - runs0
	t.Logf("revoked all tokens of %s and cut %d connections: first 401 after %.2fs; Active with a new Job admitted (%s) after %.2fs; %d upstream fetches (plugin runs), %v re-asks, %v confirmed rejections, %v GetToken calls, %v requests the worker could not authenticate",
		w.Cluster.Name, cut, firstRejection.Seconds(), a.Workload, recovered.Seconds(), runs, c1.Reasks-c0.Reasks, c1.Rejected-c0.Rejected, c1.Requests-c0.Requests, rejected-rejected0)
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

// steadyDuration is how long TestSteadyState watches: CREDBROKER_E2E_STEADY_SECS, default
// harness.SteadyDefault.
func steadyDuration() time.Duration {
	if v, err := strconv.Atoi(os.Getenv("CREDBROKER_E2E_STEADY_SECS")); err == nil && v > 0 {
		return time.Duration(v) * time.Second
	}
	return harness.SteadyDefault
}

// steadyMark is where a steady-state window starts: the counters and log lengths then.
type steadyMark struct {
	counts     harness.Counts
	shimLines  int
	warnLines  int
	watches    []*activeWatch
	names      []string
	started    time.Time
	brokerDown bool
}

// markSteady starts a steady-state window over workers: samples their Active conditions
// from now on.
func markSteady(s *harness.Stack, workers []*harness.Worker) *steadyMark {
	m := &steadyMark{started: time.Now(), shimLines: len(s.Kueue.LogLines("credbroker-shim: "))}
	if s.Broker.Running() {
		m.counts, _ = s.Broker.CountsFor("onprem")
		m.warnLines = len(s.Broker.LogLines(" WARN "))
	}
	for _, w := range workers {
		m.watches = append(m.watches, watchActive(s, w.Name))
		m.names = append(m.names, w.Name)
	}
	return m
}

// steadyViolations ends the window and says everything in it that steady running must not
// show: a GetToken call not answered OK, a line of the shim in Kueue's log, a confirmed or
// unchecked rejection, a warning of the broker, a sample of a cluster not Active, or fewer
// than minRuns shim runs per cluster (client-go must have looked at the credentials, or the
// window proves nothing about the broker).
func steadyViolations(s *harness.Stack, m *steadyMark, minRuns int) []string {
	var v []string
	for i, w := range m.watches {
		samples, off, last := w.end()
		if off > 0 {
			v = append(v, fmt.Sprintf("%s not Active in %d of %d samples (last: %s)", m.names[i], off, samples, last))
		}
	}
	if lines := s.Kueue.LogLines("credbroker-shim: "); len(lines) > m.shimLines {
		v = append(v, fmt.Sprintf("%d credbroker-shim lines in Kueue's log, the first: %.300s", len(lines)-m.shimLines, lines[m.shimLines]))
	}
	if !s.Broker.Running() {
		return append(v, "the broker is not running")
	}
	c, err := s.Broker.CountsFor("onprem")
	if err != nil {
		return append(v, "the broker's metrics: "+err.Error())
	}
	calls := c.Requests - m.counts.Requests
	if failed := calls - (c.OK - m.counts.OK); failed > 0 {
		v = append(v, fmt.Sprintf("%v of %v GetToken calls not OK", failed, calls))
	}
	if calls < float64(minRuns*len(m.watches)) {
		v = append(v, fmt.Sprintf("client-go ran the shim %v times for %d clusters; want at least %d each", calls, len(m.watches), minRuns))
	}
	if c.Rejected != m.counts.Rejected || c.Unchecked != m.counts.Unchecked {
		v = append(v, fmt.Sprintf("rejections: %v confirmed, %v unchecked", c.Rejected-m.counts.Rejected, c.Unchecked-m.counts.Unchecked))
	}
	if warns := s.Broker.LogLines(" WARN "); len(warns) > m.warnLines {
		v = append(v, fmt.Sprintf("%d warning lines of the broker, the first: %.300s", len(warns)-m.warnLines, warns[m.warnLines]))
	}
	return v
}

// TestSteadyState: minutes of normal running with credentials of 60 s (client-go runs the
// shim again at each expirationTimestamp, the broker refreshes), reconnects (every connection
// cut every 30 s, as load balancers and API server restarts do) and a client rebuild (each
// ClusterProfile changed, which makes Kueue reconcile its MultiKueueCluster): every call OK,
// no shim line in Kueue's log, the clusters Active throughout, no rejection, no warning, and
// upstream fetches on the refresh schedule. The same checks over a window in which the
// broker is stopped fail: TestBrokerRestart shows it.
func TestSteadyState(t *testing.T) {
	ctx := context.Background()
	s := startStack(t, fw.Fleet, harness.StackOptions{BrokerConfig: brokerConfig(t, shortLivedExecProvider()), KueueConfig: kueueConfig(t)})
	workers, _ := execWorkers(t, s, "steady", fw.Fleet.Workers)
	expectDispatch(t, s, "steady", "accessProviders", workers)
	runs0 := pluginRuns(s)
	d := steadyDuration()
	m := markSteady(s, workers)
	start := time.Now()
	cuts, rebuilt := 0, false
	for time.Since(start) < d {
		time.Sleep(harness.SteadyCutEvery)
		for _, w := range workers {
			cuts += w.Forward.Cut()
		}
		if !rebuilt && time.Since(start) > d/2 {
			rebuilt = true
			for _, w := range workers {
				cp, err := harness.Get(ctx, fw.Fleet.Hub.Client, "multicluster.x-k8s.io/v1alpha1", "ClusterProfile", "kueue-system", w.Name)
				if err != nil {
					t.Fatal(err)
				}
				_ = harnessSetDisplayName(cp, w.Name+"-renamed")
				if err := fw.Fleet.Hub.Client.Update(ctx, cp); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	c1, _ := s.Broker.CountsFor("onprem")
	runs := pluginRuns(s) - runs0
	violations := steadyViolations(s, m, 2)
	// At most one fetch per refresh time (40 % of the life at the earliest) per cluster.
	most := len(workers) * (int(d/(shortLifetime*4/10)) + 1)
	t.Logf("steady state %s with %s credentials, %d connections cut and each ClusterProfile changed once: %v GetToken calls (shim runs), %d upstream fetches (at most %d on the refresh schedule), %v re-asks, %v confirmed rejections; %d violations",
		d, shortLifetime, cuts, c1.Requests-m.counts.Requests, runs, most, c1.Reasks-m.counts.Reasks, c1.Rejected-m.counts.Rejected, len(violations))
	for _, v := range violations {
		t.Errorf("steady state: %s", v)
	}
	if runs < len(workers) || runs > most {
		t.Errorf("upstream fetches in steady state: %d; want between %d (one refresh per cluster) and %d (the refresh schedule)", runs, len(workers), most)
	}
	if err := s.SubmitJob(ctx, "steady", "steady-after"); err != nil {
		t.Fatal(err)
	}
	expectJobAdmitted(t, s, "steady", "steady-after", harness.Timeout)
}

// TestBrokerRestart: the broker stops while Kueue runs and a cluster's token is revoked; the
// shim's one-line error reaches Kueue's log; the broker starts again and Kueue recovers with
// the Job submitted meanwhile admitted.
func TestBrokerRestart(t *testing.T) {
	ctx := context.Background()
	s := startStack(t, fw.Fleet, harness.StackOptions{BrokerConfig: brokerConfig(t, execProvider), KueueConfig: kueueConfig(t)})
	workers, _ := execWorkers(t, s, "bdown", fw.Fleet.Workers[:1])
	expectDispatch(t, s, "bdown", "accessProviders", workers)
	w := workers[0]
	// TestSteadyState's checks over the window in which the broker is stopped must fail.
	m := markSteady(s, workers)
	if err := s.Broker.Stop(harness.StopGrace); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	rotate(t, s, w)
	w.Forward.Cut()
	if err := s.SubmitJob(ctx, "bdown", "bdown-meanwhile"); err != nil {
		t.Fatal(err)
	}
	line := expectKueueLogLine(t, s, "credbroker-shim: ", harness.Timeout)
	i := strings.Index(line, "credbroker-shim: ")
	shown := line[i:]
	if j := strings.IndexAny(shown, "\"\\"); j > 0 {
		shown = shown[:j]
	}
	t.Logf("after %.2fs Kueue's log shows: %s", time.Since(stopped).Seconds(), shown)
	if !strings.Contains(shown, "cannot connect to the broker") {
		t.Errorf("the shim's line does not say it cannot connect to the broker: %q", shown)
	}
	reason, msg := expectClusterInactive(t, s, w.Name, "", harness.Timeout)
	t.Logf("while the broker is down: %s Active=False reason=%s message=%.200q, %.2fs after it stopped", w.Name, reason, msg, time.Since(stopped).Seconds())
	violations := steadyViolations(s, m, 0)
	t.Logf("the steady-state checks over the outage: %d violations: %s", len(violations), strings.Join(violations, "; "))
	seen := false
	for _, v := range violations {
		// What Kueue shows, not merely that the broker process is gone.
		seen = seen || strings.Contains(v, "credbroker-shim lines in Kueue's log") || strings.Contains(v, "not Active")
	}
	if !seen {
		t.Errorf("the steady-state checks did not see, from Kueue's side, that the broker was stopped: %q", violations)
	}
	expectJobNotAdmitted(t, s, "bdown", "bdown-meanwhile", harness.ConsistentDuration)
	if err := s.Broker.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	expectClustersActive(t, s, harness.Timeout, w.Name)
	active := time.Since(restarted)
	// Kueue recovered: a Job submitted now is dispatched.
	if err := s.SubmitJob(ctx, "bdown", "bdown-after"); err != nil {
		t.Fatal(err)
	}
	after := expectJobAdmitted(t, s, "bdown", "bdown-after", harness.Timeout)
	// The Job submitted during the outage is not lost. Kueue v0.19.2 dispatches it at once when
	// the worker was still connected when it got its quota; when no worker was connected it
	// nominates none and waits for the next event on that Workload (MultiKueue does not requeue
	// waiting workloads when a worker connects). Seen both ways here; an annotation on the
	// Workload is such an event.
	a, nudged := expectJobAdmittedNudging(t, s, "bdown", "bdown-meanwhile", harness.NudgeAfterRecovery, nil)
	c, _ := s.Broker.CountsFor("onprem")
	t.Logf("broker back: %s Active %.2fs after the restart; a new Job admitted on %s; the Job submitted while it was down (%s) admitted on %s (needed a Workload event: %v); %v GetToken calls, %v upstream fetches since the restart",
		w.Name, active.Seconds(), after.ClusterName, a.Workload, a.ClusterName, nudged, c.Requests, c.Fetches)
}

// nudge annotates the Workload of Job ns/job: an event for Kueue's MultiKueue controller.
func nudge(ctx context.Context, s *harness.Stack, ns, job string) error {
	// The Workload can be replaced between the list and the update (Kueue deletes and
	// recreates it when a new manager finds it out of date): a Workload that is gone or
	// changed is looked up again, within harness.NudgeRetryTimeout.
	return harness.Eventually(ctx, harness.NudgeRetryTimeout, harness.Interval, func() error {
		wls, err := s.JobWorkloads(ctx, ns, job)
		if err != nil {
			return harness.StopTrying(err)
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
		err = s.Env.Hub.Client.Update(ctx, &wl)
		switch {
		case err == nil:
			return nil
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			return err
		default:
			return harness.StopTrying(err)
		}
	})
}

// TestKueueRestart: Kueue's manager restarts while the broker runs: every cluster is served
// from the broker's cache, no upstream fetch.
func TestKueueRestart(t *testing.T) {
	ctx := context.Background()
	s := startStack(t, fw.Fleet, harness.StackOptions{BrokerConfig: brokerConfig(t, execProvider), KueueConfig: kueueConfig(t)})
	workers, _ := execWorkers(t, s, "krestart", fw.Fleet.Workers)
	expectDispatch(t, s, "krestart", "accessProviders", workers)
	runs0 := pluginRuns(s)
	c0, _ := s.Broker.CountsFor("onprem")
	if err := s.Kueue.Stop(harness.KueueRestartGrace); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.StartKueue(ctx); err != nil {
		t.Fatal(err)
	}
	expectBrokerCalls(t, s.Broker, "onprem", c0, len(workers), harness.Timeout)
	if err := s.SubmitJob(ctx, "krestart", "krestart-after"); err != nil {
		t.Fatal(err)
	}
	a := expectJobAdmitted(t, s, "krestart", "krestart-after", harness.Timeout)
	c1, _ := s.Broker.CountsFor("onprem")
	runs := pluginRuns(s) - runs0
	t.Logf("Kueue restarted: Job admitted on %s %.2fs after the restart; %v GetToken calls, %d upstream fetches, %v re-asks (%v confirmed rejections)",
		a.ClusterName, a.At.Sub(start).Seconds(), c1.Requests-c0.Requests, runs, c1.Reasks-c0.Reasks, c1.Rejected-c0.Rejected)
	if runs != 0 || c1.Fetches != c0.Fetches {
		t.Errorf("upstream fetches after Kueue's restart = %d; want 0 (served from the cache)", runs)
	}
}
