//! Every librdkafka client's settings, built from a [`PipelineConfig`]: the framework's defaults
//! first, the user's `kafka`/`consumer`/`producer` properties over them, and the settings the
//! delivery contract depends on last (they cannot be overridden).

use crate::config::{Bounds, ExactlyOnce, PipelineConfig};
use crate::error::{ConfigError, Error};
use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use std::time::Duration;

/// Maps librdkafka's rejection of a property to a [`ConfigError`] naming that property.
pub(crate) fn client_creation(which: &'static str) -> impl Fn(KafkaError) -> Error {
    move |e| match e {
        KafkaError::ClientConfig(_, desc, key, value) => {
            let value = crate::config::properties::shown(&key, &value);
            Error::Config(ConfigError::new(key, format!("{desc} (value {value:?}, {which} client)")))
        }
        KafkaError::ClientCreation(msg) => Error::Config(ConfigError::new(which, msg)),
        other => Error::Kafka(other),
    }
}

pub(crate) fn consumer_config(config: &PipelineConfig) -> ClientConfig {
    let prefetch = prefetch(&config.bounds);
    let mut c = ClientConfig::new();
    c.set("partition.assignment.strategy", "cooperative-sticky")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        // librdkafka's default (1 s) idles a partition for a second whenever its prefetch queue was
        // full, which a busy pipeline hits constantly.
        .set("fetch.queue.backoff.ms", "20")
        // librdkafka's prefetch, sized from the in-flight bounds (see `prefetch`).
        .set("queued.min.messages", prefetch.records.to_string())
        .set("queued.max.messages.kbytes", prefetch.kbytes.to_string())
        // Feeds the stall watchdog (`watchdog`).
        .set("statistics.interval.ms", statistics_interval(config.stall_timeout).as_millis().to_string());
    for (k, v) in config.kafka.iter().chain(&config.consumer) {
        c.set(k, v);
    }
    c.set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", &config.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    if config.exactly_once_settings().is_some() {
        // Never process another transaction's aborted or still-open records.
        c.set("isolation.level", "read_committed");
    }
    c
}

/// The producer's `message.max.bytes` (librdkafka's default 1,000,000 when unset).
pub(crate) fn max_message_bytes(config: &PipelineConfig) -> Result<usize, Error> {
    match config.producer.get("message.max.bytes").or_else(|| config.kafka.get("message.max.bytes")) {
        None => Ok(1_000_000),
        Some(v) => v.trim().parse().map_err(|_| {
            Error::Config(ConfigError::new("message.max.bytes", format!("{v:?} is not a number of bytes")))
        }),
    }
}

pub(crate) fn admin_config(config: &PipelineConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (k, v) in &config.kafka {
        c.set(k, v);
    }
    c.set("bootstrap.servers", &config.bootstrap_servers);
    c
}

pub(crate) fn producer_config(config: &PipelineConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("enable.idempotence", "true").set("acks", "all").set("linger.ms", "5");
    for (k, v) in config.kafka.iter().chain(&config.producer) {
        c.set(k, v);
    }
    c.set("bootstrap.servers", &config.bootstrap_servers);
    c
}

/// Exactly-once mode's producer: the output producer's settings plus the transactional ones.
pub(crate) fn transactional_producer_config(config: &PipelineConfig, eo: &ExactlyOnce) -> ClientConfig {
    let mut c = producer_config(config);
    let id = config.transactional_id().unwrap_or_default();
    c.set("transactional.id", id).set("transaction.timeout.ms", eo.transaction_timeout.as_millis().to_string());
    c
}

/// The consumer that restores a partition's dedup keys from the changelog (its own group, never
/// committed): read_committed, and an end-of-partition event, because in exactly-once mode the
/// changelog is written in transactions, so its last offsets are commit markers that are never
/// delivered.
pub(crate) fn restore_consumer_config(config: &PipelineConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (k, v) in &config.kafka {
        c.set(k, v);
    }
    c.set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", format!("{}.restore", config.group_id))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true");
    c
}

/// How much librdkafka may prefetch ahead of the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Prefetch {
    /// `queued.min.messages`: records per partition.
    pub(crate) records: usize,
    /// `queued.max.messages.kbytes`: KiB for the whole consumer.
    pub(crate) kbytes: usize,
}

/// The prefetch that keeps a pipeline fed without holding a second backlog in memory.
///
/// librdkafka's defaults (100,000 records per partition, up to 64 MiB in all) are sized for a
/// consumer that hands records straight to its caller; the pipeline already holds up to
/// `max_in_flight_total` polled records and pauses partitions beyond its bounds, so a prefetch of
/// one partition bound's worth of records per partition (at least 1,000, at most librdkafka's
/// default) keeps every partition's next fetch in hand while the pipeline works, and a quarter of
/// `max_buffered_bytes` (1 to 64 MiB) caps it for large records. With the default bounds: 10,000
/// records per partition, 16 MiB; the peak resident size draining 5,000,000 records of 100 B fell
/// from 93 MiB to 57 MiB at the same throughput (`millrace-bench memory`). Set `queued.min.messages` or
/// `queued.max.messages.kbytes` in `[consumer]` to choose otherwise.
pub(crate) fn prefetch(bounds: &Bounds) -> Prefetch {
    let records = bounds.max_in_flight_per_partition.min(bounds.max_in_flight_total).clamp(1_000, 100_000);
    let kbytes = (bounds.max_buffered_bytes / 4 / 1024).clamp(1024, 65_536);
    Prefetch { records, kbytes }
}

/// How often librdkafka's statistics are wanted for a given stall timeout: four samples per timeout,
/// at least every 5 s and at most every 100 ms.
pub(crate) fn statistics_interval(stall_timeout: Duration) -> Duration {
    (stall_timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_interval_is_a_quarter_of_the_timeout_within_bounds() {
        assert_eq!(statistics_interval(Duration::from_secs(60)), Duration::from_secs(5));
        assert_eq!(statistics_interval(Duration::from_secs(2)), Duration::from_millis(500));
        assert_eq!(statistics_interval(Duration::from_millis(200)), Duration::from_millis(100));
    }

    #[test]
    fn prefetch_follows_the_bounds_within_limits() {
        assert_eq!(prefetch(&Bounds::default()), Prefetch { records: 10_000, kbytes: 16_384 });
        let small = Bounds { max_in_flight_per_partition: 10, max_buffered_bytes: 1 << 10, ..Bounds::default() };
        assert_eq!(prefetch(&small), Prefetch { records: 1_000, kbytes: 1024 });
        let large = Bounds {
            max_in_flight_total: 1 << 30,
            max_in_flight_per_partition: 1 << 30,
            max_buffered_bytes: 1 << 40,
            ..Bounds::default()
        };
        assert_eq!(prefetch(&large), Prefetch { records: 100_000, kbytes: 65_536 });
    }

    #[test]
    fn consumer_properties_override_the_prefetch() {
        let config = PipelineConfig::new("127.0.0.1:9092", "g", ["t"]).consumer_property("queued.min.messages", "50");
        let c = consumer_config(&config);
        assert_eq!(c.get("queued.min.messages"), Some("50"));
        assert_eq!(c.get("queued.max.messages.kbytes"), Some("16384"));
    }
}
