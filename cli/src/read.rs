//! Reading a DLQ topic once, from a start position to the end offsets captured when the scan opens.
//!
//! The consumer is `assign()`ed (it never joins a group, so it cannot trigger a rebalance). With a
//! group id, the start of each partition is the group's committed offset, and the caller may commit
//! through [`TopicScan::commit`]; without one, the scan starts at the beginning.

use crate::client::Hooks;
use anyhow::{Context as _, Result, anyhow, bail};
use millrace::Record;
use millrace::dlq::DlqInfo;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::FutureProducer;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// How long a metadata, watermark or committed-offsets request may take before the broker is
/// reported unreachable.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One record of a DLQ topic, copied out of the consumer as the framework copies any record, with
/// its Millrace information parsed by the framework.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DlqRecord {
    /// The DLQ record itself: its `topic`, `partition`, `offset` and `timestamp` are those in the
    /// DLQ; key, value and headers are the original key and value bytes, the original user headers
    /// and the `millrace.*` ones.
    pub record: Record,
    /// What the Millrace headers say; `None` when the record has no (valid) Millrace headers.
    pub info: Option<DlqInfo>,
}

impl DlqRecord {
    /// A DLQ record, with its Millrace headers parsed.
    pub fn new(record: Record) -> Self {
        let info = DlqInfo::from_headers(&record.headers);
        DlqRecord { record, info }
    }

    /// For tests: `out` (a DLQ record as [`millrace::dlq::dead_letter`] builds it) as read back
    /// from `partition` and `offset` of its topic.
    #[cfg(test)]
    pub fn written(out: millrace::OutputRecord, partition: i32, offset: i64) -> Self {
        DlqRecord::new(Record {
            topic: out.topic.into(),
            partition,
            offset,
            timestamp: None,
            key: out.key,
            value: out.value,
            headers: out.headers,
        })
    }
}

/// Client settings shared by the tool's consumers and producers: the brokers, and the properties of
/// [`crate::client`] (`--command-config`, `MILLRACE_KAFKA_*`).
pub fn client_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap).set("socket.connection.setup.timeout.ms", "10000");
    // Error-level lines reach the context (which keeps why a broker refused the connection); the
    // tool installs no logger, so without this librdkafka would be told to log nothing.
    c.set_log_level(rdkafka::config::RDKafkaLogLevel::Error);
    for (k, v) in crate::client::properties() {
        c.set(k, v);
    }
    c
}

/// An idempotent producer (`acks=all`) for replays.
pub fn producer(bootstrap: &str) -> Result<FutureProducer<Hooks>> {
    client_config(bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create_with_context(Hooks)
        .context("creating the Kafka producer")
}

/// Partition count of `topic`, `None` when it does not exist. Errors say the broker is unreachable
/// (or why it refused the client: `serve_logs` first delivers the log lines librdkafka queued).
pub fn partition_count<C: rdkafka::client::ClientContext>(
    client: &rdkafka::client::Client<C>,
    bootstrap: &str,
    topic: &str,
    serve_logs: impl FnOnce(),
) -> Result<Option<i32>> {
    let md = tokio::task::block_in_place(|| client.fetch_metadata(Some(topic), REQUEST_TIMEOUT)).map_err(|e| {
        serve_logs();
        unreachable_error(bootstrap, e)
    })?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else { return Ok(None) };
    match t.error() {
        None if !t.partitions().is_empty() => Ok(Some(t.partitions().len() as i32)),
        None => Ok(None),
        Some(e) => match RDKafkaErrorCode::from(e) {
            RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic => Ok(None),
            code => bail!("metadata for topic {topic}: {code}"),
        },
    }
}

/// Delivers the log lines librdkafka queued for `consumer` (they reach [`Hooks`] only when it is
/// polled), so that an error can say why a broker refused the connection. Called before anything
/// is assigned: there is no message to take, and each poll serves one queued event.
fn serve_logs(consumer: &StreamConsumer<Hooks>) {
    use futures::FutureExt as _;
    for _ in 0..256 {
        if consumer.recv().now_or_never().is_some() {
            break;
        }
    }
}

/// The error for a request the broker did not answer.
pub fn unreachable_error(bootstrap: &str, e: KafkaError) -> anyhow::Error {
    match crate::client::refused() {
        Some(reason) => anyhow!(
            "Kafka at {bootstrap} refused this client: {reason} (check the credentials and certificates in \
             --command-config or MILLRACE_KAFKA_*)"
        ),
        None => anyhow!("cannot reach Kafka at {bootstrap}: {e} (set --bootstrap or KAFKA_BOOTSTRAP_SERVERS)"),
    }
}

/// A single pass over a topic up to the end offsets captured at open.
pub struct TopicScan {
    consumer: StreamConsumer<Hooks>,
    /// The topic read (shared by the records read).
    topic: Arc<str>,
    bootstrap: String,
    /// Per partition: (start offset, end offset); records `start..end` are read.
    bounds: BTreeMap<i32, (i64, i64)>,
    /// Partitions not yet read to their end.
    remaining: BTreeSet<i32>,
    /// Per partition: the highest offset received (for the end-of-partition diagnostics).
    last_read: BTreeMap<i32, i64>,
}

impl TopicScan {
    /// Checks that `topic` exists, captures its end offsets and assigns the partitions that have
    /// records to read. With `group`, each partition starts at the group's committed offset.
    pub fn open(bootstrap: &str, topic: &str, group: Option<&str>) -> Result<Self> {
        Self::open_if_exists(bootstrap, topic, group)?
            .ok_or_else(|| anyhow!("topic {topic} does not exist (at {bootstrap})"))
    }

    /// [`open`](Self::open), or `None` when `topic` does not exist.
    pub fn open_if_exists(bootstrap: &str, topic: &str, group: Option<&str>) -> Result<Option<Self>> {
        let mut config = client_config(bootstrap);
        config
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed")
            // Short long-polls at the end of a partition: on a single broker, a commit waits behind
            // the fetch in flight on the same connection.
            .set("fetch.wait.max.ms", "100");
        // librdkafka needs a group id to assign partitions; without the caller's group this one is
        // only a name: nothing is committed under it and assign() never joins it.
        config.set("group.id", group.unwrap_or("millrace-cli-reader"));
        let consumer: StreamConsumer<Hooks> =
            config.create_with_context(Hooks).context("creating the Kafka consumer")?;
        let Some(partitions) = partition_count(consumer.client(), bootstrap, topic, || serve_logs(&consumer))? else {
            return Ok(None);
        };
        let committed = match group {
            Some(g) => {
                let mut tpl = TopicPartitionList::new();
                for p in 0..partitions {
                    tpl.add_partition(topic, p);
                }
                let got = tokio::task::block_in_place(|| consumer.committed_offsets(tpl, REQUEST_TIMEOUT))
                    .with_context(|| format!("reading the committed offsets of group {g}"))?;
                (0..partitions)
                    .filter_map(|p| match got.find_partition(topic, p).map(|e| e.offset()) {
                        Some(Offset::Offset(o)) => Some((p, o)),
                        _ => None,
                    })
                    .collect()
            }
            None => BTreeMap::new(),
        };
        let mut bounds = BTreeMap::new();
        let mut assignment = TopicPartitionList::new();
        for p in 0..partitions {
            let (low, high) = tokio::task::block_in_place(|| consumer.fetch_watermarks(topic, p, REQUEST_TIMEOUT))
                .map_err(|e| {
                    serve_logs(&consumer);
                    unreachable_error(bootstrap, e)
                })?;
            let start = committed.get(&p).map_or(low, |&c: &i64| c.max(low));
            bounds.insert(p, (start, high));
            if start < high {
                assignment.add_partition_offset(topic, p, Offset::Offset(start)).context("building the assignment")?;
            }
        }
        consumer.assign(&assignment).context("assigning the DLQ partitions")?;
        tracing::debug!(topic, ?bounds, "scan opened");
        let remaining = bounds.iter().filter(|(_, (s, e))| s < e).map(|(p, _)| *p).collect();
        Ok(Some(TopicScan {
            consumer,
            topic: topic.into(),
            bootstrap: bootstrap.to_owned(),
            bounds,
            remaining,
            last_read: BTreeMap::new(),
        }))
    }

    /// Records this scan will read at most (end minus start, summed over partitions).
    pub fn total(&self) -> u64 {
        self.bounds.values().map(|(s, e)| (e - s).max(0) as u64).sum()
    }

    /// Per partition: the start and end offsets of this scan.
    pub fn bounds(&self) -> &BTreeMap<i32, (i64, i64)> {
        &self.bounds
    }

    /// The next record in offset order within its partition (partitions interleave), or `None` once
    /// every partition was read to its captured end.
    pub async fn next(&mut self) -> Result<Option<DlqRecord>> {
        while !self.remaining.is_empty() {
            match self.consumer.recv().await {
                Ok(msg) => {
                    let (p, offset) = (msg.partition(), msg.offset());
                    let end = self.bounds.get(&p).map_or(0, |b| b.1);
                    self.last_read.insert(p, offset);
                    let record = (offset < end).then(|| DlqRecord::new(Record::from_message(&msg, self.topic.clone())));
                    drop(msg);
                    if offset >= end - 1 {
                        self.finish_partition(p);
                    }
                    if record.is_some() {
                        return Ok(record);
                    }
                }
                // Delivered after every earlier record of the partition: reached the end of the log
                // (at or past the captured end; also covers a trailing transaction marker).
                Err(KafkaError::PartitionEOF(p)) => {
                    tracing::debug!(
                        topic = %self.topic, partition = p, last_read = ?self.last_read.get(&p),
                        bounds = ?self.bounds.get(&p), "end of partition"
                    );
                    self.finish_partition(p)
                }
                Err(KafkaError::MessageConsumption(
                    code @ (RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic),
                )) => bail!("reading {}: {code} (was the topic deleted?)", self.topic),
                Err(KafkaError::MessageConsumption(
                    code @ (RDKafkaErrorCode::TopicAuthorizationFailed | RDKafkaErrorCode::GroupAuthorizationFailed),
                )) => bail!("reading {}: {code}", self.topic),
                Err(e) => {
                    tracing::warn!(topic = %self.topic, bootstrap = %self.bootstrap, "consumer error: {e} (retrying)")
                }
            }
        }
        Ok(None)
    }

    fn finish_partition(&mut self, p: i32) {
        if self.remaining.remove(&p) {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&self.topic, p);
            // Only stops needless fetching past the end; records past it are ignored anyway.
            let _ = self.consumer.pause(&tpl);
        }
    }

    /// Commits `next offset to read` per partition for the scan's group, synchronously.
    pub fn commit(&self, offsets: &BTreeMap<i32, i64>) -> Result<()> {
        if offsets.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for (p, o) in offsets {
            tpl.add_partition_offset(&self.topic, *p, Offset::Offset(*o)).context("building the commit")?;
        }
        tokio::task::block_in_place(|| self.consumer.commit(&tpl, CommitMode::Sync))
            .with_context(|| format!("committing DLQ offsets {offsets:?} of {}", self.topic))
    }
}
