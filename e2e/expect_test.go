package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"credbroker.dev/e2e/harness"
	"github.com/onsi/gomega"
)

// The suite's waits, each named by what it asserts. They poll with gomega's Eventually (or
// Consistently) every harness.Interval unless said otherwise, bounded by one of harness's
// named timeouts (harness/timeouts.go), and end the test (t.Fatal) when the assertion fails.

// expectClustersActive asserts that every named MultiKueueCluster turns Active=True within
// timeout, and returns when each was first seen so.
func expectClustersActive(t *testing.T, s *harness.Stack, timeout time.Duration, names ...string) map[string]time.Time {
	t.Helper()
	ctx := context.Background()
	seen := map[string]time.Time{}
	gomega.NewWithT(t).Eventually(func() error {
		var not []string
		for _, n := range names {
			if _, ok := seen[n]; ok {
				continue
			}
			st, reason, msg := s.ActiveCondition(ctx, n)
			if st == "True" {
				seen[n] = time.Now()
				continue
			}
			not = append(not, fmt.Sprintf("%s: Active=%q reason=%q message=%q", n, st, reason, msg))
		}
		if len(not) > 0 {
			return fmt.Errorf("MultiKueueClusters not Active: %s", strings.Join(not, "; "))
		}
		return nil
	}).WithTimeout(timeout).WithPolling(harness.Interval).Should(gomega.Succeed())
	return seen
}

// expectClusterInactive asserts that MultiKueueCluster name turns Active=False, with a message
// containing sub, within timeout; it returns that condition's reason and message.
func expectClusterInactive(t *testing.T, s *harness.Stack, name, sub string, timeout time.Duration) (reason, message string) {
	t.Helper()
	ctx := context.Background()
	gomega.NewWithT(t).Eventually(func() error {
		var st string
		st, reason, message = s.ActiveCondition(ctx, name)
		if st == "False" && strings.Contains(message, sub) {
			return nil
		}
		return fmt.Errorf("MultiKueueCluster %s: Active=%q reason=%q message=%q; want False with a message naming %q", name, st, reason, message, sub)
	}).WithTimeout(timeout).WithPolling(harness.Interval).Should(gomega.Succeed())
	return reason, message
}

// expectJobAdmitted asserts that the hub's Workload of Job set/job is admitted on a worker
// (status.clusterName, its MultiKueue admission check Ready, Admitted=True) within timeout.
func expectJobAdmitted(t *testing.T, s *harness.Stack, set, job string, timeout time.Duration) *harness.Admission {
	t.Helper()
	var a *harness.Admission
	gomega.NewWithT(t).Eventually(func() (err error) {
		a, err = s.Admission(context.Background(), set, job)
		return err
	}).WithTimeout(timeout).WithPolling(harness.Interval).Should(gomega.Succeed())
	return a
}

// admittedWithin is expectJobAdmitted as a question: whether the Job is admitted within d.
func admittedWithin(s *harness.Stack, set, job string, d time.Duration) (*harness.Admission, bool) {
	var a *harness.Admission
	err := harness.Eventually(context.Background(), d, harness.Interval, func() (err error) {
		a, err = s.Admission(context.Background(), set, job)
		return err
	})
	return a, err == nil
}

// expectJobNotAdmitted asserts that Job set/job stays unadmitted for d (t.Errorf: the test
// goes on to show what happens next).
func expectJobNotAdmitted(t *testing.T, s *harness.Stack, set, job string, d time.Duration) {
	t.Helper()
	err := harness.Consistently(context.Background(), d, harness.Interval, func() error {
		if a, err := s.Admission(context.Background(), set, job); err == nil {
			return fmt.Errorf("the Job was admitted on %s", a.ClusterName)
		}
		return nil
	})
	if err != nil {
		t.Errorf("Job %s/%s while it cannot be dispatched: %v", set, job, err)
	}
}

// expectJobAdmittedNudging asserts that Job set/job is admitted: within after by itself, or
// else, once beforeNudge (if any) passed, within harness.Timeout of an annotation on its
// Workload (nudge). It says whether the nudge was needed.
func expectJobAdmittedNudging(t *testing.T, s *harness.Stack, set, job string, after time.Duration, beforeNudge func()) (*harness.Admission, bool) {
	t.Helper()
	if a, ok := admittedWithin(s, set, job, after); ok {
		return a, false
	}
	if beforeNudge != nil {
		beforeNudge()
	}
	if err := nudge(context.Background(), s, set, job); err != nil {
		t.Fatal(err)
	}
	return expectJobAdmitted(t, s, set, job, harness.Timeout), true
}

// expectKueueLogLine asserts that a line containing sub reaches the hub Kueue's log within
// timeout, and returns the first such line.
func expectKueueLogLine(t *testing.T, s *harness.Stack, sub string, timeout time.Duration) string {
	t.Helper()
	var line string
	gomega.NewWithT(t).Eventually(func() error {
		if lines := s.Kueue.LogLines(sub); len(lines) > 0 {
			line = lines[0]
			return nil
		}
		return fmt.Errorf("no %q line in Kueue's log", sub)
	}).WithTimeout(timeout).WithPolling(harness.Interval).Should(gomega.Succeed())
	return line
}

// expectBrokerCalls asserts that the broker gets at least n GetToken calls for provider
// beyond the counts in since, within timeout.
func expectBrokerCalls(t *testing.T, b *harness.Broker, provider string, since harness.Counts, n int, timeout time.Duration) {
	t.Helper()
	gomega.NewWithT(t).Eventually(func() error {
		c, err := b.CountsFor(provider)
		if err != nil {
			return err
		}
		if got := c.Requests - since.Requests; got < float64(n) {
			return fmt.Errorf("%v GetToken calls for %s, want at least %d", got, provider, n)
		}
		return nil
	}).WithTimeout(timeout).WithPolling(harness.Interval).Should(gomega.Succeed())
}

// expectAuthFailures asserts that the count of requests c's API server could not
// authenticate passes above within timeout, and returns the count.
func expectAuthFailures(t *testing.T, c *harness.Cluster, above float64, timeout time.Duration, why string) float64 {
	t.Helper()
	var n float64
	gomega.NewWithT(t).Eventually(func() (err error) {
		if n, err = c.AuthFailures(context.Background()); err != nil {
			return err
		}
		if n <= above {
			return fmt.Errorf("%s: %v requests not authenticated, want more than %v", c.Name, n, above)
		}
		return nil
	}).WithTimeout(timeout).WithPolling(harness.FastInterval).Should(gomega.Succeed(), why)
	return n
}
