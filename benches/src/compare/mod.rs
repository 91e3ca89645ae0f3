//! The `compare` benchmark: Millrace against the raw rdkafka limit and Kafka Streams, end to end.
//!
//! # Workloads
//! See [`workload::Workload`]: C0 (raw drain), P0 (raw consume -> produce pipe), Pt(100 ms) and
//! Pt(1 s) (the pipe in transactions), F_alos (Millrace, a processor emitting one output), F_dedup
//! (dedup store on; 0% and 10% duplicates; at-least-once, and exactly-once as F_dedup_eos), F_dlq
//! (1% poison records), F_eos(100 ms) and F_eos(1 s) (Millrace exactly-once, see
//! [`millrace_side::exactly_once`]), and Kafka Streams at_least_once and exactly_once_v2 (a child
//! JVM, see [`streams`]).
//!
//! # Input
//! For each record size (`--value-size`, default 100 B, and `--large-value-size`, default 1 KiB), a
//! fresh topic of `--partitions` partitions (4) is loaded with the size's record count, keys drawn
//! uniformly over `--keys` (10,000), before any timing. Every record carries an `idempotency-key`
//! header `ik-<n>`, unique per record (the dedup store's input); the records with `n % 100 == 99` are
//! F_dlq's poison (1%). F_dedup(10%) reads a second topic where every tenth record repeats an earlier
//! record's key and idempotency key (as `dedup` loads it). Every workload except C0 writes a fresh
//! output topic (same partition count) per run, created before its clock starts and deleted after.
//!
//! # Method
//! A round runs every workload once, in [`Workload::ALL`]'s order, which puts the two sides of each
//! targeted ratio next to each other; the next round runs them in reverse, so neither side of a pair
//! always goes first: A B A B … over `--pairs` rounds (default 3). Each run uses a fresh consumer
//! group and reads its topic from the beginning. The clock starts before the group join, as in
//! `core`; CPU time is the process's own (`getrusage(RUSAGE_SELF)` deltas for the in-process Rust
//! workloads; the JVM's own process CPU time over its timed window for Kafka Streams, whose whole
//! process's CPU from `getrusage(RUSAGE_CHILDREN)` is reported too). A run is done when every input
//! record's output is acknowledged (at-least-once) or committed (transactions); Millrace's runs are
//! done by its counters (processed + dedup hits + dead-lettered), checked every 2 ms.
//!
//! The report gives, per size and workload, the median records/s with the min-max range and the
//! median CPU seconds per million records, and for each ratio the ratio of the medians, the range of
//! the per-round ratios and the ratio of CPU per record, next to its target. `RESULT compare-*`
//! lines carry the same for `report`, which writes `BENCHMARKS.md`.

pub(crate) mod millrace_side;
mod output;
pub(crate) mod raw;
mod streams;
pub mod workload;

use crate::core_bench::{RawDrain, drain_raw};
use crate::dedup_bench::{self, DUPLICATE_EVERY};
use crate::kafka::{LoadSpec, TopicArgs};
use crate::measure::Measurement;
use anyhow::{Context as _, bail};
use millrace_side::{Mode, NotRun};
use millrace_testkit::{Admin, record_count, unique};
use output::{print_header, report};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use workload::{ALOS_COMMIT, STREAMS_EOS_COMMIT_MS, Workload};

/// One record in this many is poison in F_dlq (1%).
pub const POISON_EVERY: u64 = 100;
/// The header carrying each record's idempotency key (the dedup store's default).
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";
/// Records of the default size per run, and with `--quick`.
const RECORDS: u64 = 1_000_000;
const QUICK_RECORDS: u64 = 20_000;
/// The warm window of the Millrace and Kafka Streams runs starts after 1/WARMUP_SHARE of the records
/// (see [`crate::measure::Window`]).
pub const WARMUP_SHARE: u64 = 5;
/// Pause between runs, so that the previous run's clients are fully gone before the next starts.
const SETTLE: Duration = Duration::from_millis(500);

/// Options of the `compare` benchmark.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    #[command(flatten)]
    topic: TopicArgs,
    /// Bytes per value of the second record size; 0 for none (the default with --quick).
    #[arg(long)]
    large_value_size: Option<usize>,
    /// Records per run of the second size [default: --records / 4].
    #[arg(long)]
    large_records: Option<u64>,
    /// Rounds, each running every workload once (alternately forward and in reverse) [default: 3, 1
    /// with --quick].
    #[arg(long)]
    pairs: Option<usize>,
    /// Workloads to run, comma-separated [default: all]: c0, p0, pt-100ms, pt-1s, f-alos, f-observed, f-eos-100ms,
    /// f-eos-1s, f-dedup-0, f-dedup-10, f-dedup-eos-0, f-dedup-eos-10, f-dlq, streams-alos, streams-eos.
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<Workload>,
    /// Directory of the built Kafka Streams peer (streams-peer.jar and lib/); without it the Streams
    /// workloads are reported as not available.
    #[arg(long, env = "MILLRACE_STREAMS_PEER")]
    streams_peer: Option<PathBuf>,
    /// Fail a run that has not finished after this many seconds.
    #[arg(long, default_value_t = 300)]
    run_timeout_secs: u64,
}

/// One record size and its input topics.
#[derive(Debug, Clone)]
struct Size {
    load: LoadSpec,
    /// Unique idempotency keys (every workload but F_dedup(10%)).
    input: String,
    /// 10% duplicate idempotency keys, when F_dedup(10%) runs.
    duplicates: Option<String>,
}

/// Resolved settings.
#[derive(Debug)]
struct Plan {
    bootstrap: String,
    partitions: i32,
    sizes: Vec<Size>,
    pairs: usize,
    workloads: Vec<Workload>,
    streams_peer: Option<PathBuf>,
    run_timeout: Duration,
    /// Holds the dedup runs' RocksDB stores; removed at the end.
    store_dir: PathBuf,
}

/// What a finished run measured.
#[derive(Debug, Clone)]
struct Done {
    m: Measurement,
    note: String,
    /// The whole process's CPU time, for workloads run as a child process.
    process_cpu: Option<Duration>,
}

/// Every run's outcome, by (size index, workload), in round order.
#[derive(Debug, Default)]
struct Results {
    runs: BTreeMap<(usize, Workload), Vec<Result<Done, String>>>,
    unavailable: BTreeMap<Workload, String>,
}

/// Runs the `compare` benchmark and prints its report.
pub async fn run(args: CompareArgs) -> anyhow::Result<()> {
    let quick = args.topic.quick;
    let main = args.topic.load(RECORDS, QUICK_RECORDS);
    let large_size = args.large_value_size.unwrap_or(if quick { 0 } else { 1024 });
    let workloads = if args.workloads.is_empty() {
        Workload::ALL.to_vec()
    } else {
        Workload::ALL.into_iter().filter(|w| args.workloads.contains(w)).collect()
    };
    let mut loads = vec![main];
    if large_size > 0 {
        let records = args.large_records.unwrap_or(main.records / 4).max(1);
        loads.push(LoadSpec { records, value_size: large_size, ..main });
    }
    let dup_needed = workloads.iter().any(|w| w.reads_duplicates());
    let plan = Plan {
        bootstrap: args.topic.bootstrap(),
        partitions: args.topic.partitions,
        sizes: loads
            .into_iter()
            .map(|load| Size {
                load,
                input: unique(&format!("millrace-bench-cmp-{}b", load.value_size)),
                duplicates: dup_needed.then(|| unique(&format!("millrace-bench-cmp-{}b-dup", load.value_size))),
            })
            .collect(),
        pairs: args.pairs.unwrap_or(if quick { 1 } else { 3 }),
        workloads,
        streams_peer: args.streams_peer,
        run_timeout: Duration::from_secs(args.run_timeout_secs),
        store_dir: std::env::temp_dir().join(unique("millrace-bench-cmp-dedup")),
    };
    if plan.pairs == 0 || plan.partitions < 1 || plan.sizes.iter().any(|s| s.load.records < POISON_EVERY) {
        bail!("--pairs and --partitions must be at least 1, and --records at least {POISON_EVERY}");
    }
    print_header(&plan);
    let admin = Admin::new(&plan.bootstrap)?;
    let mut topics = Vec::new();
    let mut groups = Vec::new();
    let result = measure_all(&plan, &admin, &mut topics, &mut groups).await;
    admin.clean_up(&topics, &groups).await;
    let _ = std::fs::remove_dir_all(&plan.store_dir);
    let results = result?;
    let failed = report(&plan, &results);
    if failed > 0 {
        bail!("{failed} run(s) failed (see above)");
    }
    Ok(())
}

/// Loads the inputs, then runs the rounds, printing each run as it ends.
async fn measure_all(
    plan: &Plan,
    admin: &Admin,
    topics: &mut Vec<String>,
    groups: &mut Vec<String>,
) -> anyhow::Result<Results> {
    for size in &plan.sizes {
        for (topic, duplicates) in [(Some(&size.input), false), (size.duplicates.as_ref(), true)] {
            let Some(topic) = topic else { continue };
            admin.create_topic(topic, plan.partitions, &[]).await?;
            topics.push(topic.clone());
            let (bootstrap, topic2, spec) = (plan.bootstrap.clone(), topic.clone(), size.load);
            let workload = if duplicates { dedup_bench::Workload::Duplicates } else { dedup_bench::Workload::Unique };
            let took = tokio::task::spawn_blocking(move || {
                dedup_bench::load_workload(&bootstrap, &topic2, spec, workload, IDEMPOTENCY_HEADER)
            })
            .await??;
            println!(
                "loaded {} records of {} B{} into {topic} in {:.2} s",
                spec.records,
                spec.value_size,
                if duplicates { " (10% repeating an earlier idempotency key)" } else { "" },
                took.as_secs_f64()
            );
        }
        if plan.workloads.contains(&Workload::FDlq) {
            // Created before timing: the pipeline would otherwise create it during its first run.
            let dlq = format!("{}.dlq", size.input);
            admin.create_topic(&dlq, plan.partitions, &[]).await?;
            topics.push(dlq);
        }
    }
    std::fs::create_dir_all(&plan.store_dir).context("creating the dedup stores' directory")?;

    let mut results = Results::default();
    for (index, size) in plan.sizes.iter().enumerate() {
        println!();
        println!("{} B values, {} records per run:", size.load.value_size, size.load.records);
        println!("{:>5}  {:<15}  {}", "round", "workload", crate::measure::column_headers());
        for round in 1..=plan.pairs {
            let mut order = plan.workloads.clone();
            if round % 2 == 0 {
                order.reverse();
            }
            for workload in order {
                if results.unavailable.contains_key(&workload) {
                    continue;
                }
                tokio::time::sleep(SETTLE).await;
                let group = unique(&format!("millrace-bench-cmp-{}", workload.slug()));
                let outcome = run_one(plan, admin, size, workload, &group, topics).await;
                if !matches!(outcome, Err(NotRun::Unavailable(_))) {
                    groups.push(group);
                }
                match outcome {
                    Ok(done) => {
                        println!("{round:>5}  {:<15}  {}", workload.label(), done.m.columns());
                        println!("{:>5}  {:<15}  {}", "", "", done.note);
                        results.runs.entry((index, workload)).or_default().push(Ok(done));
                    }
                    Err(NotRun::Unavailable(why)) => {
                        println!("{round:>5}  {:<15}  not available: {why}", workload.label());
                        results.unavailable.insert(workload, why);
                    }
                    Err(NotRun::Failed(e)) => {
                        println!("{round:>5}  {:<15}  FAILED: {e:#}", workload.label());
                        results.runs.entry((index, workload)).or_default().push(Err(format!("{e:#}")));
                    }
                }
            }
        }
    }
    Ok(results)
}

/// One run of `workload` on `size`'s input, with its own group and output topic.
async fn run_one(
    plan: &Plan,
    admin: &Admin,
    size: &Size,
    workload: Workload,
    group: &str,
    topics: &mut Vec<String>,
) -> Result<Done, NotRun> {
    let group = group.to_owned();
    let output = unique("millrace-bench-cmp-out");
    if workload.has_output() {
        admin.create_topic(&output, plan.partitions, &[]).await?;
    }
    let input = if workload.reads_duplicates() { size.duplicates.as_deref() } else { Some(size.input.as_str()) }
        .context("the duplicates topic was not loaded")?;
    let records = size.load.records;
    let (bootstrap, timeout) = (plan.bootstrap.as_str(), plan.run_timeout);
    let warmup = records / WARMUP_SHARE;
    let millrace =
        |mode| millrace_side::Run { bootstrap, input, output: &output, group: &group, records, timeout, mode, warmup };
    let pipe = |transactions: Option<Duration>| {
        let (bootstrap, input, output, group) = (bootstrap.to_owned(), input.to_owned(), output.clone(), group.clone());
        tokio::task::spawn_blocking(move || {
            raw::run(&raw::Pipe {
                bootstrap: &bootstrap,
                input: &input,
                output: &output,
                group: &group,
                records,
                timeout,
                transactions,
                commit_interval: ALOS_COMMIT,
            })
        })
    };
    let streams = |guarantee: &'static str, commit_interval: Duration| {
        let peer = plan.streams_peer.clone();
        let (bootstrap, input, output, group) = (bootstrap.to_owned(), input.to_owned(), output.clone(), group.clone());
        tokio::task::spawn_blocking(move || {
            streams::run(&streams::Peer {
                dir: peer.as_deref(),
                bootstrap: &bootstrap,
                input: &input,
                output: &output,
                group: &group,
                records,
                timeout,
                guarantee,
                commit_interval,
                warmup,
            })
        })
    };
    let simple = |(m, note): (Measurement, String)| Done { m, note, process_cpu: None };
    let joined = |e: tokio::task::JoinError| NotRun::Failed(e.into());
    let outcome = match workload {
        Workload::C0 => {
            let (bootstrap, input, group) = (bootstrap.to_owned(), input.to_owned(), group.clone());
            tokio::task::spawn_blocking(move || {
                drain_raw(&RawDrain {
                    bootstrap: &bootstrap,
                    topic: &input,
                    group: &group,
                    records,
                    timeout,
                    consumer_properties: &[],
                })
            })
            .await
            .map_err(joined)?
            .map(|m| Done { m, note: "drained and discarded".into(), process_cpu: None })
            .map_err(NotRun::Failed)
        }
        Workload::P0 => pipe(None)
            .await
            .map_err(joined)?
            .map(|m| Done { m, note: "outputs acknowledged".into(), process_cpu: None })
            .map_err(NotRun::Failed),
        Workload::Pt { ms } => pipe(Some(Duration::from_millis(ms)))
            .await
            .map_err(joined)?
            .map(|m| Done { m, note: "last transaction committed".into(), process_cpu: None })
            .map_err(NotRun::Failed),
        Workload::FAlos => millrace_side::run(&millrace(Mode::Alos)).await.map(simple),
        Workload::FObserved => millrace_side::run(&millrace(Mode::Observed)).await.map(simple),
        Workload::FEos { ms } => millrace_side::run(&millrace(Mode::Eos(Duration::from_millis(ms)))).await.map(simple),
        Workload::FDlq => millrace_side::run(&millrace(Mode::Dlq { poison_every: POISON_EVERY })).await.map(simple),
        Workload::FDedup { eos, .. } => {
            topics.push(millrace::dedup::changelog_topic(&group));
            let dir = plan.store_dir.join(&group);
            let mode = if eos { Mode::DedupEos(&dir, Duration::from_millis(100)) } else { Mode::Dedup(&dir) };
            let outcome = millrace_side::run(&millrace(mode)).await.map(simple);
            let _ = std::fs::remove_dir_all(&dir);
            outcome
        }
        Workload::StreamsAlos | Workload::StreamsEos => {
            let (guarantee, interval) = if workload == Workload::StreamsAlos {
                ("at_least_once", ALOS_COMMIT)
            } else {
                ("exactly_once_v2", Duration::from_millis(STREAMS_EOS_COMMIT_MS))
            };
            let done = streams(guarantee, interval).await.map_err(joined)?;
            done.map(|(m, note, cpu)| Done { m, note, process_cpu: Some(cpu) })
        }
    };
    let outcome = match (outcome, workload.expected_outputs(records)) {
        (Ok(mut done), Some(expected)) => {
            let (bootstrap2, output2, partitions) = (bootstrap.to_owned(), output.clone(), plan.partitions);
            let found = tokio::task::spawn_blocking(move || record_count(&bootstrap2, &output2, partitions))
                .await
                .map_err(joined)??;
            if found != expected {
                Err(NotRun::Failed(anyhow::anyhow!("{found} outputs in {output}, expected {expected}")))
            } else {
                done.note.push_str(&format!("; {found} outputs"));
                Ok(done)
            }
        }
        (outcome, _) => outcome,
    };
    if workload.has_output() {
        admin.clean_up(std::slice::from_ref(&output), &[]).await;
    }
    outcome
}
