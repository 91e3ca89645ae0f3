//! Handing an [`OutputRecord`] to the producer and awaiting the broker's acknowledgement; shared by
//! processor outputs ([`Context::emit`](crate::Context::emit)) and dead-lettering.

use crate::error::EmitError;
use crate::kafka::log::Producer;
use crate::record::OutputRecord;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::DeliveryFuture;
use std::time::Duration;

/// Queues `record`, waiting while librdkafka's queue is full. Returns the delivery to await.
pub(crate) async fn enqueue(producer: &Producer, record: &OutputRecord) -> Result<DeliveryFuture, EmitError> {
    let mut fr = record.as_future_record();
    loop {
        match producer.send_result(fr) {
            Ok(delivery) => return Ok(delivery),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                // librdkafka's queue is full: deliveries will drain it.
                fr = back;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err((source, _)) => return Err(EmitError::NotAcknowledged { topic: record.topic.clone(), source }),
        }
    }
}

/// Whether a successful delivery report proves the write: it names the offset the record got.
///
/// librdkafka's idempotent producer also reports success *without* an offset, for a request it
/// could not confirm: a duplicate-sequence answer, or an earlier request "implicitly acked" because
/// a later one succeeded. The latter can be wrong: on a partition the broker was still creating,
/// the first request was refused (`NOT_LEADER_OR_FOLLOWER`), the next one accepted (a broker
/// accepts any sequence from a producer it has no state for), and the refused record was reported
/// delivered yet is not in the log (found as a DLQ record missing on a fresh broker; issue 12,
/// item 3; the same librdkafka behaviour is reported as confluent-kafka-go issue 921). Such a
/// report is treated as not acknowledged: the record is produced again (at worst a duplicate).
pub(crate) fn confirmed(offset: i64) -> bool {
    offset >= 0
}

/// Awaits one delivery; returns the offset the record got (a report without one is not an
/// acknowledgement: see [`confirmed`]).
pub(crate) async fn acknowledged(topic: &str, delivery: DeliveryFuture) -> Result<i64, EmitError> {
    delivery_offset(topic, delivery.await)
}

/// What one awaited delivery report of a record produced to `topic` proves: the offset the record
/// got, or why it is not acknowledged. A success reported without an offset (librdkafka's idempotent
/// producer does that for a request it could not confirm, and it can be wrong) is
/// [`EmitError::Unconfirmed`]: produce the record again rather than count it written.
///
/// ```no_run
/// # async fn f(producer: rdkafka::producer::FutureProducer) -> Result<(), millrace::EmitError> {
/// use rdkafka::producer::FutureRecord;
/// let delivery = producer.send_result(FutureRecord::<(), _>::to("orders").payload("x")).map_err(|_| ()).unwrap();
/// let offset = millrace::delivery_offset("orders", delivery.await)?;
/// println!("written at offset {offset}");
/// # Ok(()) }
/// ```
pub fn delivery_offset(topic: &str, report: <DeliveryFuture as Future>::Output) -> Result<i64, EmitError> {
    match report {
        Ok(Ok(d)) if confirmed(d.offset) => Ok(d.offset),
        Ok(Ok(d)) => {
            tracing::warn!(topic, partition = d.partition, "delivery reported without an offset; producing again");
            Err(EmitError::Unconfirmed { topic: topic.to_owned() })
        }
        Ok(Err((source, _))) => Err(EmitError::NotAcknowledged { topic: topic.to_owned(), source }),
        Err(_) => Err(EmitError::Canceled { topic: topic.to_owned() }),
    }
}

/// Produces `record` and waits for the broker's acknowledgement.
pub(crate) async fn produce(producer: &Producer, record: &OutputRecord) -> Result<(), EmitError> {
    let delivery = enqueue(producer, record).await?;
    acknowledged(&record.topic, delivery).await.map(drop)
}
