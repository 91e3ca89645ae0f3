//! The Millrace workloads: F_alos, F_dedup (at-least-once and exactly-once), F_dlq and F_eos.
//!
//! Each is a [`Pipeline`] in key order with default bounds, a fresh group, and [`PassThrough`], which
//! emits the record's key and value to the output topic with `ctx.emit` (the record completes when
//! the output is acknowledged). A run is timed from spawning [`Pipeline::run`] until the counters say
//! every input record is done (checked every 2 ms), like `core`'s Millrace side; pipeline construction
//! and the graceful stop are not timed.

use crate::measure::{Measurement, Stopwatch, Window};
use anyhow::Context as _;
use millrace::{
    Context, DedupConfig, ExactlyOnce, OutputRecord, Pipeline, PipelineConfig, ProcessError, Processor, Record,
    StatsSnapshot,
};
use std::path::Path;
use std::time::Duration;

/// How often a run checks the pipeline's counters.
const CHECK_EVERY: Duration = Duration::from_millis(2);

/// Emits each record's key and value to `output`; with `poison_every`, fails permanently (so the
/// record goes to the DLQ) for the records whose idempotency key number `n` (header
/// `idempotency-key: ik-<n>`, written by the loader) satisfies `n % poison_every == poison_every - 1`.
pub struct PassThrough {
    pub output: String,
    pub poison_every: Option<u64>,
}

impl Processor for PassThrough {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        if let Some(every) = self.poison_every
            && is_poison(record, every)
        {
            return Err(ProcessError::permanent("poison record (benchmark)"));
        }
        let mut out = OutputRecord::to(self.output.as_str());
        out.key = record.key.clone();
        out.value = record.value.clone();
        ctx.emit(out).await?;
        Ok(())
    }
}

/// Whether the loader marked `record` as poison (see [`PassThrough`]).
pub fn is_poison(record: &Record, every: u64) -> bool {
    record
        .headers
        .get(super::IDEMPOTENCY_HEADER)
        .and_then(|v| std::str::from_utf8(v).ok()?.strip_prefix("ik-")?.parse::<u64>().ok())
        .is_some_and(|n| n % every == every - 1)
}

/// What kind of Millrace run.
#[derive(Debug, Clone, Copy)]
pub enum Mode<'a> {
    /// At-least-once, nothing else on.
    Alos,
    /// At-least-once with the HTTP listener (metrics, health) on and scraped every second.
    Observed,
    /// The dedup store on, in a fresh RocksDB directory.
    Dedup(&'a Path),
    /// The dedup store on (a fresh directory), in exactly-once mode with a transaction every
    /// interval.
    DedupEos(&'a Path, Duration),
    /// Poison records dead-lettered.
    Dlq { poison_every: u64 },
    /// Exactly-once with a transaction every interval.
    Eos(Duration),
}

/// Why a workload did not run.
#[derive(Debug)]
pub enum NotRun {
    /// The feature is not in this build (the workload is reported as not available).
    Unavailable(String),
    /// It ran and failed.
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for NotRun {
    fn from(e: anyhow::Error) -> Self {
        NotRun::Failed(e)
    }
}

impl From<millrace::Error> for NotRun {
    fn from(e: millrace::Error) -> Self {
        NotRun::Failed(e.into())
    }
}

/// One Millrace run.
pub struct Run<'a> {
    pub bootstrap: &'a str,
    pub input: &'a str,
    pub output: &'a str,
    pub group: &'a str,
    pub records: u64,
    pub timeout: Duration,
    pub mode: Mode<'a>,
    /// Records processed before the warm window starts (see [`Window`]).
    pub warmup: u64,
}

/// The configuration of an exactly-once pipeline that commits a Kafka transaction (outputs plus the
/// consumed offsets) every `interval`, built on `config` (the F_alos configuration).
pub fn exactly_once(config: PipelineConfig, interval: Duration) -> Result<PipelineConfig, String> {
    let id = format!("{}-bench", config.group_id);
    Ok(config.exactly_once(ExactlyOnce::default().transactional_id(id)).commit_interval(interval))
}

/// When a run is done: every input record accounted for by the pipeline's counters. Exactly-once
/// records count only once their output is committed, like Pt and Streams' eos_v2 stop at the
/// commit of the last output.
fn done_when(mode: Mode<'_>, s: &StatsSnapshot, records: u64) -> bool {
    match mode {
        Mode::Alos | Mode::Observed => s.processed >= records,
        Mode::Eos(_) => s.committed_outputs >= records,
        Mode::Dedup(_) => s.processed + s.dedup_hits >= records,
        // Duplicates emit nothing: done when every other record's output is committed.
        Mode::DedupEos(..) => s.committed_outputs + s.dedup_hits >= records,
        Mode::Dlq { .. } => s.processed + s.dead_lettered >= records,
    }
}

/// Builds and drives one pipeline; returns its measurement and a line on its counters.
pub async fn run(r: &Run<'_>) -> Result<(Measurement, String), NotRun> {
    let config = PipelineConfig::new(r.bootstrap, r.group, [r.input]).ordering(millrace::ProcessingOrder::Key);
    let (config, poison_every) = match r.mode {
        Mode::Alos => (config, None),
        Mode::Observed => (config.http(([127, 0, 0, 1], 0).into()), None),
        Mode::Dedup(dir) => (config.dedup(DedupConfig::new(dir)), None),
        Mode::Dlq { poison_every } => (config, Some(poison_every)),
        Mode::Eos(interval) => (exactly_once(config, interval).map_err(NotRun::Unavailable)?, None),
        Mode::DedupEos(dir, interval) => {
            (exactly_once(config.dedup(DedupConfig::new(dir)), interval).map_err(NotRun::Unavailable)?, None)
        }
    };
    let processor = PassThrough { output: r.output.to_owned(), poison_every };
    // Metrics are off but in F_alos+metrics: once that workload installed the process's Prometheus
    // recorder, the other pipelines register no-op handles (metrics are bound at construction).
    let pipeline = match config.http {
        Some(_) => Pipeline::new(config, processor)?,
        None => metrics::with_local_recorder(&metrics::NoopRecorder, || Pipeline::new(config, processor))?,
    };
    let scraper = pipeline.http_addr().map(|addr| tokio::spawn(scrape_every_second(addr)));
    let stats = pipeline.stats();
    let stop = pipeline.shutdown_token();
    let clock = Stopwatch::start();
    let mut running = tokio::spawn(pipeline.run());
    let mut first_record = None;
    let mut warm_start = None;
    let (elapsed, cpu, end) = loop {
        let s = stats.snapshot();
        if done_when(r.mode, &s, r.records) {
            let (elapsed, cpu) = clock.stop();
            break (elapsed, cpu, s);
        }
        if first_record.is_none() && s.polled > 0 {
            first_record = Some(clock.elapsed());
        }
        let handled = s.processed + s.dedup_hits + s.dead_lettered;
        if warm_start.is_none() && handled >= r.warmup {
            warm_start = Some((clock.stop(), handled));
        }
        if running.is_finished() {
            let outcome = (&mut running).await.context("joining the pipeline")?;
            return Err(NotRun::Failed(anyhow::anyhow!(
                "the pipeline stopped before it was done ({s:?}): {outcome:?}"
            )));
        }
        if clock.elapsed() > r.timeout {
            stop.cancel();
            let _ = running.await;
            return Err(NotRun::Failed(anyhow::anyhow!("not done after {:?}; counters {s:?}", r.timeout)));
        }
        tokio::time::sleep(CHECK_EVERY).await;
    };
    stop.cancel();
    if let Some(scraper) = scraper {
        scraper.abort();
    }
    let summary = running.await.context("joining the pipeline")?.context("the pipeline")?;
    if summary.failed > 0 {
        return Err(NotRun::Failed(anyhow::anyhow!("{} records failed", summary.failed)));
    }
    if let Mode::Dlq { poison_every } = r.mode
        && end.dead_lettered != r.records / poison_every
    {
        let expected = r.records / poison_every;
        return Err(NotRun::Failed(anyhow::anyhow!(
            "{} records dead-lettered, expected {expected}",
            end.dead_lettered
        )));
    }
    let note = format!(
        "in flight peak {}, running peak {}, {} commits, {} dedup hits, {} dead-lettered",
        end.in_flight_peak, end.running_peak, end.commits, end.dedup_hits, end.dead_lettered
    );
    // The window counts the records handled after its start (the check runs every 2 ms, so the
    // start is up to that late); a run whose warm-up ended between its last two checks has none.
    let warm =
        warm_start.filter(|&((at, _), handled)| at < elapsed && handled < r.records).map(|((at, cpu_at), handled)| {
            Window { records: r.records - handled, elapsed: elapsed - at, cpu: cpu.saturating_sub(cpu_at) }
        });
    let m = Measurement { records: r.records, elapsed, first_record: first_record.unwrap_or_default(), cpu, warm };
    Ok((m, note))
}

/// What Prometheus would do, every second (its default is every 15 s or more): GET /metrics.
async fn scrape_every_second(addr: std::net::SocketAddr) {
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/metrics");
    loop {
        if let Ok(response) = client.get(&url).send().await {
            let _ = response.bytes().await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
