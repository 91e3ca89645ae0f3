//! Measuring one run (wall clock and process CPU time) and summarising several.

use std::time::{Duration, Instant};

/// CPU time (user + system) used so far by every thread of this process.
#[allow(unsafe_code)] // getrusage has no safe wrapper in std or libc
pub fn process_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is valid for writes of one `rusage`; getrusage fills it and returns 0 on success.
    // On failure (impossible for RUSAGE_SELF with a valid pointer) the zeroed value is still initialised.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1_000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// A stopwatch over both wall clock and process CPU time.
pub struct Stopwatch {
    wall: Instant,
    cpu: Duration,
}

impl Stopwatch {
    /// Starts both clocks now.
    pub fn start() -> Self {
        Self { wall: Instant::now(), cpu: process_cpu() }
    }

    /// Wall-clock time since the start.
    pub fn elapsed(&self) -> Duration {
        self.wall.elapsed()
    }

    /// Stops: wall-clock and CPU time since the start.
    pub fn stop(&self) -> (Duration, Duration) {
        (self.wall.elapsed(), process_cpu().saturating_sub(self.cpu))
    }
}

/// What one timed run measured.
#[derive(Debug, Clone, Copy)]
pub struct Measurement {
    /// Records consumed and acknowledged.
    pub records: u64,
    /// From the start (before joining the group) to the last record.
    pub elapsed: Duration,
    /// From the start to the first record polled (group join, first fetch).
    pub first_record: Duration,
    /// Process CPU time over `elapsed`.
    pub cpu: Duration,
}

impl Measurement {
    /// Records per second over the whole run.
    pub fn rps(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64()
    }

    /// Records per second after the first record arrived (group join and first fetch left out).
    pub fn steady_rps(&self) -> f64 {
        let after_first = self.elapsed.saturating_sub(self.first_record).as_secs_f64();
        if after_first > 0.0 { self.records.saturating_sub(1) as f64 / after_first } else { f64::NAN }
    }

    /// CPU seconds per million records.
    pub fn cpu_s_per_m(&self) -> f64 {
        self.cpu.as_secs_f64() / self.records as f64 * 1e6
    }
}

/// Median, minimum and maximum of a sample.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// The middle value (mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Summary {
    /// Summarises `values`; `None` when empty.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut v: Vec<f64> = values.into_iter().collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Self { median, min: v[0], max: v[n - 1] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_samples() {
        let s = Summary::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Summary::of([4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert!(Summary::of([]).is_none());
    }

    #[test]
    fn cpu_time_advances_with_work() {
        let before = process_cpu();
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        std::hint::black_box(x);
        assert!(process_cpu() > before);
    }
}
