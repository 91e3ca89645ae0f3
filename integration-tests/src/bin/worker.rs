//! `millrace-it-worker`: a pipeline the integration tests run as a child process so they can SIGKILL,
//! SIGTERM or SIGSTOP it. Its processor journals every record it handles (`partition offset key epoch`,
//! one line per record, written with one `write` call so a kill leaves at most a torn last line) to a
//! file outside Kafka, then returns: the journal is the independent record of effects.
//!
//! With `--output-topic` it is also a copier: every record is emitted to that topic with the same
//! key and the value `<partition> <offset> <input value>`, in exactly-once mode with
//! `--exactly-once`. Records whose value starts with `poison` fail permanently (→ DLQ; with
//! `--park-keys` their key is parked behind them).
//!
//! Options the chaos suite (`millrace-chaos`) uses on top:
//! - `--stats-file PATH`: the pipeline's counters, rewritten every 250 ms (atomically, by rename), so
//!   a SIGKILLed incarnation still leaves its last figures behind.
//! - `--effect-ledger PATH`: the effect goes to an idempotent downstream keyed by
//!   `ctx.idempotency_key()` (an append-only file of `<key> <value>` lines; a key already there is
//!   absorbed, not applied again) — how the framework tells users to close the one window the dedup
//!   store leaves (a crash between the effect and the dedup write, invariant D2).
//! - `--decode-utf8`: the processor is a typed one (`Typed<_, Utf8>`): values that are not UTF-8
//!   never reach it and go to the DLQ with error kind `decode`.
//! - Values starting with `panic` make the processor panic (→ DLQ, kind `panic`); values starting
//!   with `inflate` emit an output of `--inflate-bytes` bytes, over the producer's
//!   `message.max.bytes` by default (→ DLQ, kind `permanent`).

use anyhow::Result;
use clap::Parser;
use millrace::codec::Utf8;
use millrace::typed::{Typed, TypedProcessor};
use millrace::{
    Bounds, Context, DedupConfig, DlqConfig, ExactlyOnce, OutputRecord, Pipeline, PipelineConfig, ProcessError,
    ProcessingOrder, Processor, Record, Stats,
};
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Parser, Debug)]
struct Args {
    #[arg(long)]
    topic: String,
    #[arg(long)]
    group: String,
    #[arg(long)]
    journal: PathBuf,
    /// Handler delay: uniformly random in [min, max] milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_min_ms: u64,
    #[arg(long, default_value_t = 0)]
    delay_max_ms: u64,
    #[arg(long, default_value = "key")]
    ordering: String,
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    #[arg(long, default_value_t = 2_000)]
    per_partition: usize,
    #[arg(long, default_value_t = 10_000)]
    total: usize,
    #[arg(long, default_value_t = 1_000)]
    commit_interval_ms: u64,
    /// Also commit whenever this many records finished.
    #[arg(long)]
    commit_every_records: Option<u64>,
    #[arg(long, default_value_t = 10_000)]
    drain_timeout_ms: u64,
    /// Turn the dedup store on, with its RocksDB in this directory.
    #[arg(long)]
    dedup_dir: Option<PathBuf>,
    /// Extra consumer properties, `key=value`.
    #[arg(long = "consumer-prop")]
    consumer_props: Vec<String>,
    /// Copy every record to this topic.
    #[arg(long)]
    output_topic: Option<String>,
    /// Exactly-once delivery (Kafka transactions).
    #[arg(long)]
    exactly_once: bool,
    /// The transactional id (exactly-once).
    #[arg(long)]
    transactional_id: Option<String>,
    /// Share of transactions aborted on purpose (exactly-once).
    #[arg(long, default_value_t = 0.0)]
    abort_ratio: f64,
    /// `transaction.timeout.ms` (exactly-once); the framework's default when unset.
    #[arg(long)]
    transaction_timeout_ms: Option<u64>,
    /// Rewrite the pipeline's counters to this file every 250 ms.
    #[arg(long)]
    stats_file: Option<PathBuf>,
    /// Apply each record's effect to this idempotent ledger, keyed by `ctx.idempotency_key()`.
    #[arg(long)]
    effect_ledger: Option<PathBuf>,
    /// Decode values as UTF-8 before the processor (undecodable ones go to the DLQ).
    #[arg(long)]
    decode_utf8: bool,
    /// Park a key on failure (`DlqConfig::park_keys`): a poison record holds its key's later records.
    #[arg(long)]
    park_keys: bool,
    /// Size of the output emitted for an `inflate…` record.
    #[arg(long, default_value_t = 2_000_000)]
    inflate_bytes: usize,
}

/// An idempotent downstream: applies an effect once per idempotency key, across restarts.
struct Ledger {
    state: Mutex<(File, HashSet<Vec<u8>>)>,
}

impl Ledger {
    fn open(path: &Path) -> Result<Self> {
        let mut file = OpenOptions::new().create(true).read(true).append(true).open(path)?;
        let mut text = Vec::new();
        file.read_to_end(&mut text)?;
        // A line torn by a kill is not an applied effect; end it so the next line stands alone.
        if text.last().is_some_and(|b| *b != b'\n') {
            file.write_all(b"\n")?;
        }
        let keys = text
            .split(|b| *b == b'\n')
            .filter(|line| !line.is_empty())
            .filter_map(|line| line.split(|b| *b == b' ').next().map(<[u8]>::to_vec))
            .collect();
        Ok(Self { state: Mutex::new((file, keys)) })
    }

    /// Applies the effect unless `key` was applied before; one `write` per effect.
    fn apply(&self, key: &[u8], value: &[u8]) -> std::io::Result<bool> {
        let mut state = self.state.lock().expect("ledger lock");
        if state.1.contains(key) {
            return Ok(false);
        }
        let mut line = key.to_vec();
        line.push(b' ');
        line.extend_from_slice(value);
        line.push(b'\n');
        state.0.write_all(&line)?;
        state.1.insert(key.to_vec());
        Ok(true)
    }
}

struct Journaling {
    file: Mutex<File>,
    delay: (u64, u64),
    output: Option<String>,
    ledger: Option<Ledger>,
    inflate_bytes: usize,
}

impl Processor for Journaling {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let (lo, hi) = self.delay;
        if hi > 0 {
            tokio::time::sleep(Duration::from_millis(rand::random_range(lo..=hi))).await;
        }
        let idempotency_key = ctx.idempotency_key().map(String::from_utf8_lossy);
        let line = format!(
            "{} {} {} {} {}\n",
            record.partition,
            record.offset,
            record.key_str().unwrap_or("-"),
            ctx.assignment_epoch(),
            idempotency_key.as_deref().unwrap_or("-")
        );
        self.file.lock().expect("journal lock").write_all(line.as_bytes()).map_err(ProcessError::transient)?;
        let value = record.value.as_deref().unwrap_or_default();
        if value.starts_with(b"poison") {
            return Err(ProcessError::permanent("poison record"));
        }
        if value.starts_with(b"panic") {
            panic!("the processor panics on {}", String::from_utf8_lossy(value));
        }
        if let Some(ledger) = &self.ledger {
            let coordinates = format!("{}/{}/{}", record.topic, record.partition, record.offset).into_bytes();
            let key = ctx.idempotency_key().map_or(coordinates, <[u8]>::to_vec);
            ledger.apply(&key, value).map_err(ProcessError::transient)?;
        }
        if let Some(topic) = &self.output {
            let mut out = format!("{} {} ", record.partition, record.offset).into_bytes();
            out.extend_from_slice(value);
            if value.starts_with(b"inflate") {
                out.resize(self.inflate_bytes.max(out.len()), b'.');
            }
            let mut out = OutputRecord::to(topic).value(out);
            out.key = record.key.clone();
            ctx.emit(out).await?;
        }
        Ok(())
    }
}

/// [`Journaling`] behind a UTF-8 decoder (`--decode-utf8`).
struct Decoded(Journaling);

impl TypedProcessor for Decoded {
    type Input = String;

    async fn process(&self, _input: String, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        self.0.process(record, ctx).await
    }

    fn name(&self) -> &str {
        "Journaling"
    }
}

/// One line of counters (`name=value …`), also the body of `--stats-file`.
fn stats_line(stats: &Stats) -> String {
    let s = stats.snapshot();
    format!(
        "polled={} processed={} dead_lettered={} panics={} dedup_hits={} dedup_restored={} dedup_restores={} assigned={} assignments={} revocations={} commits={} commit_failures={} discarded_on_revoke={} transactions={} aborted={} injected_aborts={} rewinds={} producer_resets={} in_flight_peak={} running_peak={}",
        s.polled,
        s.processed,
        s.dead_lettered,
        s.panics,
        s.dedup_hits,
        s.dedup_restored,
        s.dedup_restores,
        s.assigned_partitions,
        s.assignments,
        s.revocations,
        s.commits,
        s.commit_failures,
        s.discarded_on_revoke,
        s.transactions_committed,
        s.transactions_aborted,
        s.transactions_injected_aborts,
        s.rewinds,
        s.producer_resets,
        s.in_flight_peak,
        s.running_peak
    )
}

/// Replaces `path` with the current counters (write a temporary file, then rename).
fn write_stats(path: &Path, stats: &Stats) {
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, stats_line(stats) + "\n").is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

async fn run<P: Processor>(config: PipelineConfig, processor: P, stats_file: Option<PathBuf>) -> Result<()> {
    let pipeline = Pipeline::new(config, processor)?;
    let stats = pipeline.stats();
    if let Some(path) = stats_file.clone() {
        let stats = stats.clone();
        tokio::spawn(async move {
            loop {
                write_stats(&path, &stats);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }
    let result = pipeline.run_until_signal().await;
    if let Some(path) = &stats_file {
        write_stats(path, &stats);
    }
    let summary = result?;
    // One machine-readable line for the parent test.
    let s = stats.snapshot();
    println!(
        "SUMMARY processed={} failed={} drained={} in_flight_peak={} running_peak={} revocations={} assignments={} dedup_hits={} transactions={} aborted={}",
        summary.processed,
        summary.failed,
        summary.drained,
        s.in_flight_peak,
        s.running_peak,
        s.revocations,
        s.assignments,
        s.dedup_hits,
        s.transactions_committed,
        s.transactions_aborted
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn,librdkafka=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let ordering = match args.ordering.as_str() {
        "key" => ProcessingOrder::Key,
        "partition" => ProcessingOrder::Partition,
        "unordered" => ProcessingOrder::Unordered,
        other => anyhow::bail!("--ordering: unknown mode {other:?}"),
    };
    let mut config = PipelineConfig::new(millrace_integration_tests::bootstrap(), &args.group, [&args.topic])
        .ordering(ordering)
        .bounds(Bounds {
            max_concurrency: args.concurrency,
            max_in_flight_per_partition: args.per_partition,
            max_in_flight_total: args.total,
            ..Bounds::default()
        })
        .commit_interval(Duration::from_millis(args.commit_interval_ms))
        .drain_timeout(Duration::from_millis(args.drain_timeout_ms));
    if args.park_keys {
        config = config.dlq(DlqConfig { park_keys: true, ..DlqConfig::default() });
    }
    if let Some(dir) = &args.dedup_dir {
        config = config.dedup(DedupConfig::new(dir));
    }
    if args.exactly_once {
        let mut eo = ExactlyOnce::default().inject_abort_ratio(args.abort_ratio);
        if let Some(id) = &args.transactional_id {
            eo = eo.transactional_id(id);
        }
        if let Some(ms) = args.transaction_timeout_ms {
            eo = eo.transaction_timeout(Duration::from_millis(ms));
        }
        config = config.exactly_once(eo).commit_interval(Duration::from_millis(args.commit_interval_ms));
    }
    if let Some(n) = args.commit_every_records {
        config = config.commit_every_records(n);
    }
    for prop in &args.consumer_props {
        let (k, v) = prop.split_once('=').ok_or_else(|| anyhow::anyhow!("--consumer-prop wants key=value"))?;
        config = config.consumer_property(k, v);
    }
    let file = OpenOptions::new().create(true).append(true).open(&args.journal)?;
    let processor = Journaling {
        file: Mutex::new(file),
        delay: (args.delay_min_ms, args.delay_max_ms),
        output: args.output_topic.clone(),
        ledger: args.effect_ledger.as_deref().map(Ledger::open).transpose()?,
        inflate_bytes: args.inflate_bytes,
    };
    if args.decode_utf8 {
        run(config, Typed::new(Decoded(processor), Utf8), args.stats_file).await
    } else {
        run(config, processor, args.stats_file).await
    }
}
