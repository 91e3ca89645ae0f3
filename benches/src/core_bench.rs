//! The `core` benchmark: consume-and-acknowledge throughput with a no-op processor.
//!
//! # Setup
//! A fresh topic (random name, `--partitions` partitions) is pre-loaded with `--records` records of
//! `--value-size` bytes, keyed uniformly over `--keys` keys, by a producer tuned for bulk loading; the
//! load is flushed and acknowledged before any timing starts. Both sides then read the same records,
//! from the broker's page cache.
//!
//! # The two sides
//! - **raw**: an rdkafka `BaseConsumer` with what an at-least-once consumer minimally does per record:
//!   poll it, do nothing with it, `store_offset_from_message` (offsets then committed in the
//!   background by `enable.auto.commit`). It runs on its own thread. Timed from just before
//!   `subscribe` (so group join is included, as for Millrace) to the N-th record.
//! - **millrace**: a [`Pipeline`] in [`ProcessingOrder::Key`] with default [`Bounds`] and a
//!   no-op [`Processor`]; timed from spawning [`Pipeline::run`] to the moment its `processed`
//!   counter reaches N (checked every 2 ms). Shutdown (drain, final commit, leaving the group) is
//!   not timed.
//!
//! Both use `partition.assignment.strategy=cooperative-sticky` and `fetch.queue.backoff.ms=20`
//! (Millrace's defaults: librdkafka's own 1 s backoff idles a partition after every full prefetch
//! queue and makes the baseline swing between 0.4 and 1.6 M records/s), a fresh group and
//! `auto.offset.reset=earliest`; `--consumer-property` sets more, for both sides alike. Runs alternate raw, millrace, raw,
//! millrace … for `--pairs` pairs, and the result is the ratio of the median throughputs (and the
//! CPU seconds each side spends per million records).
//!
//! # Reading the output
//! Each run prints records/s from the start, "steady" records/s from the first record on (group
//! join and first fetch left out), the time to the first record, and process CPU. Under each
//! Millrace run a line says what its counters showed during the run (sampled every 2 ms): how much
//! of the time backpressure had partitions paused and in how many episodes, the mean and peak
//! in-flight records, and the commits issued, since pausing is what most often explains a slow run.
//!
//! # Experiments
//! `--only raw|millrace` runs one side (to profile it, e.g. under `perf record`);
//! `--max-in-flight-per-partition` and `--max-in-flight-total` change Millrace's bounds, e.g. to
//! take backpressure out of the picture. The canonical figures are those of the defaults.

use crate::kafka::{self, LoadSpec, TopicArgs};
use crate::measure::{Measurement, Stopwatch, Summary};
use anyhow::{Context as _, bail};
use millrace::{
    Bounds, Context, Pipeline, PipelineConfig, ProcessError, ProcessingOrder, Processor, Record, StatsSnapshot,
};
use millrace_testkit::{Admin, unique};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::time::Duration;

/// Records per run with `--quick`.
const QUICK_RECORDS: u64 = 100_000;
/// How often the Millrace side checks its `processed` counter.
const CHECK_EVERY: Duration = Duration::from_millis(2);
/// Pause between runs, so that the previous run's clients are fully gone before the next starts.
const SETTLE: Duration = Duration::from_millis(500);

/// Options of the `core` benchmark.
#[derive(Debug, clap::Args)]
pub struct CoreArgs {
    #[command(flatten)]
    topic: TopicArgs,
    /// Interleaved (raw, millrace) pairs of runs [default: 3, 1 with --quick].
    #[arg(long)]
    pairs: Option<usize>,
    /// A consumer property for both sides, as KEY=VALUE (repeatable), e.g. fetch.queue.backoff.ms=10.
    #[arg(long = "consumer-property", value_name = "KEY=VALUE", value_parser = parse_property)]
    consumer_properties: Vec<(String, String)>,
    /// Millrace only: overrides `Bounds::max_in_flight_per_partition` (default bounds otherwise).
    #[arg(long)]
    max_in_flight_per_partition: Option<usize>,
    /// Millrace only: overrides `Bounds::max_in_flight_total`.
    #[arg(long)]
    max_in_flight_total: Option<usize>,
    /// Run one side only (for profiling it); no ratio is reported.
    #[arg(long, value_enum)]
    only: Option<Side>,
    /// Fail a run that has not consumed every record after this many seconds.
    #[arg(long, default_value_t = 600)]
    run_timeout_secs: u64,
}

pub(crate) fn parse_property(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// The two things measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Side {
    /// The rdkafka `BaseConsumer` baseline.
    Raw,
    /// A Millrace pipeline.
    Millrace,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Raw => "raw",
            Side::Millrace => "millrace",
        }
    }
}

/// Resolved settings of one benchmark invocation.
#[derive(Debug, Clone)]
struct Plan {
    bootstrap: String,
    topic: String,
    partitions: i32,
    load: LoadSpec,
    pairs: usize,
    sides: Vec<Side>,
    consumer_properties: Vec<(String, String)>,
    bounds: Bounds,
    run_timeout: Duration,
}

impl Plan {
    fn records(&self) -> u64 {
        self.load.records
    }
}

/// Runs the `core` benchmark and prints its report.
pub async fn run(args: CoreArgs) -> anyhow::Result<()> {
    let plan = Plan {
        bootstrap: args.topic.bootstrap(),
        topic: unique("millrace-bench-core"),
        partitions: args.topic.partitions,
        load: args.topic.load(1_000_000, QUICK_RECORDS),
        pairs: args.pairs.unwrap_or(if args.topic.quick { 1 } else { 3 }),
        consumer_properties: args.consumer_properties,
        bounds: {
            let default = Bounds::default();
            Bounds {
                max_in_flight_per_partition: args
                    .max_in_flight_per_partition
                    .unwrap_or(default.max_in_flight_per_partition),
                max_in_flight_total: args.max_in_flight_total.unwrap_or(default.max_in_flight_total),
                ..default
            }
        },
        sides: args.only.map_or_else(|| vec![Side::Raw, Side::Millrace], |side| vec![side]),
        run_timeout: Duration::from_secs(args.run_timeout_secs),
    };
    if plan.records() == 0 || plan.pairs == 0 || plan.partitions < 1 {
        bail!("--records, --pairs and --partitions must be at least 1");
    }
    println!(
        "core: {} records x {} B values, {} keys, {} partitions, {} pair(s), brokers {}, {} CPUs, load average {}",
        plan.records(),
        plan.load.value_size,
        plan.load.keys,
        plan.partitions,
        plan.pairs,
        plan.bootstrap,
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average(),
    );
    if plan.bounds != Bounds::default() {
        println!("millrace bounds (not the defaults): {:?}", plan.bounds);
    }
    for (k, v) in &plan.consumer_properties {
        println!("consumer property for both sides: {k}={v}");
    }

    let admin = Admin::new(&plan.bootstrap)?;
    admin.create_topic(&plan.topic, plan.partitions, &[]).await?;
    let mut groups = Vec::new();
    let result = measure_all(&plan, &mut groups).await;
    admin.clean_up(std::slice::from_ref(&plan.topic), &groups).await;
    let runs = result?;
    report(&plan, &runs);
    Ok(())
}

/// Loads the topic, then runs the interleaved pairs, printing each run as it ends.
async fn measure_all(plan: &Plan, groups: &mut Vec<String>) -> anyhow::Result<Vec<(Side, Measurement)>> {
    let (bootstrap, topic, spec) = (plan.bootstrap.clone(), plan.topic.clone(), plan.load);
    let took = tokio::task::spawn_blocking(move || kafka::load(&bootstrap, &topic, spec)).await??;
    let bytes = plan.records() as f64 * plan.load.value_size as f64;
    println!(
        "loaded {} into {} in {:.2} s: {:.0} records/s, {:.1} MB/s of values",
        plan.records(),
        plan.topic,
        took.as_secs_f64(),
        plan.records() as f64 / took.as_secs_f64(),
        bytes / took.as_secs_f64() / 1e6,
    );

    println!();
    println!("{:>4}  {:<8}  {}", "pair", "side", crate::measure::column_headers());
    let mut runs = Vec::new();
    for pair in 1..=plan.pairs {
        for &side in &plan.sides {
            tokio::time::sleep(SETTLE).await;
            let group = unique(&format!("millrace-bench-{}", side.name()));
            groups.push(group.clone());
            let (m, note) = match side {
                Side::Raw => {
                    let plan = plan.clone();
                    let m = tokio::task::spawn_blocking(move || run_raw(&plan, &group)).await??;
                    (m, None)
                }
                Side::Millrace => {
                    let (m, note) = run_millrace(plan, &group).await?;
                    (m, Some(note))
                }
            };
            println!("{pair:>4}  {:<8}  {}", side.name(), m.columns());
            if let Some(note) = note {
                println!("{:>4}  {:<8}  {note}", "", "");
            }
            runs.push((side, m));
        }
    }
    Ok(runs)
}

/// The baseline: a plain `BaseConsumer` that stores every offset after a no-op. Blocking.
fn run_raw(plan: &Plan, group: &str) -> anyhow::Result<Measurement> {
    drain_raw(&RawDrain {
        bootstrap: &plan.bootstrap,
        topic: &plan.topic,
        group,
        records: plan.records(),
        timeout: plan.run_timeout,
        consumer_properties: &plan.consumer_properties,
    })
}

/// What [`drain_raw`] reads, and how.
pub(crate) struct RawDrain<'a> {
    pub(crate) bootstrap: &'a str,
    pub(crate) topic: &'a str,
    /// A fresh group, so the topic is read from the beginning.
    pub(crate) group: &'a str,
    /// Records to consume before the clock stops.
    pub(crate) records: u64,
    pub(crate) timeout: Duration,
    /// Extra consumer properties (after the defaults, before the owned ones).
    pub(crate) consumer_properties: &'a [(String, String)],
}

/// The raw rdkafka drain (`core`'s baseline, the `compare` benchmark's C0): a `BaseConsumer` that
/// polls every record, does nothing with it and stores its offset (committed in the background by
/// `enable.auto.commit`). Timed from just before `subscribe` to the N-th record. Blocking.
pub(crate) fn drain_raw(d: &RawDrain<'_>) -> anyhow::Result<Measurement> {
    let (records, timeout) = (d.records, d.timeout);
    let mut config = ClientConfig::new();
    config
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("fetch.queue.backoff.ms", "20")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false");
    for (k, v) in d.consumer_properties {
        config.set(k, v);
    }
    let consumer: BaseConsumer = config
        .set("bootstrap.servers", d.bootstrap)
        .set("group.id", d.group)
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .create()
        .context("creating the raw consumer")?;
    let clock = Stopwatch::start();
    consumer.subscribe(&[d.topic]).context("subscribing the raw consumer")?;
    let mut consumed = 0u64;
    let mut first_record = None;
    while consumed < records {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(msg)) => {
                std::hint::black_box(&msg); // the no-op "processing"
                consumer.store_offset_from_message(&msg).context("storing an offset")?;
                consumed += 1;
                first_record.get_or_insert_with(|| clock.elapsed());
            }
            Some(Err(e)) => tracing::warn!(error = %e, "raw consumer error"),
            None if clock.elapsed() > timeout => bail!("raw: only {consumed} of {records} records after {timeout:?}"),
            None => {}
        }
    }
    let (elapsed, cpu) = clock.stop();
    Ok(Measurement { records, elapsed, first_record: first_record.unwrap_or_default(), cpu, warm: None })
}

/// Millrace's side: does nothing with each record (also the `dedup` benchmark's processor).
pub(crate) struct Noop;

impl Processor for Noop {
    async fn process(&self, record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        std::hint::black_box(record);
        Ok(())
    }
}

/// Millrace: a pipeline with a no-op processor, timed until it has processed every record. Also
/// returns a line on what its counters showed during the run.
async fn run_millrace(plan: &Plan, group: &str) -> anyhow::Result<(Measurement, String)> {
    let records = plan.records();
    let mut config =
        PipelineConfig::new(&plan.bootstrap, group, [&plan.topic]).ordering(ProcessingOrder::Key).bounds(plan.bounds);
    for (k, v) in &plan.consumer_properties {
        config = config.consumer_property(k, v);
    }
    let pipeline = Pipeline::new(config, Noop)?;
    let stats = pipeline.stats();
    let stop = pipeline.shutdown_token();

    let clock = Stopwatch::start();
    let mut running = tokio::spawn(pipeline.run());
    let mut first_record = None;
    let mut samples = Samples::default();
    let (elapsed, cpu) = loop {
        let s = stats.snapshot();
        if s.processed >= records {
            break clock.stop();
        }
        if first_record.is_none() && s.polled > 0 {
            first_record = Some(clock.elapsed());
        }
        samples.add(&s);
        if running.is_finished() {
            let outcome = (&mut running).await?;
            bail!("millrace: the pipeline stopped after {} of {records} records: {outcome:?}", s.processed);
        }
        if clock.elapsed() > plan.run_timeout {
            stop.cancel();
            let _ = running.await;
            bail!("millrace: only {} of {records} records after {:?}", s.processed, plan.run_timeout);
        }
        tokio::time::sleep(CHECK_EVERY).await;
    };

    let end = stats.snapshot();
    stop.cancel();
    let summary = running.await?.context("millrace pipeline")?;
    if summary.failed > 0 {
        bail!("millrace: {} records failed", summary.failed);
    }
    let note = format!(
        "paused {:.0}% of the time ({} episodes), in flight mean {:.0} (peak {}), running peak {}, {} commits",
        samples.paused_fraction() * 100.0,
        samples.pause_episodes,
        samples.mean_in_flight(),
        end.in_flight_peak,
        end.running_peak,
        end.commits,
    );
    Ok((Measurement { records, elapsed, first_record: first_record.unwrap_or_default(), cpu, warm: None }, note))
}

/// What the 2 ms checks of the Millrace side saw, to explain its throughput: how often backpressure
/// had partitions paused, and how full the pipeline was.
#[derive(Debug, Default)]
pub(crate) struct Samples {
    taken: u64,
    paused: u64,
    /// Times a sample saw partitions paused after one that saw none.
    pub(crate) pause_episodes: u64,
    was_paused: bool,
    in_flight: u64,
}

impl Samples {
    pub(crate) fn add(&mut self, s: &StatsSnapshot) {
        if s.polled == 0 {
            return; // still joining the group
        }
        self.taken += 1;
        let paused = s.paused_partitions > 0;
        self.paused += u64::from(paused);
        self.pause_episodes += u64::from(paused && !self.was_paused);
        self.was_paused = paused;
        self.in_flight += s.in_flight;
    }

    pub(crate) fn paused_fraction(&self) -> f64 {
        self.paused as f64 / self.taken.max(1) as f64
    }

    pub(crate) fn mean_in_flight(&self) -> f64 {
        self.in_flight as f64 / self.taken.max(1) as f64
    }
}

/// Prints the summary table and the machine-readable `RESULT` line.
fn report(plan: &Plan, runs: &[(Side, Measurement)]) {
    let summarise = |side: Side, metric: fn(&Measurement) -> f64| {
        Summary::of(runs.iter().filter(|(s, _)| *s == side).map(|(_, m)| metric(m)))
            .expect("every side in the plan ran at least once")
    };
    let rps = |side| summarise(side, Measurement::rps);
    let steady = |side| summarise(side, Measurement::steady_rps);
    let cpu = |side| summarise(side, Measurement::cpu_s_per_m);

    println!();
    println!("summary over {} pair(s) of {} records (median, min-max):", plan.pairs, plan.records());
    println!(
        "{:<8}  {:>11}  {:>23}  {:>12}  {:>15}",
        "side", "records/s", "min-max records/s", "steady rec/s", "cpu s/M (min-max)"
    );
    for &side in &plan.sides {
        let (r, st, c) = (rps(side), steady(side), cpu(side));
        println!(
            "{:<8}  {:>11.0}  {:>23}  {:>12.0}  {:>5.2} ({:.2}-{:.2})",
            side.name(),
            r.median,
            format!("{:.0}-{:.0}", r.min, r.max),
            st.median,
            c.median,
            c.min,
            c.max,
        );
    }
    if plan.sides.len() < 2 {
        return; // one side only: nothing to compare
    }
    let ratio = rps(Side::Millrace).median / rps(Side::Raw).median;
    let steady_ratio = steady(Side::Millrace).median / steady(Side::Raw).median;
    let cpu_ratio = cpu(Side::Millrace).median / cpu(Side::Raw).median;
    println!(
        "millrace/raw: throughput {ratio:.3} (steady {steady_ratio:.3}), CPU per record {cpu_ratio:.2}x; load average {}",
        load_average()
    );
    println!(
        "RESULT core raw_rps={:.0} millrace_rps={:.0} ratio={ratio:.3} raw_cpu_s_per_m={:.3} millrace_cpu_s_per_m={:.3} \
         raw_steady_rps={:.0} millrace_steady_rps={:.0} steady_ratio={steady_ratio:.3} records={} pairs={}",
        rps(Side::Raw).median,
        rps(Side::Millrace).median,
        cpu(Side::Raw).median,
        cpu(Side::Millrace).median,
        steady(Side::Raw).median,
        steady(Side::Millrace).median,
        plan.records(),
        plan.pairs,
    );
}

/// The 1, 5 and 15-minute load averages, for context on a shared machine ("?" where unavailable).
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "?".into())
}
