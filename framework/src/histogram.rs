//! Duration histograms on the per-record path, at the cost of a counter.
//!
//! Recording every attempt into the metrics recorder's histogram pushes one sample per record into a
//! structure all worker threads share (measured: F_alos with the listener on ran at 0.90 of F_alos
//! off, +8% CPU per record). Instead each partition task counts its records' durations into a
//! [`TaskHistogram`] of fixed buckets that only that task writes (its processing futures are polled
//! by the task alone, so a relaxed load and store suffice), and moves the counts into the pipeline's
//! [`Histogram`] once per batch of work, with the rest of its tally. The publisher copies the
//! cumulative bucket counts to `<name>_bucket{le}` counters (with `_sum` and `_count`) once a
//! second: the series a Prometheus histogram has, that `histogram_quantile` reads.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Bucket upper bounds (seconds) for every duration: 1 ms to 5 min, then +Inf.
pub(crate) const BUCKETS: [f64; 16] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// The bucket bounds in microseconds, for the comparison on the hot path.
const BOUNDS_US: [u64; 16] = [
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    30_000_000,
    60_000_000,
    300_000_000,
];

/// Slots: one per bound and one for +Inf.
const SLOTS: usize = BUCKETS.len() + 1;

/// Counts per bucket (not cumulative), the sum in microseconds and nothing else: the count is the
/// sum of the buckets.
#[derive(Debug, Default)]
struct Counts {
    buckets: [AtomicU64; SLOTS],
    sum_us: AtomicU64,
}

fn slot(us: u64) -> usize {
    BOUNDS_US.iter().position(|&b| us <= b).unwrap_or(BUCKETS.len())
}

/// One partition task's counts since its last flush. Written by that task only.
#[derive(Debug, Default)]
pub(crate) struct TaskHistogram(Counts);

impl TaskHistogram {
    /// Counts one duration. Only the owning task calls this (a load and a store, no lock prefix).
    pub(crate) fn record(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let bucket = &self.0.buckets[slot(us)];
        bucket.store(bucket.load(Relaxed) + 1, Relaxed);
        self.0.sum_us.store(self.0.sum_us.load(Relaxed).saturating_add(us), Relaxed);
    }

    /// Moves the counts into `into` (the owning task only).
    pub(crate) fn flush(&self, into: &Histogram) {
        for (mine, shared) in self.0.buckets.iter().zip(&into.0.buckets) {
            let n = mine.load(Relaxed);
            if n > 0 {
                mine.store(0, Relaxed);
                shared.fetch_add(n, Relaxed);
            }
        }
        let sum = self.0.sum_us.load(Relaxed);
        if sum > 0 {
            self.0.sum_us.store(0, Relaxed);
            into.0.sum_us.fetch_add(sum, Relaxed);
        }
    }
}

/// A pipeline's histogram: what its tasks flushed.
#[derive(Debug, Default)]
pub(crate) struct Histogram(Counts);

/// A histogram as Prometheus exposes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HistogramSnapshot {
    /// Cumulative counts per bound of [`BUCKETS`], then +Inf (= the count).
    pub(crate) cumulative: [u64; SLOTS],
    pub(crate) sum_seconds: f64,
}

impl HistogramSnapshot {
    pub(crate) fn count(&self) -> u64 {
        self.cumulative[BUCKETS.len()]
    }
}

impl Histogram {
    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = [0; SLOTS];
        let mut total = 0;
        for (c, b) in cumulative.iter_mut().zip(&self.0.buckets) {
            total += b.load(Relaxed);
            *c = total;
        }
        HistogramSnapshot { cumulative, sum_seconds: self.0.sum_us.load(Relaxed) as f64 / 1e6 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_match_the_buckets() {
        for (us, s) in BOUNDS_US.iter().zip(BUCKETS) {
            assert_eq!(*us, (s * 1e6).round() as u64);
        }
    }

    #[test]
    fn counts_are_cumulative_and_flushed_once() {
        let shared = Histogram::default();
        let task = TaskHistogram::default();
        for ms in [0, 1, 2, 40, 400_000] {
            task.record(Duration::from_millis(ms));
        }
        assert_eq!(shared.snapshot().count(), 0, "nothing before the flush");
        task.flush(&shared);
        task.flush(&shared);
        task.record(Duration::from_millis(3));
        task.flush(&shared);
        let s = shared.snapshot();
        // <= 1 ms: 0 and 1; <= 2.5 ms: + 2; <= 5 ms: + 3; <= 50 ms: + 40; +Inf: + 400 s.
        assert_eq!(&s.cumulative[..6], &[2, 3, 4, 4, 4, 5]);
        assert_eq!((s.count(), s.cumulative[15]), (6, 5));
        assert!((s.sum_seconds - 400.046).abs() < 1e-9, "{}", s.sum_seconds);
    }
}
