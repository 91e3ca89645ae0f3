//! The typed events: one struct per happening. `emit` is the only place where a happening is
//! logged, counted in [`Stats`](crate::Stats) and recorded as a metric.

use super::Telemetry;
use super::instruments::{ATTEMPT_TIMEOUTS, ATTEMPTS_CANCELLED, ATTEMPTS_DROPPED, DEAD_LETTERED, RETRIES};
use crate::context::CancelReason;
use crate::dlq::Failure;
use crate::record::Record;
use crate::stats::Stats;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// A transient failure will be retried after `delay`.
pub(crate) struct RetryScheduled<'a> {
    pub(crate) record: &'a Record,
    pub(crate) attempt: u32,
    pub(crate) delay: Duration,
    pub(crate) error: &'a dyn std::fmt::Display,
}

impl RetryScheduled<'_> {
    pub(crate) fn emit(self, t: &Telemetry) {
        let r = self.record;
        Stats::bump(&t.stats.retries);
        t.metrics.count(RETRIES, "topic", r.topic.to_string());
        t.retrying.lock().unwrap_or_else(|p| p.into_inner()).note(r, self.attempt, self.error);
        tracing::warn!(
            pipeline = %t.name, topic = %r.topic, partition = r.partition, offset = r.offset,
            attempt = self.attempt, delay = ?self.delay, error = %self.error, "transient failure; retrying"
        );
    }
}

/// A processor call ran past the attempt timeout and was cancelled (a transient failure).
pub(crate) struct AttemptTimedOut<'a> {
    pub(crate) record: &'a Record,
    pub(crate) attempt: u32,
    pub(crate) after: Duration,
}

impl AttemptTimedOut<'_> {
    pub(crate) fn emit(self, t: &Telemetry) {
        let r = self.record;
        t.metrics.count(ATTEMPT_TIMEOUTS, "topic", r.topic.to_string());
        tracing::warn!(
            pipeline = %t.name, topic = %r.topic, partition = r.partition, offset = r.offset,
            key = r.key_str().unwrap_or_default(), attempt = self.attempt, after = ?self.after,
            "processor call ran past attempt_timeout; cancelled"
        );
    }
}

/// A processor call was cancelled ([`CancelReason`]): past its attempt timeout (after
/// [`AttemptTimedOut`]), or still running at its partition's drain deadline.
pub(crate) struct AttemptCancelled<'a> {
    pub(crate) record: &'a Record,
    pub(crate) attempt: u32,
    pub(crate) reason: CancelReason,
    /// It did not return by itself: it never listened to `ctx.cancelled()`, or ran past the grace.
    pub(crate) dropped: bool,
}

impl AttemptCancelled<'_> {
    pub(crate) fn emit(self, t: &Telemetry) {
        let r = self.record;
        Stats::bump(&t.stats.attempts_cancelled);
        t.metrics.count2(ATTEMPTS_CANCELLED, ("topic", r.topic.to_string()), ("reason", self.reason.as_str()));
        if self.dropped {
            Stats::bump(&t.stats.attempts_dropped);
            t.metrics.count(ATTEMPTS_DROPPED, "topic", r.topic.to_string());
        }
        if self.reason != CancelReason::Timeout {
            tracing::warn!(
                pipeline = %t.name, topic = %r.topic, partition = r.partition, offset = r.offset,
                key = r.key_str().unwrap_or_default(), attempt = self.attempt, reason = self.reason.as_str(),
                dropped = self.dropped,
                "processor call still running at the partition's drain deadline; cancelled, the record is left \
                 uncommitted"
            );
        }
    }
}

/// The processor panicked (the attempt fails permanently).
pub(crate) struct ProcessorPanicked;

impl ProcessorPanicked {
    pub(crate) fn emit(self, t: &Telemetry) {
        Stats::bump(&t.stats.panics);
    }
}

/// A record that failed for good is in the DLQ (acknowledged, or, exactly-once, ready for the
/// transaction that commits its offset).
pub(crate) struct RecordDeadLettered<'a> {
    pub(crate) record: &'a Record,
    pub(crate) dlq: &'a str,
    pub(crate) failure: &'a Failure,
}

impl RecordDeadLettered<'_> {
    pub(crate) fn emit(self, t: &Telemetry) {
        let (r, f) = (self.record, self.failure);
        t.metrics.count(DEAD_LETTERED, "kind", f.kind.as_str());
        tracing::warn!(
            pipeline = %t.name, topic = %r.topic, partition = r.partition, offset = r.offset, dlq = %self.dlq,
            kind = %f.kind, attempts = f.attempts, error = %f.message, "record dead-lettered"
        );
    }
}

/// A record failed for good with the DLQ off: its partition's commits stop before it.
pub(crate) struct RecordFailed<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) failure: &'a Failure,
}

impl RecordFailed<'_> {
    pub(crate) fn emit(self, t: &Telemetry) {
        let f = self.failure;
        tracing::error!(
            pipeline = %t.name, topic = %self.topic, partition = self.partition, offset = self.offset,
            kind = %f.kind, error = %f.message, "record failed (DLQ off); its offset will not be committed past"
        );
    }
}

/// A DLQ produce failed; the record stays unfinished and the produce is retried.
pub(crate) struct DlqProduceFailed<'a> {
    pub(crate) dlq: &'a str,
    pub(crate) error: &'a str,
}

impl DlqProduceFailed<'_> {
    pub(crate) fn emit(self, t: &Telemetry, log: &crate::kafka::log::KafkaLog) {
        Stats::bump(&t.stats.dlq_produce_failures);
        log.warn(&format!("DLQ produce to {} failed; the record stays uncommitted", self.dlq), self.error);
    }
}

/// An offset commit (or a transaction commit) was issued and ended: `error` if it failed.
pub(crate) struct CommitEnded<'a> {
    pub(crate) took: Duration,
    pub(crate) error: Option<&'a dyn std::fmt::Display>,
}

impl CommitEnded<'_> {
    pub(crate) fn emit(self, t: &Telemetry) {
        Stats::bump(&t.stats.commits);
        t.metrics.commit.record(self.took.as_secs_f64());
        if let Some(e) = self.error {
            Stats::bump(&t.stats.commit_failures);
            tracing::warn!(pipeline = %t.name, error = %e, "offset commit failed; it will be retried");
        }
    }
}

/// An asynchronous offset commit failed (reported by the consumer's commit callback).
pub(crate) struct AsyncCommitFailed<'a> {
    pub(crate) error: &'a str,
}

impl AsyncCommitFailed<'_> {
    pub(crate) fn emit(self, t: &Telemetry, log: &crate::kafka::log::KafkaLog) {
        Stats::bump(&t.stats.commit_failures);
        log.warn("async offset commit failed", self.error);
    }
}

/// Partitions were assigned to this member.
pub(crate) struct PartitionsAssigned {
    pub(crate) count: u64,
}

impl PartitionsAssigned {
    pub(crate) fn emit(self, t: &Telemetry) {
        t.stats.assignments.fetch_add(self.count, Relaxed);
        t.stats.assigned_partitions.fetch_add(self.count, Relaxed);
        t.stats.joined.store(1, Relaxed);
        tracing::info!(pipeline = %t.name, assigned = self.count, "partitions assigned");
    }
}

/// Partitions were revoked (or lost: another member owns them already); `paused` of them were
/// paused.
pub(crate) struct PartitionsRevoked {
    pub(crate) count: u64,
    pub(crate) paused: u64,
    pub(crate) lost: bool,
}

impl PartitionsRevoked {
    pub(crate) fn emit(self, t: &Telemetry) {
        t.stats.revocations.fetch_add(self.count, Relaxed);
        t.stats.assigned_partitions.fetch_sub(self.count, Relaxed);
        t.stats.paused_partitions.fetch_sub(self.paused, Relaxed);
        if self.lost {
            tracing::warn!(pipeline = %t.name, partitions = self.count, "partitions lost; not committing (another member owns them)");
        } else {
            tracing::info!(pipeline = %t.name, partitions = self.count, "partitions revoked");
        }
    }
}

/// Exactly-once: a transaction committed.
pub(crate) struct TransactionCommitted {
    pub(crate) outputs: u64,
    pub(crate) partitions: usize,
    /// Until the completed work was in the transaction, the offsets sent, and it committed.
    pub(crate) pumped: Duration,
    pub(crate) offsets_sent: Duration,
    pub(crate) took: Duration,
    /// From `begin_transaction` to the commit.
    pub(crate) open_for: Duration,
}

impl TransactionCommitted {
    pub(crate) fn emit(self, t: &Telemetry) {
        Stats::bump(&t.stats.transactions_committed);
        t.stats.committed_outputs.fetch_add(self.outputs, Relaxed);
        t.metrics.commit.record(self.took.as_secs_f64());
        t.metrics.transaction.record(self.open_for.as_secs_f64());
        tracing::debug!(pipeline = %t.name, outputs = self.outputs, partitions = self.partitions, pumped = ?self.pumped,
            offsets_sent = ?self.offsets_sent, took = ?self.took, "transaction committed");
    }
}

/// Exactly-once: a transaction is being aborted (or failed to begin).
pub(crate) struct TransactionAborting;

impl TransactionAborting {
    pub(crate) fn emit(self, t: &Telemetry) {
        Stats::bump(&t.stats.transactions_aborted);
    }
}

/// Exactly-once: this transaction will be aborted on purpose (`inject_abort_ratio`).
pub(crate) struct InjectedAbort;

impl InjectedAbort {
    pub(crate) fn emit(self, t: &Telemetry) {
        Stats::bump(&t.stats.transactions_injected_aborts);
        tracing::info!(pipeline = %t.name, "aborting this transaction on purpose (inject_abort_ratio)");
    }
}

/// The circuit breaker opened (from closed).
pub(crate) struct BreakerTripped<'a> {
    pub(crate) reason: &'a str,
    pub(crate) cooldown: Duration,
}

impl BreakerTripped<'_> {
    pub(crate) fn emit(self, t: &Telemetry) {
        Stats::bump(&t.stats.breaker_trips);
        t.stats.breaker_open.store(1, Relaxed);
        tracing::error!(
            pipeline = %t.name, reason = self.reason, cooldown = ?self.cooldown,
            "circuit breaker open: pipeline unhealthy, consumption paused"
        );
    }
}

/// The breaker's cool-down passed: consumption resumes and the next attempt is its probe.
pub(crate) struct BreakerHalfOpen;

impl BreakerHalfOpen {
    pub(crate) fn emit(self, t: &Telemetry) {
        tracing::warn!(pipeline = %t.name, "circuit breaker half-open after its cool-down; one attempt probes");
    }
}

/// The half-open breaker's probe failed: open again for another cool-down.
pub(crate) struct BreakerProbeFailed {
    pub(crate) cooldown: Duration,
}

impl BreakerProbeFailed {
    pub(crate) fn emit(self, t: &Telemetry) {
        Stats::bump(&t.stats.breaker_probes);
        tracing::error!(
            pipeline = %t.name, cooldown = ?self.cooldown,
            "circuit breaker probe failed; open again, consumption paused"
        );
    }
}

/// The half-open breaker's probe succeeded: closed, the pipeline runs again.
pub(crate) struct BreakerClosed;

impl BreakerClosed {
    pub(crate) fn emit(self, t: &Telemetry) {
        Stats::bump(&t.stats.breaker_probes);
        t.stats.breaker_open.store(0, Relaxed);
        tracing::warn!(pipeline = %t.name, "circuit breaker closed: its probe succeeded; running again");
    }
}
