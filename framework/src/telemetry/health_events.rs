//! The typed events of the pipeline's health: the watchdog's stalled partitions and unreachable
//! cluster, and exactly-once mode's producer replacements and fences. As in [`events`](super::events),
//! `emit` is the one place each is logged and counted.

use super::Telemetry;
use crate::stats::Stats;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// What holds a stalled partition back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stall {
    /// Readable records lie ahead of the fetch position, which does not move.
    Fetch,
    /// `read_committed`: an open transaction holds the last stable offset below the high watermark.
    OpenTransaction,
    /// Owned, but librdkafka does not fetch it: the offset to start from (the group's committed
    /// offset) is not resolved.
    NotFetching,
}

/// A partition made no progress for `stall_timeout` (reported once per stall).
pub(crate) struct PartitionStalled<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) kind: Stall,
    pub(crate) position: i64,
    pub(crate) end: i64,
    pub(crate) last_stable: i64,
    pub(crate) fetch_state: &'a str,
    pub(crate) stuck: Duration,
}

impl PartitionStalled<'_> {
    pub(crate) fn emit(self, t: &Telemetry) {
        Stats::bump(&t.stats.stalled_partitions);
        let (name, topic, partition, position, end, last_stable) =
            (&t.name, self.topic, self.partition, self.position, self.end, self.last_stable);
        let stuck_for_s = self.stuck.as_secs();
        match self.kind {
            Stall::Fetch => tracing::error!(pipeline = %name, topic, partition, position, end, last_stable,
                fetch_state = %self.fetch_state, stuck_for_s,
                "partition stalled: records lie ahead of its position but fetching them makes no progress \
                 (see the consumer errors logged for it, e.g. a compression codec this build cannot decode)"),
            Stall::OpenTransaction => tracing::error!(pipeline = %name, topic, partition, position, end, last_stable,
                stuck_for_s,
                "partition stalled: an open transaction holds its last stable offset below the high watermark \
                 (a hanging transaction? see kafka-transactions.sh find-hanging)"),
            Stall::NotFetching => tracing::error!(pipeline = %name, topic, partition, fetch_state = %self.fetch_state,
                stuck_for_s,
                "partition stalled: owned, but the offset to start from is not resolved: the group's committed \
                 offsets do not come (the group coordinator does not answer, or, read_committed, a transaction \
                 holds this group's offsets pending: kafka-transactions.sh list / describe-producers)"),
        }
    }
}

/// A partition reported stalled is no longer: its position moved (`position` is `Some`), or it is
/// no longer owned.
pub(crate) struct StallCleared<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) position: Option<i64>,
}

impl StallCleared<'_> {
    pub(crate) fn emit(self, t: &Telemetry) {
        t.stats.stalled_partitions.fetch_sub(1, Relaxed);
        if let Some(position) = self.position {
            tracing::info!(pipeline = %t.name, topic = %self.topic, partition = self.partition, position,
                "partition makes progress again");
        }
    }
}

/// Whether any broker connection is up, from one statistics report. `report` says the
/// unreachable cluster lasted `stall_timeout` and was not reported yet (logged once); `recovered`
/// that a reported outage ended.
pub(crate) struct ClusterReach<'a> {
    pub(crate) bootstrap: &'a str,
    pub(crate) reachable: bool,
    pub(crate) report: Option<Duration>,
    pub(crate) recovered: bool,
}

impl ClusterReach<'_> {
    pub(crate) fn emit(self, t: &Telemetry) {
        t.stats.cluster_unreachable.store(u64::from(!self.reachable), Relaxed);
        if self.recovered {
            tracing::info!(pipeline = %t.name, bootstrap = %self.bootstrap, "cluster reachable again");
        }
        if let Some(down) = self.report {
            tracing::error!(pipeline = %t.name, bootstrap = %self.bootstrap,
                down_for_s = down.as_secs(), "no broker of the cluster can be reached (retrying)");
        }
    }
}

/// Exactly-once: the transactional producer is being replaced (after an outage, a fence or an
/// unknown transaction outcome; the cause was logged where it was decided).
pub(crate) struct ProducerReplacing<'a> {
    pub(crate) cause: Option<&'a dyn std::fmt::Display>,
}

impl ProducerReplacing<'_> {
    pub(crate) fn emit(self, t: &Telemetry) {
        tracing::info!(pipeline = %t.name, cause = ?self.cause.map(ToString::to_string),
            "replacing the transactional producer; uncommitted work will be redone");
    }
}

/// Exactly-once: the new transactional producer is initialised.
pub(crate) struct ProducerReplaced;

impl ProducerReplaced {
    pub(crate) fn emit(self, t: &Telemetry) {
        Stats::bump(&t.stats.producer_resets);
        tracing::info!(pipeline = %t.name, "transactional producer replaced");
    }
}

/// Exactly-once: fenced (the coordinator's transaction timeout, or another producer with this
/// transactional id), within the fences tolerated: the producer will be replaced.
pub(crate) struct FencedRecovering<'a> {
    pub(crate) transactional_id: &'a str,
    pub(crate) fences_in_window: usize,
    pub(crate) error: &'a dyn std::fmt::Display,
}

impl FencedRecovering<'_> {
    pub(crate) fn emit(self, t: &Telemetry) {
        Stats::bump(&t.stats.fenced_recoveries);
        tracing::warn!(pipeline = %t.name, transactional_id = self.transactional_id,
            fences_in_window = self.fences_in_window, error = %self.error,
            "fenced: the transaction coordinator aborted this instance's open transaction (it stayed open past \
             transaction_timeout, e.g. the process was paused) or another producer initialised this transactional \
             id; replacing the producer and redoing uncommitted work");
    }
}

/// Exactly-once: transactions stop for good (`error` says why: a fatal producer error, or a
/// transactional id taken back and forth by another live instance).
pub(crate) struct TransactionsStopped<'a> {
    pub(crate) error: &'a dyn std::fmt::Display,
    pub(crate) cause: &'a dyn std::fmt::Display,
}

impl TransactionsStopped<'_> {
    pub(crate) fn emit(self, t: &Telemetry) {
        tracing::error!(pipeline = %t.name, error = %self.cause, "{}: this instance stops committing", self.error);
    }
}

/// A processor call has held its thread (one poll, no await) for at least `at_least`: it cannot
/// be cancelled, and its partition's task is frozen until it returns ([`crate::blocking`]).
pub(crate) struct CallBlocking<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) attempt: u32,
    pub(crate) at_least: Duration,
}

impl CallBlocking<'_> {
    pub(crate) fn emit(self, t: &Telemetry) {
        tracing::error!(
            pipeline = %t.name, topic = %self.topic, partition = self.partition, offset = self.offset,
            attempt = self.attempt, blocked_for = ?self.at_least,
            "processor call blocks its thread (no await): it cannot be cancelled, and its partition waits for it"
        );
    }
}

/// A call reported by [`CallBlocking`] returned from its poll.
pub(crate) struct CallUnblocked<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
}

impl CallUnblocked<'_> {
    pub(crate) fn emit(self, t: &Telemetry) {
        tracing::info!(pipeline = %t.name, topic = %self.topic, partition = self.partition,
            "blocking processor call returned");
    }
}
