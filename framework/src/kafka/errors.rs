//! Every classification of a librdkafka error, in one place: what an error means for the member
//! ([`is_fatal`]), for the connection ([`is_outage`]), for the transactional producer ([`is_fence`],
//! [`txn_call`]), for the one record an output was produced for ([`rejects_record`]), and for the
//! input topics ([`names_missing_topic`]). The modules that act on errors ask here instead of
//! matching error codes themselves.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Errors a client reports with their reason, after which it cannot connect until its configuration
/// changes: the SASL handshake refused the credentials (a wrong password, a mechanism the broker does
/// not enable), or TLS could not verify a certificate (an untrusted CA, a client certificate the
/// broker refuses, a host name that does not match). librdkafka retries both forever; a Java client
/// throws them to the application. Other TLS errors (a connection dropped mid-handshake) are retried.
pub(crate) fn refuses_connection(e: &KafkaError, reason: &str) -> bool {
    match e.rdkafka_error_code() {
        Some(RDKafkaErrorCode::Authentication) => true,
        Some(RDKafkaErrorCode::SSL) => reason.contains("certificate"),
        _ => false,
    }
}

/// A fatal error, said as what it means for this pipeline: an authorization failure names the
/// resource it was refused (the group, the input topics, the transactional id) and the ACL operation
/// it needs; anything else is returned as it is.
pub(crate) fn explain(e: crate::Error, config: &crate::PipelineConfig) -> crate::Error {
    use crate::Error;
    let kafka = match &e {
        Error::Kafka(k) | Error::Transaction(k) => k.clone(),
        _ => return e,
    };
    let (resource, operation, acl_target) = match kafka.rdkafka_error_code() {
        Some(RDKafkaErrorCode::GroupAuthorizationFailed) => {
            (format!("consumer group {}", config.group_id), "READ", format!("--group {}", config.group_id))
        }
        Some(RDKafkaErrorCode::TopicAuthorizationFailed) => {
            let topics = config.topics.join(", ");
            let targets = config.topics.iter().map(|t| format!("--topic {t}")).collect::<Vec<_>>().join(" ");
            (format!("input topic(s) {topics}"), "READ", targets)
        }
        Some(RDKafkaErrorCode::TransactionalIdAuthorizationFailed) => {
            let id = config.transactional_id().unwrap_or_default();
            (format!("transactional id {id}"), "WRITE", format!("--transactional-id {id}"))
        }
        Some(RDKafkaErrorCode::ClusterAuthorizationFailed) => {
            ("the cluster".to_owned(), "IDEMPOTENT_WRITE", "--cluster".to_owned())
        }
        _ => return e,
    };
    Error::NotAuthorized { resource, operation, acl_target, source: Box::new(kafka) }
}

/// A produce to `topic` (`what`: "output topic", "DLQ topic") refused by the ACLs, as the error that
/// stops the pipeline; `None` for any other error.
pub(crate) fn write_refused(what: &str, topic: &str, e: &KafkaError) -> Option<crate::Error> {
    (e.rdkafka_error_code() == Some(RDKafkaErrorCode::TopicAuthorizationFailed)).then(|| crate::Error::NotAuthorized {
        resource: format!("{what} {topic}"),
        operation: "WRITE",
        acl_target: format!("--topic {topic}"),
        source: Box::new(e.clone()),
    })
}

/// Errors after which a member cannot go on: authorization failures, or librdkafka's fatal state.
pub(crate) fn is_fatal(e: &KafkaError) -> bool {
    use RDKafkaErrorCode::*;
    matches!(
        e.rdkafka_error_code(),
        Some(
            Fatal
                | TopicAuthorizationFailed
                | GroupAuthorizationFailed
                | ClusterAuthorizationFailed
                | SaslAuthenticationFailed
                | InvalidConfig
                | ProducerFenced
                | InvalidProducerEpoch
        )
    )
}

/// Errors that say the brokers were unreachable or slow rather than that the request was refused.
pub(crate) fn is_outage(e: &KafkaError) -> bool {
    use RDKafkaErrorCode::*;
    matches!(
        e.rdkafka_error_code(),
        Some(
            OperationTimedOut
                | RequestTimedOut
                | MessageTimedOut
                | BrokerTransportFailure
                | AllBrokersDown
                | NetworkException
                | CoordinatorNotAvailable
                | NotCoordinator
                | CoordinatorLoadInProgress
        )
    )
}

/// Whether an error code says a newer producer with the same transactional id (or the broker's
/// transaction timeout) fenced this one.
pub(crate) fn is_fence(code: Option<RDKafkaErrorCode>) -> bool {
    use RDKafkaErrorCode::*;
    matches!(code, Some(Fenced | ProducerFenced | InvalidProducerEpoch))
}

/// How to treat a failed transaction call (begin, send offsets, commit, abort).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxnCall {
    /// Call it again (within the transaction timeout).
    Retry,
    /// Abort the open transaction and redo its work.
    Abort,
    /// The producer cannot be used again.
    Fatal,
}

/// What a failed transaction call asks for, from librdkafka's own verdict on the error.
pub(crate) fn txn_call(e: &KafkaError) -> TxnCall {
    match e {
        KafkaError::Transaction(r) if r.is_fatal() => TxnCall::Fatal,
        KafkaError::Transaction(r) if r.txn_requires_abort() => TxnCall::Abort,
        KafkaError::Transaction(r) if r.is_retriable() => TxnCall::Retry,
        _ => TxnCall::Abort,
    }
}

/// How an output was rejected for its own record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rejection {
    /// Never producible as it is (too large, invalid topic, not authorised, refused by policy).
    Permanent,
    /// The topic or partition does not exist (yet): retried under the retry policy.
    UnknownTopic,
}

/// Whether `e` rejects the one record it was reported for (rather than the transaction, the
/// producer or the connection), and how.
pub(crate) fn rejects_record(e: &KafkaError) -> Option<Rejection> {
    use RDKafkaErrorCode::*;
    match e.rdkafka_error_code()? {
        UnknownTopicOrPartition | UnknownTopic | UnknownPartition | UnknownTopicId => Some(Rejection::UnknownTopic),
        MessageSizeTooLarge
        | InvalidMessageSize
        | MessageBatchTooLarge
        | InvalidTopic
        | TopicAuthorizationFailed
        | InvalidRecord
        | PolicyViolation
        | InvalidTimestamp => Some(Rejection::Permanent),
        _ => None,
    }
}

/// Whether a consumer error names an input topic or partition that does not exist.
pub(crate) fn names_missing_topic(e: &KafkaError) -> bool {
    use RDKafkaErrorCode::*;
    matches!(e.rdkafka_error_code(), Some(UnknownTopicOrPartition | UnknownTopic | UnknownPartition))
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn produce(code: RDKafkaErrorCode) -> KafkaError {
        KafkaError::MessageProduction(code)
    }

    #[test]
    fn record_rejections_are_told_from_transient_errors() {
        assert_eq!(rejects_record(&produce(RDKafkaErrorCode::UnknownTopicOrPartition)), Some(Rejection::UnknownTopic));
        assert_eq!(rejects_record(&produce(RDKafkaErrorCode::MessageSizeTooLarge)), Some(Rejection::Permanent));
        assert_eq!(rejects_record(&produce(RDKafkaErrorCode::TopicAuthorizationFailed)), Some(Rejection::Permanent));
        assert_eq!(rejects_record(&produce(RDKafkaErrorCode::MessageTimedOut)), None);
        assert_eq!(rejects_record(&produce(RDKafkaErrorCode::QueueFull)), None);
    }

    #[test]
    fn outages_fences_and_fatal_errors() {
        assert!(is_outage(&produce(RDKafkaErrorCode::MessageTimedOut)));
        assert!(!is_outage(&produce(RDKafkaErrorCode::MessageSizeTooLarge)));
        assert!(is_fatal(&KafkaError::Global(RDKafkaErrorCode::GroupAuthorizationFailed)));
        assert!(!is_fatal(&KafkaError::Global(RDKafkaErrorCode::AllBrokersDown)));
        assert!(is_fence(Some(RDKafkaErrorCode::Fenced)));
        assert!(is_fence(Some(RDKafkaErrorCode::ProducerFenced)));
        assert!(is_fence(Some(RDKafkaErrorCode::InvalidProducerEpoch)));
        assert!(!is_fence(Some(RDKafkaErrorCode::TransactionalIdAuthorizationFailed)));
        assert!(!is_fence(None));
        assert!(names_missing_topic(&KafkaError::Global(RDKafkaErrorCode::UnknownTopicOrPartition)));
        assert!(!names_missing_topic(&KafkaError::Global(RDKafkaErrorCode::AllBrokersDown)));
    }
}
