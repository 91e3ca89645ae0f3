//! The replay loop: reads the DLQ, produces what is to be replayed, commits the finished prefix.

use super::output::{Summary, event_line};
use super::{Action, decide, default_group, replay_output, target_partition};
use crate::args::ReplayArgs;
use crate::client::Hooks;
use crate::filter::Filter;
use crate::progress::Progress;
use crate::read::{DlqRecord, TopicScan, partition_count};
use anyhow::{Context as _, Result, anyhow, bail};
use futures::FutureExt as _;
use millrace::EmitError;
use millrace::dlq::replay_count;
use millrace::record::OutputRecord;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, Producer as _};
use serde_json::json;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::pin::Pin;
use std::time::{Duration, Instant};

/// Records in flight or waiting for an earlier one before their offset can be committed; past this
/// the replay waits for the oldest acknowledgement.
const MAX_PENDING: usize = 10_000;
/// How often the committable prefix is committed while the replay runs.
const COMMIT_EVERY: Duration = Duration::from_secs(1);

/// A record whose DLQ offset waits to be committed: finished, or waiting for its acknowledgement.
struct Pending {
    partition: i32,
    offset: i64,
    delivery: Option<InFlight>,
}

/// A produce waiting for its acknowledgement.
struct InFlight {
    delivery: DeliveryFuture,
    /// The topic produced to (for the framework's delivery check and its log).
    topic: String,
    /// What was produced, for the error messages: `DLQ partition P offset O to TARGET`.
    what: String,
}

/// Spaces produces `1/rate` seconds apart.
struct Pace {
    interval: Duration,
    next: Instant,
}

impl Pace {
    /// When the next produce may go, reserving that slot.
    fn reserve(&mut self) -> Instant {
        let at = self.next.max(Instant::now());
        self.next = at + self.interval;
        at
    }
}

/// Resolves on SIGINT or SIGTERM (the framework's signal handling); never, if signals cannot be
/// listened for.
async fn stop_signal() {
    if millrace::shutdown::wait_for_signal().await.is_err() {
        std::future::pending::<()>().await;
    }
}

struct Replayer<'a> {
    args: &'a ReplayArgs,
    filter: Filter,
    bootstrap: &'a str,
    scan: TopicScan,
    /// Sends the replays; `None` in a dry run.
    producer: Option<FutureProducer<Hooks>>,
    /// Answers metadata requests on connections of its own (the consumer's may be busy with a fetch).
    metadata: FutureProducer<Hooks>,
    pending: VecDeque<Pending>,
    /// Per partition, the next offset to commit (finished prefix).
    finished: BTreeMap<i32, i64>,
    committed: BTreeMap<i32, i64>,
    last_commit: Instant,
    /// Partition counts of destination topics (`None`: does not exist).
    topics: HashMap<String, Option<i32>>,
    pace: Option<Pace>,
    progress: Progress,
    summary: Summary,
}

impl Replayer<'_> {
    fn report(&self, event: &str, record: &DlqRecord, detail: &str, extra: serde_json::Value) {
        self.progress.println(&event_line(self.args.format, event, record, detail, extra));
    }

    fn status(&self) -> String {
        self.summary.line()
    }

    /// Partition count of a destination topic, from a cache filled by metadata requests.
    fn destination(&mut self, topic: &str) -> Result<Option<i32>> {
        if let Some(known) = self.topics.get(topic) {
            return Ok(*known);
        }
        // A producer serves its queued log lines on its own polling thread: nothing to deliver here.
        let count = partition_count(self.metadata.client(), self.bootstrap, topic, || {})?;
        tracing::debug!(topic, ?count, "destination metadata");
        self.topics.insert(topic.to_owned(), count);
        Ok(count)
    }

    /// Handles one record. Returns `false` when a stop signal arrived while waiting.
    async fn handle(&mut self, record: DlqRecord, stop: &mut Pin<Box<dyn Future<Output = ()> + Send>>) -> Result<bool> {
        let action = decide(&record, &self.filter, self.args.to.as_deref(), self.args.max_replays);
        let mut delivery = None;
        match action {
            Action::FilteredOut => self.summary.filtered_out += 1,
            Action::Exhausted { replays } => {
                self.summary.exhausted += 1;
                let max = self.args.max_replays;
                let detail = format!(
                    "exhausted: replayed {replays} times (--max-replays {max}); after a fix: --min-replays {max} --max-replays {}",
                    max.saturating_add(3)
                );
                self.report("exhausted", &record, &detail, json!({}));
            }
            Action::SkippedNoHeaders => {
                self.summary.skipped_no_headers += 1;
                self.report(
                    "skipped",
                    &record,
                    "no Millrace headers, so no original topic: replay it with --to TOPIC",
                    json!({"reason": "no-millrace-headers"}),
                );
            }
            Action::Replay { topic } => {
                let Some(partitions) = self.destination(&topic)? else {
                    bail!(
                        "topic {topic} does not exist (destination of DLQ partition {} offset {}); create it or replay with --to",
                        record.record.partition,
                        record.record.offset
                    );
                };
                let out = replay_output(&record, &topic, target_partition(&record, &topic, partitions));
                let target = match out.partition {
                    Some(p) => format!("{topic} partition {p}"),
                    None => topic.clone(),
                };
                let no_headers = if record.info.is_none() { " (no Millrace headers)" } else { "" };
                let count = replay_count(&out.headers);
                if self.producer.is_none() {
                    self.summary.replayed += 1;
                    let detail = format!("-> {target}  replay.count {count}{no_headers}");
                    let extra = json!({"to_topic": topic, "to_partition": out.partition, "replay_count_after": count});
                    self.report("would-replay", &record, &detail, extra);
                } else {
                    if let Some(pace) = &mut self.pace {
                        let at = pace.reserve();
                        tokio::select! {
                            _ = tokio::time::sleep_until(at.into()) => {}
                            _ = stop.as_mut() => return Ok(false),
                        }
                    }
                    if record.info.is_none() {
                        let detail = format!("-> {target}{no_headers}");
                        self.report("replaying", &record, &detail, json!({"to_topic": topic}));
                    }
                    let what = format!(
                        "DLQ partition {} offset {} to {target}",
                        record.record.partition, record.record.offset
                    );
                    delivery = Some(InFlight { delivery: self.send(&out).await?, topic: out.topic.clone(), what });
                }
            }
        }
        self.summary.scanned += 1;
        self.pending.push_back(Pending { partition: record.record.partition, offset: record.record.offset, delivery });
        self.settle(false).await?;
        while self.pending.len() > MAX_PENDING {
            self.settle_one(true).await?;
        }
        if self.last_commit.elapsed() >= COMMIT_EVERY {
            self.commit()?;
        }
        let status = self.status();
        self.progress.inc(|| status);
        Ok(true)
    }

    /// Hands the record to the producer, waiting for room in its queue when it is full.
    async fn send(&mut self, out: &OutputRecord) -> Result<DeliveryFuture> {
        let mut record = out.as_future_record();
        loop {
            let producer = self.producer.as_ref().ok_or_else(|| anyhow!("no producer in a dry run"))?;
            match producer.send_result(record) {
                Ok(delivery) => return Ok(delivery),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    if self.pending.iter().any(|p| p.delivery.is_some()) {
                        self.settle_one(true).await?;
                    } else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                Err((e, _)) => bail!("producing to {}: {e}", out.topic),
            }
        }
    }

    /// Finishes the oldest pending record if it is finished or acknowledged (waiting for the
    /// acknowledgement with `wait`). Returns whether one was finished. A failed produce drops every
    /// pending record, so that nothing at or after it is committed.
    async fn settle_one(&mut self, wait: bool) -> Result<bool> {
        let Some(front) = self.pending.front_mut() else { return Ok(false) };
        if let Some(InFlight { delivery, topic, what }) = &mut front.delivery {
            let acked = if wait {
                delivery.await
            } else {
                match delivery.now_or_never() {
                    Some(acked) => acked,
                    None => return Ok(false),
                }
            };
            let (topic, what) = (topic.clone(), what.clone());
            if let Err(e) = self.acknowledged(acked, &topic, &what) {
                self.pending.clear();
                return Err(e);
            }
        }
        if let Some(front) = self.pending.pop_front() {
            self.finished.insert(front.partition, front.offset + 1);
        }
        Ok(true)
    }

    /// Finishes pending records in order: those already acknowledged, or all with `wait`.
    async fn settle(&mut self, wait: bool) -> Result<()> {
        while self.settle_one(wait).await? {}
        Ok(())
    }

    /// Counts an acknowledged replay to `topic`, or says why `what` is not acknowledged.
    fn acknowledged(&mut self, acked: <DeliveryFuture as Future>::Output, topic: &str, what: &str) -> Result<()> {
        acknowledgement(acked, topic, what)?;
        self.summary.replayed += 1;
        Ok(())
    }

    /// Commits the finished prefix of each partition that moved since the last commit.
    fn commit(&mut self) -> Result<()> {
        self.last_commit = Instant::now();
        if self.args.dry_run {
            return Ok(());
        }
        let moved: BTreeMap<i32, i64> =
            self.finished.iter().filter(|(p, o)| self.committed.get(p) != Some(o)).map(|(p, o)| (*p, *o)).collect();
        if moved.is_empty() {
            return Ok(());
        }
        self.scan.commit(&moved)?;
        self.committed.extend(moved);
        Ok(())
    }
}

/// What the delivery report of a replay of `what` to `topic` proves: `Ok` when the broker
/// acknowledged it with an offset, else the error to stop with (the framework's check; `topic` names
/// the topic in the warning it logs for an offset-less report).
fn acknowledgement(acked: <DeliveryFuture as Future>::Output, topic: &str, what: &str) -> Result<()> {
    match millrace::delivery_offset(topic, acked) {
        Ok(_) => Ok(()),
        // A success without an offset does not prove the write: stop before committing past it; a
        // second run replays it.
        Err(EmitError::Unconfirmed { .. }) => Err(anyhow!(
            "producing {what}: reported delivered without an offset, so the write is not confirmed; \
             nothing from it on was committed: run the replay again"
        )),
        Err(EmitError::NotAcknowledged { source, .. }) => Err(anyhow!("producing {what} failed: {source}")),
        Err(_) => Err(anyhow!("producing {what}: the producer went away before acknowledging")),
    }
}

/// Runs `millrace dlq replay`; the summary says what happened (also when interrupted).
pub async fn run(bootstrap: &str, args: &ReplayArgs) -> Result<Summary> {
    let filter = args.filter.to_filter()?;
    let group = args.group.clone().unwrap_or_else(|| default_group(&args.topic, &filter));
    let scan = TopicScan::open(bootstrap, &args.topic, Some(&group))?;
    let metadata: FutureProducer<Hooks> = if args.dry_run {
        crate::read::client_config(bootstrap).create_with_context(Hooks).context("creating the Kafka client")?
    } else {
        crate::read::producer(bootstrap)?
    };
    if let Some(to) = &args.to
        && partition_count(metadata.client(), bootstrap, to, || {})?.is_none()
    {
        bail!("topic {to} does not exist (given as --to)");
    }
    let producer = (!args.dry_run).then(|| metadata.clone());
    let positions: Vec<String> = scan.bounds().iter().map(|(p, (s, e))| format!("{p}: {s}..{e}")).collect();
    eprintln!(
        "{} {} with group {group}: {} records to read (partition: from..to {})",
        if args.dry_run { "dry run of replaying" } else { "replaying" },
        args.topic,
        scan.total(),
        positions.join(", ")
    );
    let progress = Progress::new("replay", scan.total());
    let mut replayer = Replayer {
        args,
        filter,
        bootstrap,
        scan,
        producer,
        metadata,
        pending: VecDeque::new(),
        finished: BTreeMap::new(),
        committed: BTreeMap::new(),
        last_commit: Instant::now(),
        topics: HashMap::new(),
        pace: args.rate.map(|r| Pace { interval: Duration::from_secs_f64(1.0 / r), next: Instant::now() }),
        progress,
        summary: Summary { dry_run: args.dry_run, group, ..Summary::default() },
    };
    let mut stop: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(stop_signal());
    let scanned: Result<()> = async {
        loop {
            let record = tokio::select! {
                biased;
                _ = stop.as_mut() => {
                    replayer.summary.interrupted = true;
                    return Ok(());
                }
                record = replayer.scan.next() => record?,
            };
            let Some(record) = record else { return Ok(()) };
            if !replayer.handle(record, &mut stop).await? {
                replayer.summary.interrupted = true;
                return Ok(());
            }
        }
    }
    .await;
    // Whatever stopped the scan, wait for the records in flight and commit what is finished.
    let in_flight = replayer.pending.iter().filter(|p| p.delivery.is_some()).count();
    let settled = tokio::select! {
        settled = replayer.settle(true) => settled,
        _ = stop_signal() => Err(anyhow!(
            "interrupted again: stopped without waiting for {in_flight} records in flight; their DLQ offsets are not committed"
        )),
    };
    tracing::debug!(summary = %replayer.summary.line(), "scan ended; in flight settled");
    let committed = replayer.commit();
    tracing::debug!("committed");
    replayer.progress.finish();
    if let Some(p) = &replayer.producer {
        // Nothing should be left (every delivery was awaited); this only bounds the wait when not.
        let _ = tokio::task::block_in_place(|| p.flush(Duration::from_secs(5)));
    }
    tracing::debug!("producer flushed");
    scanned.and(settled).and(committed).with_context(|| format!("replay stopped ({})", replayer.summary.line()))?;
    Ok(replayer.summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::Timestamp;
    use rdkafka::producer::future_producer::Delivery;
    use std::sync::{Arc, Mutex};

    /// The warnings logged while `f` runs, as text.
    fn warnings(f: impl FnOnce()) -> String {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || LogWriter(writer.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = buffer.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    struct LogWriter(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for LogWriter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn an_offsetless_delivery_is_not_acknowledged_and_the_warning_names_the_topic() {
        let what = "DLQ partition 0 offset 7 to orders partition 3";
        let report = Ok(Ok(Delivery { partition: 3, offset: -1, timestamp: Timestamp::NotAvailable }));
        let mut result = None;
        let logged = warnings(|| result = Some(acknowledgement(report, "orders", what)));
        let err = result.unwrap().unwrap_err().to_string();
        assert!(err.starts_with(&format!("producing {what}: reported delivered without an offset")), "{err}");
        assert!(logged.contains(r#"topic="orders""#), "{logged}");
        assert!(!logged.contains("DLQ partition"), "the warning names the topic, not the description: {logged}");
        let acked = Ok(Ok(Delivery { partition: 3, offset: 12, timestamp: Timestamp::NotAvailable }));
        assert!(acknowledgement(acked, "orders", what).is_ok());
    }
}
