//! The parked-keys topic `<group>.parked-keys`: where a pipeline's parked keys are kept, so that a
//! key stays parked across a SIGKILL, a restart and a move of its partition to another instance.
//!
//! Compacted, one record per parked key: partition = the source partition, key = source topic, a
//! zero byte, then the record key ([`entry_key`]), value = the blocking record's offset in decimal;
//! a release is a tombstone. Only the owner of a source partition writes its parked-keys
//! partition (at-least-once: acknowledged before the record's offset completes; exactly-once: in
//! the record's transaction), and a partition's parked keys are read back, to the end of the
//! committed records, before its first record runs ([`restore`]).

use super::{Change, ParkedKeys};
use crate::kafka::config::restore_consumer_config;
use crate::kafka::produce::produce;
use crate::kafka::topic;
use crate::processor::Processor;
use crate::record::OutputRecord;
use crate::retry::Backoff;
use crate::shared::Shared;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The parked-keys topic of consumer group `group`.
///
/// ```
/// assert_eq!(millrace::park::topic_for_group("billing"), "billing.parked-keys");
/// ```
pub fn topic_for_group(group: &str) -> String {
    format!("{group}.parked-keys")
}

/// The key of a parked-keys record: `source_topic`, a zero byte, the record key.
pub fn entry_key(source_topic: &str, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(source_topic.len() + 1 + key.len());
    k.extend_from_slice(source_topic.as_bytes());
    k.push(0);
    k.extend_from_slice(key);
    k
}

/// What a parked-keys record says: source topic, record key, and the blocking record's offset
/// (`None`: released). `None` for a record that is not one.
///
/// ```
/// use millrace::park::{entry_key, read_entry};
/// let key = entry_key("orders", b"K");
/// assert_eq!(read_entry(Some(&key), Some(b"10")), Some(("orders", &b"K"[..], Some(10))));
/// assert_eq!(read_entry(Some(&key), None), Some(("orders", &b"K"[..], None)));
/// ```
pub fn read_entry<'a>(key: Option<&'a [u8]>, value: Option<&[u8]>) -> Option<(&'a str, &'a [u8], Option<i64>)> {
    let key = key?;
    let zero = key.iter().position(|b| *b == 0)?;
    let topic = std::str::from_utf8(&key[..zero]).ok()?;
    let offset = match value {
        None => None,
        Some(v) => Some(std::str::from_utf8(v).ok()?.parse().ok()?),
    };
    Some((topic, &key[zero + 1..], offset))
}

/// The parked-keys record for a change of `key`'s parking in `source_topic`/`partition`.
pub(crate) fn entry(group: &str, source_topic: &str, partition: i32, key: &[u8], change: Change) -> OutputRecord {
    let mut out = OutputRecord::to(topic_for_group(group));
    out.partition = Some(partition);
    out.key = Some(entry_key(source_topic, key));
    out.value = match change {
        Change::Park(at) => Some(at.to_string().into_bytes()),
        Change::Release => None,
    };
    out
}

/// Creates the parked-keys topic once per run (compacted; partitions: the largest input topic's).
async fn ensure<P: Processor>(shared: &Arc<Shared<P>>, name: &str) -> Result<(), Result<crate::Error, String>> {
    let known = |s: &Shared<P>| s.dlq_topics.lock().unwrap_or_else(|p| p.into_inner()).contains(name);
    if known(shared) {
        return Ok(());
    }
    let configs = [("cleanup.policy", "compact")];
    topic::ensure(&shared.admin, name, &shared.config.topics, &configs)
        .await
        .map_err(|e| e.refusal("parked-keys topic", name))?;
    shared.dlq_topics.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_owned());
    Ok(())
}

/// At-least-once: writes `out` (a parked-keys record), acknowledged, retrying with the pipeline's
/// backoff until it is or `cancel` fires. Returns whether it was written; a refusal by the ACLs
/// stops the pipeline.
pub(crate) async fn write<P: Processor>(
    shared: &Arc<Shared<P>>,
    out: &OutputRecord,
    cancel: &CancellationToken,
) -> bool {
    let mut backoff = Backoff::from_policy(&shared.config.retry, Duration::from_millis(100));
    loop {
        let written = match ensure(shared, &out.topic).await {
            Ok(()) => match produce(&shared.handles.producer, out).await {
                Ok(()) => return true,
                Err(e) if shared.log.stop_if_refused("parked-keys topic", &out.topic, &e) => return false,
                Err(e) => e.to_string(),
            },
            Err(Ok(refused)) => {
                shared.log.stop_with(refused);
                return false;
            }
            Err(Err(e)) => e,
        };
        shared.log.warn("parked-keys write failed; the record stays unfinished", &written);
        if !backoff.wait(cancel).await {
            return false;
        }
    }
}

/// Reads `topic`/`partition`'s parked keys, retrying (with a warning) until they are read or
/// `cancel` fires (`None`). The partition's records wait meanwhile: running them unparked could
/// break a parked key's order.
pub(crate) async fn restore<P: Processor>(
    shared: &Arc<Shared<P>>,
    topic: &str,
    partition: i32,
    cancel: &CancellationToken,
) -> Option<ParkedKeys> {
    let name = topic_for_group(&shared.config.group_id);
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        let read = match ensure(shared, &name).await {
            Ok(()) => {
                let (s, t, n) = (shared.clone(), topic.to_owned(), name.clone());
                tokio::task::spawn_blocking(move || read(&s, &n, &t, partition))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r)
            }
            Err(Ok(refused)) => {
                shared.log.stop_with(refused);
                return None;
            }
            Err(Err(e)) => Err(e),
        };
        match read {
            Ok(parked) => {
                if parked.len() > 0 {
                    tracing::info!(topic, partition, parked = parked.len(), "parked keys restored");
                }
                return Some(parked);
            }
            Err(e) => shared.log.warn(&format!("parked keys of {topic}/{partition} not read; its records wait"), &e),
        }
        tokio::select! {
            () = tokio::time::sleep(backoff.next_delay()) => {}
            () = cancel.cancelled() => return None,
        }
    }
}

fn read<P: Processor>(shared: &Shared<P>, name: &str, topic: &str, partition: i32) -> Result<ParkedKeys, String> {
    let mut parked = ParkedKeys::new(shared.config.dlq.max_parked_keys);
    let consumer: BaseConsumer = restore_consumer_config(&shared.config).create().map_err(|e| e.to_string())?;
    let (low, high) = consumer.fetch_watermarks(name, partition, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    if low >= high {
        return Ok(parked);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(name, partition, Offset::Offset(low)).map_err(|e| e.to_string())?;
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut next = low;
    while next < high {
        if std::time::Instant::now() > deadline {
            return Err(format!("read {next} of {high} in 60 s"));
        }
        let msg = match consumer.poll(Duration::from_millis(200)) {
            None => continue,
            // The end of the committed records (the rest is markers, or a transaction still open).
            Some(Err(KafkaError::PartitionEOF(_))) => break,
            Some(other) => other.map_err(|e| e.to_string())?,
        };
        next = msg.offset() + 1;
        if let Some((t, key, at)) = read_entry(msg.key(), msg.payload())
            && t == topic
        {
            parked.apply(key, at.map_or(Change::Release, Change::Park));
        }
    }
    Ok(parked)
}
