//! Topic plumbing of the example: reading a topic to its end, and the group's progress (committed
//! offsets against end offsets).

use anyhow::{Result, bail};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// librdkafka's default context logs each partition's end as an error; here it ends a read.
struct EndIsNoError;

impl ClientContext for EndIsNoError {
    fn error(&self, error: KafkaError, reason: &str) {
        if !matches!(error, KafkaError::PartitionEOF(_)) {
            eprintln!("kafka: {error}: {reason}");
        }
    }
}

impl ConsumerContext for EndIsNoError {}

fn consumer(bootstrap: &str, group: &str) -> Result<BaseConsumer<EndIsNoError>> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create_with_context(EndIsNoError)?)
}

fn partitions(c: &BaseConsumer<EndIsNoError>, topic: &str) -> Result<Vec<i32>> {
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    Ok(md.topics().first().map(|t| t.partitions().iter().map(|p| p.id()).collect()).unwrap_or_default())
}

/// Every record value of `topic`, from the beginning to its end.
pub fn read_values(bootstrap: &str, topic: &str) -> Result<Vec<Vec<u8>>> {
    // assign() needs a group id; nothing is committed under it.
    let c = consumer(bootstrap, "shipping-reader")?;
    let parts = partitions(&c, topic)?;
    let mut tpl = TopicPartitionList::new();
    for p in &parts {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let (mut values, mut ended) = (Vec::new(), 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while ended < parts.len() {
        if Instant::now() > deadline {
            bail!("reading {topic}: {ended} of {} partitions reached their end in 60 s", parts.len());
        }
        match c.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) => values.push(m.payload().unwrap_or_default().to_vec()),
            Some(Err(KafkaError::PartitionEOF(_))) => ended += 1,
            Some(Err(e)) => return Err(e.into()),
        }
    }
    Ok(values)
}

/// Whether `group` has committed every partition of `topic` up to the end offsets in `ends`.
pub fn caught_up(bootstrap: &str, group: &str, topic: &str, ends: &[(i32, i64)]) -> Result<bool> {
    let c = consumer(bootstrap, group)?;
    let mut tpl = TopicPartitionList::new();
    for (p, _) in ends {
        tpl.add_partition(topic, *p);
    }
    let committed = c.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok(ends.iter().all(|(p, end)| {
        *end == 0
            || committed.find_partition(topic, *p).is_some_and(|e| matches!(e.offset(), Offset::Offset(o) if o >= *end))
    }))
}

/// The end offset of each partition of `topic`, now.
pub fn end_offsets(bootstrap: &str, topic: &str) -> Result<Vec<(i32, i64)>> {
    let c = consumer(bootstrap, "shipping-reader")?;
    partitions(&c, topic)?
        .into_iter()
        .map(|p| Ok((p, c.fetch_watermarks(topic, p, Duration::from_secs(10))?.1)))
        .collect()
}
