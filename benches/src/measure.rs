//! Measuring one run (wall clock and process CPU time; the machine's and another process's CPU time,
//! and processes' resident memory, where `/proc` has them) and summarising several.

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

/// CPU time (user + system) used so far by every child process this process has waited for
/// (`getrusage(RUSAGE_CHILDREN)`): the difference around one child's life is that child's CPU time.
#[allow(unsafe_code)] // getrusage has no safe wrapper in std or libc
pub fn children_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: as in `process_cpu`: `usage` is valid for writes of one `rusage` and zero-initialised.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_CHILDREN, usage.as_mut_ptr());
        usage.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1_000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Clock ticks per second of `/proc`'s CPU times (`USER_HZ`).
#[allow(unsafe_code)] // sysconf has no safe wrapper in std or libc
fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a configuration value; it has no memory-safety preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

fn ticks(n: u64) -> Duration {
    Duration::from_secs_f64(n as f64 / clock_ticks_per_second())
}

/// CPU time of the whole machine so far, all CPUs summed, as (busy, total), from `/proc/stat`
/// (busy is everything but idle and I/O wait). `None` where unavailable (not Linux).
pub fn machine_cpu() -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> =
        stat.lines().next()?.strip_prefix("cpu ")?.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
    // user nice system idle iowait irq softirq steal (guest time is already included in user)
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some((ticks(total.saturating_sub(idle)), ticks(total)))
}

/// CPU time (user + system, all threads) used so far by another process of this machine, from
/// `/proc/<pid>/stat`. `None` if there is no such process (or no `/proc`).
pub fn other_process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields that follow start after the last ')'.
    let after_name: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Fields 14 (utime) and 15 (stime) of proc(5); `after_name` starts at field 3.
    let (utime, stime): (u64, u64) = (after_name.get(11)?.parse().ok()?, after_name.get(12)?.parse().ok()?);
    Some(ticks(utime + stime))
}

/// The peak resident set size, in KiB, of the largest child process waited for so far
/// (`getrusage(RUSAGE_CHILDREN).ru_maxrss`, which Linux reports in KiB).
#[allow(unsafe_code)] // getrusage has no safe wrapper in std or libc
pub fn children_max_rss_kib() -> u64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: as in `process_cpu`: `usage` is valid for writes of one `rusage` and zero-initialised.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_CHILDREN, usage.as_mut_ptr());
        usage.assume_init()
    };
    usage.ru_maxrss.max(0) as u64
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
    /// The run's warm window, where it has one (see [`Window`]).
    pub warm: Option<Window>,
}

/// The end of a run, from the moment a number of warm-up records had been processed: what a run
/// measures once a JIT (Kafka Streams' JVM) has compiled the hot path, and the same for the Rust
/// sides, so that the two are compared over the same share of the input.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Records in the window (the run's, less the warm-up).
    pub records: u64,
    /// Wall-clock time from the warm-up's end to the run's.
    pub elapsed: Duration,
    /// Process CPU time over `elapsed`.
    pub cpu: Duration,
}

impl Window {
    /// Records per second in the window.
    pub fn rps(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU seconds per million records in the window.
    pub fn cpu_s_per_m(&self) -> f64 {
        self.cpu.as_secs_f64() / self.records as f64 * 1e6
    }
}

/// The headers of [`Measurement::columns`], aligned with them.
pub fn column_headers() -> String {
    format!(
        "{:>11}  {:>12}  {:>9}  {:>12}  {:>7}  {:>7}",
        "records/s", "steady rec/s", "elapsed s", "1st record s", "cpu s", "cpu s/M"
    )
}

impl Measurement {
    /// The run's figures as table columns, under [`column_headers`].
    pub fn columns(&self) -> String {
        format!(
            "{:>11.0}  {:>12.0}  {:>9.3}  {:>12.3}  {:>7.2}  {:>7.2}",
            self.rps(),
            self.steady_rps(),
            self.elapsed.as_secs_f64(),
            self.first_record.as_secs_f64(),
            self.cpu.as_secs_f64(),
            self.cpu_s_per_m()
        )
    }

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

    /// Records per second in the warm window (NaN without one).
    pub fn warm_rps(&self) -> f64 {
        self.warm.map_or(f64::NAN, |w| w.rps())
    }

    /// CPU seconds per million records in the warm window (NaN without one).
    pub fn warm_cpu_s_per_m(&self) -> f64 {
        self.warm.map_or(f64::NAN, |w| w.cpu_s_per_m())
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
    use millrace_testkit::proc_status_kib;

    #[test]
    fn median_of_odd_and_even_samples() {
        let s = Summary::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Summary::of([4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert!(Summary::of([]).is_none());
    }

    #[test]
    fn reads_this_process_and_the_machine_from_proc() {
        let (busy, total) = machine_cpu().expect("/proc/stat on Linux");
        assert!(busy <= total && total > Duration::ZERO);
        assert!(other_process_cpu(std::process::id()).is_some());
        assert!(other_process_cpu(u32::MAX).is_none());
        // RSS first: the high-water mark read after it cannot be below it (other tests allocate meanwhile).
        let rss = proc_status_kib(None, "VmRSS").unwrap();
        let hwm = proc_status_kib(None, "VmHWM").unwrap();
        assert!(hwm >= rss && rss > 0);
        assert_eq!(proc_status_kib(Some(std::process::id()), "VmHWM").map(|h| h >= rss), Some(true));
        assert!(proc_status_kib(None, "NoSuchField").is_none());
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
