//! The `dedup` benchmark: what Millrace's dedup store costs per record, and how fast a partition's
//! keys are restored from the changelog.
//!
//! # Workloads
//! Two fresh topics (random names, `--partitions` partitions) are pre-loaded before any timing, each
//! with `--records` records of `--value-size` bytes, Kafka keys drawn uniformly over `--keys` keys,
//! and an `idempotency-key` header (the [`DedupConfig`] default header) on every record:
//! - **0%** duplicates: every record has its own idempotency key (`ik-<n>`).
//! - **10%** duplicates: every tenth record (exactly `records / 10` of them) repeats the Kafka key
//!   *and* the idempotency key of an earlier, uniformly chosen non-duplicate record, as a producer
//!   retry or an upstream re-send would: an old key at a new offset. The Kafka key is repeated too
//!   because the store is per topic-partition: a repeated idempotency key is recognised only in the
//!   partition of its first occurrence, which is where real re-sends land.
//!
//! # The two sides
//! - **nodedup**: a [`Pipeline`] in [`ProcessingOrder::Key`] with default bounds and the `core` benchmark's
//!   no-op processor, dedup off.
//! - **dedup**: the same with `PipelineConfig::dedup(DedupConfig::new(dir))` (defaults: write-ahead
//!   log on, no fsync per write, changelog on), a fresh RocksDB directory per run under a temporary
//!   directory (`--dir` chooses where; its file system is printed). Every new key costs a RocksDB
//!   lookup, and a place in its partition's next batch (one acknowledged produce to the changelog
//!   topic `<group>.dedup-changelog` and one RocksDB write per batch) before its offset completes;
//!   a repeated key skips the processor.
//!
//! Each run uses a fresh consumer group, so it reads its topic from the beginning, and the clock
//! runs from spawning [`Pipeline::run`] until `processed + dedup_hits` reaches the record count
//! (checked every 2 ms), like `core`'s Millrace side. With a fresh group the dedup pipeline also
//! creates its changelog topic while timed (what the first start of a group does): the "from start"
//! figures include that, the "steady" figures (from the first completed record on) leave it out, as
//! they leave out group join and the first fetch for both sides. CPU time is the whole process's
//! (`getrusage`, all threads: librdkafka's and RocksDB's included) over the same interval. Pipeline
//! construction (which opens the RocksDB store) and shutdown are not timed. Under each run a line
//! gives what its counters showed (as in `core`) and how busy the whole machine was (`/proc/stat`):
//! on a small machine shared with a local broker a dedup run is CPU-bound, so a low ratio there is
//! a cost per record, not a wait. With `--broker-pid` the broker's CPU time per run is reported too,
//! since the changelog's writes are work for the broker.
//!
//! A pair is nodedup then dedup; every pair runs both workloads (0% pair, then 10% pair), for
//! `--pairs` pairs, so slow drift of a shared machine hits both sides alike. The result is, per
//! workload, the ratio of the median throughputs dedup/nodedup (the target is at least 0.85), and
//! the CPU seconds each spends per million records. Each dedup run is checked: on the 10% workload
//! exactly `records / 10` dedup hits, on the 0% workload none.
//!
//! # Restore rate
//! After each dedup run on the 0% workload (so the changelog holds one entry per record, in batch
//! records), a second
//! dedup pipeline starts in the **same** group with an **empty** RocksDB directory: its committed
//! offsets are at the end of the topic, so it processes nothing, but on assignment every partition
//! restores its keys from the changelog (before processing). Measured from spawning its run until
//! `dedup_restores` equals the partition count; reported as entries restored (`dedup_restored`) per
//! second of that interval, and also from the moment all partitions were assigned (restore proper,
//! group join left out). `--no-restore` skips it.
//!
//! # Experiments
//! `--only nodedup|dedup` runs one side and `--workload 0pct|10pct` one workload (e.g. to profile under
//! `perf record --call-graph dwarf`); `--no-restore` skips the restores; `--sync-writes` fsyncs every
//! RocksDB write; `--no-changelog` keeps RocksDB but drops the changelog (separating the two costs);
//! `--producer-property` tunes the changelog's producer; `--dir` puts the stores on another file
//! system. The canonical figures are those of the defaults.

mod output;
mod runs;

use crate::core_bench::parse_property;
use crate::kafka::{LoadSpec, TopicArgs};
use crate::measure::Measurement;
use anyhow::{Context as _, bail};
use millrace::{DedupConfig, PipelineConfig, ProcessingOrder, StatsSnapshot};
use millrace_testkit::{Admin, unique};
use output::{print_header, report};
pub(crate) use runs::load_workload;
use runs::measure_all;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Records per run with `--quick`.
const QUICK_RECORDS: u64 = 50_000;
/// How often a run checks the pipeline's counters.
const CHECK_EVERY: Duration = Duration::from_millis(2);
/// Pause between runs, so that the previous run's clients are fully gone before the next starts.
const SETTLE: Duration = Duration::from_millis(500);
/// One record in this many repeats an earlier idempotency key in the duplicates workload.
pub(crate) const DUPLICATE_EVERY: u64 = 10;
/// The ratio dedup/nodedup the dedup store should reach.
const TARGET_RATIO: f64 = 0.85;

/// Options of the `dedup` benchmark.
#[derive(Debug, clap::Args)]
pub struct DedupArgs {
    #[command(flatten)]
    topic: TopicArgs,
    /// Interleaved (nodedup, dedup) pairs per workload [default: 3, 1 with --quick].
    #[arg(long)]
    pairs: Option<usize>,
    /// Run one side only (for profiling it); no ratio is reported.
    #[arg(long, value_enum)]
    only: Option<Side>,
    /// Run one workload only.
    #[arg(long, value_enum)]
    workload: Option<Workload>,
    /// Skip the restore measurement.
    #[arg(long)]
    no_restore: bool,
    /// fsync every RocksDB write (`DedupConfig::sync_writes`; default off, as in `DedupConfig::new`).
    #[arg(long)]
    sync_writes: bool,
    /// Directory under which each run's RocksDB store is created (and removed) [default: the system
    /// temporary directory].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Experiment: dedup without the changelog topic (`DedupConfig::changelog = false`): RocksDB only.
    /// There is then nothing to restore.
    #[arg(long)]
    no_changelog: bool,
    /// A producer property for both sides' pipelines, as KEY=VALUE (repeatable), e.g. linger.ms=1; only
    /// the dedup side produces (its changelog writes).
    #[arg(long = "producer-property", value_name = "KEY=VALUE", value_parser = parse_property)]
    producer_properties: Vec<(String, String)>,
    /// Process id of a broker on this machine, to report its CPU time per run too (the changelog's
    /// writes are work for the broker, which shares the machine's CPUs when local).
    #[arg(long)]
    broker_pid: Option<u32>,
    /// Fail a run that has not finished after this many seconds.
    #[arg(long, default_value_t = 600)]
    run_timeout_secs: u64,
}

/// The two pipelines compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Side {
    /// Dedup off.
    Nodedup,
    /// Dedup on.
    Dedup,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Nodedup => "nodedup",
            Side::Dedup => "dedup",
        }
    }
}

/// The two pre-loaded topics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Workload {
    /// Every record has its own idempotency key.
    #[value(name = "0pct")]
    Unique,
    /// One record in ten repeats an earlier record's idempotency key.
    #[value(name = "10pct")]
    Duplicates,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Unique => "0%",
            Workload::Duplicates => "10%",
        }
    }

    /// Records of `records` that repeat an earlier idempotency key.
    fn duplicates(self, records: u64) -> u64 {
        match self {
            Workload::Unique => 0,
            Workload::Duplicates => records / DUPLICATE_EVERY,
        }
    }
}

/// Resolved settings of one benchmark invocation.
#[derive(Debug, Clone)]
struct Plan {
    bootstrap: String,
    /// The workloads run, with their topics.
    topics: Vec<(Workload, String)>,
    partitions: i32,
    load: LoadSpec,
    pairs: usize,
    sides: Vec<Side>,
    restore: bool,
    sync_writes: bool,
    changelog: bool,
    producer_properties: Vec<(String, String)>,
    broker_pid: Option<u32>,
    /// Holds every run's store; removed at the end.
    base_dir: PathBuf,
    run_timeout: Duration,
}

impl Plan {
    fn records(&self) -> u64 {
        self.load.records
    }

    fn config(&self, topic: &str, group: &str, dedup_dir: Option<&Path>) -> PipelineConfig {
        let mut config = PipelineConfig::new(&self.bootstrap, group, [topic]).ordering(ProcessingOrder::Key);
        for (k, v) in &self.producer_properties {
            config = config.producer_property(k, v);
        }
        match dedup_dir {
            Some(dir) => config.dedup(DedupConfig {
                sync_writes: self.sync_writes,
                changelog: self.changelog,
                ..DedupConfig::new(dir)
            }),
            None => config,
        }
    }
}

/// What one timed run measured.
#[derive(Debug, Clone)]
struct Run {
    workload: Workload,
    side: Side,
    m: Measurement,
    /// From the start to the first completed record.
    first_done: Duration,
    /// Records completed (processed or skipped) when the first completion was seen.
    done_at_first: u64,
    /// The counters when the run ended.
    end: StatsSnapshot,
    /// Share of the machine's CPU time that was busy (all processes), if known.
    machine_busy: Option<f64>,
    /// CPU time of the broker process (`--broker-pid`), if known.
    broker_cpu: Option<Duration>,
}

impl Run {
    /// The broker's CPU seconds per million records, if known.
    fn broker_cpu_s_per_m(&self) -> Option<f64> {
        Some(self.broker_cpu?.as_secs_f64() / self.m.records as f64 * 1e6)
    }

    /// Records per second from the first completed record on (group join, first fetch and the
    /// changelog topic's creation left out).
    fn steady_rps(&self) -> f64 {
        let after = self.m.elapsed.saturating_sub(self.first_done).as_secs_f64();
        if after > 0.0 { self.m.records.saturating_sub(self.done_at_first) as f64 / after } else { f64::NAN }
    }
}

/// What one restore measured.
#[derive(Debug, Clone, Copy)]
struct Restore {
    /// Entries applied from the changelog (`dedup_restored`).
    entries: u64,
    /// From the start to `dedup_restores == partitions`.
    elapsed: Duration,
    /// From the start to every partition being assigned.
    assigned: Duration,
    cpu: Duration,
    /// The counters at the end: `polled` should be 0 (offsets were committed at the end).
    end: StatsSnapshot,
}

impl Restore {
    fn rate(&self) -> f64 {
        self.entries as f64 / self.elapsed.as_secs_f64()
    }

    /// Entries per second once every partition was assigned (group join left out).
    fn rate_after_assignment(&self) -> f64 {
        let after = self.elapsed.saturating_sub(self.assigned).as_secs_f64();
        if after > 0.0 { self.entries as f64 / after } else { f64::NAN }
    }
}

/// Everything measured, and whether the checks held.
#[derive(Debug, Default)]
struct Results {
    runs: Vec<Run>,
    restores: Vec<Restore>,
    /// Failed checks (wrong dedup hit counts, a restore that processed records …).
    problems: Vec<String>,
}

/// Runs the `dedup` benchmark and prints its report.
pub async fn run(args: DedupArgs) -> anyhow::Result<()> {
    let workloads = args.workload.map_or_else(|| vec![Workload::Unique, Workload::Duplicates], |w| vec![w]);
    let tag = |w: Workload| match w {
        Workload::Unique => "0pct",
        Workload::Duplicates => "10pct",
    };
    let sides = args.only.map_or_else(|| vec![Side::Nodedup, Side::Dedup], |side| vec![side]);
    let plan = Plan {
        bootstrap: args.topic.bootstrap(),
        topics: workloads.iter().map(|&w| (w, unique(&format!("millrace-bench-dedup-{}", tag(w))))).collect(),
        partitions: args.topic.partitions,
        load: args.topic.load(500_000, QUICK_RECORDS),
        pairs: args.pairs.unwrap_or(if args.topic.quick { 1 } else { 3 }),
        restore: !args.no_restore
            && !args.no_changelog
            && sides.contains(&Side::Dedup)
            && workloads.contains(&Workload::Unique),
        sides,
        sync_writes: args.sync_writes,
        changelog: !args.no_changelog,
        producer_properties: args.producer_properties,
        broker_pid: args.broker_pid,
        base_dir: args.dir.unwrap_or_else(std::env::temp_dir).join(unique("millrace-bench-dedup")),
        run_timeout: Duration::from_secs(args.run_timeout_secs),
    };
    if plan.records() < DUPLICATE_EVERY || plan.pairs == 0 || plan.partitions < 1 {
        bail!("--records must be at least {DUPLICATE_EVERY}, --pairs and --partitions at least 1");
    }
    std::fs::create_dir_all(&plan.base_dir)
        .with_context(|| format!("creating the store directory {}", plan.base_dir.display()))?;
    print_header(&plan);

    let admin = Admin::new(&plan.bootstrap)?;
    let mut topics = Vec::new();
    let mut groups = Vec::new();
    let mut result = Ok(Results::default());
    for (_, topic) in &plan.topics {
        if let Err(e) = admin.create_topic(topic, plan.partitions, &[]).await {
            result = Err(e);
            break;
        }
        topics.push(topic.clone());
    }
    if result.is_ok() {
        result = measure_all(&plan, &mut groups, &mut topics).await;
    }
    admin.clean_up(&topics, &groups).await;
    if let Err(e) = std::fs::remove_dir_all(&plan.base_dir) {
        eprintln!("warning: removing {}: {e}", plan.base_dir.display());
    }
    let results = result?;
    report(&plan, &results);
    Ok(())
}
