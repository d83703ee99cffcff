//! The broker's two clocks and client-go's whole seconds, in one place.
//!
//! The cache's schedule runs on two clocks: the monotonic one (tokio's `Instant`, what
//! paused-time tests drive) and the wall clock ([`wall_now`]), which expiries are stated in.
//! Where the monotonic clock lags the wall clock (a suspended or paused VM, a checkpointed and
//! restored container, a stepped clock), only the wall clock knows a credential has expired,
//! so every rule checks both. client-go's `expirationTimestamp` has whole seconds, so every
//! time handed to a caller is rounded here, once ([`whole_second_at_or_after`]).

use std::time::{Duration, SystemTime};

/// The wall clock. Tests move it ahead on their own thread ([`wall_ahead`]).
pub fn wall_now() -> SystemTime {
    #[cfg(test)]
    {
        SystemTime::now() + WALL_AHEAD.with(std::cell::Cell::get)
    }
    #[cfg(not(test))]
    {
        SystemTime::now()
    }
}

#[cfg(test)]
thread_local! {
    /// How far this test thread's wall clock is ahead of the system's ([`wall_now`]).
    static WALL_AHEAD: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

/// Moves this thread's wall clock `by` ahead of the monotonic one (paused tokio time stays).
#[cfg(test)]
pub(crate) fn wall_ahead(by: Duration) {
    WALL_AHEAD.with(|w| w.set(w.get() + by));
}

/// Puts this thread's wall clock back on the system's.
#[cfg(test)]
pub(crate) fn wall_reset() {
    WALL_AHEAD.with(|w| w.set(Duration::ZERO));
}

/// The first whole second at or after `t`. A come-back time truncated to its second could lie
/// in the past when it is less than a second away, and client-go would run the plugin again
/// at once: rounding up keeps it in the future.
pub fn whole_second_at_or_after(t: SystemTime) -> SystemTime {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since
        .as_secs()
        .saturating_add(u64::from(since.subsec_nanos() > 0));
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// The last whole second strictly before `t`: the latest come-back time a credential
/// expiring at `t` allows.
pub fn last_whole_second_before(t: SystemTime) -> SystemTime {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = if since.subsec_nanos() > 0 {
        since.as_secs()
    } else {
        since.as_secs().saturating_sub(1)
    };
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, nanos: u32) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::new(secs, nanos)
    }

    #[test]
    fn come_back_times_round_up_to_the_next_whole_second() {
        assert_eq!(whole_second_at_or_after(at(100, 300_000_000)), at(101, 0));
        assert_eq!(whole_second_at_or_after(at(100, 1)), at(101, 0));
        assert_eq!(whole_second_at_or_after(at(100, 0)), at(100, 0));
    }

    #[test]
    fn the_latest_come_back_is_strictly_before_the_expiry() {
        assert_eq!(last_whole_second_before(at(100, 0)), at(99, 0));
        assert_eq!(last_whole_second_before(at(100, 1)), at(100, 0));
        assert_eq!(last_whole_second_before(at(0, 0)), at(0, 0));
    }

    #[test]
    fn a_test_threads_wall_clock_moves_alone() {
        let before = wall_now();
        wall_ahead(Duration::from_secs(3600));
        assert!(wall_now() >= before + Duration::from_secs(3600));
        std::thread::spawn(|| assert!(wall_now() < SystemTime::now() + Duration::from_secs(60)))
            .join()
            .unwrap();
        wall_reset();
        assert!(wall_now() < before + Duration::from_secs(60));
    }
}
