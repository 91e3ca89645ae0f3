//! `millrace dlq replay`: produces DLQ records back to their original topic (or `--to`).
//!
//! The replay keeps its position in a consumer group of its own on the DLQ topic, so an interrupted
//! replay resumes where it stopped. A DLQ offset is committed only when every earlier record of its
//! partition is finished: produced and acknowledged (idempotent producer, `acks=all`), or not to be
//! produced (filtered out, parked, without Millrace headers). Commits are synchronous and cover only
//! that contiguous prefix, so a crash replays at most the unacknowledged tail again, never skips.
//!
//! A replayed record is the original: key, value bytes unchanged, user headers (idempotency keys
//! survive), plus `millrace.replay.count` = previous count + 1; the other `millrace.*` headers are
//! dropped. Sent back to its original topic it goes to its original partition while that still
//! exists, so per-key order is kept whatever partitioner first placed it.

use crate::args::{Format, ReplayArgs};
use crate::filter::Filter;
use crate::progress::Progress;
use crate::read::{DlqRecord, TopicScan, partition_count};
use crate::show::cell;
use anyhow::{Context as _, Result, anyhow, bail};
use futures::FutureExt as _;
use millrace::EmitError;
use millrace::dlq::{headers, replay_count, user_headers};
use millrace::record::OutputRecord;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, Producer as _};
use serde::Serialize;
use serde_json::json;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::pin::Pin;
use std::time::{Duration, Instant};

/// Records in flight or waiting for an earlier one before their offset can be committed; past this
/// the replay waits for the oldest acknowledgement.
const MAX_PENDING: usize = 10_000;
/// How often the committable prefix is committed while the replay runs.
const COMMIT_EVERY: Duration = Duration::from_secs(1);

/// What to do with one DLQ record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Not selected by the filters: skipped and committed past.
    FilteredOut,
    /// Already replayed `--max-replays` times: reported, not produced, committed past.
    Parked {
        /// Its replay count.
        replays: u32,
    },
    /// No Millrace headers and no `--to`: reported, not produced, committed past.
    SkippedNoHeaders,
    /// Produce it to `topic`.
    Replay {
        /// Destination topic.
        topic: String,
    },
}

/// Decides what happens to `record` (a pure function of the record and the options).
pub fn decide(record: &DlqRecord, filter: &Filter, to: Option<&str>, max_replays: u32) -> Action {
    if !filter.matches(record) {
        return Action::FilteredOut;
    }
    let replays = replay_count(&record.headers);
    if replays >= max_replays {
        return Action::Parked { replays };
    }
    match (to, &record.info) {
        (Some(to), _) => Action::Replay { topic: to.to_owned() },
        (None, Some(info)) => Action::Replay { topic: info.original_topic.clone() },
        (None, None) => Action::SkippedNoHeaders,
    }
}

/// The record to produce for a replay: original key, value bytes and user headers, plus
/// `millrace.replay.count` one higher than the DLQ record's; no other `millrace.*` header.
pub fn replay_output(record: &DlqRecord, topic: &str, partition: Option<i32>) -> OutputRecord {
    let mut out = OutputRecord::to(topic);
    out.partition = partition;
    out.key = record.key.clone();
    out.value = record.value.clone();
    out.headers = user_headers(&record.headers);
    out.headers.push(headers::REPLAY_COUNT, replay_count(&record.headers).saturating_add(1).to_string());
    out
}

/// The partition to produce to: the original one when going back to the original topic and it still
/// exists there (`partitions` is the topic's current count), else `None` (the partitioner decides).
pub fn target_partition(record: &DlqRecord, topic: &str, partitions: i32) -> Option<i32> {
    let info = record.info.as_ref()?;
    (info.original_topic == topic && info.original_partition < partitions).then_some(info.original_partition)
}

/// The replay's default consumer group: `millrace-replay.<dlq topic>`, plus `.<filter hash>` when
/// filters are given, so differently filtered replays keep separate positions.
pub fn default_group(dlq_topic: &str, filter: &Filter) -> String {
    if filter.is_empty() {
        format!("millrace-replay.{dlq_topic}")
    } else {
        format!("millrace-replay.{dlq_topic}.{}", filter.short_hash())
    }
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Records produced and acknowledged (with `--dry-run`: records that would be produced).
    pub replayed: u64,
    /// Records not produced because they reached `--max-replays`.
    pub parked: u64,
    /// Records without Millrace headers, not produced for lack of `--to`.
    pub skipped_no_headers: u64,
    /// Records not selected by the filters.
    pub filtered_out: u64,
    /// Records read from the DLQ.
    pub scanned: u64,
    /// Whether nothing was produced or committed.
    pub dry_run: bool,
    /// Whether a signal stopped the replay before the end.
    pub interrupted: bool,
    /// The consumer group holding the replay position.
    pub group: String,
}

impl Summary {
    /// The machine-readable summary line:
    /// `replayed N, parked N, skipped-no-headers N, filtered-out N`.
    pub fn line(&self) -> String {
        format!(
            "replayed {}, parked {}, skipped-no-headers {}, filtered-out {}",
            self.replayed, self.parked, self.skipped_no_headers, self.filtered_out
        )
    }
}

/// A record whose DLQ offset waits to be committed: finished, or waiting for its acknowledgement.
struct Pending {
    partition: i32,
    offset: i64,
    delivery: Option<(DeliveryFuture, String)>,
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
    producer: Option<FutureProducer>,
    /// Answers metadata requests on connections of its own (the consumer's may be busy with a fetch).
    metadata: FutureProducer,
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
        let line = match self.args.format {
            Format::Table => {
                let original = record
                    .info
                    .as_ref()
                    .map(|i| {
                        format!(
                            "  original {} partition {} offset {}",
                            i.original_topic, i.original_partition, i.original_offset
                        )
                    })
                    .unwrap_or_default();
                format!(
                    "{event:<12}  DLQ partition {} offset {}{original}  key {}  {detail}",
                    record.partition,
                    record.offset,
                    cell(record.key.as_deref(), 80)
                )
            }
            Format::Json => {
                let mut obj = json!({
                    "event": event,
                    "dlq_partition": record.partition,
                    "dlq_offset": record.offset,
                    "original_topic": record.info.as_ref().map(|i| &i.original_topic),
                    "original_partition": record.info.as_ref().map(|i| i.original_partition),
                    "original_offset": record.info.as_ref().map(|i| i.original_offset),
                    "replay_count": replay_count(&record.headers),
                });
                let mut key = serde_json::Map::new();
                crate::show::bytes_json(&mut key, "key", record.key.as_deref());
                if let (Some(obj), serde_json::Value::Object(extra)) = (obj.as_object_mut(), extra) {
                    obj.extend(key);
                    obj.extend(extra);
                }
                obj.to_string()
            }
        };
        self.progress.println(&line);
    }

    fn status(&self) -> String {
        self.summary.line()
    }

    /// Partition count of a destination topic, from a cache filled by metadata requests.
    fn destination(&mut self, topic: &str) -> Result<Option<i32>> {
        if let Some(known) = self.topics.get(topic) {
            return Ok(*known);
        }
        let count = partition_count(self.metadata.client(), self.bootstrap, topic)?;
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
            Action::Parked { replays } => {
                self.summary.parked += 1;
                let detail = format!("parked: replayed {replays} times (--max-replays {})", self.args.max_replays);
                self.report("parked", &record, &detail, json!({}));
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
                        record.partition,
                        record.offset
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
                    let what = format!("DLQ partition {} offset {} to {target}", record.partition, record.offset);
                    delivery = Some((self.send(&out).await?, what));
                }
            }
        }
        self.summary.scanned += 1;
        self.pending.push_back(Pending { partition: record.partition, offset: record.offset, delivery });
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
        if let Some((delivery, what)) = &mut front.delivery {
            let acked = if wait {
                delivery.await
            } else {
                match delivery.now_or_never() {
                    Some(acked) => acked,
                    None => return Ok(false),
                }
            };
            let what = what.clone();
            if let Err(e) = self.acknowledged(acked, &what) {
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

    fn acknowledged(&mut self, acked: <DeliveryFuture as Future>::Output, what: &str) -> Result<()> {
        match millrace::delivery_offset(what, acked) {
            Ok(_) => {
                self.summary.replayed += 1;
                Ok(())
            }
            // A success without an offset does not prove the write: stop before committing past
            // it; a second run replays it.
            Err(EmitError::Unconfirmed { .. }) => Err(anyhow!(
                "producing {what}: reported delivered without an offset, so the write is not confirmed; \
                 nothing from it on was committed: run the replay again"
            )),
            Err(EmitError::NotAcknowledged { source, .. }) => Err(anyhow!("producing {what} failed: {source}")),
            Err(_) => Err(anyhow!("producing {what}: the producer went away before acknowledging")),
        }
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

/// Runs `millrace dlq replay`; the summary says what happened (also when interrupted).
pub async fn run(bootstrap: &str, args: &ReplayArgs) -> Result<Summary> {
    let filter = args.filter.to_filter()?;
    let group = args.group.clone().unwrap_or_else(|| default_group(&args.topic, &filter));
    let scan = TopicScan::open(bootstrap, &args.topic, Some(&group))?;
    let metadata: FutureProducer = if args.dry_run {
        crate::read::client_config(bootstrap).create().context("creating the Kafka client")?
    } else {
        crate::read::producer(bootstrap)?
    };
    if let Some(to) = &args.to
        && partition_count(metadata.client(), bootstrap, to)?.is_none()
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

/// Prints the summary: the summary line (or a JSON object) on stdout.
pub fn print_summary(summary: &Summary, format: Format) -> Result<()> {
    if summary.dry_run {
        eprintln!("dry run: nothing was produced or committed");
    }
    if summary.interrupted {
        eprintln!("interrupted: the next replay with group {} resumes from here", summary.group);
    }
    match format {
        Format::Table => println!("{}", summary.line()),
        Format::Json => println!("{}", serde_json::to_string(summary)?),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace::dlq::{DlqErrorKind, DlqInfo, Failure, dead_letter};
    use millrace::record::{Headers, Record};

    fn dlq_record(replays: Option<&str>) -> DlqRecord {
        let mut headers = Headers::default();
        headers.push("idempotency-key", "order-7");
        headers.0.push(millrace::record::Header { name: "null-header".into(), value: None });
        if let Some(n) = replays {
            headers.push(millrace::dlq::headers::REPLAY_COUNT, n);
        }
        let original = Record {
            topic: "orders".into(),
            partition: 3,
            offset: 42,
            timestamp: Some(1),
            key: Some(b"k".to_vec()),
            value: Some(vec![0xff, 0x00, 0xfe]),
            headers,
        };
        let failure = Failure {
            kind: DlqErrorKind::Permanent,
            message: "bad".into(),
            attempts: 1,
            first_failure_ms: 5,
            last_failure_ms: 6,
        };
        let out = dead_letter(&original, "orders.dlq", "billing", "Charge", &failure);
        let info = DlqInfo::from_headers(&out.headers);
        assert!(info.is_some());
        DlqRecord {
            partition: 0,
            offset: 7,
            timestamp: None,
            key: out.key,
            value: out.value,
            headers: out.headers,
            info,
        }
    }

    fn no_headers_record() -> DlqRecord {
        let mut headers = Headers::default();
        headers.push("trace", "t1");
        DlqRecord {
            partition: 1,
            offset: 0,
            timestamp: None,
            key: Some(b"k".to_vec()),
            value: Some(b"v".to_vec()),
            headers,
            info: None,
        }
    }

    #[test]
    fn rewrite_keeps_the_original_and_counts_the_replay() {
        let record = dlq_record(Some("1"));
        let out = replay_output(&record, "orders", Some(3));
        assert_eq!(out.topic, "orders");
        assert_eq!(out.partition, Some(3));
        assert_eq!(out.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(out.value.as_deref(), Some(&[0xff, 0x00, 0xfe][..]), "value bytes unchanged");
        let names: Vec<&str> = out.headers.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(
            names,
            ["idempotency-key", "null-header", headers::REPLAY_COUNT],
            "user headers in order, then the count"
        );
        assert_eq!(out.headers.0[1].value, None, "null headers stay null");
        assert_eq!(out.headers.get(headers::REPLAY_COUNT), Some(&b"2"[..]));
        assert_eq!(
            replay_output(&dlq_record(None), "orders", None).headers.get(headers::REPLAY_COUNT),
            Some(&b"1"[..])
        );
        let plain = replay_output(&no_headers_record(), "retry", None);
        assert_eq!(plain.headers.get("trace"), Some(&b"t1"[..]));
        assert_eq!(plain.headers.get(headers::REPLAY_COUNT), Some(&b"1"[..]));
    }

    #[test]
    fn decisions() {
        let none = Filter::default();
        assert_eq!(decide(&dlq_record(None), &none, None, 3), Action::Replay { topic: "orders".into() });
        assert_eq!(decide(&dlq_record(Some("2")), &none, None, 3), Action::Replay { topic: "orders".into() });
        assert_eq!(decide(&dlq_record(Some("3")), &none, None, 3), Action::Parked { replays: 3 });
        assert_eq!(decide(&dlq_record(None), &none, None, 0), Action::Parked { replays: 0 });
        assert_eq!(decide(&dlq_record(None), &none, Some("retry"), 3), Action::Replay { topic: "retry".into() });
        assert_eq!(decide(&no_headers_record(), &none, None, 3), Action::SkippedNoHeaders);
        assert_eq!(decide(&no_headers_record(), &none, Some("retry"), 3), Action::Replay { topic: "retry".into() });
        let panics = Filter { kinds: vec![DlqErrorKind::Panic], ..Filter::default() };
        assert_eq!(decide(&dlq_record(Some("9")), &panics, None, 3), Action::FilteredOut, "filters come first");
    }

    #[test]
    fn original_partition_only_on_the_original_topic() {
        let record = dlq_record(None);
        assert_eq!(target_partition(&record, "orders", 4), Some(3));
        assert_eq!(target_partition(&record, "orders", 2), None, "partition gone: let the partitioner choose");
        assert_eq!(target_partition(&record, "retry", 8), None);
        assert_eq!(target_partition(&no_headers_record(), "orders", 8), None);
    }

    #[test]
    fn groups_differ_by_filter() {
        let none = Filter::default();
        assert_eq!(default_group("orders.dlq", &none), "millrace-replay.orders.dlq");
        let panics = Filter { kinds: vec![DlqErrorKind::Panic], ..Filter::default() };
        let decodes = Filter { kinds: vec![DlqErrorKind::Decode], ..Filter::default() };
        let g = default_group("orders.dlq", &panics);
        assert!(g.starts_with("millrace-replay.orders.dlq.") && g.len() == "millrace-replay.orders.dlq.".len() + 8);
        assert_ne!(g, default_group("orders.dlq", &decodes));
        assert_eq!(g, default_group("orders.dlq", &panics.clone().normalized().unwrap()));
    }

    #[test]
    fn summary_line_is_stable() {
        let s = Summary { replayed: 4, parked: 1, skipped_no_headers: 2, filtered_out: 3, ..Summary::default() };
        assert_eq!(s.line(), "replayed 4, parked 1, skipped-no-headers 2, filtered-out 3");
    }
}
