//! Reading a topic back: to its end offsets, or as a reader in a given isolation.

use crate::offsets::Isolation;
use crate::{bootstrap, plain_consumer, unique};
use anyhow::{Context as _, Result, bail};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// A record read back from a topic.
#[derive(Debug, Clone)]
pub struct ReadRecord {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Headers.
    pub headers: millrace::record::Headers,
}

/// A reader of every partition of a topic from the beginning, in the given isolation; poll it
/// repeatedly (it keeps up with a topic being written) or read to the end with [`read_topic_as`].
pub struct TopicReader {
    consumer: BaseConsumer,
    partitions: usize,
}

impl TopicReader {
    /// Assigns every partition of `topic` (which must exist) from its first offset.
    pub fn new(topic: &str, isolation: Isolation) -> Result<Self> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            // librdkafka's assign() needs a group id even though nothing is committed.
            .set("group.id", unique("reader"))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", isolation.property())
            .create()?;
        let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let t = md.topics().first().filter(|t| t.error().is_none()).context("topic metadata")?;
        let mut tpl = TopicPartitionList::new();
        for p in t.partitions() {
            tpl.add_partition_offset(topic, p.id(), Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        Ok(Self { consumer, partitions: t.partitions().len() })
    }

    /// Polls for up to `wait`; returns the records read and the partitions that reached their end.
    pub fn poll(&self, wait: Duration) -> Result<(Vec<ReadRecord>, Vec<i32>)> {
        use rdkafka::Message;
        let mut records = Vec::new();
        let mut at_end = Vec::new();
        let deadline = Instant::now() + wait;
        while let Some(msg) = self.consumer.poll(deadline.saturating_duration_since(Instant::now())) {
            match msg {
                Ok(msg) => records.push(ReadRecord {
                    partition: msg.partition(),
                    offset: msg.offset(),
                    key: msg.key().map(<[u8]>::to_vec),
                    value: msg.payload().map(<[u8]>::to_vec),
                    headers: millrace::record::Headers::of_message(&msg),
                }),
                Err(rdkafka::error::KafkaError::PartitionEOF(p)) => at_end.push(p),
                Err(e) => return Err(e.into()),
            }
            if records.len() >= 10_000 || Instant::now() >= deadline {
                break;
            }
        }
        Ok((records, at_end))
    }
}

/// Reads `topic` from the beginning until every partition reports its end (for `ReadCommitted`,
/// the last stable offset), within 60 s.
pub fn read_topic_as(topic: &str, isolation: Isolation) -> Result<Vec<ReadRecord>> {
    let reader = TopicReader::new(topic, isolation)?;
    let mut out = Vec::new();
    let mut ended = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while ended.len() < reader.partitions {
        if Instant::now() > deadline {
            bail!(
                "reading {topic}: only {} of {} partitions reached their end in 60 s",
                ended.len(),
                reader.partitions
            );
        }
        let (records, at_end) = reader.poll(Duration::from_millis(200))?;
        out.extend(records);
        ended.extend(at_end);
    }
    Ok(out)
}

/// Reads every record of `topic` from the beginning to the end offsets at the time of the call.
/// A missing topic reads as empty.
pub fn read_topic(topic: &str) -> Result<Vec<ReadRecord>> {
    use rdkafka::Message;
    // librdkafka's assign() needs a group id even though nothing is committed.
    let consumer = plain_consumer(&bootstrap(), Some(&unique("reader")))?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let Some(t) = md.topics().first().filter(|t| t.error().is_none()) else { return Ok(Vec::new()) };
    let mut tpl = TopicPartitionList::new();
    let mut remaining = 0;
    let mut ends = HashMap::new();
    for p in t.partitions() {
        let (low, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
        tpl.add_partition_offset(topic, p.id(), Offset::Offset(low))?;
        ends.insert(p.id(), high);
        remaining += (high - low).max(0);
    }
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while remaining > 0 {
        if Instant::now() > deadline {
            bail!("reading {topic}: {remaining} records missing after 30 s");
        }
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else { continue };
        let msg = msg?;
        if msg.offset() >= ends[&msg.partition()] {
            continue;
        }
        remaining -= 1;
        let headers = millrace::record::Headers::of_message(&msg);
        out.push(ReadRecord {
            partition: msg.partition(),
            offset: msg.offset(),
            key: msg.key().map(<[u8]>::to_vec),
            value: msg.payload().map(<[u8]>::to_vec),
            headers,
        });
    }
    Ok(out)
}
