package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker.dev/e2e/harness"
	"github.com/onsi/gomega"
)

// shortLifetime is the life of the credentials the lifecycle scenarios hand out
// (harness.ShortLifetime says why it is what it is).
const shortLifetime = harness.ShortLifetime

// shortLivedExecProvider is execProvider whose upstream hands out credentials of shortLifetime.
func shortLivedExecProvider() string {
	return execProvider + fmt.Sprintf("  env: {TOKEN_LIFETIME: %s}\n", shortLifetime)
}

// runTimes are the times of the token plugin's successful runs (upstream fetches).
func runTimes(t *testing.T, s *harness.Stack) []time.Time {
	t.Helper()
	b, _ := os.ReadFile(filepath.Join(s.RunDir, "runs.log"))
	var out []time.Time
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, strings.Fields(line)[0])
		if err != nil {
			t.Fatalf("runs.log: %q: %v", line, err)
		}
		out = append(out, at)
	}
	return out
}

// failedRuns counts the token plugin's runs while its upstream was down.
func failedRuns(s *harness.Stack) int {
	b, _ := os.ReadFile(filepath.Join(s.RunDir, "runs.log.fail"))
	return strings.Count(string(b), "\n")
}

// upstreamDown takes the token plugin's upstream down (true) or brings it back.
func upstreamDown(t *testing.T, s *harness.Stack, down bool) {
	t.Helper()
	p := filepath.Join(s.RunDir, "tokens", "DOWN")
	if down {
		writeFile(t, p, "down\n")
	} else if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
}

// expectFetchBeyond asserts that the upstream is called more than n times within timeout, and
// returns when the last call happened.
func expectFetchBeyond(t *testing.T, s *harness.Stack, n int, timeout time.Duration) time.Time {
	t.Helper()
	var at time.Time
	gomega.NewWithT(t).Eventually(func() error {
		if runs := runTimes(t, s); len(runs) > n {
			at = runs[len(runs)-1]
			return nil
		}
		return fmt.Errorf("no upstream fetch beyond the %d-th", n)
	}).WithTimeout(timeout).WithPolling(harness.FastInterval).Should(gomega.Succeed())
	return at
}

// activeWatch samples a MultiKueueCluster's Active condition every harness.SampleInterval.
type activeWatch struct {
	mu       sync.Mutex
	samples  int
	notTrue  int
	firstOff time.Time
	lastOff  string
	stop     chan struct{}
	done     chan struct{}
}

func watchActive(s *harness.Stack, name string) *activeWatch {
	w := &activeWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			st, reason, msg := s.ActiveCondition(context.Background(), name)
			w.mu.Lock()
			w.samples++
			if st != "True" {
				w.notTrue++
				if w.firstOff.IsZero() {
					w.firstOff = time.Now()
				}
				w.lastOff = fmt.Sprintf("Active=%q reason=%q message=%.300q", st, reason, msg)
			}
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-time.After(harness.SampleInterval):
			}
		}
	}()
	return w
}

// end stops sampling and returns (samples, samples not Active, the last such condition).
func (w *activeWatch) end() (int, int, string) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.samples, w.notTrue, w.lastOff
}

// outcomes counts the broker's GetToken log lines by outcome (Hit, Stale, Miss, Joined) and
// code since line from.
func outcomes(b *harness.Broker, from int) (map[string]int, int) {
	lines := b.LogLines("GetToken")
	if from > len(lines) {
		from = len(lines)
	}
	count := map[string]int{}
	for _, l := range lines[from:] {
		for _, f := range strings.Fields(l) {
			if v, ok := strings.CutPrefix(f, "outcome="); ok {
				count[v]++
			} else if v, ok := strings.CutPrefix(f, "code="); ok && strings.Trim(v, `"`) != "OK" {
				count["code "+strings.Trim(v, `"`)]++
			}
		}
	}
	return count, len(lines)
}

func describeCounts(m map[string]int) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// keepBusy cuts w's connections every harness.BusyCutEvery until the returned function is called (or the test ends).
func keepBusy(t *testing.T, w *harness.Worker) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			case <-time.After(harness.BusyCutEvery):
				w.Forward.Cut()
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(done); <-finished }) }
	t.Cleanup(stop)
	return stop
}

// TestCredentialLifecycle: credentials of 60 s through real Kueue, in three phases on one
// worker:
//
//  1. running: client-go runs the shim again at each expirationTimestamp the broker sent, and
//     the broker refreshes ahead (a call past the refresh time is served the held credential
//     at once and starts the fetch): fetches follow the refresh schedule, every call is
//     answered OK, the cluster stays Active;
//  2. an upstream outage shorter than the held credential's life (it starts right after a
//     fetch and ends before that credential's serving window does): the refresh fails, the
//     held credential is served meanwhile, a Job is dispatched during the outage, zero failed
//     calls, the cluster stays Active;
//  3. an outage longer than that life: the broker stops serving the credential before it
//     expires, the shim fails, the MultiKueueCluster turns Active=False with client-go's
//     message naming the shim and the shim's line in Kueue's log; when the upstream is back
//     the cluster is Active again by itself.
//
// Kueue's watches on the worker stay open, and between events it requests nothing but its
// garbage collector's list once a minute; client-go looks at its credential only when a request
// is made. So the suite cuts the worker's connections every 5 s: Kueue reconnects (lists and
// watches again), as a busy hub with Jobs flowing requests all the time.
func TestCredentialLifecycle(t *testing.T) {
	ctx := context.Background()
	s := startStack(t, fw.Fleet, harness.StackOptions{BrokerConfig: brokerConfig(t, shortLivedExecProvider()), KueueConfig: kueueConfig(t)})
	workers, tokens := execWorkers(t, s, "life", fw.Fleet.Workers[:1])
	w := workers[0]
	expectDispatch(t, s, "life", "accessProviders", workers)
	first := runTimes(t, s)
	if len(first) != 1 {
		t.Fatalf("upstream fetches after the first dispatch = %d, want 1", len(first))
	}

	// 1. Running: two refreshes in the background.
	c0, _ := s.Broker.CountsFor("onprem")
	_, line0 := outcomes(s.Broker, 0)
	watch := watchActive(s, w.Name)
	busy := keepBusy(t, w)
	phase1 := time.Now()
	expectFetchBeyond(t, s, 2, harness.TwoRefreshesWithin)
	samples, off, last := watch.end()
	c1, _ := s.Broker.CountsFor("onprem")
	runs := runTimes(t, s)
	var gaps []string
	for i := 1; i < len(runs); i++ {
		gaps = append(gaps, fmt.Sprintf("%.0fs", runs[i].Sub(runs[i-1]).Seconds()))
	}
	oc, line1 := outcomes(s.Broker, line0)
	t.Logf("1. running %.0fs with %s credentials: %v shim runs (GetToken calls, %v OK), %d upstream fetches in all, %s apart (refresh at 40-60%% of the life: %.0f-%.0fs after a fetch, then at the caller's next call); calls by outcome: %s; Active in %d/%d samples",
		time.Since(phase1).Seconds(), shortLifetime, c1.Requests-c0.Requests, c1.OK-c0.OK, len(runs), strings.Join(gaps, ", "),
		0.4*shortLifetime.Seconds(), 0.6*shortLifetime.Seconds(), describeCounts(oc), samples-off, samples)
	if c1.Requests-c0.Requests < 2 {
		t.Errorf("client-go ran the shim %v times in the running phase; want at least 2 (once per expirationTimestamp)", c1.Requests-c0.Requests)
	}
	if c1.OK-c0.OK != c1.Requests-c0.Requests || oc["Miss"] > 0 {
		t.Errorf("running phase: %v of %v calls OK, %d fetched on the caller's path; want every call OK and served from the cache (refreshed ahead)", c1.OK-c0.OK, c1.Requests-c0.Requests, oc["Miss"])
	}
	for i := 1; i < len(runs); i++ {
		if gap := runs[i].Sub(runs[i-1]); gap < shortLifetime*4/10-harness.RefreshScheduleSlack || gap > shortLifetime {
			t.Errorf("fetch %d came %.1fs after the one before; the schedule says between %.0fs (refresh time) and %.0fs (the credential's life)", i+1, gap.Seconds(), 0.4*shortLifetime.Seconds(), shortLifetime.Seconds())
		}
	}
	if off > 0 {
		t.Errorf("running phase: the cluster was not Active in %d of %d samples (last: %s)", off, samples, last)
	}

	// 2. A short outage, right after a fetch: over before the held credential's serving window
	// (three quarters of its life) ends.
	fetched := expectFetchBeyond(t, s, len(runs), harness.NextRefreshWithin)
	upstreamDown(t, s, true)
	outage := shortLifetime * 7 / 10
	downAt := time.Now()
	c2, _ := s.Broker.CountsFor("onprem")
	watch = watchActive(s, w.Name)
	if err := s.SubmitJob(ctx, "life", "life-outage"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(outage - time.Since(fetched))
	upstreamDown(t, s, false)
	downFor := time.Since(downAt)
	a := expectJobAdmitted(t, s, "life", "life-outage", harness.ShortTimeout)
	// Past the held credential's serving window: the next call fetches anew.
	expectFetchBeyond(t, s, len(runTimes(t, s)), harness.NextRefreshWithin)
	samples, off, last = watch.end()
	c3, _ := s.Broker.CountsFor("onprem")
	oc, _ = outcomes(s.Broker, line1)
	t.Logf("2. upstream down %.0fs (from %.1fs after a fetch; the credential is served for %.0fs): Job %s admitted on %s during it; %v GetToken calls, %v failed; %d failed upstream runs (%v fetch errors); calls by outcome: %s; Active in %d/%d samples",
		downFor.Seconds(), downAt.Sub(fetched).Seconds(), 0.75*shortLifetime.Seconds(), a.Workload, a.ClusterName,
		c3.Requests-c2.Requests, (c3.Requests-c2.Requests)-(c3.OK-c2.OK), failedRuns(s), c3.FetchErrors-c2.FetchErrors, describeCounts(oc), samples-off, samples)
	if c3.OK-c2.OK != c3.Requests-c2.Requests {
		t.Errorf("short outage: %v of %v GetToken calls failed; want 0", (c3.Requests-c2.Requests)-(c3.OK-c2.OK), c3.Requests-c2.Requests)
	}
	if off > 0 {
		t.Errorf("short outage: the cluster was not Active in %d of %d samples (last: %s)", off, samples, last)
	}
	if failedRuns(s) == 0 {
		t.Errorf("short outage: no refresh was tried while the upstream was down (the outage was not felt)")
	}

	// 3. A long outage: the held credential's serving window ends while the upstream is down.
	warn3 := len(s.Kueue.LogLines("credbroker-shim: "))
	upstreamDown(t, s, true)
	downAt = time.Now()
	reason, msg := expectClusterInactive(t, s, w.Name, "credbroker-shim", harness.ServingWindowEndsWithin)
	inactive := time.Since(downAt)
	shimLines := s.Kueue.LogLines("credbroker-shim: ")[warn3:]
	if len(shimLines) == 0 {
		t.Fatalf("long outage: no credbroker-shim line in Kueue's log")
	}
	// Kueue logs JSON: the shim's line sits in a string, its quotes escaped.
	shown := strings.ReplaceAll(shimLines[0][strings.Index(shimLines[0], "credbroker-shim: "):], `\"`, `"`)
	if j := strings.Index(shown, `","`); j > 0 {
		shown = shown[:j]
	}
	upstreamDown(t, s, false)
	back := time.Now()
	expectClustersActive(t, s, harness.RecoveryTimeout, w.Name)
	recovered := time.Since(back)
	if err := s.SubmitJob(ctx, "life", "life-after"); err != nil {
		t.Fatal(err)
	}
	expectJobAdmitted(t, s, "life", "life-after", harness.Timeout)
	busy()
	c4, _ := s.Broker.CountsFor("onprem")
	t.Logf("3. upstream down %.0fs: Active=False %.0fs after the outage began (reason %s, message %.160q); Kueue's log: %s; upstream back: Active again in %.1fs by itself and a new Job admitted; %d upstream fetches in all, %d failed runs, %v GetToken calls refused",
		back.Sub(downAt).Seconds(), inactive.Seconds(), reason, msg, shown, recovered.Seconds(), len(runTimes(t, s)), failedRuns(s), (c4.Requests-c3.Requests)-(c4.OK-c3.OK))
	if !strings.Contains(shown, "UNAVAILABLE") {
		t.Errorf("the shim's line does not say the broker answered UNAVAILABLE: %q", shown)
	}
	noTokenIn(t, "the broker log", s.Broker.LogText(), tokens...)
}
