//! The Kafka Streams peer, run as a child process: `benches/streams-peer` (built by `scripts/bench`
//! with `mvn -q package`) drains the input topic through a pass-through topology with one stream thread
//! per core (`--threads`) and prints one `STREAMS key=value …` line (see its `StreamsPeer.java`).
//!
//! Its throughput and CPU seconds are those of its own timed window (from `KafkaStreams.start()` until
//! every output is visible: acknowledged for at_least_once, committed for exactly_once_v2), measured by
//! the JVM itself, so JVM start-up is left out as pipeline construction is for Millrace. The whole
//! process's CPU time (start-up, JIT and shutdown included) is taken from `getrusage(RUSAGE_CHILDREN)`
//! once the child is reaped, and reported beside it. Its warm window (from the moment the topology has
//! seen `warmup` records to the end) is measured the same way and compared with Millrace's own.

use super::millrace_side::NotRun;
use crate::measure::{Measurement, Window, children_cpu};
use anyhow::Context as _;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// One run of the peer.
pub struct Peer<'a> {
    /// Directory holding `streams-peer.jar` and `lib/`.
    pub dir: Option<&'a Path>,
    pub bootstrap: &'a str,
    pub input: &'a str,
    pub output: &'a str,
    pub group: &'a str,
    pub records: u64,
    pub timeout: Duration,
    /// `at_least_once` or `exactly_once_v2`.
    pub guarantee: &'a str,
    pub commit_interval: Duration,
    /// Records processed before the warm window starts.
    pub warmup: u64,
}

/// Runs the peer; returns its measurement, a note, and the whole process's CPU time.
pub fn run(p: &Peer<'_>) -> Result<(Measurement, String, Duration), NotRun> {
    let dir = p.dir.ok_or_else(|| {
        NotRun::Unavailable("the Kafka Streams peer is not built: run scripts/bench, or pass --streams-peer".into())
    })?;
    let jar = dir.join("streams-peer.jar");
    if !jar.is_file() {
        return Err(NotRun::Unavailable(format!("no {} (run scripts/bench to build it)", jar.display())));
    }
    let java = std::env::var_os("JAVA").map_or_else(|| PathBuf::from("java"), PathBuf::from);
    let classpath = format!("{}:{}/*", jar.display(), dir.join("lib").display());
    let cpu_before = children_cpu();
    let mut child = Command::new(&java)
        .args(["-cp", &classpath, "dev.millrace.bench.StreamsPeer"])
        .args(["--bootstrap", p.bootstrap, "--input", p.input, "--output", p.output])
        .args(["--records", &p.records.to_string(), "--guarantee", p.guarantee])
        .args(["--commit-interval-ms", &p.commit_interval.as_millis().to_string()])
        .args(["--warmup-records", &p.warmup.to_string()])
        .args(["--application-id", p.group, "--timeout-s", &p.timeout.as_secs().to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {} (a JDK 17+ is needed; JAVA chooses the binary)", java.display()))?;
    let stderr = child.stderr.take().context("the child's stderr")?;
    // Drained on a thread so that a chatty child never blocks on a full pipe; kept for errors.
    let stderr =
        std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).collect::<Vec<String>>());
    let stdout = child.stdout.take().context("the child's stdout")?;
    let mut line = None;
    for l in BufReader::new(stdout).lines().map_while(Result::ok) {
        if let Some(rest) = l.strip_prefix("STREAMS ") {
            line = Some(rest.to_owned());
        }
    }
    let status = child.wait().context("waiting for the Kafka Streams peer")?;
    let whole_cpu = children_cpu().saturating_sub(cpu_before);
    let stderr = stderr.join().unwrap_or_default();
    let Some(line) = line.filter(|_| status.success()) else {
        let tail: Vec<&String> = stderr.iter().filter(|l| !l.contains("SLF4J")).rev().take(8).collect();
        let tail: Vec<&str> = tail.into_iter().rev().map(String::as_str).collect();
        return Err(NotRun::Failed(anyhow::anyhow!("the Kafka Streams peer failed ({status}): {}", tail.join(" | "))));
    };
    let fields: HashMap<&str, &str> = line.split_whitespace().filter_map(|f| f.split_once('=')).collect();
    let secs = |name: &str| -> anyhow::Result<Duration> {
        let v: f64 = fields.get(name).with_context(|| format!("no {name} in {line:?}"))?.parse()?;
        Ok(Duration::from_secs_f64(v.max(0.0)))
    };
    let field = |name: &str| fields.get(name).copied().unwrap_or("?");
    let warm = Window {
        records: field("warm_records").parse().with_context(|| format!("no warm_records in {line:?}"))?,
        elapsed: secs("warm_elapsed_s")?,
        cpu: secs("warm_cpu_s")?,
    };
    let m = Measurement {
        records: p.records,
        elapsed: secs("elapsed_s")?,
        first_record: secs("first_record_s")?,
        cpu: secs("cpu_s")?,
        warm: Some(warm),
    };
    let note = format!(
        "{} stream threads, linger.ms {}, batch.size {}; warm (after {} records) {:.0} records/s, {:.2} CPU s/M; \
         JVM process CPU {:.2} s in all ({:.2} s/M records; start-up, JIT and shutdown included)",
        field("threads"),
        field("linger_ms"),
        field("batch_size"),
        p.warmup,
        warm.rps(),
        warm.cpu_s_per_m(),
        whole_cpu.as_secs_f64(),
        whole_cpu.as_secs_f64() / p.records as f64 * 1e6
    );
    Ok((m, note, whole_cpu))
}
