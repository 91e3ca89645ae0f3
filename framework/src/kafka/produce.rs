//! Handing an [`OutputRecord`] to the producer and awaiting the broker's acknowledgement; shared by
//! processor outputs ([`Context::emit`](crate::Context::emit)) and dead-lettering.

use crate::error::EmitError;
use crate::kafka::log::Producer;
use crate::record::OutputRecord;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryFuture, FutureRecord};
use rdkafka::util::IntoOpaque;
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

/// librdkafka's record types, filled from an [`OutputRecord`] by [`fill`]: the one conversion the
/// output producer (`FutureRecord`), the transactional producer (`BaseRecord`) and
/// [`OutputRecord::as_future_record`] share.
pub(crate) trait KafkaRecord<'a>: Sized {
    fn with_key(self, key: &'a [u8]) -> Self;
    fn with_payload(self, value: &'a [u8]) -> Self;
    fn with_partition(self, partition: i32) -> Self;
    fn with_headers(self, headers: OwnedHeaders) -> Self;
}

impl<'a> KafkaRecord<'a> for FutureRecord<'a, [u8], [u8]> {
    fn with_key(self, key: &'a [u8]) -> Self {
        self.key(key)
    }
    fn with_payload(self, value: &'a [u8]) -> Self {
        self.payload(value)
    }
    fn with_partition(self, partition: i32) -> Self {
        self.partition(partition)
    }
    fn with_headers(self, headers: OwnedHeaders) -> Self {
        self.headers(headers)
    }
}

impl<'a, D: IntoOpaque> KafkaRecord<'a> for BaseRecord<'a, [u8], [u8], D> {
    fn with_key(self, key: &'a [u8]) -> Self {
        self.key(key)
    }
    fn with_payload(self, value: &'a [u8]) -> Self {
        self.payload(value)
    }
    fn with_partition(self, partition: i32) -> Self {
        self.partition(partition)
    }
    fn with_headers(self, headers: OwnedHeaders) -> Self {
        self.headers(headers)
    }
}

/// Fills `record` (already addressed to `out.topic`) with `out`'s key, value, partition and headers.
pub(crate) fn fill<'a, R: KafkaRecord<'a>>(mut record: R, out: &'a OutputRecord) -> R {
    if let Some(h) = kafka_headers(&out.headers) {
        record = record.with_headers(h);
    }
    if let Some(k) = out.key.as_deref() {
        record = record.with_key(k);
    }
    if let Some(v) = out.value.as_deref() {
        record = record.with_payload(v);
    }
    if let Some(p) = out.partition {
        record = record.with_partition(p);
    }
    record
}

/// An output's headers as librdkafka takes them; `None` when there are none (saves an allocation).
fn kafka_headers(headers: &crate::record::Headers) -> Option<OwnedHeaders> {
    (!headers.is_empty()).then(|| {
        headers.iter().fold(OwnedHeaders::new_with_capacity(headers.len()), |all, h| {
            all.insert(KafkaHeader { key: &h.name, value: h.value.as_deref() })
        })
    })
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

/// Awaits one delivery.
pub(crate) async fn acknowledged(topic: &str, delivery: DeliveryFuture) -> Result<(), EmitError> {
    match delivery.await {
        Ok(Ok(d)) if confirmed(d.offset) => Ok(()),
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
    acknowledged(&record.topic, delivery).await
}
