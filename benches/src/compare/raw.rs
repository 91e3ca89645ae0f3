//! The raw rdkafka pipes, the limit on this machine: P0 (consume -> produce, offsets committed
//! asynchronously) and Pt(i) (the same in Kafka transactions committed every i). C0, the drain, is
//! `core`'s baseline ([`crate::core_bench::drain_raw`]).
//!
//! One thread does everything, the simplest loop a user would write: poll a record, hand the same key
//! and value to a `ThreadedProducer` (whose own thread delivers them), note the next offset of its
//! partition. Both clients get the settings Millrace's own clients get, so that the comparison is of
//! the frameworks, not of settings: consumer `partition.assignment.strategy=cooperative-sticky`,
//! `fetch.queue.backoff.ms=20`, `auto.offset.reset=earliest`; producer `acks=all`,
//! `enable.idempotence=true`, `linger.ms=5`.
//!
//! - **P0** commits the consumed position (`commit_consumer_state(Async)`) every second, Millrace's
//!   default commit interval, without waiting for the outputs' acknowledgements: cheaper than
//!   at-least-once strictly needs, which makes it a limit. It is done when every record was consumed
//!   and every output acknowledged (`flush`).
//! - **Pt(i)**: `transactional.id` set, `init_transactions` (timed: a real start pays it too) and
//!   `begin_transaction`; every i, `send_offsets_to_transaction` with the consumer's group metadata
//!   and the next offsets, `commit_transaction`, `begin_transaction`. The consumer reads with
//!   `isolation.level=read_committed`. Done when the last transaction, holding the last record, is
//!   committed. The commit blocks the loop (no polling meanwhile), as in the textbook loop.

use crate::measure::{Measurement, Stopwatch};
use anyhow::{Context as _, bail};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// How long transactional calls and the final flush may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// One run of a raw pipe.
pub struct Pipe<'a> {
    pub bootstrap: &'a str,
    pub input: &'a str,
    pub output: &'a str,
    /// A fresh group (and the transactional id's stem).
    pub group: &'a str,
    pub records: u64,
    pub timeout: Duration,
    /// `None` for P0; the transaction interval for Pt.
    pub transactions: Option<Duration>,
    /// P0's commit interval.
    pub commit_interval: Duration,
}

/// Counts failed deliveries.
#[derive(Default)]
struct Deliveries {
    failed: AtomicU64,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            tracing::warn!(error = %e, "raw pipe: delivery failed");
            self.failed.fetch_add(1, Relaxed);
        }
    }
}

/// Runs the pipe until every record went through; blocking (run it off the async runtime).
pub fn run(p: &Pipe<'_>) -> anyhow::Result<Measurement> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", p.bootstrap)
        .set("group.id", p.group)
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("fetch.queue.backoff.ms", "20")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("enable.auto.commit", "false")
        .set("isolation.level", if p.transactions.is_some() { "read_committed" } else { "read_uncommitted" })
        .create()
        .context("creating the pipe's consumer")?;
    let mut producer_config = ClientConfig::new();
    producer_config
        .set("bootstrap.servers", p.bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5");
    if p.transactions.is_some() {
        producer_config.set("transactional.id", format!("{}-tx", p.group));
    }
    let producer: ThreadedProducer<Deliveries> =
        producer_config.create_with_context(Deliveries::default()).context("creating the pipe's producer")?;

    let clock = Stopwatch::start();
    if p.transactions.is_some() {
        producer.init_transactions(CALL_TIMEOUT).context("init_transactions")?;
        producer.begin_transaction().context("begin_transaction")?;
    }
    consumer.subscribe(&[p.input]).context("subscribing the pipe's consumer")?;
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    let (mut consumed, mut first_record, mut last_commit) = (0u64, None, Instant::now());
    let mut transactions = 0u64;
    while consumed < p.records {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(msg)) => {
                let mut record = BaseRecord::to(p.output);
                if let Some(key) = msg.key() {
                    record = record.key(key);
                }
                if let Some(value) = msg.payload() {
                    record = record.payload(value);
                }
                send(&producer, record)?;
                next.insert(msg.partition(), msg.offset() + 1);
                consumed += 1;
                first_record.get_or_insert_with(|| clock.elapsed());
            }
            Some(Err(e)) => tracing::warn!(error = %e, "raw pipe: consumer error"),
            None if clock.elapsed() > p.timeout => {
                bail!("raw pipe: only {consumed} of {} records after {:?}", p.records, p.timeout)
            }
            None => {}
        }
        match p.transactions {
            Some(interval) if last_commit.elapsed() >= interval && consumed < p.records => {
                commit_transaction(&consumer, &producer, p.input, &next)?;
                producer.begin_transaction().context("begin_transaction")?;
                transactions += 1;
                last_commit = Instant::now();
            }
            None if last_commit.elapsed() >= p.commit_interval => {
                if let Err(e) = consumer.commit_consumer_state(CommitMode::Async) {
                    tracing::warn!(error = %e, "raw pipe: async commit failed");
                }
                last_commit = Instant::now();
            }
            _ => {}
        }
    }
    if p.transactions.is_some() {
        commit_transaction(&consumer, &producer, p.input, &next)?;
        transactions += 1;
    } else {
        producer.flush(CALL_TIMEOUT).context("flushing the pipe's producer")?;
    }
    let (elapsed, cpu) = clock.stop();
    let failed = producer.context().failed.load(Relaxed);
    if failed > 0 {
        bail!("raw pipe: {failed} outputs were not delivered");
    }
    if p.transactions.is_none() {
        let _ = consumer.commit_consumer_state(CommitMode::Sync);
    }
    tracing::debug!(transactions, "raw pipe done");
    Ok(Measurement { records: p.records, elapsed, first_record: first_record.unwrap_or_default(), cpu, warm: None })
}

/// Queues one record, waiting while the producer's queue is full (also the `latency` writer's).
pub fn send<C: ProducerContext<DeliveryOpaque = ()>>(
    producer: &ThreadedProducer<C>,
    mut record: BaseRecord<'_, [u8], [u8]>,
) -> anyhow::Result<()> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back; // the producer's thread is delivering: give it a moment
                std::thread::sleep(Duration::from_micros(200));
            }
            Err((e, _)) => return Err(e).context("producing a record"),
        }
    }
}

/// Adds the consumed positions to the open transaction and commits it.
fn commit_transaction(
    consumer: &BaseConsumer,
    producer: &ThreadedProducer<Deliveries>,
    topic: &str,
    next: &BTreeMap<i32, i64>,
) -> anyhow::Result<()> {
    let mut offsets = TopicPartitionList::new();
    for (&partition, &offset) in next {
        offsets.add_partition_offset(topic, partition, Offset::Offset(offset)).context("building the offsets")?;
    }
    let metadata = consumer.group_metadata().context("the consumer has no group metadata")?;
    producer.send_offsets_to_transaction(&offsets, &metadata, CALL_TIMEOUT).context("send_offsets_to_transaction")?;
    producer.commit_transaction(CALL_TIMEOUT).context("commit_transaction")?;
    Ok(())
}
