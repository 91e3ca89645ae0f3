//! What the pipeline needs from the cluster before and while it consumes: brokers that answer at
//! start-up ([`reach`]), and input topics that exist ([`TopicWatch`]).
//!
//! Start-up: before subscribing (and, in exactly-once mode, before initialising transactions) the
//! poll thread asks the brokers for the input topics' metadata, retrying every second. While no
//! broker has answered, [`StatsSnapshot::cluster_unreachable`](crate::StatsSnapshot::cluster_unreachable)
//! is set; after `stall_timeout` without an answer one error naming the bootstrap list is logged.
//! With a [`startup_timeout`](crate::PipelineConfig::startup_timeout), `run()` fails with
//! [`Error::Unreachable`] once it passed; without one, it keeps retrying (as Kafka clients do), and a
//! pipeline stopped before it ever reached the cluster returns the same error rather than `Ok`.
//!
//! Missing input topics: a topic the metadata does not know (never created, or deleted while the
//! pipeline runs: librdkafka then reports `UnknownTopicOrPartition` from the poll and revokes its
//! partitions) is logged once at error level, counted in
//! [`StatsSnapshot::missing_topics`](crate::StatsSnapshot::missing_topics), and checked again every
//! [`RECHECK`] until it exists again. With
//! [`fail_on_missing_topic`](crate::PipelineConfig::fail_on_missing_topic), `run()` fails with
//! [`Error::MissingTopic`] instead.

use crate::config::PipelineConfig;
use crate::error::Error;
use crate::retry::Backoff;
use crate::stats::Stats;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaRespErr;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long one metadata request may take before it is retried.
const ATTEMPT: Duration = Duration::from_secs(1);
/// How often a missing input topic is looked up again.
pub(crate) const RECHECK: Duration = Duration::from_secs(10);

/// Waits until a broker answers a metadata request for the input topics; records which of them do
/// not exist in `topics`. Fails with [`Error::Unreachable`] after the configured start-up timeout,
/// or when `stop` is cancelled first; with [`Error::MissingTopic`] if a topic is missing and the
/// configuration says to fail on that.
pub(crate) fn reach<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    config: &PipelineConfig,
    stop: &CancellationToken,
    stats: &Stats,
    topics: &mut TopicWatch,
    refused: impl Fn() -> Option<Error>,
) -> Result<(), Error> {
    let started = Instant::now();
    let bootstrap = &config.bootstrap_servers;
    let mut reported = false;
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(1));
    loop {
        stats.beat();
        let attempt = Instant::now();
        match topics.lookup(consumer) {
            Ok(missing) => {
                stats.cluster_unreachable.store(0, Relaxed);
                if reported {
                    tracing::info!(pipeline = %config.name, %bootstrap, waited_s = started.elapsed().as_secs(), "cluster reached");
                }
                return topics.update(missing, stats);
            }
            Err(e) => {
                stats.cluster_unreachable.store(1, Relaxed);
                // Wrong credentials or an untrusted certificate: waiting longer cannot help.
                if let Some(fatal) = refused() {
                    return Err(fatal);
                }
                let waited = started.elapsed();
                let unreachable = || Error::Unreachable { bootstrap: bootstrap.clone(), waited };
                if stop.is_cancelled() {
                    tracing::error!(pipeline = %config.name, %bootstrap, waited_s = waited.as_secs(),
                        "stopped before the cluster was ever reached");
                    return Err(unreachable());
                }
                if config.startup_timeout.is_some_and(|limit| waited >= limit) {
                    tracing::error!(pipeline = %config.name, %bootstrap, waited_s = waited.as_secs(), error = %e,
                        "cluster not reached within startup_timeout; giving up");
                    return Err(unreachable());
                }
                if !reported && waited >= config.stall_timeout {
                    reported = true;
                    tracing::error!(pipeline = %config.name, %bootstrap, waited_s = waited.as_secs(), error = %e,
                        "cluster not reached yet (retrying; set startup_timeout to fail instead)");
                }
                // A refused connection fails at once: do not spin.
                let pause = backoff.next_delay().saturating_sub(attempt.elapsed());
                std::thread::sleep(pause);
            }
        }
    }
}

/// The input topics the metadata says are missing, reported once each.
#[derive(Debug)]
pub(crate) struct TopicWatch {
    name: String,
    topics: Vec<String>,
    fail: bool,
    missing: BTreeSet<String>,
    /// Set by a consumer error that may mean a topic disappeared.
    due: bool,
    last_lookup: Instant,
    next_recheck: Instant,
}

impl TopicWatch {
    pub(crate) fn new(config: &PipelineConfig) -> Self {
        Self {
            name: config.name.clone(),
            topics: config.topics.clone(),
            fail: config.fail_on_missing_topic,
            missing: BTreeSet::new(),
            due: false,
            last_lookup: Instant::now(),
            next_recheck: Instant::now() + RECHECK,
        }
    }

    /// Notes a consumer error: an unknown topic or partition makes the next [`check`](Self::check)
    /// look the input topics up.
    pub(crate) fn consumer_error(&mut self, e: &KafkaError) {
        if crate::kafka::errors::names_missing_topic(e) {
            self.due = true;
        }
    }

    /// Looks the input topics up if a consumer error asked for it, or while one is missing (every
    /// [`RECHECK`]); cheap otherwise. A lookup that fails (broker down) changes nothing.
    pub(crate) fn check<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, stats: &Stats) -> Result<(), Error> {
        if self.missing.is_empty() && !self.due {
            return Ok(()); // the common case: no clock read on the per-record path
        }
        let now = Instant::now();
        let recheck = !self.missing.is_empty() && now >= self.next_recheck;
        // A burst of consumer errors costs one lookup a second at most.
        let asked = self.due && now >= self.last_lookup + ATTEMPT;
        if !asked && !recheck {
            return Ok(());
        }
        self.due = false;
        self.last_lookup = now;
        self.next_recheck = now + RECHECK;
        match self.lookup(consumer) {
            Ok(missing) => self.update(missing, stats),
            Err(e) => {
                tracing::debug!(pipeline = %self.name, error = %e, "input topic lookup failed");
                Ok(())
            }
        }
    }

    /// The input topics the brokers' metadata does not know; an error when no broker answered.
    fn lookup<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>) -> Result<BTreeSet<String>, KafkaError> {
        let mut missing = BTreeSet::new();
        for topic in &self.topics {
            let md = consumer.fetch_metadata(Some(topic), ATTEMPT)?;
            let unknown = md
                .topics()
                .iter()
                .find(|t| t.name() == topic)
                .is_none_or(|t| matches!(t.error(), Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)));
            if unknown {
                missing.insert(topic.clone());
            }
        }
        Ok(missing)
    }

    /// Reports topics that went missing and those that are back; fails on a missing one if so
    /// configured.
    fn update(&mut self, missing: BTreeSet<String>, stats: &Stats) -> Result<(), Error> {
        for topic in missing.difference(&self.missing) {
            if self.fail {
                tracing::error!(pipeline = %self.name, %topic, "input topic does not exist; stopping (fail_on_missing_topic)");
                return Err(Error::MissingTopic { topic: topic.clone() });
            }
            tracing::error!(pipeline = %self.name, %topic,
                "input topic does not exist: nothing is consumed from it until it is created \
                 (set fail_on_missing_topic to stop instead)");
        }
        for topic in self.missing.difference(&missing) {
            tracing::info!(pipeline = %self.name, %topic, "input topic exists again");
        }
        stats.missing_topics.store(missing.len() as u64, Relaxed);
        self.missing = missing;
        Ok(())
    }
}
