package harness

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// The harness's waits are gomega's, with the failure returned: these pin what the suite's
// harness steps rely on (nil once the check passes, the last error when it never does, an
// early end on StopTrying, Consistently failing at the first bad look).

func TestEventuallyPassesOnceTheCheckDoes(t *testing.T) {
	n := 0
	err := Eventually(context.Background(), 5*time.Second, time.Millisecond, func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || n != 3 {
		t.Fatalf("Eventually = %v after %d looks; want nil after 3", err, n)
	}
}

func TestEventuallyReturnsTheLastErrorWhenTimedOut(t *testing.T) {
	start := time.Now()
	err := Eventually(context.Background(), 50*time.Millisecond, 5*time.Millisecond, func() error { return errors.New("still 3 pods") })
	if err == nil || !strings.Contains(err.Error(), "still 3 pods") || !strings.Contains(err.Error(), "Timed out") {
		t.Fatalf("Eventually = %v; want gomega's time-out naming the last error", err)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("gave up after %s, before its 50ms", d)
	}
}

func TestEventuallyStopsAtStopTrying(t *testing.T) {
	n := 0
	start := time.Now()
	err := Eventually(context.Background(), time.Minute, time.Millisecond, func() error {
		n++
		return StopTrying(errors.New("kueue exited"))
	})
	if err == nil || !strings.Contains(err.Error(), "kueue exited") || n != 1 || time.Since(start) > 10*time.Second {
		t.Fatalf("Eventually = %v after %d looks, %s; want the StopTrying error at once", err, n, time.Since(start))
	}
}

func TestConsistentlyFailsAtTheFirstBadLook(t *testing.T) {
	if err := Consistently(context.Background(), 30*time.Millisecond, 5*time.Millisecond, func() error { return nil }); err != nil {
		t.Fatalf("Consistently of a passing check = %v", err)
	}
	n := 0
	err := Consistently(context.Background(), time.Minute, time.Millisecond, func() error {
		if n++; n == 3 {
			return errors.New("admitted")
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "admitted") || n != 3 {
		t.Fatalf("Consistently = %v after %d looks; want the third look's error", err, n)
	}
}
