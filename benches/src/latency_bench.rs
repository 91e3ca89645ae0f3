//! End-to-end latency at a fixed offered load: P0, F_alos, Pt(100 ms) and F_eos(100 ms).
//!
//! # Method
//! First P0's throughput on this machine is measured: one P0 run drains 500,000 pre-loaded records
//! (the same pass-through as `compare`'s). The offered loads are `--loads` of that (default 0.5, the
//! issue's, and 0.1), unless `--rate` gives one. Then, for each load, in rounds (each runs every workload once, the next in reverse order), every run
//! gets a fresh input topic, output topic and group, and:
//!
//! - the workload starts (the raw pipes of `compare` on a blocking thread; Millrace's pipelines as in
//!   `compare`: key order, default bounds, a processor emitting each record with `ctx.emit`);
//! - a producer thread writes 1,000 warm-up records (not measured: the group join, the first fetch,
//!   `init_transactions`), waits until a reader has seen them all in the output topic, then writes
//!   `rate × seconds` records paced to the rate (the records due at each instant are sent at once;
//!   `linger.ms=1`, `acks=1`). Each value starts with the microsecond it was handed to the producer
//!   (a clock of this process) and its sequence number;
//! - a reader thread (`assign`ed to every output partition, `fetch.wait.max.ms=5`) reads the output
//!   topic as the workload's consumers would: `read_uncommitted` for the at-least-once workloads, where
//!   an output is visible once acknowledged, `read_committed` for the transactional ones, where it is
//!   visible once its transaction commits. A record's latency is the time from its hand-off to the
//!   input producer to the reader's poll returning its output; the same input producer and reader
//!   serve every workload, so their own delay is in every figure alike.
//!
//! The run reports the rate actually sent, p50, p99, p99.9 and the maximum, and whether the workload
//! kept up (p99.9 below a second; a workload slower than the offered load has a latency that grows
//! with the run's length, so its percentiles measure the run, not the pipeline). The summary gives
//! medians over the rounds and the two targeted ratios (F_alos p99 / P0 p99 ≤ 1.5, F_eos(100 ms) p99 /
//! Pt(100 ms) p99 ≤ 1.2); `RESULT latency-*` lines carry the same.

use crate::compare::millrace_side::{self, Mode};
use crate::compare::raw;
use crate::kafka::{LoadSpec, load};
use crate::measure::Summary;
use anyhow::{Context as _, bail};
use millrace_testkit::{Admin, unique};
use rand::RngExt;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Records sent before the measured ones.
const WARMUP: u64 = 1_000;
/// A warm-up record's sequence number.
const WARM: u64 = u64::MAX;
/// How long a run may take beyond its paced writing.
const GRACE: Duration = Duration::from_secs(120);
/// A p99.9 above this means the workload did not keep up with the offered load.
const KEPT_UP: Duration = Duration::from_secs(1);

/// Options of `latency`.
#[derive(Debug, clap::Args)]
pub struct LatencyArgs {
    /// Offered loads as fractions of P0's throughput (measured first), comma-separated: each load is
    /// a set of rounds of its own.
    #[arg(long, value_delimiter = ',', default_values_t = [0.5, 0.1])]
    loads: Vec<f64>,
    /// One offered load in records/s (instead of --loads; P0's throughput is then not measured).
    #[arg(long)]
    rate: Option<u64>,
    /// How long each run writes at the offered load.
    #[arg(long, default_value_t = 15)]
    seconds: u64,
    /// Rounds, each running every workload once (alternately forward and in reverse).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Bytes per record value (at least 16).
    #[arg(long, default_value_t = 100)]
    value_size: usize,
    /// Number of distinct keys, drawn uniformly.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Partitions of the input and output topics.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// A smoke run: 2 s per run at 2,000 records/s, one round.
    #[arg(long)]
    quick: bool,
    /// Brokers; defaults to KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092.
    #[arg(long)]
    bootstrap: Option<String>,
    /// Writes every run's latencies (microseconds, in send order) to `<dir>/<load>-<round>-<workload>.txt`.
    #[arg(long)]
    dump: Option<std::path::PathBuf>,
}

/// The workloads, in the order of a forward round (each targeted pair side by side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    P0,
    FAlos,
    Pt100,
    FEos100,
}

impl Workload {
    const ALL: [Workload; 4] = [Workload::P0, Workload::FAlos, Workload::Pt100, Workload::FEos100];

    fn label(self) -> &'static str {
        match self {
            Workload::P0 => "P0",
            Workload::FAlos => "F_alos",
            Workload::Pt100 => "Pt(100 ms)",
            Workload::FEos100 => "F_eos(100 ms)",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Workload::P0 => "p0",
            Workload::FAlos => "f-alos",
            Workload::Pt100 => "pt-100ms",
            Workload::FEos100 => "f-eos-100ms",
        }
    }

    fn transactional(self) -> bool {
        matches!(self, Workload::Pt100 | Workload::FEos100)
    }
}

/// What one run measured.
#[derive(Debug, Clone)]
struct Latencies {
    /// Records/s actually handed to the input producer.
    sent_rps: f64,
    /// Sorted, in microseconds.
    micros: Vec<u64>,
    /// In send order (for `--dump`).
    in_order: Vec<u64>,
}

impl Latencies {
    fn quantile_ms(&self, q: f64) -> f64 {
        let i = ((self.micros.len() as f64 * q) as usize).min(self.micros.len() - 1);
        self.micros[i] as f64 / 1e3
    }
    fn max_ms(&self) -> f64 {
        self.micros.last().copied().unwrap_or_default() as f64 / 1e3
    }
    fn kept_up(&self) -> bool {
        self.quantile_ms(0.999) < KEPT_UP.as_secs_f64() * 1e3
    }
}

/// Microseconds since this process's first call: the one clock of writer and reader.
fn now_us() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// Runs the benchmark and prints its report.
pub async fn run(args: LatencyArgs) -> anyhow::Result<()> {
    let bootstrap = args.bootstrap.clone().unwrap_or_else(millrace::PipelineConfig::bootstrap_from_env);
    let (seconds, rounds) = if args.quick { (2, 1) } else { (args.seconds, args.rounds) };
    if args.value_size < 16 || rounds == 0 || seconds == 0 || args.partitions < 1 {
        bail!("--value-size must be at least 16, --rounds, --seconds and --partitions at least 1");
    }
    let admin = Admin::new(&bootstrap)?;
    let (mut topics, mut groups) = (Vec::new(), Vec::new());
    let outcome = measure(&args, &bootstrap, seconds, rounds, &admin, &mut topics, &mut groups).await;
    admin.clean_up(&topics, &groups).await;
    outcome
}

async fn measure(
    args: &LatencyArgs,
    bootstrap: &str,
    seconds: u64,
    rounds: usize,
    admin: &Admin,
    topics: &mut Vec<String>,
    groups: &mut Vec<String>,
) -> anyhow::Result<()> {
    // (label, records/s) of every offered load.
    let loads: Vec<(String, u64)> = match (args.quick, args.rate) {
        (true, _) => vec![("rate-2000".into(), 2_000)],
        (false, Some(rate)) => vec![(format!("rate-{rate}"), rate)],
        (false, None) => {
            let p0 = p0_throughput(args, bootstrap, admin, topics, groups).await?;
            println!("P0 drained {p0:.0} records/s");
            println!("RESULT latency-p0 rps={p0:.0}");
            args.loads.iter().map(|&f| (format!("{f}"), (p0 * f) as u64)).collect()
        }
    };
    for (load, rate) in loads {
        if rate == 0 {
            bail!("offered load {load} is 0 records/s");
        }
        println!();
        match load.strip_prefix("rate-") {
            Some(_) => println!("offered load {rate} records/s, {seconds} s per run"),
            None => println!("offered load {load} of P0's throughput: {rate} records/s, {seconds} s per run"),
        }
        println!(
            "RESULT latency-plan load={load} rate={rate} seconds={seconds} rounds={rounds} value_size={}",
            args.value_size
        );
        let results = at_load(args, bootstrap, admin, topics, groups, &load, rate, seconds, rounds).await?;
        summarize(&load, &results);
    }
    Ok(())
}

/// The rounds at one offered load.
#[allow(clippy::too_many_arguments)]
async fn at_load(
    args: &LatencyArgs,
    bootstrap: &str,
    admin: &Admin,
    topics: &mut Vec<String>,
    groups: &mut Vec<String>,
    load: &str,
    rate: u64,
    seconds: u64,
    rounds: usize,
) -> anyhow::Result<Vec<(Workload, Latencies)>> {
    let paced = rate * seconds;
    println!(
        "{:>5}  {:<14}  {:>10}  {:>8}  {:>8}  {:>9}  {:>8}  kept up",
        "round", "workload", "sent rec/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms"
    );
    let mut results: Vec<(Workload, Latencies)> = Vec::new();
    for round in 1..=rounds {
        let mut order = Workload::ALL.to_vec();
        if round % 2 == 0 {
            order.reverse();
        }
        for workload in order {
            let l = run_one(args, bootstrap, admin, topics, groups, workload, rate, paced).await?;
            if let Some(dir) = &args.dump {
                let text: String = l.in_order.iter().map(|us| format!("{us}\n")).collect();
                let path = dir.join(format!("{load}-{round}-{}.txt", workload.slug()));
                std::fs::create_dir_all(dir)
                    .and_then(|()| std::fs::write(&path, text))
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            println!(
                "{round:>5}  {:<14}  {:>10.0}  {:>8.1}  {:>8.1}  {:>9.1}  {:>8.1}  {}",
                workload.label(),
                l.sent_rps,
                l.quantile_ms(0.5),
                l.quantile_ms(0.99),
                l.quantile_ms(0.999),
                l.max_ms(),
                if l.kept_up() { "yes" } else { "no" }
            );
            println!(
                "RESULT latency-run load={load} workload={} round={round} sent_rps={:.0} p50_ms={:.2} p99_ms={:.2} p999_ms={:.2} \
                 max_ms={:.2} kept_up={}",
                workload.slug(),
                l.sent_rps,
                l.quantile_ms(0.5),
                l.quantile_ms(0.99),
                l.quantile_ms(0.999),
                l.max_ms(),
                l.kept_up()
            );
            results.push((workload, l));
        }
    }
    Ok(results)
}

/// Medians over the rounds, and the targeted ratios of p99.
fn summarize(load: &str, results: &[(Workload, Latencies)]) {
    println!("medians over the rounds (load {load}):");
    let median = |w: Workload, q: f64| {
        Summary::of(results.iter().filter(|(x, _)| *x == w).map(|(_, l)| l.quantile_ms(q))).map(|s| s.median)
    };
    for w in Workload::ALL {
        let (Some(p50), Some(p99), Some(p999)) = (median(w, 0.5), median(w, 0.99), median(w, 0.999)) else { continue };
        let kept = results.iter().filter(|(x, _)| *x == w).all(|(_, l)| l.kept_up());
        println!(
            "  {:<14} p50 {p50:.1} ms, p99 {p99:.1} ms, p99.9 {p999:.1} ms; kept up in every round: {kept}",
            w.label()
        );
        println!(
            "RESULT latency-median load={load} workload={} p50_ms={p50:.2} p99_ms={p99:.2} p999_ms={p999:.2} kept_up={kept}",
            w.slug()
        );
    }
    for (framework, raw, target) in [(Workload::FAlos, Workload::P0, 1.5), (Workload::FEos100, Workload::Pt100, 1.2)] {
        let (Some(f), Some(r)) = (median(framework, 0.99), median(raw, 0.99)) else { continue };
        let ratio = f / r;
        let met = if ratio <= target { "met" } else { "not met" };
        println!("  {} p99 / {} p99 = {ratio:.2}; target ≤ {target}: {met}", framework.label(), raw.label());
        println!(
            "RESULT latency-ratio load={load} of={} to={} p99_ratio={ratio:.3} target={target} met={}",
            framework.slug(),
            raw.slug(),
            ratio <= target
        );
    }
}

/// P0's throughput draining a pre-loaded topic (as in `compare`), in records/s.
async fn p0_throughput(
    args: &LatencyArgs,
    bootstrap: &str,
    admin: &Admin,
    topics: &mut Vec<String>,
    groups: &mut Vec<String>,
) -> anyhow::Result<f64> {
    let (input, output) = fresh_topics(admin, topics, args.partitions, "p0").await?;
    let group = unique("millrace-bench-lat-p0");
    groups.push(group.clone());
    let spec = LoadSpec { records: 500_000, value_size: args.value_size, keys: args.keys };
    let (b, i) = (bootstrap.to_owned(), input.clone());
    tokio::task::spawn_blocking(move || load(&b, &i, spec)).await??;
    let m = raw_pipe(bootstrap, &input, &output, &group, spec.records, GRACE, None).await?;
    Ok(m.rps())
}

/// A fresh input topic and output topic (`--partitions` each), kept for the clean-up.
async fn fresh_topics(
    admin: &Admin,
    topics: &mut Vec<String>,
    partitions: i32,
    what: &str,
) -> anyhow::Result<(String, String)> {
    let (input, output) = (unique(&format!("millrace-bench-lat-{what}")), unique("millrace-bench-lat-out"));
    for t in [&input, &output] {
        admin.create_topic(t, partitions, &[]).await?;
        topics.push(t.clone());
    }
    Ok((input, output))
}

/// One run of `compare`'s raw pipe (P0 without `transactions`, else Pt) on a blocking thread.
async fn raw_pipe(
    bootstrap: &str,
    input: &str,
    output: &str,
    group: &str,
    records: u64,
    timeout: Duration,
    transactions: Option<Duration>,
) -> anyhow::Result<crate::measure::Measurement> {
    let (b, i, o, g) = (bootstrap.to_owned(), input.to_owned(), output.to_owned(), group.to_owned());
    tokio::task::spawn_blocking(move || {
        raw::run(&raw::Pipe {
            bootstrap: &b,
            input: &i,
            output: &o,
            group: &g,
            records,
            timeout,
            transactions,
            commit_interval: Duration::from_secs(1),
        })
    })
    .await?
}

/// One run: the workload, the paced writer and the reader; returns the sorted latencies.
#[allow(clippy::too_many_arguments)]
async fn run_one(
    args: &LatencyArgs,
    bootstrap: &str,
    admin: &Admin,
    topics: &mut Vec<String>,
    groups: &mut Vec<String>,
    workload: Workload,
    rate: u64,
    paced: u64,
) -> anyhow::Result<Latencies> {
    let (input, output) = fresh_topics(admin, topics, args.partitions, workload.slug()).await?;
    let group = unique(&format!("millrace-bench-lat-{}", workload.slug()));
    groups.push(group.clone());
    let records = WARMUP + paced;
    let timeout = GRACE + Duration::from_secs(paced / rate.max(1));
    let seen = Arc::new(AtomicU64::new(0));
    let reader = {
        let (b, o, seen, partitions, committed) =
            (bootstrap.to_owned(), output.clone(), seen.clone(), args.partitions, workload.transactional());
        std::thread::spawn(move || read(&b, &o, partitions, committed, paced, &seen, timeout))
    };
    let writer = {
        let (b, i, seen, value_size, keys) =
            (bootstrap.to_owned(), input.clone(), seen.clone(), args.value_size, args.keys);
        std::thread::spawn(move || write(&b, &i, value_size, keys, rate, paced, &seen))
    };
    let ran: anyhow::Result<()> = match workload {
        Workload::P0 | Workload::Pt100 => {
            let transactions = (workload == Workload::Pt100).then_some(Duration::from_millis(100));
            raw_pipe(bootstrap, &input, &output, &group, records, timeout, transactions).await.map(drop)
        }
        Workload::FAlos | Workload::FEos100 => {
            let mode = if workload == Workload::FAlos { Mode::Alos } else { Mode::Eos(Duration::from_millis(100)) };
            let (input, output, group) = (input.as_str(), output.as_str(), group.as_str());
            let run = millrace_side::Run { bootstrap, input, output, group, records, timeout, mode, warmup: 0 };
            millrace_side::run(&run).await.map(drop).map_err(|e| match e {
                millrace_side::NotRun::Unavailable(why) => anyhow::anyhow!("not available: {why}"),
                millrace_side::NotRun::Failed(e) => e,
            })
        }
    };
    let sent_rps = writer.join().map_err(|_| anyhow::anyhow!("the writer panicked"))?;
    let micros = reader.join().map_err(|_| anyhow::anyhow!("the reader panicked"))?;
    ran.with_context(|| format!("{} did not finish", workload.label()))?;
    let sent_rps = sent_rps?;
    let in_order = micros?;
    let mut micros = in_order.clone();
    micros.sort_unstable();
    Ok(Latencies { sent_rps, micros, in_order })
}

/// The input producer: the warm-up records, then (once the reader saw them) `paced` records at
/// `rate`; returns the rate achieved.
fn write(
    bootstrap: &str,
    topic: &str,
    value_size: usize,
    keys: u64,
    rate: u64,
    paced: u64,
    seen: &AtomicU64,
) -> anyhow::Result<f64> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "1")
        .set("linger.ms", "1")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .context("creating the input producer")?;
    let keys: Vec<String> = (0..keys.max(1)).map(|k| format!("key-{k}")).collect();
    let mut rng = rand::rng();
    let mut value = vec![b'v'; value_size];
    let mut send = |seq: u64, value: &mut Vec<u8>| -> anyhow::Result<()> {
        value[8..16].copy_from_slice(&seq.to_le_bytes());
        value[0..8].copy_from_slice(&now_us().to_le_bytes());
        let key = &keys[rng.random_range(0..keys.len())];
        raw::send(&producer, BaseRecord::to(topic).key(key.as_bytes()).payload(value.as_slice()))
    };
    for _ in 0..WARMUP {
        send(WARM, &mut value)?;
    }
    let deadline = Instant::now() + GRACE;
    while seen.load(Relaxed) < WARMUP {
        if Instant::now() > deadline {
            bail!("the warm-up records' outputs did not all arrive in {GRACE:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let start = Instant::now();
    let per_us = rate as f64 / 1e6;
    let mut sent = 0;
    while sent < paced {
        let due = ((start.elapsed().as_micros() as f64 * per_us) as u64 + 1).min(paced);
        if due <= sent {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        for seq in sent..due {
            send(seq, &mut value)?;
        }
        sent = due;
    }
    let took = start.elapsed();
    producer.flush(GRACE).context("flushing the input producer")?;
    Ok(paced as f64 / took.as_secs_f64())
}

/// The output's reader: counts the warm-up outputs in `seen`, returns the latency of each of the
/// `paced` measured records (microseconds, in send order).
fn read(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    read_committed: bool,
    paced: u64,
    seen: &AtomicU64,
    timeout: Duration,
) -> anyhow::Result<Vec<u64>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("millrace-bench-lat-reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", if read_committed { "read_committed" } else { "read_uncommitted" })
        .set("fetch.wait.max.ms", "5")
        .create()
        .context("creating the reader")?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut latencies = vec![u64::MAX; paced as usize];
    let mut got = 0u64;
    let deadline = Instant::now() + timeout;
    while got < paced {
        if Instant::now() > deadline {
            bail!("the reader saw {got} of {paced} measured outputs in {timeout:?}");
        }
        let Some(message) = consumer.poll(Duration::from_millis(50)) else { continue };
        let at = now_us();
        let message = message.context("reading the output")?;
        let value = message.payload().filter(|v| v.len() >= 16).context("an output without the writer's stamp")?;
        let sent = u64::from_le_bytes(value[0..8].try_into()?);
        let seq = u64::from_le_bytes(value[8..16].try_into()?);
        if seq == WARM {
            seen.fetch_add(1, Relaxed);
        } else if let Some(slot) = latencies.get_mut(seq as usize)
            && *slot == u64::MAX
        {
            // A duplicate (at-least-once after a retry) counts once, at its first arrival.
            *slot = at.saturating_sub(sent);
            got += 1;
        }
    }
    Ok(latencies)
}
