//! The relay's errors.

/// What stops a relay session (the relay reconnects after the transient ones) or the relay.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is invalid; found when the relay is built.
    #[error("invalid outbox relay setting `{field}`: {reason}")]
    Config {
        /// The setting.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The database refused or lost the connection, or a statement failed.
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// The Kafka producer failed (creating it, a transaction call).
    #[error("Kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The broker did not acknowledge a row's record: the batch's transaction is aborted and the
    /// batch published again (the row stays in the table until it is acknowledged).
    #[error("outbox row {id} (topic `{topic}`) was not acknowledged: {source}")]
    Delivery {
        /// The row's id.
        id: i64,
        /// The row's topic.
        topic: String,
        /// The producer's error.
        source: rdkafka::error::KafkaError,
    },
    /// The outbox table does not exist (run `millrace outbox install` or [`crate::schema::install`]).
    #[error("the outbox table `{0}` does not exist: create it with `millrace outbox install` (docs: outbox/README.md)")]
    NoTable(String),
}

impl Error {
    /// Whether the relay should stop rather than reconnect (a setting cannot fix itself).
    pub fn is_fatal(&self) -> bool {
        matches!(self, Error::Config { .. })
    }
}
