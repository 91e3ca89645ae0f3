//! The parts of a [`PipelineConfig`](super::PipelineConfig): processing order, in-flight bounds,
//! the DLQ, its circuit breaker, and the delivery mode (at-least-once or exactly-once).

use serde::Deserialize;
use std::time::Duration;

/// How records of one partition may run concurrently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessingOrder {
    /// Records with the same key run one at a time in offset order; different keys run
    /// concurrently. Records with a null key are ordered by partition.
    #[default]
    Key,
    /// One record at a time per partition, in offset order.
    Partition,
    /// Any record may run at any time (still committed only as a contiguous prefix).
    Unordered,
}

/// Limits that keep memory flat whatever the backlog (invariant I4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Bounds {
    /// Records handed to processors at the same moment, across all partitions.
    pub max_concurrency: usize,
    /// Polled, unfinished records per partition before that partition is paused (so that one slow
    /// partition cannot take the whole budget). Off while it is not below `max_in_flight_total`.
    pub max_in_flight_per_partition: usize,
    /// Polled, unfinished records in total before every partition is paused.
    pub max_in_flight_total: usize,
    /// Bytes of polled, unfinished records (key + value + headers) before every partition is paused.
    pub max_buffered_bytes: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_concurrency: 256,
            max_in_flight_per_partition: 10_000,
            max_in_flight_total: 10_000,
            max_buffered_bytes: 64 << 20,
        }
    }
}

/// Where records that cannot be processed go.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DlqConfig {
    /// Dead-letter failed records (default). When off, a failed record is logged and left
    /// uncommitted (redelivered after a restart); the partition keeps flowing for other records.
    pub enabled: bool,
    /// DLQ topic name; `{topic}` stands for the source topic. Default `{topic}.dlq`.
    pub topic: String,
    /// Create a missing DLQ topic (with the source topic's partition count) on first use. When off,
    /// a missing DLQ topic holds the failed record uncommitted until the topic exists.
    pub create_topics: bool,
    /// Park a key on failure (off by default): when a record of key K fails for good, K's later
    /// records in its partition are not run but dead-lettered behind it, in offset order, with kind
    /// `parked` and the header `millrace.parked.by` naming the blocking record, until the key is
    /// released: by `millrace dlq replay` once the replay of the blocking record is processed, or by
    /// `millrace dlq release`. Every other key keeps flowing and offsets keep committing. The parked
    /// keys are kept in the compacted topic `<group>.parked-keys` and restored before a partition's
    /// first record. Off by default because a parked key stops taking effect until an operator
    /// acts: right for a key's events that depend on each other (a refund after its capture), wrong
    /// for independent ones, which would wait behind an unrelated failure. Records without a key
    /// are never parked (nothing orders them by key). Needs the DLQ on and an `ordering` other than
    /// `unordered`. See docs/guarantees.md, "Per-key order and the DLQ".
    pub park_keys: bool,
    /// Parked keys one partition may hold (default 10,000). At the bound a key that fails for good is
    /// dead-lettered without being parked (its later records run, as with parking off), logged at
    /// warn level and counted in [`StatsSnapshot::park_overflows`](crate::StatsSnapshot::park_overflows).
    pub max_parked_keys: usize,
}

impl Default for DlqConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            topic: "{topic}.dlq".into(),
            create_topics: true,
            park_keys: false,
            max_parked_keys: 10_000,
        }
    }
}

/// Stops a pipeline that would flood its DLQ (a broken deploy) or hammer a downstream that is down.
///
/// It trips when more than `max_dlq_share` of a window of `window` finished records were
/// dead-lettered, after `max_consecutive` dead-lettered records in a row, or when more than
/// `max_transient_share` of a window of `transient_window` attempts failed transiently (the
/// processor returned a transient error or ran past `attempt_timeout`; failures of Millrace's own
/// produces are not counted: librdkafka retries those). While open, every partition is paused (the
/// member stays in the group), records already polled do not start and retries wait instead of
/// churning; the state is logged at error level and shown by
/// [`StatsSnapshot::breaker_open`](crate::StatsSnapshot::breaker_open). After `cooldown` it is
/// half-open: consumption resumes and one attempt at a time, the probe, goes through. Its success
/// closes the breaker; its failure opens it for another `cooldown`.
///
/// ```
/// use millrace::{CircuitBreakerConfig, PipelineConfig};
/// use std::time::Duration;
///
/// let breaker = CircuitBreakerConfig { max_transient_share: 0.5, cooldown: Duration::from_secs(10), ..Default::default() };
/// let config = PipelineConfig::new("127.0.0.1:9092", "billing", ["orders"]).circuit_breaker(breaker);
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CircuitBreakerConfig {
    /// On by default.
    pub enabled: bool,
    /// Finished records per evaluation window of the DLQ share.
    pub window: u32,
    /// Share of dead-lettered records in a window that trips the breaker (0.0–1.0).
    pub max_dlq_share: f64,
    /// Dead-lettered records in a row that trip the breaker.
    pub max_consecutive: u32,
    /// Share of transiently failed attempts in a window that trips the breaker (0.0–1.0; 0 turns
    /// this trip off). Default 0.8.
    pub max_transient_share: f64,
    /// Ended attempts per evaluation window of the transient share. Default 200.
    pub transient_window: u32,
    /// How long consumption stays paused before the probe.
    #[serde(with = "humantime_serde")]
    pub cooldown: Duration,
}

impl Default for CircuitBreakerConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            window: 200,
            max_dlq_share: 0.5,
            max_consecutive: 100,
            max_transient_share: 0.8,
            transient_window: 200,
            cooldown: Duration::from_secs(30),
        }
    }
}

/// What a committed offset promises.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Offsets are committed after each record's effects and outputs are done (acknowledged): nothing
    /// is lost, a crash may repeat effects (absorbed by the dedup store when it is on).
    #[default]
    AtLeastOnce,
    /// Read-process-write in Kafka transactions: outputs, DLQ records, dedup changelog entries and
    /// the input offsets commit together once per `commit_interval`, or not at all. `read_committed`
    /// readers of the outputs see every input reflected exactly once. See [`ExactlyOnce`].
    ExactlyOnce(ExactlyOnce),
}

/// Settings of [`Delivery::ExactlyOnce`].
///
/// The transactional id must be unique per running instance and stable across its restarts
/// (KIP-447: one transactional producer per instance, zombies fenced by the consumer group's
/// generation). A restarted instance with the same id aborts whatever transaction its previous
/// incarnation left open, at once; with a new id that transaction blocks `read_committed` readers
/// until `transaction_timeout` expires it.
///
/// ```
/// use millrace::{ExactlyOnce, PipelineConfig};
/// use std::time::Duration;
///
/// let config = PipelineConfig::new("127.0.0.1:9092", "copier", ["orders"])
///     .exactly_once(ExactlyOnce::default().transactional_id("copier-1"));
/// assert_eq!(config.commit_interval, Duration::from_millis(100)); // one transaction per 100 ms
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExactlyOnce {
    /// The producer's `transactional.id`. Default `<group_id>.<hostname>`: set it when several
    /// instances of one group run on the same host, or they fence each other.
    pub transactional_id: Option<String>,
    /// `transaction.timeout.ms`: how long the broker lets a transaction stay open before aborting
    /// it (what a crashed instance's open transaction costs readers). Must be at least twice the
    /// commit interval and one second; default 10 s. The broker caps it at its
    /// `transaction.max.timeout.ms` (15 min by default).
    #[serde(with = "humantime_serde")]
    pub transaction_timeout: Duration,
    /// Fault injection for tests: abort this share (0.0–1.0) of transactions on purpose instead of
    /// committing them, exercising the abort-and-rewind path; spread evenly (1/3 aborts every third
    /// transaction), not at random. 0 (off) by default.
    #[serde(skip)]
    pub inject_abort_ratio: f64,
}

impl Default for ExactlyOnce {
    fn default() -> Self {
        Self { transactional_id: None, transaction_timeout: Duration::from_secs(10), inject_abort_ratio: 0.0 }
    }
}

impl ExactlyOnce {
    /// Sets the transactional id.
    pub fn transactional_id(mut self, id: impl Into<String>) -> Self {
        self.transactional_id = Some(id.into());
        self
    }

    /// Sets the transaction timeout.
    pub fn transaction_timeout(mut self, timeout: Duration) -> Self {
        self.transaction_timeout = timeout;
        self
    }

    /// Aborts this share of transactions on purpose (tests of the abort path).
    pub fn inject_abort_ratio(mut self, ratio: f64) -> Self {
        self.inject_abort_ratio = ratio;
        self
    }
}
