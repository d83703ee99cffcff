package harness

import (
	"context"
	"errors"
	"time"

	"github.com/onsi/gomega"
)

// Eventually is gomega's Eventually for the harness's own steps, which run outside a test too
// (TestMain starts the fleet) and return errors: check is polled every interval until it
// returns nil, for at most timeout (or until ctx ends); the error is gomega's failure message
// (the time waited and check's last error). A check that returns gomega.StopTrying(...)
// ends the wait at once. Tests use gomega.NewWithT(t) and the suite's expect* helpers.
func Eventually(ctx context.Context, timeout, interval time.Duration, check func() error) error {
	return assert(func(g gomega.Gomega) bool {
		return g.Eventually(ctx, check).WithTimeout(timeout).WithPolling(interval).Should(gomega.Succeed())
	})
}

// Consistently is gomega's Consistently with Eventually's error: check must return nil at every
// look, every interval, for duration.
func Consistently(ctx context.Context, duration, interval time.Duration, check func() error) error {
	return assert(func(g gomega.Gomega) bool {
		return g.Consistently(ctx, check).WithTimeout(duration).WithPolling(interval).Should(gomega.Succeed())
	})
}

// assert runs one gomega assertion with a fail handler that keeps the message.
func assert(run func(gomega.Gomega) bool) error {
	var failure string
	g := gomega.NewGomega(func(message string, _ ...int) { failure = message })
	if run(g) {
		return nil
	}
	return errors.New(failure)
}

// StopTrying ends an Eventually at once with err: the condition can no longer come true (a
// process exited, a pod was replaced).
func StopTrying(err error) error { return gomega.StopTrying(err.Error()).Wrap(err) }
