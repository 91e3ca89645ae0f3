//! Handing an [`OutputRecord`] to the producer and awaiting the broker's acknowledgement; shared by
//! processor outputs ([`Context::emit`](crate::Context::emit)) and dead-lettering.

use crate::error::EmitError;
use crate::kafka_log::Producer;
use crate::record::OutputRecord;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureRecord};
use std::time::Duration;

/// Queues `record`, waiting while librdkafka's queue is full. Returns the delivery to await.
pub(crate) async fn enqueue(producer: &Producer, record: &OutputRecord) -> Result<DeliveryFuture, EmitError> {
    let headers = kafka_headers(&record.headers);
    loop {
        let mut fr: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&record.topic);
        if let Some(h) = &headers {
            fr = fr.headers(h.clone());
        }
        if let Some(k) = record.key.as_deref() {
            fr = fr.key(k);
        }
        if let Some(v) = record.value.as_deref() {
            fr = fr.payload(v);
        }
        if let Some(p) = record.partition {
            fr = fr.partition(p);
        }
        match producer.send_result(fr) {
            Ok(delivery) => return Ok(delivery),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                // librdkafka's queue is full: deliveries will drain it.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err((source, _)) => return Err(EmitError::NotAcknowledged { topic: record.topic.clone(), source }),
        }
    }
}

/// An output's headers as librdkafka takes them; `None` when there are none (saves an allocation).
pub(crate) fn kafka_headers(headers: &crate::record::Headers) -> Option<OwnedHeaders> {
    (!headers.is_empty()).then(|| {
        headers.iter().fold(OwnedHeaders::new_with_capacity(headers.len()), |all, h| {
            all.insert(KafkaHeader { key: &h.name, value: h.value.as_deref() })
        })
    })
}

/// Awaits one delivery.
pub(crate) async fn acknowledged(topic: &str, delivery: DeliveryFuture) -> Result<(), EmitError> {
    match delivery.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((source, _))) => Err(EmitError::NotAcknowledged { topic: topic.to_owned(), source }),
        Err(_) => Err(EmitError::Canceled { topic: topic.to_owned() }),
    }
}

/// Produces `record` and waits for the broker's acknowledgement.
pub(crate) async fn produce(producer: &Producer, record: &OutputRecord) -> Result<(), EmitError> {
    let delivery = enqueue(producer, record).await?;
    acknowledged(&record.topic, delivery).await
}
