//! Typed errors: what a processor returns ([`ProcessError`]) and what the runtime returns ([`Error`]).

use std::fmt;

/// Boxed error from user code or another crate.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Whether retrying a failed record can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// Timeouts, 5xx, throttling, a lost connection: retried with backoff.
    Transient,
    /// Validation errors, malformed payloads, a panic: retrying cannot help.
    Permanent,
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureKind::Transient => "transient",
            FailureKind::Permanent => "permanent",
        })
    }
}

/// The error a [`Processor`](crate::Processor) returns for one record, classified as transient or
/// permanent.
///
/// ```
/// use millrace::{FailureKind, ProcessError};
///
/// let e = ProcessError::transient(std::io::Error::other("upstream timed out"));
/// assert_eq!(e.kind(), FailureKind::Transient);
/// let e = ProcessError::permanent("order id missing");
/// assert!(!e.is_transient());
/// assert_eq!(e.to_string(), "permanent: order id missing");
/// ```
#[derive(Debug)]
pub struct ProcessError {
    kind: FailureKind,
    cause: Cause,
    source: BoxError,
}

/// Where a failure came from, for the DLQ's error kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    Processor,
    Decode,
    Panic,
    Timeout,
}

impl ProcessError {
    /// A failure worth retrying.
    pub fn transient(source: impl Into<BoxError>) -> Self {
        Self::new(FailureKind::Transient, source)
    }

    /// A failure retrying cannot fix.
    pub fn permanent(source: impl Into<BoxError>) -> Self {
        Self::new(FailureKind::Permanent, source)
    }

    /// A failure of the given kind.
    pub fn new(kind: FailureKind, source: impl Into<BoxError>) -> Self {
        Self { kind, cause: Cause::Processor, source: source.into() }
    }

    /// The record's payload could not be decoded: permanent, dead-lettered with error kind `decode`.
    pub fn decode(source: impl Into<BoxError>) -> Self {
        Self { kind: FailureKind::Permanent, cause: Cause::Decode, source: source.into() }
    }

    /// A caught panic: permanent, dead-lettered with error kind `panic`.
    pub(crate) fn panic(message: String) -> Self {
        Self { kind: FailureKind::Permanent, cause: Cause::Panic, source: message.into() }
    }

    /// An attempt that ran past the attempt timeout and was cancelled: transient, dead-lettered with
    /// error kind `timeout` once the retries are used up.
    pub(crate) fn timed_out(after: std::time::Duration) -> Self {
        Self {
            kind: FailureKind::Transient,
            cause: Cause::Timeout,
            source: format!("attempt timed out after {after:?} and was cancelled").into(),
        }
    }

    /// A failure whose kind `classify` decides, for errors from other crates.
    ///
    /// ```
    /// use millrace::{FailureKind, ProcessError};
    /// use std::io::ErrorKind;
    ///
    /// let classify = |e: &std::io::Error| match e.kind() {
    ///     ErrorKind::TimedOut | ErrorKind::ConnectionReset => FailureKind::Transient,
    ///     _ => FailureKind::Permanent,
    /// };
    /// let e = ProcessError::classify(std::io::Error::from(ErrorKind::TimedOut), classify);
    /// assert!(e.is_transient());
    /// ```
    pub fn classify<E>(error: E, classify: impl FnOnce(&E) -> FailureKind) -> Self
    where
        E: Into<BoxError>,
    {
        let kind = classify(&error);
        Self::new(kind, error)
    }

    pub(crate) fn cause(&self) -> Cause {
        self.cause
    }

    /// Transient or permanent.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    /// Whether the retry policy may try again.
    pub fn is_transient(&self) -> bool {
        self.kind == FailureKind::Transient
    }

    /// The underlying error.
    pub fn source_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }
}

impl fmt::Display for ProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.source)
    }
}

impl std::error::Error for ProcessError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// Classifies a `Result`'s error in place: `call().await.transient()?`.
///
/// ```
/// use millrace::{ProcessError, ResultExt};
///
/// fn parse(v: &str) -> Result<u32, ProcessError> {
///     v.parse::<u32>().permanent()
/// }
/// assert!(parse("x").is_err());
/// assert_eq!(parse("7").unwrap(), 7);
/// ```
pub trait ResultExt<T> {
    /// Maps the error to a transient [`ProcessError`] (retried).
    fn transient(self) -> Result<T, ProcessError>;
    /// Maps the error to a permanent [`ProcessError`] (dead-lettered without retry).
    fn permanent(self) -> Result<T, ProcessError>;
}

impl<T, E: Into<BoxError>> ResultExt<T> for Result<T, E> {
    fn transient(self) -> Result<T, ProcessError> {
        self.map_err(ProcessError::transient)
    }

    fn permanent(self) -> Result<T, ProcessError> {
        self.map_err(ProcessError::permanent)
    }
}

/// Emitting an output record failed.
#[derive(Debug, thiserror::Error)]
pub enum EmitError {
    /// The broker did not acknowledge the record (after the producer's own retries).
    #[error("output to {topic} not acknowledged: {source}")]
    NotAcknowledged {
        /// Destination topic.
        topic: String,
        /// The producer's error.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// The producer was shut down before the delivery report arrived.
    #[error("producer closed before the output to {topic} was acknowledged")]
    Canceled {
        /// Destination topic.
        topic: String,
    },
    /// Exactly-once mode: the output's topic does not exist (or its metadata cannot be read), so
    /// the record is not put into a transaction, where it would abort it. Transient: retried under
    /// the retry policy (the topic may yet be created), then dead-lettered as `transient-exhausted`.
    #[error("output topic {topic} is not available: {reason}")]
    TopicUnavailable {
        /// Destination topic.
        topic: String,
        /// What the metadata request said.
        reason: String,
    },
    /// The producer reported the output delivered but without an offset: it could not confirm the
    /// write. librdkafka's idempotent producer does this when a later request succeeded after an
    /// earlier one failed, and the earlier one can have been refused (`NOT_LEADER_OR_FOLLOWER` on
    /// a partition the broker was still creating), so the output may be missing. Transient: the
    /// record is retried (at-least-once: an output may then appear twice, never not at all).
    #[error("output to {topic} reported delivered without an offset: the write is not confirmed")]
    Unconfirmed {
        /// Destination topic.
        topic: String,
    },
    /// The record is larger than the producer's `message.max.bytes`: it can never be produced.
    #[error("output to {topic} is {size} bytes, over the producer's message.max.bytes ({max})")]
    TooLarge {
        /// Destination topic.
        topic: String,
        /// Key, value and header bytes.
        size: usize,
        /// The limit.
        max: usize,
    },
}

impl From<EmitError> for ProcessError {
    /// An unacknowledged output is transient: the record is retried (at-least-once). An output the
    /// broker rejects for good (too large, an invalid topic: the same list that exactly-once mode
    /// dead-letters at once) is permanent. An output to a topic that does not exist (yet) stays
    /// transient, so it is retried under the policy and then dead-lettered as `transient-exhausted`.
    /// An output the ACLs refuse is not the record's fault: it stops the pipeline
    /// ([`Error::NotAuthorized`]) and the record is left unfinished.
    fn from(e: EmitError) -> Self {
        let permanent = match &e {
            EmitError::TooLarge { .. } => true,
            EmitError::NotAcknowledged { source, .. } => {
                crate::kafka::errors::rejects_record(source) == Some(crate::kafka::errors::Rejection::Permanent)
            }
            _ => false,
        };
        if permanent { ProcessError::permanent(e) } else { ProcessError::transient(e) }
    }
}

/// A configuration value that cannot work, named by its field.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: `{field}`: {reason}")]
pub struct ConfigError {
    /// The field (or Kafka property) at fault.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { field: field.into(), reason: reason.into() }
    }
}

/// Why a pipeline could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration was rejected at start-up.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A Kafka client could not be created or failed fatally (authorization, fencing, a fatal
    /// librdkafka error).
    #[error("fatal Kafka error: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The dedup store could not be opened.
    #[error(transparent)]
    Dedup(#[from] crate::dedup::store::DedupError),
    /// Exactly-once mode stopped on a fatal transaction error (the producer failed for good, e.g.
    /// the transactional id is not authorized, or a partition could not be rewound). A fence alone
    /// is not one: the producer is replaced and the uncommitted work redone (see
    /// [`TransactionalIdConflict`](Self::TransactionalIdConflict) for when it is not). Nothing was
    /// committed after it; restarting is the caller's choice.
    #[error("exactly-once processing stopped: {0}")]
    Transaction(rdkafka::error::KafkaError),
    /// Exactly-once mode was fenced again and again with no broker outage: another live instance
    /// appears to use the same transactional id, and the two would take it from each other forever.
    /// Give each instance its own
    /// [`ExactlyOnce::transactional_id`](crate::ExactlyOnce::transactional_id) (the default,
    /// `<group_id>.<hostname>`, is shared by instances on one host). Nothing was committed after it.
    #[error(
        "exactly-once processing stopped: fenced {fences} times within {}s without a broker outage; another \
         instance appears to use transactional id {transactional_id:?}: give each instance a distinct \
         `transactional_id`",
        within.as_secs()
    )]
    TransactionalIdConflict {
        /// The contested transactional id.
        transactional_id: String,
        /// Fences counted within `within`.
        fences: usize,
        /// The window they were counted in.
        within: std::time::Duration,
    },
    /// The runtime's own threads failed.
    #[error("runtime failure: {0}")]
    Runtime(String),
    /// No broker of `bootstrap` answered within
    /// [`startup_timeout`](crate::PipelineConfig::startup_timeout), or the pipeline was stopped
    /// before any did. Nothing was consumed.
    #[error("no broker of {bootstrap} could be reached in {waited:?}")]
    Unreachable {
        /// The bootstrap list tried.
        bootstrap: String,
        /// How long the pipeline tried.
        waited: std::time::Duration,
    },
    /// The cluster refused this client's credentials or certificates: the SASL handshake failed (a
    /// wrong user or password, a mechanism the broker does not enable), or TLS could not verify a
    /// certificate (an untrusted CA: check `ssl.ca.location`; a client certificate the broker
    /// refuses; a host name the broker's certificate does not name). librdkafka's reason is kept,
    /// and never holds a secret. Retrying cannot help until the configuration changes. Nothing was
    /// consumed after it.
    #[error("the cluster refused this client: {reason}")]
    Refused {
        /// What librdkafka reported, naming the broker.
        reason: String,
    },
    /// The cluster's ACLs do not allow this client's principal to `operation` the resource: the
    /// consumer group, the input topics, an output or DLQ topic, or the transactional id. Retrying
    /// cannot help until an ACL grants it; nothing was committed past the records it stopped at,
    /// so a restart after the grant processes everything as usual.
    #[error(
        "not authorized to {operation} {resource}: grant this client's principal {operation} on it with an ACL \
         (e.g. kafka-acls --add --allow-principal User:<name> --operation {operation} {acl_target})"
    )]
    NotAuthorized {
        /// What was refused: `consumer group billing`, `input topic orders`, `transactional id t-1`.
        resource: String,
        /// The ACL operation it needs (`READ`, `WRITE`, `DESCRIBE`, ...).
        operation: &'static str,
        /// The resource as `kafka-acls` names it (`--group billing`, `--topic orders`).
        acl_target: String,
        /// The error librdkafka reported.
        source: Box<rdkafka::error::KafkaError>,
    },
    /// [`create_topics`](crate::create_topics) could not create or reach a topic (the brokers are
    /// away, the partition count is invalid, ...); a refusal by the ACLs is
    /// [`NotAuthorized`](Self::NotAuthorized).
    #[error("creating topic {topic} at {bootstrap} (is the broker up?): {reason}")]
    TopicCreation {
        /// The topic.
        topic: String,
        /// The bootstrap list used.
        bootstrap: String,
        /// What failed.
        reason: String,
    },
    /// An input topic does not exist (never created, or deleted while the pipeline ran) and
    /// [`fail_on_missing_topic`](crate::PipelineConfig::fail_on_missing_topic) is set.
    #[error("input topic {topic} does not exist")]
    MissingTopic {
        /// The topic.
        topic: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;

    fn not_acknowledged(code: RDKafkaErrorCode) -> FailureKind {
        let source = KafkaError::MessageProduction(code);
        ProcessError::from(EmitError::NotAcknowledged { topic: "out".into(), source }).kind()
    }

    #[test]
    fn an_output_rejected_for_good_is_permanent_and_a_missing_topic_transient() {
        // The same list as exactly-once mode's rejected outputs (kafka::errors::rejects_record).
        assert_eq!(not_acknowledged(RDKafkaErrorCode::MessageSizeTooLarge), FailureKind::Permanent);
        assert_eq!(not_acknowledged(RDKafkaErrorCode::TopicAuthorizationFailed), FailureKind::Permanent);
        assert_eq!(not_acknowledged(RDKafkaErrorCode::InvalidTopic), FailureKind::Permanent);
        assert_eq!(not_acknowledged(RDKafkaErrorCode::UnknownTopicOrPartition), FailureKind::Transient);
        assert_eq!(not_acknowledged(RDKafkaErrorCode::MessageTimedOut), FailureKind::Transient);
        let too_large = EmitError::TooLarge { topic: "out".into(), size: 2, max: 1 };
        assert_eq!(ProcessError::from(too_large).kind(), FailureKind::Permanent);
        assert_eq!(ProcessError::from(EmitError::Unconfirmed { topic: "out".into() }).kind(), FailureKind::Transient);
    }
}
