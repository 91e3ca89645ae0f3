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
//!   lookup and write and an acknowledged produce to the compacted changelog topic
//!   `<group>.dedup-changelog` before its offset completes; a repeated key skips the processor.
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
//! After each dedup run on the 0% workload (so the changelog holds one entry per record), a second
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

use crate::core_bench::{Noop, Samples, load_average, parse_property};
use crate::kafka::{self, LoadSpec, Planned, TopicArgs};
use crate::measure::{Measurement, Stopwatch, Summary, machine_cpu, other_process_cpu};
use anyhow::{Context as _, bail};
use millrace::dedup::changelog_topic;
use millrace::{DedupConfig, Pipeline, PipelineConfig, ProcessingOrder, StatsSnapshot};
use millrace_testkit::{Admin, unique};
use rand::RngExt;
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

/// The settings, including the dedup store's write settings, before anything runs.
fn print_header(plan: &Plan) {
    let workloads: Vec<&str> = plan.topics.iter().map(|(w, _)| w.name()).collect();
    println!(
        "dedup: {} records x {} B values per workload ({} duplicates), {} keys, {} partitions, {} pair(s), \
         brokers {}, {} CPUs, load average {}",
        plan.records(),
        plan.load.value_size,
        workloads.join(" and "),
        plan.load.keys,
        plan.partitions,
        plan.pairs,
        plan.bootstrap,
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average(),
    );
    let defaults = DedupConfig::new(&plan.base_dir);
    println!(
        "dedup store: RocksDB under {} ({} file system), fresh per run; write-ahead log on (always); \
         sync_writes={} ({}); one column family per topic-partition; TTL {} s; header {:?}",
        plan.base_dir.display(),
        file_system_of(&plan.base_dir),
        plan.sync_writes,
        if plan.sync_writes {
            "every write fsynced before the record completes"
        } else {
            "WAL written but not fsynced per write: survives a process kill, not a power loss"
        },
        defaults.ttl.as_secs(),
        defaults.header,
    );
    if plan.changelog {
        println!(
            "dedup changelog: each new key produced to <group>.dedup-changelog (compacted; the pipeline's \
             producer: acks=all, enable.idempotence=true, linger.ms=5 unless overridden) and acknowledged \
             before its offset completes; restore timeout {} s",
            defaults.restore_timeout.as_secs(),
        );
    } else {
        println!("dedup changelog: OFF (--no-changelog experiment: RocksDB only, nothing to restore)");
    }
    for (k, v) in &plan.producer_properties {
        println!("producer property for both sides: {k}={v}");
    }
    if let Some(pid) = plan.broker_pid {
        match other_process_cpu(pid) {
            Some(_) => println!("broker process {pid}: its CPU time is reported per run"),
            None => println!("broker process {pid}: not found, its CPU time is not reported"),
        }
    }
}

/// Loads the topics, then runs the interleaved pairs (and the restores), printing each as it ends.
async fn measure_all(plan: &Plan, groups: &mut Vec<String>, topics: &mut Vec<String>) -> anyhow::Result<Results> {
    let header = DedupConfig::new(&plan.base_dir).header;
    for (workload, topic) in &plan.topics {
        let (bootstrap, topic2, spec, workload, header) =
            (plan.bootstrap.clone(), topic.clone(), plan.load, *workload, header.clone());
        let took =
            tokio::task::spawn_blocking(move || load_workload(&bootstrap, &topic2, spec, workload, &header)).await??;
        println!(
            "loaded {} records ({} repeating an earlier idempotency key) into {} in {:.2} s: {:.0} records/s",
            plan.records(),
            workload.duplicates(plan.records()),
            topic,
            took.as_secs_f64(),
            plan.records() as f64 / took.as_secs_f64(),
        );
    }

    println!();
    println!(
        "{:>4}  {:<8}  {:<8}  {:>11}  {:>12}  {:>9}  {:>10}  {:>7}  {:>7}  {:>7}",
        "pair", "workload", "side", "records/s", "steady rec/s", "elapsed s", "1st done s", "cpu s", "cpu s/M", "hits"
    );
    let mut results = Results::default();
    let mut run_number = 0;
    for pair in 1..=plan.pairs {
        for (workload, topic) in &plan.topics {
            for &side in &plan.sides {
                tokio::time::sleep(SETTLE).await;
                run_number += 1;
                let group = unique(&format!("millrace-bench-dedup-{}", side.name()));
                groups.push(group.clone());
                let dir = (side == Side::Dedup).then(|| plan.base_dir.join(format!("run-{run_number}")));
                if dir.is_some() && plan.changelog {
                    // Created by the pipeline on its first key (or first restore): delete it afterwards.
                    topics.push(changelog_topic(&group));
                }
                let (run, note) = timed_run(plan, *workload, topic, side, &group, dir.as_deref()).await?;
                println!(
                    "{pair:>4}  {:<8}  {:<8}  {:>11.0}  {:>12.0}  {:>9.3}  {:>10.3}  {:>7.2}  {:>7.2}  {:>7}",
                    workload.name(),
                    side.name(),
                    run.m.rps(),
                    run.steady_rps(),
                    run.m.elapsed.as_secs_f64(),
                    run.first_done.as_secs_f64(),
                    run.m.cpu.as_secs_f64(),
                    run.m.cpu_s_per_m(),
                    run.end.dedup_hits,
                );
                println!("{:>4}  {:<8}  {:<8}  {note}", "", "", "");
                let expected_hits = if side == Side::Dedup { workload.duplicates(plan.records()) } else { 0 };
                if run.end.dedup_hits != expected_hits {
                    let problem = format!(
                        "pair {pair} {} {}: {} dedup hits, expected {expected_hits}",
                        workload.name(),
                        side.name(),
                        run.end.dedup_hits
                    );
                    println!("{:>4}  CHECK FAILED: {problem}", "");
                    results.problems.push(problem);
                }
                if side == Side::Dedup && *workload == Workload::Unique && plan.restore {
                    tokio::time::sleep(SETTLE).await;
                    let dir = plan.base_dir.join(format!("run-{run_number}-restore"));
                    let restore = measure_restore(plan, topic, &group, &dir).await?;
                    println!(
                        "{:>4}  {:<8}  {:<8}  {} entries in {:.3} s: {:.0} entries/s ({:.0}/s after all {} partitions \
                         were assigned at {:.3} s), cpu {:.2} s, {} records polled",
                        "",
                        "",
                        "restore",
                        restore.entries,
                        restore.elapsed.as_secs_f64(),
                        restore.rate(),
                        restore.rate_after_assignment(),
                        plan.partitions,
                        restore.assigned.as_secs_f64(),
                        restore.cpu.as_secs_f64(),
                        restore.end.polled,
                    );
                    if restore.entries != plan.records() || restore.end.polled != 0 {
                        let problem = format!(
                            "pair {pair} restore: {} entries restored (expected {}), {} records polled (expected 0)",
                            restore.entries,
                            plan.records(),
                            restore.end.polled
                        );
                        println!("{:>4}  CHECK FAILED: {problem}", "");
                        results.problems.push(problem);
                    }
                    results.restores.push(restore);
                }
                results.runs.push(run);
            }
        }
    }
    Ok(results)
}

/// Loads one workload's topic: unique idempotency keys, or one record in [`DUPLICATE_EVERY`] repeating
/// the Kafka key and idempotency key of an earlier non-duplicate record. Blocking.
pub(crate) fn load_workload(
    bootstrap: &str,
    topic: &str,
    spec: LoadSpec,
    workload: Workload,
    header: &str,
) -> anyhow::Result<Duration> {
    let mut rng = rand::rng();
    let keys = spec.keys.max(1);
    // The Kafka key of each non-duplicate record, by its idempotency key's number.
    let mut originals: Vec<u64> = Vec::with_capacity(spec.records as usize);
    kafka::load_planned(bootstrap, topic, spec, |i| {
        let repeat = workload == Workload::Duplicates && i % DUPLICATE_EVERY == DUPLICATE_EVERY - 1;
        let (key, n) = if repeat {
            let n = rng.random_range(0..originals.len());
            (originals[n], n)
        } else {
            originals.push(rng.random_range(0..keys));
            (originals[originals.len() - 1], originals.len() - 1)
        };
        Planned { key, header: Some((header.to_owned(), format!("ik-{n}").into_bytes())) }
    })
}

/// One timed run: a pipeline over `topic` (with dedup when `dedup_dir` is given), until every record
/// is processed or skipped as a duplicate. Also returns a line on what its counters showed during the
/// run (sampled every 2 ms), as `core` prints under its Millrace runs.
async fn timed_run(
    plan: &Plan,
    workload: Workload,
    topic: &str,
    side: Side,
    group: &str,
    dedup_dir: Option<&Path>,
) -> anyhow::Result<(Run, String)> {
    let records = plan.records();
    let pipeline = Pipeline::new(plan.config(topic, group, dedup_dir), Noop)?;
    let mut first_done = None;
    let mut samples = Samples::default();
    let what = format!("{} {}", workload.name(), side.name());
    let driven = drive(pipeline, plan, &what, |s, at| {
        let done = s.processed + s.dedup_hits;
        if first_done.is_none() && done > 0 {
            first_done = Some((at, done));
        }
        samples.add(s);
        done >= records
    })
    .await?;
    let (first_done, done_at_first) = first_done.unwrap_or_default();
    let Driven { elapsed, cpu, at_done: end, machine_busy, broker_cpu, .. } = driven;
    let m = Measurement { records, elapsed, first_record: first_done, cpu };
    let run = Run { workload, side, m, first_done, done_at_first, end, machine_busy, broker_cpu };
    let mut note = format!(
        "paused {:.0}% of the time ({} episodes), in flight mean {:.0} (peak {}), running peak {}, {} commits; \
         machine busy {}",
        samples.paused_fraction() * 100.0,
        samples.pause_episodes,
        samples.mean_in_flight(),
        end.in_flight_peak,
        end.running_peak,
        end.commits,
        machine_busy.map_or_else(|| "?".to_owned(), |b| format!("{:.0}%", b * 100.0)),
    );
    if let (Some(cpu), Some(per_m)) = (broker_cpu, run.broker_cpu_s_per_m()) {
        note.push_str(&format!(", broker cpu {:.2} s ({per_m:.2} s/M)", cpu.as_secs_f64()));
    }
    Ok((run, note))
}

/// A dedup pipeline in `group` (whose offsets are committed at the end of `topic`) with an empty
/// store in `dir`, timed until every partition restored its keys from the changelog.
async fn measure_restore(plan: &Plan, topic: &str, group: &str, dir: &Path) -> anyhow::Result<Restore> {
    let pipeline = Pipeline::new(plan.config(topic, group, Some(dir)), Noop)?;
    let partitions = plan.partitions as u64;
    let mut assigned = None;
    let driven = drive(pipeline, plan, "restore", |s, at| {
        if assigned.is_none() && s.assigned_partitions >= partitions {
            assigned = Some(at);
        }
        // `dedup_restores` counts complete restores only (an empty changelog partition is one), so
        // this waits until every partition has read its changelog to the end.
        s.dedup_restores >= partitions
    })
    .await?;
    // The entries are read after the pipeline stopped, the one snapshot that is sure to hold every
    // partition's count (each restore adds its entries to `dedup_restored` just before it counts itself).
    let Driven { elapsed, cpu, after_stop: end, .. } = driven;
    Ok(Restore { entries: end.dedup_restored, elapsed, assigned: assigned.unwrap_or(elapsed), cpu, end })
}

/// What [`drive`] measured.
struct Driven {
    /// Wall-clock time to `done`.
    elapsed: Duration,
    /// This process's CPU time over `elapsed`.
    cpu: Duration,
    /// The counters when `done` said so.
    at_done: StatsSnapshot,
    /// The counters after the pipeline stopped.
    after_stop: StatsSnapshot,
    /// Share of the machine's CPU time that was busy over `elapsed` (every process), if known.
    machine_busy: Option<f64>,
    /// The broker's CPU time over `elapsed`, if its process id was given.
    broker_cpu: Option<Duration>,
}

/// Spawns `pipeline.run()` and checks its counters every [`CHECK_EVERY`] until `done(snapshot, time
/// since start)` says so; then stops it gracefully (not timed) and checks that nothing failed.
async fn drive(
    pipeline: Pipeline<Noop>,
    plan: &Plan,
    what: &str,
    mut done: impl FnMut(&StatsSnapshot, Duration) -> bool,
) -> anyhow::Result<Driven> {
    let stats = pipeline.stats();
    let stop = pipeline.shutdown_token();
    let (machine_before, broker_before) = (machine_cpu(), plan.broker_pid.and_then(other_process_cpu));
    let clock = Stopwatch::start();
    let mut running = tokio::spawn(pipeline.run());
    let (elapsed, cpu, at_done) = loop {
        let s = stats.snapshot();
        if done(&s, clock.elapsed()) {
            let (elapsed, cpu) = clock.stop();
            break (elapsed, cpu, s);
        }
        if running.is_finished() {
            let outcome = (&mut running).await?;
            bail!("{what}: the pipeline stopped before it was done ({s:?}): {outcome:?}");
        }
        if clock.elapsed() > plan.run_timeout {
            stop.cancel();
            let _ = running.await;
            bail!("{what}: not done after {:?}; counters {s:?}", plan.run_timeout);
        }
        tokio::time::sleep(CHECK_EVERY).await;
    };
    let machine_busy = machine_before.zip(machine_cpu()).and_then(|((busy0, total0), (busy1, total1))| {
        let total = total1.saturating_sub(total0).as_secs_f64();
        (total > 0.0).then(|| busy1.saturating_sub(busy0).as_secs_f64() / total)
    });
    let broker_after = plan.broker_pid.and_then(other_process_cpu);
    let broker_cpu = broker_before.zip(broker_after).map(|(before, after)| after.saturating_sub(before));
    stop.cancel();
    let summary = running.await?.with_context(|| format!("{what} pipeline"))?;
    if summary.failed > 0 {
        bail!("{what}: {} records failed", summary.failed);
    }
    Ok(Driven { elapsed, cpu, at_done, after_stop: stats.snapshot(), machine_busy, broker_cpu })
}

/// Prints the summary table, the ratios, the restore rate and the machine-readable `RESULT` line.
fn report(plan: &Plan, results: &Results) {
    let summarise = |workload: Workload, side: Side, metric: &dyn Fn(&Run) -> f64| {
        Summary::of(results.runs.iter().filter(|r| r.workload == workload && r.side == side).map(metric))
    };
    let rps = |w, s| summarise(w, s, &|r: &Run| r.m.rps());
    let steady = |w, s| summarise(w, s, &Run::steady_rps);
    let cpu = |w, s| summarise(w, s, &|r: &Run| r.m.cpu_s_per_m());
    let broker = |w, s| summarise(w, s, &|r: &Run| r.broker_cpu_s_per_m().unwrap_or(f64::NAN));
    let busy = |w, s| summarise(w, s, &|r: &Run| r.machine_busy.map_or(f64::NAN, |b| b * 100.0));

    println!();
    println!("summary over {} pair(s) of {} records (median, min-max):", plan.pairs, plan.records());
    let broker_column = plan.broker_pid.is_some();
    println!(
        "{:<8}  {:<8}  {:>11}  {:>23}  {:>12}  {:>19}  {:>12}{}",
        "workload",
        "side",
        "records/s",
        "min-max records/s",
        "steady rec/s",
        "cpu s/M (min-max)",
        "machine busy",
        if broker_column { "  broker cpu s/M" } else { "" },
    );
    for &(workload, _) in &plan.topics {
        for &side in &plan.sides {
            let (Some(r), Some(st), Some(c)) = (rps(workload, side), steady(workload, side), cpu(workload, side))
            else {
                continue;
            };
            let (b, m) = (broker(workload, side).map_or(f64::NAN, |b| b.median), busy(workload, side));
            println!(
                "{:<8}  {:<8}  {:>11.0}  {:>23}  {:>12.0}  {:>19}  {:>12}{}",
                workload.name(),
                side.name(),
                r.median,
                format!("{:.0}-{:.0}", r.min, r.max),
                st.median,
                format!("{:.2} ({:.2}-{:.2})", c.median, c.min, c.max),
                m.filter(|m| !m.median.is_nan()).map_or_else(|| "?".to_owned(), |m| format!("{:.0}%", m.median)),
                match (broker_column, b.is_nan()) {
                    (false, _) => String::new(),
                    (true, true) => format!("  {:>14}", "?"),
                    (true, false) => format!("  {b:>14.2}"),
                },
            );
        }
    }
    let ratio = |w, metric: &dyn Fn(Workload, Side) -> Option<Summary>| {
        Some(metric(w, Side::Dedup)?.median / metric(w, Side::Nodedup)?.median)
    };
    for &(w, _) in &plan.topics {
        let (Some(r), Some(st), Some(c)) = (ratio(w, &rps), ratio(w, &steady), ratio(w, &cpu)) else { continue };
        println!(
            "dedup/nodedup, {} duplicates: throughput {r:.3} (steady {st:.3}), CPU per record {c:.2}x; target >= \
             {TARGET_RATIO}: {}",
            w.name(),
            if r >= TARGET_RATIO { "met" } else { "NOT met" },
        );
    }
    let restore_rate = Summary::of(results.restores.iter().map(Restore::rate));
    if let Some(rate) = restore_rate {
        let secs = Summary::of(results.restores.iter().map(|r| r.elapsed.as_secs_f64())).expect("non-empty");
        let after = Summary::of(results.restores.iter().map(Restore::rate_after_assignment)).expect("non-empty");
        let entries = Summary::of(results.restores.iter().map(|r| r.entries as f64)).expect("non-empty");
        println!(
            "restore into an empty store: {:.0} entries in {:.3} s ({:.3}-{:.3}): {:.0} entries/s ({:.0}-{:.0}); \
             {:.0} entries/s after assignment",
            entries.median, secs.median, secs.min, secs.max, rate.median, rate.min, rate.max, after.median,
        );
    }
    if results.problems.is_empty() {
        println!("checks: dedup hit counts and restored entries as expected");
    } else {
        println!("checks FAILED: {}", results.problems.join("; "));
    }
    println!("load average {}", load_average());

    let fmt = |v: Option<f64>, digits: usize| v.map_or_else(|| "na".to_owned(), |v| format!("{v:.digits$}"));
    let median = |s: Option<Summary>| s.map(|s| s.median);
    println!(
        "RESULT dedup ratio_0pct={} ratio_10pct={} restore_rate={} nodedup_rps={} dedup_rps={} \
         nodedup_rps_10pct={} dedup_rps_10pct={} steady_ratio_0pct={} steady_ratio_10pct={} \
         cpu_ratio_0pct={} cpu_ratio_10pct={} nodedup_cpu_s_per_m={} dedup_cpu_s_per_m={} records={} pairs={} \
         sync_writes={} changelog={} checks={}",
        fmt(ratio(Workload::Unique, &rps), 3),
        fmt(ratio(Workload::Duplicates, &rps), 3),
        fmt(median(restore_rate), 0),
        fmt(median(rps(Workload::Unique, Side::Nodedup)), 0),
        fmt(median(rps(Workload::Unique, Side::Dedup)), 0),
        fmt(median(rps(Workload::Duplicates, Side::Nodedup)), 0),
        fmt(median(rps(Workload::Duplicates, Side::Dedup)), 0),
        fmt(ratio(Workload::Unique, &steady), 3),
        fmt(ratio(Workload::Duplicates, &steady), 3),
        fmt(ratio(Workload::Unique, &cpu), 3),
        fmt(ratio(Workload::Duplicates, &cpu), 3),
        fmt(median(cpu(Workload::Unique, Side::Nodedup)), 3),
        fmt(median(cpu(Workload::Unique, Side::Dedup)), 3),
        plan.records(),
        plan.pairs,
        plan.sync_writes,
        plan.changelog,
        if results.problems.is_empty() { "ok" } else { "failed" },
    );
}

/// The type of the file system holding `path` (from `/proc/mounts`; "?" where unknown).
fn file_system_of(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, mount_point, fs_type) = (fields.next()?, fields.next()?, fields.next()?);
            path.starts_with(mount_point).then(|| (mount_point.len(), fs_type.to_owned()))
        })
        .max_by_key(|(len, _)| *len)
        .map_or_else(|| "?".to_owned(), |(_, fs_type)| fs_type)
}
