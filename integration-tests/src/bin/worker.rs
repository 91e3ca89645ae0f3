//! `millrace-it-worker`: a pipeline the integration tests run as a child process so they can SIGKILL,
//! SIGTERM or SIGSTOP it. Its processor journals every record it handles (`partition offset key epoch`,
//! one line per record, written with one `write` call so a kill leaves at most a torn last line) to a
//! file outside Kafka, then returns: the journal is the independent record of effects.
//!
//! With `--output-topic` it is also a copier: every record is emitted to that topic with the same
//! key and the value `<partition> <offset> <input value>`, in exactly-once mode with
//! `--exactly-once`. Records whose value starts with `poison` fail permanently (→ DLQ).

use anyhow::Result;
use clap::Parser;
use millrace::{
    Bounds, Context, DedupConfig, ExactlyOnce, Ordering, OutputRecord, Pipeline, PipelineConfig, ProcessError,
    Processor, Record,
};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
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
}

struct Journaling {
    file: Mutex<File>,
    delay: (u64, u64),
    output: Option<String>,
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
        if let Some(topic) = &self.output {
            let mut out = format!("{} {} ", record.partition, record.offset).into_bytes();
            out.extend_from_slice(value);
            let mut out = OutputRecord::to(topic).value(out);
            out.key = record.key.clone();
            ctx.emit(out).await?;
        }
        Ok(())
    }
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
        "key" => Ordering::Key,
        "partition" => Ordering::Partition,
        "unordered" => Ordering::Unordered,
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
    if let Some(dir) = &args.dedup_dir {
        config = config.dedup(DedupConfig::new(dir));
    }
    if args.exactly_once {
        let mut eo = ExactlyOnce::default().inject_abort_ratio(args.abort_ratio);
        if let Some(id) = &args.transactional_id {
            eo = eo.transactional_id(id);
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
    };
    let pipeline = Pipeline::new(config, processor)?;
    let stats = pipeline.stats();
    let summary = pipeline.run_until_signal().await?;
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
