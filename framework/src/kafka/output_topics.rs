//! Exactly-once mode: output topics checked to exist before an output joins a transaction.
//!
//! An output to a topic that does not exist would abort the transaction carrying it (after
//! librdkafka waited up to `topic.metadata.propagation.max.ms` for the topic to appear), and with it
//! every partition's work in that transaction. [`Context::emit`](crate::Context::emit) asks here
//! first: a topic seen to exist is remembered for the run; one that is missing fails the attempt with
//! [`EmitError::TopicUnavailable`], a transient error, so the record is retried under the retry
//! policy and then dead-lettered, as at-least-once mode does with the same output. (A topic deleted
//! later, or any other rejection, is handled in the transaction: see `rejected`.)

use crate::error::EmitError;
use crate::kafka::log::Producer;
use rdkafka::producer::Producer as _;
use rdkafka::types::RDKafkaRespErr;
use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// How long one metadata request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Output topics known to exist in this run.
#[derive(Debug, Default)]
pub(crate) struct OutputTopics {
    known: Mutex<HashSet<String>>,
}

/// What the metadata lookup says when the ACLs refuse the topic.
const DENIED: &str = "not authorized";

impl OutputTopics {
    /// `Ok` when `topic` exists: from memory, else from a metadata request on `producer`.
    pub(crate) async fn check(&self, producer: &Producer, topic: &str) -> Result<(), EmitError> {
        if self.known.lock().unwrap_or_else(PoisonError::into_inner).contains(topic) {
            return Ok(());
        }
        let unavailable = |reason: String| EmitError::TopicUnavailable { topic: topic.to_owned(), reason };
        let client = producer.clone();
        let name = topic.to_owned();
        let found = tokio::task::spawn_blocking(move || {
            let md = client.client().fetch_metadata(Some(&name), METADATA_TIMEOUT).map_err(|e| e.to_string())?;
            match md.topics().iter().find(|t| t.name() == name) {
                Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(()),
                Some(t) if t.error() == Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED) => {
                    Err(DENIED.to_owned())
                }
                Some(t) => Err(match t.error() {
                    Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => {
                        "the topic does not exist".to_owned()
                    }
                    Some(e) => format!("metadata error {e:?}"),
                    None => "the topic has no partitions".to_owned(),
                }),
                None => Err("the topic does not exist".to_owned()),
            }
        })
        .await
        .map_err(|e| unavailable(e.to_string()))?;
        if found.as_ref().is_err_and(|e| e == DENIED) {
            // The ACLs refuse the topic (not even DESCRIBE): the caller stops the pipeline.
            let source =
                rdkafka::error::KafkaError::MetadataFetch(rdkafka::types::RDKafkaErrorCode::TopicAuthorizationFailed);
            return Err(EmitError::NotAcknowledged { topic: topic.to_owned(), source });
        }
        found.map_err(unavailable)?;
        self.known.lock().unwrap_or_else(PoisonError::into_inner).insert(topic.to_owned());
        Ok(())
    }
}
