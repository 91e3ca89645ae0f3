//! Parked keys (key parking, `DlqConfig::park_keys`): what a pipeline's group has parked, read from
//! its `<group>.parked-keys` topic, and `millrace dlq release`, which releases a parked key.
//!
//! A release is not written to the parked-keys topic (only the pipeline that owns a partition writes
//! there): it is a release marker produced to the key's source partition (key K, an empty value,
//! `millrace.control: release`, `millrace.parked.by` = the parking it releases). The pipeline reads
//! it in order with the partition's records, never hands it to the processor, and releases K if K is
//! still parked behind that record (a marker for a parking that was since replaced does nothing).
//! Other consumers of the topic see the marker as a record with an empty value and those headers.

use crate::args::ReleaseArgs;
use crate::read::{TopicScan, producer};
use anyhow::{Context as _, Result, anyhow, bail};
use millrace::dlq::{Coordinates, headers};
use millrace::park::{RELEASE, read_entry, topic_for_group};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// A key parked now: where, and behind which record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Parking {
    /// The consumer group that parked it.
    pub group: String,
    /// The source topic.
    pub topic: String,
    /// The source partition.
    pub partition: i32,
    /// The key (UTF-8, lossy).
    pub key: String,
    /// The blocking record's offset in the source partition.
    pub blocking_offset: i64,
    /// Records of the key parked behind it that are in the DLQ topic read (filled by `dlq stats`).
    pub parked_records: u64,
    #[serde(skip)]
    raw_key: Vec<u8>,
}

impl Parking {
    /// The blocking record's coordinates.
    pub fn blocking(&self) -> Coordinates {
        Coordinates { topic: self.topic.clone(), partition: self.partition, offset: self.blocking_offset }
    }
}

/// The keys `group` has parked now (the last entry per key wins), in topic, partition, key order;
/// none when the group never parked a key.
pub async fn read(bootstrap: &str, group: &str) -> Result<Vec<Parking>> {
    let name = topic_for_group(group);
    let Some(mut scan) = TopicScan::open_if_exists(bootstrap, &name, None)? else { return Ok(Vec::new()) };
    let mut now: BTreeMap<(String, i32, Vec<u8>), i64> = BTreeMap::new();
    while let Some(r) = scan.next().await? {
        let Some((topic, key, at)) = read_entry(r.record.key.as_deref(), r.record.value.as_deref()) else { continue };
        let slot = (topic.to_owned(), r.record.partition, key.to_vec());
        match at {
            Some(at) => now.insert(slot, at),
            None => now.remove(&slot),
        };
    }
    Ok(now
        .into_iter()
        .map(|((topic, partition, raw_key), blocking_offset)| Parking {
            group: group.to_owned(),
            topic,
            partition,
            key: String::from_utf8_lossy(&raw_key).into_owned(),
            blocking_offset,
            parked_records: 0,
            raw_key,
        })
        .collect())
}

/// Runs `millrace dlq release`: a release marker for every parking of the key (in `--topic` only,
/// when given). Returns the markers written (or, with `--dry-run`, that would be).
pub async fn release(bootstrap: &str, args: &ReleaseArgs) -> Result<usize> {
    let parked = read(bootstrap, &args.group).await?;
    let chosen: Vec<&Parking> = parked
        .iter()
        .filter(|p| p.raw_key == args.key.as_bytes() && args.topic.as_ref().is_none_or(|t| *t == p.topic))
        .collect();
    if chosen.is_empty() {
        bail!(
            "key {:?} is not parked by group {}{} ({} parked keys; `millrace dlq stats <dlq topic>` lists them)",
            args.key,
            args.group,
            args.topic.as_ref().map(|t| format!(" in {t}")).unwrap_or_default(),
            parked.len()
        );
    }
    if args.dry_run {
        for p in &chosen {
            println!("would release key {:?} in {}/{} (parked behind {})", p.key, p.topic, p.partition, p.blocking());
        }
        return Ok(chosen.len());
    }
    let producer = producer(bootstrap)?;
    for p in &chosen {
        let by = p.blocking().to_string();
        let marker_headers = OwnedHeaders::new()
            .insert(Header { key: headers::CONTROL, value: Some(RELEASE) })
            .insert(Header { key: headers::PARKED_BY, value: Some(&by) });
        let record = FutureRecord::to(&p.topic)
            .partition(p.partition)
            .key(&p.raw_key[..])
            .payload(&b""[..])
            .headers(marker_headers);
        let (_, offset) = producer
            .send(record, Duration::from_secs(30))
            .await
            .map(|d| (d.partition, d.offset))
            .map_err(|(e, _)| anyhow!("{e}"))
            .with_context(|| format!("producing the release marker to {}/{}", p.topic, p.partition))?;
        println!(
            "release marker for key {:?} written to {}/{} at offset {offset} (parked behind {by}); the pipeline releases the key when it reaches it",
            p.key, p.topic, p.partition
        );
    }
    Ok(chosen.len())
}
