//! Producing test records: by key and value, or with full control over key, value and headers.

use crate::bootstrap;
use anyhow::{Result, bail};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

/// One record a test wrote.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Written {
    /// Partition it landed in.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its key.
    pub key: String,
}

/// Produces `(key, value)` pairs to `topic` (partitioned by key) and returns where each landed.
pub async fn produce(topic: &str, records: impl IntoIterator<Item = (String, Vec<u8>)>) -> Result<Vec<Written>> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("linger.ms", "10")
        .set("enable.idempotence", "true")
        // One request in flight: librdkafka's idempotent producer can report a record refused by a
        // partition the broker is still creating as delivered when the next request succeeds
        // (issue 12, item 3). Tests need every record where they say it is.
        .set("max.in.flight.requests.per.connection", "1")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let mut pending = Vec::new();
    for (key, value) in records {
        let delivery = producer
            .send_result(FutureRecord::to(topic).key(key.as_bytes()).payload(&value))
            .map_err(|(e, _)| anyhow::anyhow!("enqueue failed: {e}"))?;
        pending.push((key, delivery));
    }
    let mut written = Vec::with_capacity(pending.len());
    for (key, delivery) in pending {
        let (partition, offset) = match delivery.await? {
            Ok(d) if d.offset < 0 => bail!("delivery to {topic} [{}] reported without an offset", d.partition),
            Ok(d) => (d.partition, d.offset),
            Err((e, _)) => bail!("delivery failed: {e}"),
        };
        written.push(Written { partition, offset, key });
    }
    Ok(written)
}

/// `n` records with keys `key-0 … key-(keys-1)` round-robin and values `value-i`.
pub fn keyed_records(n: usize, keys: usize) -> impl Iterator<Item = (String, Vec<u8>)> {
    (0..n).map(move |i| (format!("key-{}", i % keys), format!("value-{i}").into_bytes()))
}

/// A record to produce: key, value (either may be null) and headers.
pub type RawRecord = (Option<Vec<u8>>, Option<Vec<u8>>, Vec<(String, Vec<u8>)>);

/// Produces records with full control over key, value (possibly null) and headers; returns where
/// each landed.
pub async fn produce_raw(topic: &str, records: impl IntoIterator<Item = RawRecord>) -> Result<Vec<(i32, i64)>> {
    use rdkafka::message::{Header, OwnedHeaders};
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        // One request in flight: librdkafka's idempotent producer can report a record refused by a
        // partition the broker is still creating as delivered when the next request succeeds
        // (issue 12, item 3). Tests need every record where they say it is.
        .set("max.in.flight.requests.per.connection", "1")
        .set("message.max.bytes", "2000000")
        .create()?;
    let mut pending = Vec::new();
    for (key, value, headers) in records {
        let mut h = OwnedHeaders::new();
        for (k, v) in &headers {
            h = h.insert(Header { key: k, value: Some(v) });
        }
        let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(h);
        if let Some(k) = key.as_deref() {
            rec = rec.key(k);
        }
        if let Some(v) = value.as_deref() {
            rec = rec.payload(v);
        }
        pending.push(producer.send_result(rec).map_err(|(e, _)| anyhow::anyhow!("enqueue failed: {e}"))?);
    }
    let mut out = Vec::new();
    for d in pending {
        match d.await? {
            Ok(d) if d.offset < 0 => bail!("delivery to {topic} [{}] reported without an offset", d.partition),
            Ok(d) => out.push((d.partition, d.offset)),
            Err((e, _)) => bail!("delivery failed: {e}"),
        }
    }
    Ok(out)
}
