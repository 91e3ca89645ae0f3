//! Consumer-group callbacks: what happens when partitions are assigned, revoked or lost.
//!
//! Revoke (I2, I5): stop handing out the revoked partitions' queued records, wait for the running
//! ones until the drain deadline, commit the completed prefix (the [`Committer`]: synchronously, or
//! in a transaction with their outputs), and only then let librdkafka release them. Lost partitions
//! (session expired) are dropped without a commit: another member owns them already. Assign: a
//! fresh [`PartitionHandle`] with a new epoch per partition.
//!
//! Exactly-once: [`Hooks::rewind`] replaces a partition's task after an aborted transaction and
//! seeks the consumer back to the last committed offset.

use crate::breaker::Breaker;
use crate::commit::Committer;
use crate::kafka::log::KafkaLog;
use crate::partition::PartitionHandle;
use crate::state::assignments::{Assignments, Starter};
use crate::stats::Stats;
use crate::telemetry::Telemetry;
use crate::telemetry::events::{AsyncCommitFailed, PartitionsAssigned, PartitionsRevoked};
use crate::watchdog::Watchdog;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::statistics::Statistics;
use rdkafka::{Offset, TopicPartitionList};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The consumer's context: rebalance hooks, commit results and librdkafka's logs and errors.
pub(crate) struct Hooks {
    pub(crate) assignments: Arc<Mutex<Assignments>>,
    /// Set when the pipeline runs (it needs the runtime).
    pub(crate) starter: OnceLock<Starter>,
    pub(crate) telemetry: Arc<Telemetry>,
    pub(crate) drain_timeout: Duration,
    pub(crate) name: String,
    /// Bumped whenever the assignment changes (invalidates the poll thread's handle cache).
    pub(crate) version: AtomicU64,
    /// Throttled logs, and the fatal error the poll loop stops on.
    pub(crate) log: Arc<KafkaLog>,
    /// Every commit: plain offsets (at-least-once) or transactions (exactly-once).
    pub(crate) committer: Committer,
    /// Reports stalled partitions and an unreachable cluster from librdkafka's statistics.
    pub(crate) watchdog: Watchdog,
    /// The circuit breaker (while it is open every partition is held back, not stalled).
    pub(crate) breaker: Arc<Breaker>,
}

impl Hooks {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Assignments> {
        self.assignments.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let lost = consumer.assignment_lost();
        let handles: Vec<_> = {
            let mut a = self.lock();
            self.version.fetch_add(1, Relaxed);
            tpl.elements().iter().filter_map(|e| a.remove(e.topic(), e.partition())).collect()
        };
        if handles.is_empty() {
            return;
        }
        let paused = handles.iter().filter(|h| h.is_paused()).count() as u64;
        PartitionsRevoked { count: handles.len() as u64, paused, lost }.emit(&self.telemetry);
        // Queued records are dropped; running ones may finish until the deadline (none when lost).
        let deadline = if lost { Instant::now() } else { Instant::now() + self.drain_timeout };
        let stops: Vec<_> = handles.iter().map(|h| h.stop(false, deadline)).collect();
        if lost {
            self.committer.lost(&handles);
            return;
        }
        for (h, stop) in handles.iter().zip(stops) {
            if !stop.wait() {
                tracing::warn!(pipeline = %self.name, topic = %h.topic, partition = h.partition,
                    "drain deadline passed on revoke; committing only the completed prefix");
            }
        }
        self.committer.released(consumer, &handles, &self.telemetry);
    }

    /// Exactly-once, after an aborted transaction: replaces the task of each of `handles` still
    /// owned by a fresh one (new epoch) and seeks the consumer back to its last committed offset,
    /// so the records whose outputs were aborted are redone. An error means a partition could not
    /// be rewound: committing anything further for it could skip records, so the caller stops.
    pub(crate) fn rewind(&self, consumer: &BaseConsumer<Self>, handles: &[Arc<PartitionHandle>]) -> KafkaResult<()> {
        self.rewind_to(consumer, handles, PartitionHandle::rewind_target)
    }

    /// Exactly-once, after the transactional producer was replaced: like [`rewind`](Self::rewind),
    /// but to the offsets the group coordinator holds, which a consumer reading `read_committed`
    /// fetches with `require_stable` (so they are final once no transaction of this member is
    /// pending). One try of at most `timeout`: the poll thread calls it again on its next turns
    /// while it fails (the coordinator away or still settling the old transaction), and polls in
    /// between, so that a session lost meanwhile is handed to the rebalance callback and the member
    /// can rejoin. Handles retired meanwhile (revoked, lost, rewound) are skipped; when none is left
    /// nothing is fetched.
    pub(crate) fn rewind_to_group_offsets(
        &self,
        consumer: &BaseConsumer<Self>,
        handles: &[Arc<PartitionHandle>],
        timeout: Duration,
    ) -> KafkaResult<()> {
        let current: Vec<Arc<PartitionHandle>> = {
            let a = self.lock();
            handles
                .iter()
                .filter(|h| a.get(&h.topic, h.partition).is_some_and(|c| Arc::ptr_eq(c, h)))
                .cloned()
                .collect()
        };
        if current.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for h in &current {
            tpl.add_partition(&h.topic, h.partition);
        }
        let committed = consumer.committed_offsets(tpl, timeout)?;
        self.rewind_to(consumer, &current, |h| {
            match committed.find_partition(&h.topic, h.partition).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => Some(o),
                // Nothing committed for this group yet: where this epoch started.
                _ => h.rewind_target(),
            }
        })
    }

    fn rewind_to(
        &self,
        consumer: &BaseConsumer<Self>,
        handles: &[Arc<PartitionHandle>],
        target: impl Fn(&PartitionHandle) -> Option<i64>,
    ) -> KafkaResult<()> {
        let Some(start) = self.starter.get() else { return Ok(()) };
        for old in handles {
            let replaced = {
                let mut a = self.lock();
                match a.get(&old.topic, old.partition) {
                    Some(current) if Arc::ptr_eq(current, old) => {
                        a.remove(&old.topic, old.partition);
                        a.insert(&old.topic, old.partition, start);
                        self.version.fetch_add(1, Relaxed);
                        true
                    }
                    _ => false, // revoked meanwhile: the next owner redoes it
                }
            };
            // The old task drops its queued records and nothing reads its completions any more.
            let _ = old.stop(false, Instant::now());
            old.pending.discard();
            if !replaced {
                continue;
            }
            Stats::bump(&self.telemetry.stats.rewinds);
            if old.is_paused() {
                self.telemetry.stats.paused_partitions.fetch_sub(1, Relaxed);
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(&old.topic, old.partition);
                consumer.resume(&tpl)?;
            }
            if let Some(target) = target(old) {
                consumer.seek(&old.topic, old.partition, Offset::Offset(target), Duration::from_secs(10))?;
                tracing::info!(pipeline = %self.name, topic = %old.topic, partition = old.partition, offset = target, "rewound");
            }
        }
        Ok(())
    }

    fn assign(&self, tpl: &TopicPartitionList) {
        let Some(start) = self.starter.get() else {
            tracing::error!(pipeline = %self.name, "partitions assigned before the pipeline runs");
            return;
        };
        let mut a = self.lock();
        self.version.fetch_add(1, Relaxed);
        for e in tpl.elements() {
            a.insert(e.topic(), e.partition(), start);
        }
        PartitionsAssigned { count: tpl.count() as u64 }.emit(&self.telemetry);
    }
}

impl ClientContext for Hooks {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.log.log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.log.error(error, reason);
    }

    fn stats(&self, statistics: Statistics) {
        let busy = self.breaker.tripped();
        let owned = self.lock();
        self.watchdog.observe(&statistics, &owned, &self.telemetry, busy);
        self.telemetry.observe_partitions(&statistics, &owned, self.watchdog.read_committed());
    }
}

impl ConsumerContext for Hooks {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => self.revoke(consumer, tpl),
            Rebalance::Assign(_) => {}
            Rebalance::Error(e) => tracing::warn!(pipeline = %self.name, error = %e, "rebalance error"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.assign(tpl);
            // librdkafka keeps a partition's pause flag across revoke and re-assign: a partition this
            // member paused for backpressure before losing it would come back paused forever.
            if tpl.count() > 0
                && let Err(e) = consumer.resume(tpl)
            {
                tracing::warn!(pipeline = %self.name, error = %e, "resuming newly assigned partitions failed");
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        if let Err(e) = result {
            AsyncCommitFailed { error: &e.to_string() }.emit(&self.telemetry, &self.log);
            self.committer.async_commit_failed();
        }
    }
}
