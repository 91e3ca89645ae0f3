//! The `slow` benchmark: a slow processor on one partition, in every ordering mode, against the ideal
//! that the concurrency bound allows (the shape of Confluent Parallel Consumer's published table).
//!
//! # Workload
//! Fresh one-partition topics (random names) are pre-loaded with `--records` records (default 10,000)
//! of `--value-size` bytes, one topic per key count of `--key-counts` (default 1, 10, 100 and 10,000
//! distinct keys, each record's key drawn uniformly). The processor sleeps (`tokio::time::sleep`, so
//! it waits without holding a thread) for a delay drawn uniformly from 0 to `--max-delay-us` µs
//! (default 5 ms). The delay is a function of the record's offset and the invocation's seed
//! (printed; `--seed` repeats it, keys included), so every run, whatever its topic, sleeps the same
//! multiset of delays and the ideal is the same for all of them. Every sleep is recorded: its
//! record's key, the delay asked for, and when it began and ended (`Instant`s taken around the sleep).
//!
//! # Runs
//! A [`Pipeline`] with `Bounds::max_concurrency = --concurrency` (default 100; the other bounds are
//! the defaults), a fresh consumer group per run, in these configurations:
//! [`ProcessingOrder::Partition`]; [`ProcessingOrder::Key`] on each key-count topic; [`ProcessingOrder::Unordered`]
//! (Partition and Unordered read the 100-key topic, or the first one; their keys do not matter).
//! The configurations run round-robin, `--pairs` times (default 2), and the summary gives the medians.
//!
//! # What is measured
//! **elapsed** is the processing window: from the first sleep's start to the last sleep's end, so
//! group join and the first fetch (the same for every configuration, and large next to the
//! ~0.3 s ideal) are left out; "from start" (spawning `Pipeline::run` until the `processed` counter
//! reached the record count, checked every 2 ms) is printed too. records/s is records / elapsed.
//!
//! # Ideals and bounds
//! - **ideal**: the sum of the requested delays / concurrency: every permit busy all the time.
//! - **ideal (ms)**: the same with every delay rounded up to a whole millisecond. Tokio's timer
//!   has a 1 ms granularity: a sleep's deadline is rounded up to a millisecond tick (counted from the
//!   runtime's start), and a worker with nothing else to do parks for the whole number of ticks from
//!   the tick it is in to that one, i.e. from *its own moment*, not from a tick boundary. A sleep of
//!   `d` begun a fraction `p` of a tick after a boundary thus lasts about `ceil(p + d)` ms: `d` plus
//!   one millisecond on average (`d` rounded up is only half a millisecond more), plus any wake-up
//!   delay. The "act" columns use the measured sleeps, which include all of that.
//! - **ideal (act)**: the sum of the measured sleeps / concurrency: the processor's real service
//!   time, the ideal a scheduler can be held to (it cannot make the timer more precise).
//! - **bound**: a simulation of Millrace's discipline with zero overhead: every record available at
//!   once, in offset order; a record starts when its lane (the partition, its key, or itself) is
//!   free and a permit is (permits handed out first come, first served), and lasts its delay. For
//!   key order this is essentially `max(total / concurrency, the longest key's total)`: with 100 keys
//!   drawn uniformly over 10,000 records the busiest key carries about 30% more work than the average
//!   key (more records, and by chance longer delays; 1.23-1.39 times in 90% of random draws), and its
//!   records must run one after another; with no more keys than permits the permits never bind, and
//!   this bound is exact: no key-ordered scheduler can do better with these delays. So the 1.3x
//!   target against the ideal sits at the median of what key order permits at all, whatever the
//!   framework. The bound is computed with the requested delays, the rounded ones, and the measured
//!   ones; elapsed / bound (act) is what Millrace itself adds (polling, dispatch, waking), with the
//!   timer's cost and the key order's inherent tail left out.
//! - **concurrency**: the sum of the measured sleeps / elapsed: how many records were asleep on
//!   average.
//!
//! The targets: key order with 100 keys at least 50 times partition order's throughput, and within
//! 1.3 times the ideal. Elapsed / ideal (requested) factors into the key order's tail (bound req /
//! ideal req), the timer (bound act / bound req) and Millrace's own overhead (elapsed / bound act),
//! which the summary shows separately.

mod analysis;
mod output;
mod runs;

use crate::core_bench::load_average;
use anyhow::bail;
use millrace::{Context, PipelineConfig, ProcessError, ProcessingOrder, Processor, Record};
use millrace_testkit::{Admin, unique};
use output::report;
use rand::{RngExt, SeedableRng};
use runs::measure_all;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Records per topic with `--quick`.
const QUICK_RECORDS: u64 = 1_000;
/// How often a run checks the pipeline's counters.
const CHECK_EVERY: Duration = Duration::from_millis(2);
/// Pause between runs, so that the previous run's clients are fully gone before the next starts.
const SETTLE: Duration = Duration::from_millis(500);
/// Target: key order (100 keys) throughput / partition order throughput, at least.
const TARGET_SPEEDUP: f64 = 50.0;
/// Target: key order (100 keys) elapsed / ideal, at most.
const TARGET_VS_IDEAL: f64 = 1.3;
/// The key count the targets are about.
const KEYS_FOR_TARGETS: u64 = 100;

/// Options of the `slow` benchmark.
#[derive(Debug, clap::Args)]
pub struct SlowArgs {
    /// Records per topic, all on one partition [default: 10000, 1000 with --quick].
    #[arg(long)]
    records: Option<u64>,
    /// Bytes per record value.
    #[arg(long, default_value_t = 100)]
    value_size: usize,
    /// Distinct keys of the key-order runs, one topic (and one configuration) each.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 10, 100, 10_000])]
    key_counts: Vec<u64>,
    /// `Bounds::max_concurrency` of every run.
    #[arg(long, default_value_t = 100)]
    concurrency: usize,
    /// Longest delay of the processor, in microseconds (delays are uniform from 0 to this).
    #[arg(long, default_value_t = 5_000)]
    max_delay_us: u64,
    /// Rounds of every configuration, interleaved round-robin [default: 2, 1 with --quick].
    #[arg(long)]
    pairs: Option<usize>,
    /// A smoke run: 1000 records and one round, unless --records or --pairs say otherwise.
    #[arg(long)]
    quick: bool,
    /// Seed of the delays [default: random, printed].
    #[arg(long)]
    seed: Option<u64>,
    /// Brokers; defaults to KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092.
    #[arg(long)]
    bootstrap: Option<String>,
    /// Fail a run that has not processed every record after this many seconds.
    #[arg(long, default_value_t = 600)]
    run_timeout_secs: u64,
}

/// One configuration: an ordering mode (and, for key order, the topic's key count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Partition,
    Key(u64),
    Unordered,
}

impl Mode {
    fn name(self) -> String {
        match self {
            Mode::Partition => "partition".into(),
            Mode::Key(k) => format!("key-{k}"),
            Mode::Unordered => "unordered".into(),
        }
    }

    fn ordering(self) -> ProcessingOrder {
        match self {
            Mode::Partition => ProcessingOrder::Partition,
            Mode::Key(_) => ProcessingOrder::Key,
            Mode::Unordered => ProcessingOrder::Unordered,
        }
    }
}

/// Resolved settings of one benchmark invocation.
#[derive(Debug, Clone)]
struct Plan {
    bootstrap: String,
    records: u64,
    value_size: usize,
    concurrency: usize,
    max_delay: Duration,
    seed: u64,
    pairs: usize,
    /// Topic per key count.
    topics: Vec<(u64, String)>,
    /// The configurations and the topic each reads.
    modes: Vec<(Mode, String)>,
    run_timeout: Duration,
}

/// The delay of the record at `offset`: uniform over 0..=`max`, in whole microseconds.
fn delay_of(seed: u64, offset: i64, max: Duration) -> Duration {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (offset as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    Duration::from_micros(rng.random_range(0..=max.as_micros() as u64))
}

/// One sleep of the processor.
#[derive(Debug, Clone)]
struct Slept {
    offset: i64,
    key: Option<Vec<u8>>,
    requested: Duration,
    began: Instant,
    ended: Instant,
}

impl Slept {
    fn actual(&self) -> Duration {
        self.ended - self.began
    }
}

/// The processor: sleeps for its record's delay and records the sleep.
struct Sleeper {
    seed: u64,
    max_delay: Duration,
    log: Arc<Mutex<Vec<Slept>>>,
}

impl Processor for Sleeper {
    async fn process(&self, record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        let requested = delay_of(self.seed, record.offset, self.max_delay);
        let began = Instant::now();
        tokio::time::sleep(requested).await;
        let ended = Instant::now();
        let slept = Slept { offset: record.offset, key: record.key.clone(), requested, began, ended };
        self.log.lock().unwrap_or_else(|p| p.into_inner()).push(slept);
        Ok(())
    }
}

/// Sums of delays (or lower bounds) in three flavours: as requested, rounded up to whole
/// milliseconds, and as measured.
#[derive(Debug, Clone, Copy, Default)]
struct Triple {
    requested: Duration,
    whole_ms: Duration,
    actual: Duration,
}

/// `d` rounded up to a whole millisecond.
fn ceil_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_nanos().div_ceil(1_000_000) as u64)
}

/// What one run measured.
#[derive(Debug, Clone)]
struct Run {
    mode: Mode,
    /// First sleep's start to last sleep's end.
    elapsed: Duration,
    /// Spawning the pipeline to the last record counted as processed.
    from_start: Duration,
    /// Sleeps recorded (more than the records if some were redelivered).
    sleeps: usize,
    /// Sum of the sleeps / concurrency.
    ideal: Triple,
    /// The zero-overhead simulation of the run's ordering.
    bound: Triple,
    /// Mean measured sleep minus mean requested delay.
    overshoot: Duration,
    running_peak: u64,
}

impl Run {
    fn rps(&self, records: u64) -> f64 {
        records as f64 / self.elapsed.as_secs_f64()
    }

    /// Records asleep on average over the window.
    fn concurrency(&self, plan: &Plan) -> f64 {
        self.ideal.actual.as_secs_f64() * plan.concurrency as f64 / self.elapsed.as_secs_f64()
    }
}

/// Runs the `slow` benchmark and prints its report.
pub async fn run(args: SlowArgs) -> anyhow::Result<()> {
    let records = args.records.unwrap_or(if args.quick { QUICK_RECORDS } else { 10_000 });
    let pairs = args.pairs.unwrap_or(if args.quick { 1 } else { 2 });
    if records == 0 || pairs == 0 || args.concurrency == 0 || args.key_counts.is_empty() {
        bail!("--records, --pairs, --concurrency and --key-counts must be at least 1");
    }
    if args.key_counts.contains(&0) {
        bail!("a key count must be at least 1");
    }
    let mut key_counts = args.key_counts.clone();
    key_counts.dedup();
    let topics: Vec<(u64, String)> =
        key_counts.iter().map(|&k| (k, unique(&format!("millrace-bench-slow-{k}keys")))).collect();
    let shared_topic = topics.iter().find(|(k, _)| *k == KEYS_FOR_TARGETS).unwrap_or(&topics[0]).1.clone();
    let mut modes = vec![(Mode::Partition, shared_topic.clone())];
    modes.extend(topics.iter().map(|(k, t)| (Mode::Key(*k), t.clone())));
    modes.push((Mode::Unordered, shared_topic));
    let plan = Plan {
        bootstrap: args.bootstrap.unwrap_or_else(PipelineConfig::bootstrap_from_env),
        records,
        value_size: args.value_size,
        concurrency: args.concurrency,
        max_delay: Duration::from_micros(args.max_delay_us),
        seed: args.seed.unwrap_or_else(|| rand::rng().random()),
        pairs,
        topics,
        modes,
        run_timeout: Duration::from_secs(args.run_timeout_secs),
    };
    println!(
        "slow: {} records x {} B values on one partition, keys {:?}, processor sleeping uniform 0-{} us \
         (tokio::time::sleep, seed {}), max_concurrency {}, {} round(s), brokers {}, {} CPUs, load average {}",
        plan.records,
        plan.value_size,
        key_counts,
        plan.max_delay.as_micros(),
        plan.seed,
        plan.concurrency,
        plan.pairs,
        plan.bootstrap,
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average(),
    );

    let admin = Admin::new(&plan.bootstrap)?;
    let mut created = Vec::new();
    let mut groups = Vec::new();
    let mut result = Ok(Vec::new());
    for (_, topic) in &plan.topics {
        if let Err(e) = admin.create_topic(topic, 1, &[]).await {
            result = Err(e);
            break;
        }
        created.push(topic.clone());
    }
    if result.is_ok() {
        result = measure_all(&plan, &mut groups).await;
    }
    admin.clean_up(&created, &groups).await;
    let runs = result?;
    report(&plan, &runs);
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::analysis::simulate;
    use super::*;

    #[test]
    fn simulation_follows_lanes_and_permits() {
        // One lane: everything in series.
        assert_eq!(simulate(&[(0, 3), (0, 4), (0, 5)], 10), 12);
        // Separate lanes, enough permits: the longest job.
        assert_eq!(simulate(&[(0, 3), (1, 4), (2, 5)], 10), 5);
        // Separate lanes, one permit: in series again.
        assert_eq!(simulate(&[(0, 3), (1, 4), (2, 5)], 1), 12);
        // Two permits: 0 and 1 start; 2 takes 0's permit at 3 and ends at 8.
        assert_eq!(simulate(&[(0, 3), (1, 4), (2, 5)], 2), 8);
        // The busiest lane bounds the makespan: lane 0 holds 3 + 3, lane 1 holds 1.
        assert_eq!(simulate(&[(0, 3), (1, 1), (0, 3)], 2), 6);
    }

    #[test]
    fn delays_are_uniform_and_repeatable() {
        let max = Duration::from_millis(5);
        let delays: Vec<Duration> = (0..20_000).map(|o| delay_of(7, o, max)).collect();
        assert!(delays.iter().all(|d| *d <= max));
        let mean = delays.iter().sum::<Duration>().as_secs_f64() / delays.len() as f64;
        assert!((mean - 0.0025).abs() < 0.0001, "mean {mean}");
        assert_eq!(delay_of(7, 42, max), delays[42]);
        let other_seed: Vec<Duration> = (0..10).map(|o| delay_of(8, o, max)).collect();
        assert_ne!(other_seed, delays[..10]);
        assert_eq!(ceil_ms(Duration::from_micros(1)), Duration::from_millis(1));
        assert_eq!(ceil_ms(Duration::from_millis(2)), Duration::from_millis(2));
        assert_eq!(ceil_ms(Duration::ZERO), Duration::ZERO);
    }
}
