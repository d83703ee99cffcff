//! Percentiles over measured durations.

use std::time::Duration;

/// Nearest-rank percentile (`p` in 0..=100) of `samples`, which it sorts.
pub fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}

/// Median and p99.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub n: usize,
    pub p50: Duration,
    pub p99: Duration,
}

pub fn summarize(samples: &mut [Duration]) -> Summary {
    Summary {
        n: samples.len(),
        p50: percentile(samples, 50.0),
        p99: percentile(samples, 99.0),
    }
}

/// Milliseconds with enough digits for sub-millisecond values.
pub fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 10.0 {
        format!("{ms:.3} ms")
    } else {
        format!("{ms:.1} ms")
    }
}
