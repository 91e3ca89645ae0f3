//! End offsets (high watermarks, last stable offsets) and a group's committed offsets.

use crate::{bootstrap, plain_consumer};
use anyhow::{Context as _, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode::*};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a partition whose leader or group coordinator is not ready may be asked again.
const NOT_READY_RETRY: Duration = Duration::from_secs(30);

/// The group's committed offset per partition of `topic` (partitions without a commit are absent).
/// A group coordinator that is still loading or moving (a fresh broker, or one just restarted), or a
/// request that timed out or found no broker up (right after a restart the first connection can
/// take longer than the request's 10 s), is asked again for up to 30 s: such an answer says nothing
/// about the offsets.
pub fn committed_offsets(group: &str, topic: &str, partitions: i32) -> Result<BTreeMap<i32, i64>> {
    let consumer = plain_consumer(&bootstrap(), Some(group))?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let deadline = Instant::now() + NOT_READY_RETRY;
    let committed = loop {
        match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
            Err(KafkaError::MetadataFetch(
                NotCoordinator
                | CoordinatorLoadInProgress
                | CoordinatorNotAvailable
                | OperationTimedOut
                | RequestTimedOut
                | BrokerTransportFailure
                | AllBrokersDown,
            )) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => break other?,
        }
    };
    Ok(committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect())
}

/// The low and high watermarks per partition `0..partitions` of `topic` on the brokers `bootstrap`.
/// A partition whose leader is moving or not loaded yet (right after a broker restart, or a topic's
/// creation) is asked again, for up to 30 s. Blocking.
pub fn watermarks(bootstrap: &str, topic: &str, partitions: i32) -> Result<BTreeMap<i32, (i64, i64)>> {
    let consumer = plain_consumer(bootstrap, None)?;
    let deadline = Instant::now() + NOT_READY_RETRY;
    let mut marks = BTreeMap::new();
    for p in 0..partitions {
        let low_high = loop {
            match consumer.fetch_watermarks(topic, p, Duration::from_secs(10)) {
                Err(KafkaError::MetadataFetch(
                    NotLeaderForPartition | LeaderNotAvailable | UnknownTopicOrPartition | NotCoordinator,
                )) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                other => break other.with_context(|| format!("reading the end offset of {topic}/{p}"))?,
            }
        };
        marks.insert(p, low_high);
    }
    Ok(marks)
}

/// The records `topic`'s partitions `0..partitions` hold on the brokers `bootstrap`: the sum of high
/// minus low watermarks (for a transactional topic the commit markers count too). Blocking.
pub fn record_count(bootstrap: &str, topic: &str, partitions: i32) -> Result<u64> {
    Ok(watermarks(bootstrap, topic, partitions)?.values().map(|(low, high)| (high - low).max(0) as u64).sum())
}

/// The high watermark (end offset) per partition, on the environment's brokers; retried like
/// [`watermarks`]. Blocking.
pub fn end_offsets(topic: &str, partitions: i32) -> Result<BTreeMap<i32, i64>> {
    Ok(watermarks(&bootstrap(), topic, partitions)?.into_iter().map(|(p, (_, high))| (p, high)).collect())
}

/// Which records a reader of a transactional topic sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Everything written, including aborted and still-open transactions' records.
    ReadUncommitted,
    /// Only committed transactions' records (what downstream consumers of an exactly-once pipeline use).
    ReadCommitted,
}

impl Isolation {
    /// The value of librdkafka's `isolation.level`.
    pub(crate) fn property(self) -> &'static str {
        match self {
            Isolation::ReadUncommitted => "read_uncommitted",
            Isolation::ReadCommitted => "read_committed",
        }
    }
}

/// End offsets as a reader with `isolation` sees them: the high watermark, or for `ReadCommitted`
/// the last stable offset (held back by any transaction still open). Keep one to query repeatedly.
pub struct Watermarks {
    consumer: BaseConsumer,
}

impl Watermarks {
    /// A client reading with `isolation`.
    pub fn new(isolation: Isolation) -> Result<Self> {
        let consumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("isolation.level", isolation.property())
            .create()?;
        Ok(Self { consumer })
    }

    /// The end offset of each partition of `topic`.
    pub fn ends(&self, topic: &str, partitions: i32) -> Result<BTreeMap<i32, i64>> {
        (0..partitions).map(|p| Ok((p, self.consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?.1))).collect()
    }
}
