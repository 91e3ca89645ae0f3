//! Reading the output back as its consumers must: `isolation.level=read_committed`, so records of
//! aborted (or still open) transactions are never seen.

use anyhow::{Result, bail};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// librdkafka's default context logs each partition's end as an error (it reaches the error callback
/// as a global `PartitionEOF` code); here it is the expected end of the read.
struct EndIsNoError;

impl ClientContext for EndIsNoError {
    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() != Some(RDKafkaErrorCode::PartitionEOF) {
            eprintln!("reading back: {error}: {reason}");
        }
    }
}

impl ConsumerContext for EndIsNoError {}

/// Reads `topic` from the beginning to its last stable offset and counts the enriched orders whose
/// id starts with `prefix`: how many distinct ones, and how many records repeated one.
pub fn read_committed(bootstrap: &str, topic: &str, prefix: &str) -> Result<(u64, u64)> {
    let consumer: BaseConsumer<EndIsNoError> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "enricher-verify") // assign() needs one; nothing is committed
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create_with_context(EndIsNoError)?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions = metadata.topics().first().map_or(0, |t| t.partitions().len());
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let (mut seen, mut at_end) = (HashMap::<String, u64>::new(), 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while at_end < partitions {
        if Instant::now() > deadline {
            bail!("reading {topic}: {at_end} of {partitions} partitions reached their end in 60 s");
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => at_end += 1,
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(m)) => {
                let value: serde_json::Value = serde_json::from_slice(m.payload().unwrap_or_default())?;
                if let Some(id) = value["id"].as_str().filter(|id| id.starts_with(prefix)) {
                    *seen.entry(id.to_owned()).or_default() += 1;
                }
            }
        }
    }
    let repeated = seen.values().map(|n| n - 1).sum();
    Ok((seen.len() as u64, repeated))
}

/// Reads the output as [`read_committed`] does, again and again until it holds `n` distinct orders
/// of the run (or `timeout` passes): the counts of the last read.
pub fn until_committed(bootstrap: &str, topic: &str, prefix: &str, n: u64, timeout: Duration) -> Result<(u64, u64)> {
    let deadline = Instant::now() + timeout;
    loop {
        let (distinct, repeated) = read_committed(bootstrap, topic, prefix)?;
        if distinct >= n || repeated > 0 || Instant::now() > deadline {
            return Ok((distinct, repeated));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
