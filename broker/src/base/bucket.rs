//! A token bucket: so many a second, with a burst at once. The one pace the broker puts on
//! what a caller can repeat at will: the rate limit's calls, the refusals it answers, the
//! refused peers' connections it serves.
//!
//! Kept as the time the bucket is full again (the generic cell rate algorithm), not as a
//! count of tokens: whole nanoseconds, so that a bucket refilled for exactly one interval
//! always has exactly one token back (a count in floating point may come back a hair short),
//! and one `Instant` a bucket.

use std::time::Duration;

use tokio::time::Instant;

/// Tokens refilled at `per_second` up to `burst`; full when new.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    /// The time one token takes to come back.
    each: Duration,
    /// How long the bucket takes to refill from empty: `burst` tokens.
    depth: Duration,
    /// When the bucket is full again, had no token been taken since; at or before now, it is.
    full_at: Instant,
}

impl TokenBucket {
    /// A full bucket. `per_second` of 0 is read as 1; over a billion, every take succeeds.
    pub fn new(per_second: u32, burst: u32, now: Instant) -> Self {
        let each = Duration::from_secs(1) / per_second.max(1);
        Self {
            each,
            depth: each * burst,
            full_at: now,
        }
    }

    /// Takes a token if there is one.
    pub fn try_take(&mut self, now: Instant) -> bool {
        let after = self.full_at.max(now) + self.each;
        if after.saturating_duration_since(now) > self.depth {
            return false;
        }
        self.full_at = after;
        true
    }

    /// Takes a token whether there is one or not: the bucket may go into debt, which it pays
    /// back at its rate. Says until when it is in debt, if it is.
    pub fn take(&mut self, now: Instant) -> Option<Instant> {
        self.full_at = self.full_at.max(now) + self.each;
        self.owed_until(now)
    }

    /// Until when the bucket is in debt (more taken than it held), if it is at `now`.
    pub fn owed_until(&self, now: Instant) -> Option<Instant> {
        let until = self.full_at.checked_sub(self.depth)?;
        (until > now).then_some(until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_at_once_then_one_per_interval_and_never_past_the_burst() {
        let mut bucket = TokenBucket::new(10, 5, Instant::now());
        assert_eq!(
            (0..10).filter(|_| bucket.try_take(Instant::now())).count(),
            5
        );
        for _ in 0..50 {
            tokio::time::advance(Duration::from_millis(100)).await;
            assert!(bucket.try_take(Instant::now()), "one back per 1/10 s");
            assert!(!bucket.try_take(Instant::now()), "and only one");
        }
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(
            (0..10).filter(|_| bucket.try_take(Instant::now())).count(),
            5,
            "refilled up to the burst"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_that_does_not_divide_a_second_refills_a_token_per_interval() {
        // 1 s / 3 is 333 333 333 ns: three tokens back a nanosecond short of a second.
        let mut bucket = TokenBucket::new(3, 3, Instant::now());
        assert_eq!(
            (0..10).filter(|_| bucket.try_take(Instant::now())).count(),
            3
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            (0..10).filter(|_| bucket.try_take(Instant::now())).count(),
            3
        );
        for _ in 0..300 {
            tokio::time::advance(Duration::from_secs(1) / 3).await;
            assert!(bucket.try_take(Instant::now()), "one back per interval");
            assert!(!bucket.try_take(Instant::now()), "and only one");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_debt_is_paid_back_at_the_rate() {
        let mut bucket = TokenBucket::new(100, 16, Instant::now());
        let step = Duration::from_millis(10);
        for n in 1..=16 {
            assert_eq!(
                bucket.take(Instant::now()),
                None,
                "take {n} is in the burst"
            );
        }
        assert_eq!(bucket.take(Instant::now()), Some(Instant::now() + step));
        assert_eq!(bucket.take(Instant::now()), Some(Instant::now() + 2 * step));
        assert_eq!(
            bucket.owed_until(Instant::now()),
            Some(Instant::now() + 2 * step)
        );
        assert!(!bucket.try_take(Instant::now()), "in debt, nothing to take");
        tokio::time::advance(2 * step).await;
        assert_eq!(bucket.owed_until(Instant::now()), None);
        assert!(
            !bucket.try_take(Instant::now()),
            "out of debt is empty, not full"
        );
        tokio::time::advance(step).await;
        assert!(bucket.try_take(Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn extreme_rates_neither_panic_nor_stop() {
        let now = Instant::now();
        let mut unlimited = TokenBucket::new(u32::MAX, 1, now);
        assert!((0..1_000).all(|_| unlimited.try_take(now)));
        let mut slow = TokenBucket::new(0, u32::MAX, now);
        assert!((0..1_000).all(|_| slow.try_take(now)));
        let mut none = TokenBucket::new(1, 0, now);
        assert!(!none.try_take(now));
        assert_eq!(none.take(now), Some(now + Duration::from_secs(1)));
    }
}
