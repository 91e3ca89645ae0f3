//! Pipeline configuration, validated at start-up with the offending field named.

mod downstream;
mod load;
mod operate;
mod parts;
pub mod properties;

pub use downstream::RateLimit;
pub use parts::{Bounds, CircuitBreakerConfig, Delivery, DlqConfig, ExactlyOnce, ProcessingOrder};
pub use properties::KafkaProperties;

use crate::error::ConfigError;
use crate::retry::RetryPolicy;
use std::time::Duration;

/// Environment variable naming the brokers, used by [`PipelineConfig::bootstrap_from_env`].
pub const BOOTSTRAP_ENV: &str = "KAFKA_BOOTSTRAP_SERVERS";
/// Brokers used when [`BOOTSTRAP_ENV`] is unset.
pub const DEFAULT_BOOTSTRAP: &str = "127.0.0.1:9092";

/// Everything a pipeline needs to run.
///
/// Kafka client properties pass through untouched: [`kafka`](Self::kafka) goes to both the consumer and
/// the producer, [`consumer`](Self::consumer) and [`producer`](Self::producer) to one of them. The few
/// properties the delivery contract depends on (`enable.auto.commit`, `enable.auto.offset.store`,
/// `group.id`, `bootstrap.servers`) are owned by Millrace and rejected if set there.
///
/// ```
/// use millrace::{ProcessingOrder, PipelineConfig};
/// use std::time::Duration;
///
/// let config = PipelineConfig::new("127.0.0.1:9092", "billing", ["orders"])
///     .ordering(ProcessingOrder::Key)
///     .commit_interval(Duration::from_millis(500))
///     .consumer_property("session.timeout.ms", "10000");
/// assert!(config.validate().is_ok());
///
/// let bad = PipelineConfig::new("127.0.0.1:9092", "", ["orders"]);
/// assert_eq!(bad.validate().unwrap_err().field, "group_id");
/// ```
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default = "PipelineConfig::unset", deny_unknown_fields)]
pub struct PipelineConfig {
    /// `host:port[,host:port…]` of the brokers.
    pub bootstrap_servers: String,
    /// Consumer group id.
    pub group_id: String,
    /// Topics to consume.
    #[serde(deserialize_with = "load::one_or_many")]
    pub topics: Vec<String>,
    /// Name reported in logs (and, later, DLQ headers). Defaults to the group id.
    pub name: String,
    /// Concurrency within a partition.
    pub ordering: ProcessingOrder,
    /// In-flight limits.
    pub bounds: Bounds,
    /// How often the completed prefix is committed (also committed at revoke and shutdown). In
    /// exactly-once mode, one transaction per interval.
    #[serde(with = "humantime_serde")]
    pub commit_interval: Duration,
    /// Also commit as soon as this many records finished since the last commit (off by default).
    pub commit_every_records: Option<u64>,
    /// How long a revoke or a shutdown waits for running records before committing what is done.
    /// Calls still running then are cancelled ([`Context::cancelled`](crate::Context::cancelled)
    /// fires), given [`cancel_grace`](Self::cancel_grace), and dropped; their records are processed
    /// again. Must stay below `max.poll.interval.ms` (and should stay below `session.timeout.ms`).
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// How long one processor call may run before it is cancelled (its future dropped at its next
    /// await) and counted as a transient failure: retried under [`retry`](Self::retry), then
    /// dead-lettered with error kind `timeout`. The outputs' acknowledgements are awaited outside
    /// it. `None` (the default) in at-least-once mode: no limit. In exactly-once mode `None` means
    /// the transaction timeout (a hung call holds its partition's later outputs back the way an open
    /// transaction would), and a set value may not exceed it. See
    /// [`attempt_timeout`](Self::attempt_timeout) for what happens to a cancelled call's outputs.
    #[serde(with = "humantime_serde")]
    pub attempt_timeout: Option<Duration>,
    /// How long a cancelled call (past [`attempt_timeout`](Self::attempt_timeout), or still running
    /// when a revoke's or a shutdown's [`drain_timeout`](Self::drain_timeout) ends) that listens for
    /// [`Context::cancelled`](crate::Context::cancelled) may take to stop before its future is
    /// dropped. Default 1 s. At a revoke the grace runs after the partition was committed and
    /// released, so it does not lengthen the rebalance.
    #[serde(with = "humantime_serde")]
    pub cancel_grace: Duration,
    /// Retries of transient failures.
    pub retry: RetryPolicy,
    /// The dead-letter topic.
    pub dlq: DlqConfig,
    /// The circuit breaker (dead-letter floods, transient storms).
    pub circuit_breaker: CircuitBreakerConfig,
    /// The RocksDB dedup store (off unless set).
    pub dedup: Option<crate::dedup::DedupConfig>,
    /// At-least-once (default) or exactly-once in Kafka transactions.
    pub delivery: Delivery,
    /// Properties for both the consumer and the producer.
    pub kafka: KafkaProperties,
    /// Consumer-only properties.
    pub consumer: KafkaProperties,
    /// Producer-only properties.
    pub producer: KafkaProperties,
    /// How long an owned partition may make no progress, with records ahead of it and none of them
    /// held by Millrace, before it is reported as stalled: logged once at error level (topic,
    /// partition, position, end) and counted in
    /// [`StatsSnapshot::stalled_partitions`](crate::StatsSnapshot::stalled_partitions). Also how long
    /// the cluster may be unreachable before that is logged at error level. Default 60 s, at least
    /// 1 s. See [`stall_timeout`](Self::stall_timeout) for what counts as a stall.
    #[serde(with = "humantime_serde")]
    pub stall_timeout: Duration,
    /// How long one poll of a processor call may hold its thread (no await) before it is reported
    /// as blocking (see [`blocked_poll_threshold`](Self::blocked_poll_threshold)). Default 1 s, at
    /// least 100 ms.
    #[serde(with = "humantime_serde")]
    pub blocked_poll_threshold: Duration,
    /// How long `run()` tries to reach the cluster at start-up before failing with
    /// [`Error::Unreachable`](crate::Error::Unreachable). `None` (default): retry until it answers or
    /// the pipeline is stopped, as Kafka clients do.
    #[serde(with = "humantime_serde")]
    pub startup_timeout: Option<Duration>,
    /// Fail `run()` with [`Error::MissingTopic`](crate::Error::MissingTopic) when an input topic does
    /// not exist, at start-up or later. Default `false`: the missing topic is logged at error level
    /// and counted in [`StatsSnapshot::missing_topics`](crate::StatsSnapshot::missing_topics), and
    /// the pipeline keeps consuming its other topics and picks the topic up when it is (re)created.
    pub fail_on_missing_topic: bool,
    /// Where the pipeline serves `/metrics`, `/health/live` and `/health/ready` (off unless set; see
    /// [`http`](Self::http)).
    pub http: Option<std::net::SocketAddr>,
    /// Processor calls per second across the pipeline; off by default. See [`RateLimit`].
    pub rate_limit: Option<RateLimit>,
}

const OWNED_PROPERTIES: [&str; 4] = ["enable.auto.commit", "enable.auto.offset.store", "group.id", "bootstrap.servers"];

impl PipelineConfig {
    /// A configuration with defaults for everything but the brokers, group and topics.
    pub fn new<T: Into<String>>(
        bootstrap_servers: impl Into<String>,
        group_id: impl Into<String>,
        topics: impl IntoIterator<Item = T>,
    ) -> Self {
        let group_id = group_id.into();
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            name: group_id.clone(),
            group_id,
            topics: topics.into_iter().map(Into::into).collect(),
            ordering: ProcessingOrder::default(),
            bounds: Bounds::default(),
            commit_interval: Duration::from_secs(1),
            commit_every_records: None,
            drain_timeout: Duration::from_secs(10),
            attempt_timeout: None,
            cancel_grace: Duration::from_secs(1),
            retry: RetryPolicy::default(),
            dlq: DlqConfig::default(),
            circuit_breaker: CircuitBreakerConfig::default(),
            dedup: None,
            delivery: Delivery::AtLeastOnce,
            kafka: KafkaProperties::default(),
            consumer: KafkaProperties::default(),
            producer: KafkaProperties::default(),
            stall_timeout: Duration::from_secs(60),
            blocked_poll_threshold: Duration::from_secs(1),
            startup_timeout: None,
            fail_on_missing_topic: false,
            http: None,
            rate_limit: None,
        }
    }

    /// The brokers from `KAFKA_BOOTSTRAP_SERVERS`, or `127.0.0.1:9092` when unset.
    pub fn bootstrap_from_env() -> String {
        std::env::var(BOOTSTRAP_ENV).ok().filter(|s| !s.trim().is_empty()).unwrap_or_else(|| DEFAULT_BOOTSTRAP.into())
    }

    /// Sets the ordering mode.
    pub fn ordering(mut self, ordering: ProcessingOrder) -> Self {
        self.ordering = ordering;
        self
    }

    /// Sets the in-flight bounds.
    pub fn bounds(mut self, bounds: Bounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// Sets the name used in logs.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the commit interval.
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval;
        self
    }

    /// Also commits whenever `records` finished since the last commit.
    pub fn commit_every_records(mut self, records: u64) -> Self {
        self.commit_every_records = Some(records);
        self
    }

    /// Sets the drain deadline for revokes and shutdown.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Cancels a processor call that runs longer than `timeout` (a transient failure). Outputs a
    /// cancelled call had emitted: in exactly-once mode they are dropped with the attempt and never
    /// committed; in at-least-once mode they may already be in their topics (as with any failed
    /// attempt that emitted before failing), so a retry can duplicate them. A call that blocks its
    /// thread without awaiting cannot be cancelled.
    ///
    /// ```
    /// use millrace::PipelineConfig;
    /// use std::time::Duration;
    ///
    /// let config = PipelineConfig::new("127.0.0.1:9092", "billing", ["orders"])
    ///     .attempt_timeout(Duration::from_secs(5));
    /// assert_eq!(config.effective_attempt_timeout(), Some(Duration::from_secs(5)));
    /// ```
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// Sets how long a cancelled call that listens may take to stop (see
    /// [`cancel_grace`](Self::cancel_grace)).
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.cancel_grace = grace;
        self
    }

    /// The attempt timeout in force: [`attempt_timeout`](Self::attempt_timeout), else the
    /// transaction timeout in exactly-once mode, else none.
    pub fn effective_attempt_timeout(&self) -> Option<Duration> {
        self.attempt_timeout.or_else(|| self.exactly_once_settings().map(|eo| eo.transaction_timeout))
    }

    /// Sets the retry policy for transient failures.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the dead-letter configuration.
    pub fn dlq(mut self, dlq: DlqConfig) -> Self {
        self.dlq = dlq;
        self
    }

    /// Sets the circuit breaker (see [`CircuitBreakerConfig`]).
    pub fn circuit_breaker(mut self, breaker: CircuitBreakerConfig) -> Self {
        self.circuit_breaker = breaker;
        self
    }

    /// Turns the dedup store on.
    pub fn dedup(mut self, dedup: crate::dedup::DedupConfig) -> Self {
        self.dedup = Some(dedup);
        self
    }

    /// Switches to exactly-once delivery (Kafka transactions) and sets the commit interval, which is
    /// also the transaction interval, to 100 ms; call [`commit_interval`](Self::commit_interval)
    /// afterwards to change it.
    pub fn exactly_once(mut self, settings: ExactlyOnce) -> Self {
        self.delivery = Delivery::ExactlyOnce(settings);
        self.commit_interval = Duration::from_millis(100);
        self
    }

    /// The exactly-once settings, when that mode is on.
    pub fn exactly_once_settings(&self) -> Option<&ExactlyOnce> {
        match &self.delivery {
            Delivery::ExactlyOnce(eo) => Some(eo),
            Delivery::AtLeastOnce => None,
        }
    }

    /// The transactional id exactly-once mode uses: the configured one, else `<group_id>.<hostname>`.
    pub fn transactional_id(&self) -> Option<String> {
        let eo = self.exactly_once_settings()?;
        Some(eo.transactional_id.clone().unwrap_or_else(|| format!("{}.{}", self.group_id, hostname())))
    }

    /// The DLQ topic for records from `source`.
    pub fn dlq_topic(&self, source: &str) -> String {
        crate::dlq::topic_for(&self.dlq.topic, source)
    }

    /// Adds a Kafka property for both clients.
    pub fn kafka_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.kafka.insert(key.into(), value.into());
        self
    }

    /// Adds a consumer property.
    pub fn consumer_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.consumer.insert(key.into(), value.into());
        self
    }

    /// Adds a producer property.
    pub fn producer_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.producer.insert(key.into(), value.into());
        self
    }

    /// Checks every field; the error names the first one that cannot work. Kafka property names and
    /// values are checked again by librdkafka when the clients are created, which also names them.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err(ConfigError::new("bootstrap_servers", "must name at least one broker (host:port)"));
        }
        if self.group_id.trim().is_empty() {
            return Err(ConfigError::new("group_id", "must not be empty"));
        }
        if self.topics.is_empty() {
            return Err(ConfigError::new("topics", "must name at least one topic"));
        }
        if let Some(t) = self.topics.iter().find(|t| !valid_topic_name(t)) {
            return Err(ConfigError::new(
                "topics",
                format!("{t:?} is not a valid topic name (1-249 of [a-zA-Z0-9._-])"),
            ));
        }
        let b = &self.bounds;
        for (field, v) in [
            ("bounds.max_concurrency", b.max_concurrency),
            ("bounds.max_in_flight_per_partition", b.max_in_flight_per_partition),
            ("bounds.max_in_flight_total", b.max_in_flight_total),
            ("bounds.max_buffered_bytes", b.max_buffered_bytes),
        ] {
            if v == 0 {
                return Err(ConfigError::new(field, "must be at least 1"));
            }
        }
        if b.max_in_flight_per_partition > b.max_in_flight_total {
            return Err(ConfigError::new(
                "bounds.max_in_flight_per_partition",
                format!(
                    "{} exceeds bounds.max_in_flight_total ({})",
                    b.max_in_flight_per_partition, b.max_in_flight_total
                ),
            ));
        }
        if self.commit_interval.is_zero() {
            return Err(ConfigError::new("commit_interval", "must be above zero"));
        }
        if self.commit_every_records == Some(0) {
            return Err(ConfigError::new("commit_every_records", "must be at least 1 when set"));
        }
        self.retry.validate()?;
        if self.dlq.enabled {
            for t in &self.topics {
                let dlq = self.dlq_topic(t);
                if !valid_topic_name(&dlq) {
                    return Err(ConfigError::new("dlq.topic", format!("gives {dlq:?}, not a valid topic name")));
                }
                if self.topics.contains(&dlq) {
                    return Err(ConfigError::new("dlq.topic", format!("{dlq:?} is also an input topic")));
                }
            }
        }
        if self.dlq.park_keys {
            if !self.dlq.enabled {
                return Err(ConfigError::new(
                    "dlq.park_keys",
                    "needs the DLQ on (dlq.enabled): parked records go there",
                ));
            }
            if self.ordering == ProcessingOrder::Unordered {
                return Err(ConfigError::new("dlq.park_keys", "needs per-key order (ordering key or partition)"));
            }
            if self.dlq.max_parked_keys == 0 {
                return Err(ConfigError::new("dlq.max_parked_keys", "must be at least 1"));
            }
        }
        if let Some(d) = &self.dedup {
            let retry_window: Duration =
                (1..self.retry.max_attempts.max(1)).map(|a| self.retry.ceiling(a)).sum::<Duration>();
            if d.ttl <= retry_window {
                return Err(ConfigError::new(
                    "dedup.ttl",
                    format!("{:?} must exceed the longest retry window ({retry_window:?})", d.ttl),
                ));
            }
            if d.dir.as_os_str().is_empty() {
                return Err(ConfigError::new("dedup.dir", "must name a directory"));
            }
        }
        self.validate_downstream()?;
        for (map, prefix) in [(&self.kafka, "kafka"), (&self.consumer, "consumer"), (&self.producer, "producer")] {
            if let Some(k) = map.keys().find(|k| OWNED_PROPERTIES.contains(&k.as_str())) {
                return Err(ConfigError::new(
                    format!("{prefix}.{k}"),
                    "is managed by Millrace (offsets are committed only after effects); set the config field instead",
                ));
            }
        }
        if let Some(eo) = self.exactly_once_settings() {
            let floor = (self.commit_interval * 2).max(Duration::from_secs(1));
            if eo.transaction_timeout < floor {
                return Err(ConfigError::new(
                    "delivery.transaction_timeout",
                    format!(
                        "{:?} must be at least {floor:?} (twice the commit interval, and 1 s)",
                        eo.transaction_timeout
                    ),
                ));
            }
            if let Some(t) = self.attempt_timeout.filter(|t| *t > eo.transaction_timeout) {
                return Err(ConfigError::new(
                    "attempt_timeout",
                    format!("{t:?} must not exceed delivery.transaction_timeout ({:?})", eo.transaction_timeout),
                ));
            }
            if eo.transactional_id.as_ref().is_some_and(|id| id.trim().is_empty()) {
                return Err(ConfigError::new("delivery.transactional_id", "must not be empty when set"));
            }
            if !(0.0..=1.0).contains(&eo.inject_abort_ratio) {
                return Err(ConfigError::new("delivery.inject_abort_ratio", "must be in [0, 1]"));
            }
            for key in ["transactional.id", "transaction.timeout.ms", "isolation.level"] {
                if self.kafka.contains_key(key) || self.producer.contains_key(key) || self.consumer.contains_key(key) {
                    return Err(ConfigError::new(
                        key,
                        "is managed by Millrace in exactly-once mode; set the ExactlyOnce field instead",
                    ));
                }
            }
        }
        if self.stall_timeout < Duration::from_secs(1) {
            return Err(ConfigError::new("stall_timeout", format!("{:?} must be at least 1 s", self.stall_timeout)));
        }
        if self.blocked_poll_threshold < Duration::from_millis(100) {
            let threshold = self.blocked_poll_threshold;
            return Err(ConfigError::new("blocked_poll_threshold", format!("{threshold:?} must be at least 100 ms")));
        }
        if self.attempt_timeout.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::new("attempt_timeout", "must be above zero when set"));
        }
        if self.startup_timeout.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::new("startup_timeout", "must be above zero when set"));
        }
        let max_poll = self.consumer_ms("max.poll.interval.ms", 300_000)?;
        if self.drain_timeout.as_millis() as u64 >= max_poll {
            return Err(ConfigError::new(
                "drain_timeout",
                format!("{:?} must be below max.poll.interval.ms ({max_poll} ms)", self.drain_timeout),
            ));
        }
        Ok(())
    }

    /// A consumer property in milliseconds, as librdkafka will see it.
    fn consumer_ms(&self, key: &str, default: u64) -> Result<u64, ConfigError> {
        match self.consumer.get(key).or_else(|| self.kafka.get(key)) {
            None => Ok(default),
            Some(v) => {
                v.trim().parse().map_err(|_| ConfigError::new(key, format!("{v:?} is not a number of milliseconds")))
            }
        }
    }
}

/// This machine's host name, for the default transactional id.
fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

fn valid_topic_name(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 249
        && t != "."
        && t != ".."
        && t.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

#[cfg(test)]
mod tests;
