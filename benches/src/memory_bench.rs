//! The `memory` benchmark: the peak resident memory of a Millrace process draining a large backlog.
//!
//! # Method
//! A fresh topic (random name, `--partitions` partitions, default 4) is pre-loaded with `--records`
//! records (default 5,000,000; 500,000 with `--quick`) of `--value-size` bytes (default 100), keyed
//! uniformly over `--keys` keys, and acknowledged before anything is measured. The loading producer
//! queues up to a million records, so it must not be in the measured process: the pipeline runs in a
//! **child process**, this same binary re-invoked with the hidden `memory-child` subcommand. The child
//! builds a [`Pipeline`] with the defaults (key order, default [`millrace::Bounds`], a fresh group)
//! and a no-op processor, runs it until its `processed` counter reaches the record count (checked
//! every 2 ms), stops it gracefully (drain, final commit, leaving the group), and then prints one
//! `CHILD key=value …` line: its peak resident set size (`VmHWM` of `/proc/self/status`, the
//! kernel's high-water mark over the process's whole life, so no peak between samples is missed),
//! its resident size before the pipeline existed (the runtime and the binary), and its timings.
//! The kernel updates the high-water mark lazily (proc(5) calls it inaccurate; a reading after the
//! shutdown was seen a fraction of a MiB below one taken earlier), so the child also reads it when the
//! backlog is drained and samples its `VmRSS` every ~50 ms; the peak reported is the largest of all
//! readings, its own and the parent's.
//! It also prints progress lines with its current `VmRSS`, which the parent passes on.
//!
//! Two cross-checks come from the parent: the largest `VmRSS` it saw sampling the child every
//! 50 ms, and `getrusage(RUSAGE_CHILDREN).ru_maxrss` after the child was reaped. The latter is *not*
//! the child's own peak when the parent was bigger: the kernel folds the peak of the address space a
//! process had before `exec` into its `ru_maxrss`, and the child is spawned from the parent's (vfork),
//! so it reads max(the parent's peak at the spawn, the child's peak): one more reason the child reports
//! its own `VmHWM`. The parent's `VmHWM` at the spawn is printed next to it.
//!
//! # Experiments
//! `--consumer-property KEY=VALUE` passes consumer properties to the child's pipeline. The ones that
//! matter are librdkafka's prefetch, `queued.min.messages` (records *per partition*) and
//! `queued.max.messages.kbytes` (for the whole consumer): librdkafka's defaults, 100,000 and 64 MiB,
//! made most of the memory above the runtime's own, well above Millrace's in-flight bound (10,000
//! records), so Millrace sizes them from its bounds (10,000 and 16 MiB by default);
//! `--consumer-property queued.min.messages=100000 --consumer-property
//! queued.max.messages.kbytes=65536` shows librdkafka's defaults. The canonical figure is that of the
//! defaults.
//!
//! records/s is records / time from spawning [`Pipeline::run`] to the last record processed (group
//! join and first fetch included); "steady" leaves out the time to the first record. The target is a
//! peak RSS of at most 64 MiB, flat with the backlog's size (run `--records 1000000` and
//! `--records 10000000`: within 1.1× of each other).

use crate::core_bench::{Noop, load_average, parse_property};
use crate::kafka::{self, LoadSpec, Planned, TopicArgs};
use crate::measure::{Stopwatch, children_max_rss_kib};
use anyhow::{Context as _, bail};
use millrace::{Pipeline, PipelineConfig};
use millrace_testkit::{Admin, Reaped, proc_status_kib, unique};
use rand::RngExt;
use std::collections::HashMap;
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Records with `--quick`.
const QUICK_RECORDS: u64 = 500_000;
/// How often the child checks its pipeline's counters.
const CHECK_EVERY: Duration = Duration::from_millis(2);
/// How often the parent samples the child's resident size.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);
/// The child reads its own resident size every this many checks (every ~50 ms).
const RSS_EVERY_CHECKS: u64 = 25;
/// Target peak resident set size, in MiB (issue 21; it was 256 MiB before).
pub const TARGET_MIB: f64 = 64.0;
/// Prefix of the child's result line.
const CHILD_PREFIX: &str = "CHILD ";

/// Options of the `memory` benchmark.
#[derive(Debug, clap::Args)]
pub struct MemoryArgs {
    #[command(flatten)]
    topic: TopicArgs,
    /// A consumer property for the child's pipeline, as KEY=VALUE (repeatable), e.g.
    /// queued.min.messages=10000.
    #[arg(long = "consumer-property", value_name = "KEY=VALUE", value_parser = parse_property)]
    consumer_properties: Vec<(String, String)>,
    /// Fail if the child has not drained the backlog after this many seconds.
    #[arg(long, default_value_t = 1800)]
    run_timeout_secs: u64,
}

/// Options of the child process (set by the parent).
#[derive(Debug, clap::Args)]
pub struct MemoryChildArgs {
    #[arg(long)]
    bootstrap: String,
    #[arg(long)]
    topic: String,
    #[arg(long)]
    group: String,
    #[arg(long)]
    records: u64,
    #[arg(long)]
    run_timeout_secs: u64,
    #[arg(long = "consumer-property", value_parser = parse_property)]
    consumer_properties: Vec<(String, String)>,
}

/// Runs the `memory` benchmark and prints its report.
pub async fn run(args: MemoryArgs) -> anyhow::Result<()> {
    let bootstrap = args.topic.bootstrap();
    let spec = args.topic.load(5_000_000, QUICK_RECORDS);
    let partitions = args.topic.partitions;
    if spec.records == 0 || partitions < 1 {
        bail!("--records and --partitions must be at least 1");
    }
    let topic = unique("millrace-bench-memory");
    let group = unique("millrace-bench-memory");
    println!(
        "memory: {} records x {} B values, {} keys, {} partitions, brokers {}, {} CPUs, load average {}",
        spec.records,
        spec.value_size,
        spec.keys,
        partitions,
        bootstrap,
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average(),
    );
    for (k, v) in &args.consumer_properties {
        println!("consumer property (not the defaults): {k}={v}");
    }
    let admin = Admin::new(&bootstrap)?;
    admin.create_topic(&topic, partitions, &[]).await?;
    let child = ChildArgsOwned {
        bootstrap: bootstrap.clone(),
        topic: topic.clone(),
        group: group.clone(),
        records: spec.records,
        timeout: Duration::from_secs(args.run_timeout_secs),
        consumer_properties: args.consumer_properties,
    };
    let result = measure(child, spec).await;
    admin.clean_up(std::slice::from_ref(&topic), std::slice::from_ref(&group)).await;
    let outcome = result?;
    report(spec, partitions, &outcome);
    Ok(())
}

/// Loads the topic (printing progress), then runs and watches the child.
async fn measure(child: ChildArgsOwned, spec: LoadSpec) -> anyhow::Result<Outcome> {
    let (b, t) = (child.bootstrap.clone(), child.topic.clone());
    let took = tokio::task::spawn_blocking(move || load_with_progress(&b, &t, spec)).await??;
    println!(
        "loaded {} records into {} in {:.1} s: {:.0} records/s",
        spec.records,
        child.topic,
        took.as_secs_f64(),
        spec.records as f64 / took.as_secs_f64()
    );
    tokio::task::spawn_blocking(move || supervise(&child)).await?
}

/// [`kafka::load`], printing progress every tenth of the records. Blocking.
fn load_with_progress(bootstrap: &str, topic: &str, spec: LoadSpec) -> anyhow::Result<Duration> {
    let mut rng = rand::rng();
    let keys = spec.keys.max(1);
    let step = (spec.records / 10).max(1);
    let started = Instant::now();
    kafka::load_planned(bootstrap, topic, spec, |i| {
        if i > 0 && i % step == 0 {
            println!("  loading: {i} of {} records queued ({:.1} s)", spec.records, started.elapsed().as_secs_f64());
        }
        if i + 1 == spec.records {
            println!("  loading: all queued ({:.1} s), waiting for acknowledgements", started.elapsed().as_secs_f64());
        }
        Planned { key: rng.random_range(0..keys), header: None }
    })
}

/// What the parent passes to the child.
struct ChildArgsOwned {
    bootstrap: String,
    topic: String,
    group: String,
    records: u64,
    timeout: Duration,
    consumer_properties: Vec<(String, String)>,
}

/// What the child reported, and the parent's own observations of it.
#[derive(Debug)]
struct Outcome {
    /// The child's `CHILD` line, as key → value.
    child: HashMap<String, String>,
    /// Largest `VmRSS` the parent sampled, KiB.
    sampled_peak_kib: u64,
    /// `ru_maxrss` of the reaped child, KiB.
    ru_maxrss_kib: u64,
    /// The parent's own `VmHWM` when it spawned the child, KiB.
    parent_hwm_kib: u64,
}

impl Outcome {
    fn get(&self, key: &str) -> Option<f64> {
        self.child.get(key)?.parse().ok()
    }
}

/// Starts the child, passes its progress lines on, samples its resident size until it exits, and
/// returns its report. Blocking.
fn supervise(args: &ChildArgsOwned) -> anyhow::Result<Outcome> {
    let exe = std::env::current_exe().context("locating this binary to re-invoke it")?;
    let mut command = Command::new(exe);
    command
        .arg("memory-child")
        .args(["--bootstrap", &args.bootstrap, "--topic", &args.topic, "--group", &args.group])
        .args(["--records", &args.records.to_string(), "--run-timeout-secs", &args.timeout.as_secs().to_string()]);
    for (k, v) in &args.consumer_properties {
        command.arg(format!("--consumer-property={k}={v}"));
    }
    let parent_hwm_kib = proc_status_kib(None, "VmHWM").unwrap_or(0);
    // Killed and reaped if supervising it fails early.
    let mut child =
        Reaped(command.stdin(Stdio::null()).stdout(Stdio::piped()).spawn().context("starting the child process")?);
    let pid = child.id();
    println!("child process {pid} started");
    let stdout = child.stdout.take().context("the child's stdout")?;
    let reader = std::thread::spawn(move || {
        let mut report = None;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            match line.strip_prefix(CHILD_PREFIX) {
                Some(rest) => {
                    println!("  child: {line}");
                    report = Some(
                        rest.split_whitespace()
                            .filter_map(|kv| kv.split_once('='))
                            .map(|(k, v)| (k.to_owned(), v.to_owned()))
                            .collect::<HashMap<_, _>>(),
                    );
                }
                None => println!("  child: {line}"),
            }
        }
        report
    });
    let deadline = Instant::now() + args.timeout + Duration::from_secs(60);
    let mut sampled_peak_kib = 0;
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for the child")? {
            break status;
        }
        if let Some(rss) = proc_status_kib(Some(pid), "VmRSS") {
            sampled_peak_kib = sampled_peak_kib.max(rss);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the child process did not finish within {:?}", args.timeout);
        }
        std::thread::sleep(SAMPLE_EVERY);
    };
    let report = reader.join().map_err(|_| anyhow::anyhow!("the child's output reader panicked"))?;
    if !status.success() {
        bail!("the child process failed: {status}");
    }
    let child = report.context("the child printed no CHILD line")?;
    Ok(Outcome { child, sampled_peak_kib, ru_maxrss_kib: children_max_rss_kib(), parent_hwm_kib })
}

fn mib(kib: f64) -> f64 {
    kib / 1024.0
}

/// Prints the peak RSS, its cross-checks, the throughput, and the `RESULT` line.
fn report(spec: LoadSpec, partitions: i32, o: &Outcome) {
    let kib = |key| o.get(key).unwrap_or(f64::NAN);
    // The kernel's high-water mark and the samples (its update is lazy; see `run_child`).
    let peak = kib("hwm_kib").max(kib("rss_sampled_peak_kib")).max(o.sampled_peak_kib as f64);
    let elapsed = o.get("elapsed_s").unwrap_or(f64::NAN);
    let first = o.get("first_record_s").unwrap_or(f64::NAN);
    let rps = spec.records as f64 / elapsed;
    let steady = spec.records.saturating_sub(1) as f64 / (elapsed - first);
    println!();
    println!(
        "peak RSS of the child: {:.1} MiB ({:.1} MB) (VmHWM {:.1} MiB, {:.1} MiB at the moment the backlog was \
         drained; largest VmRSS it sampled {:.1} MiB); before the pipeline existed {:.1} MiB (VmHWM {:.1} MiB)",
        mib(peak),
        peak * 1024.0 / 1e6,
        mib(kib("hwm_kib")),
        mib(kib("hwm_at_done_kib")),
        mib(kib("rss_sampled_peak_kib")),
        mib(kib("baseline_rss_kib")),
        mib(kib("baseline_hwm_kib")),
    );
    println!(
        "cross-checks: largest VmRSS sampled by the parent every {} ms {:.1} MiB; ru_maxrss of the reaped child \
         {:.1} MiB (the larger of its peak and the parent's at the spawn, {:.1} MiB)",
        SAMPLE_EVERY.as_millis(),
        mib(o.sampled_peak_kib as f64),
        mib(o.ru_maxrss_kib as f64),
        mib(o.parent_hwm_kib as f64),
    );
    println!(
        "pipeline during the run: in flight peak {} records, buffered bytes peak {:.1} MiB (sampled), paused {}% of \
         the time",
        o.child.get("in_flight_peak").map_or("?", String::as_str),
        mib(kib("buffered_bytes_peak") / 1024.0),
        o.child.get("paused_pct").map_or("?", String::as_str),
    );
    println!(
        "drained {} records in {elapsed:.2} s: {rps:.0} records/s ({steady:.0} steady, first record at {first:.3} s), \
         cpu {} s",
        spec.records,
        o.child.get("cpu_s").map_or("?", String::as_str),
    );
    println!(
        "peak RSS target <= {TARGET_MIB} MiB: {}; load average {}",
        if mib(peak) <= TARGET_MIB { "met" } else { "NOT met" },
        load_average()
    );
    println!(
        "RESULT memory peak_rss_mib={:.1} rps={rps:.0} steady_rps={steady:.0} baseline_rss_mib={:.1} \
         rss_at_done_mib={:.1} sampled_peak_mib={:.1} ru_maxrss_mib={:.1} records={} value_size={} keys={} \
         partitions={partitions}",
        mib(peak),
        mib(kib("baseline_rss_kib")),
        mib(kib("hwm_at_done_kib")),
        mib(o.sampled_peak_kib as f64),
        mib(o.ru_maxrss_kib as f64),
        spec.records,
        spec.value_size,
        spec.keys,
    );
}

/// The child: drains the backlog with a default pipeline and prints its `CHILD` line.
pub async fn run_child(args: MemoryChildArgs) -> anyhow::Result<()> {
    let status = |field| proc_status_kib(None, field).unwrap_or(0);
    let (baseline_rss, baseline_hwm) = (status("VmRSS"), status("VmHWM"));
    let mut config = PipelineConfig::new(&args.bootstrap, &args.group, [&args.topic]);
    for (k, v) in &args.consumer_properties {
        config = config.consumer_property(k, v);
    }
    let pipeline = Pipeline::new(config, Noop)?;
    let stats = pipeline.stats();
    let stop = pipeline.shutdown_token();
    let records = args.records;
    let timeout = Duration::from_secs(args.run_timeout_secs);
    let step = (records / 10).max(1);
    let mut next_progress = step;
    let (mut first_record, mut buffered_peak, mut samples, mut paused, mut rss_peak) = (None, 0, 0u64, 0u64, 0);
    let clock = Stopwatch::start();
    let mut running = tokio::spawn(pipeline.run());
    let (elapsed, cpu) = loop {
        let s = stats.snapshot();
        if s.processed >= records {
            break clock.stop();
        }
        if s.polled > 0 {
            first_record.get_or_insert_with(|| clock.elapsed());
            buffered_peak = buffered_peak.max(s.buffered_bytes);
            samples += 1;
            paused += u64::from(s.paused_partitions > 0);
            if samples % RSS_EVERY_CHECKS == 0 {
                rss_peak = rss_peak.max(status("VmRSS"));
            }
        }
        if s.processed >= next_progress {
            println!(
                "processed {} of {records} ({:.1} s), RSS {:.1} MiB, in flight {}",
                s.processed,
                clock.elapsed().as_secs_f64(),
                mib(status("VmRSS") as f64),
                s.in_flight,
            );
            next_progress = (s.processed / step + 1) * step;
        }
        if running.is_finished() {
            let outcome = (&mut running).await?;
            bail!("the pipeline stopped after {} of {records} records: {outcome:?}", s.processed);
        }
        if clock.elapsed() > timeout {
            stop.cancel();
            let _ = running.await;
            bail!("only {} of {records} records after {timeout:?}", s.processed);
        }
        tokio::time::sleep(CHECK_EVERY).await;
    };
    let hwm_at_done = status("VmHWM");
    rss_peak = rss_peak.max(status("VmRSS"));
    stop.cancel();
    let summary = running.await?.context("the pipeline")?;
    if summary.failed > 0 {
        bail!("{} records failed", summary.failed);
    }
    let end = stats.snapshot();
    println!(
        "{CHILD_PREFIX}records={records} elapsed_s={:.3} first_record_s={:.3} cpu_s={:.2} \
         baseline_rss_kib={baseline_rss} \
         baseline_hwm_kib={baseline_hwm} hwm_at_done_kib={hwm_at_done} hwm_kib={} rss_sampled_peak_kib={rss_peak} \
         rss_end_kib={} in_flight_peak={} buffered_bytes_peak={buffered_peak} paused_pct={:.0} drained={}",
        elapsed.as_secs_f64(),
        first_record.unwrap_or_default().as_secs_f64(),
        cpu.as_secs_f64(),
        // The kernel updates its high-water mark lazily (proc(5) calls VmHWM inaccurate): a later reading
        // can be below an earlier one, so keep the larger.
        status("VmHWM").max(hwm_at_done),
        status("VmRSS"),
        end.in_flight_peak,
        paused as f64 * 100.0 / samples.max(1) as f64,
        summary.drained,
    );
    Ok(())
}
