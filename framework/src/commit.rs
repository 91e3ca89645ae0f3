//! The one owner of every commit: periodic (the poll loop, every `commit_interval`), on revoke, on
//! shutdown, and what lost partitions and an error stop leave behind. The delivery mode is chosen
//! once, when the pipeline is built ([`Committer::Offsets`] or [`Committer::Transactions`]); callers
//! do not test it.
//!
//! What is safe to commit is each partition's business ([`PartitionHandle`]: its completed prefix,
//! the offset last committed, its pending outputs, its epoch and rewind target); this module decides
//! when and how it reaches the group coordinator:
//! - at-least-once: the completed prefixes as plain offset commits, asynchronous while running
//!   (a failed one is committed again at the next tick) and synchronous when partitions are
//!   released (I2, I5);
//! - exactly-once: the open Kafka transaction with the partitions' outputs and offsets
//!   ([`Transactions`]); released partitions' pending outputs are dropped once their transaction
//!   ended, and a transaction aborted inside a rebalance callback leaves the partitions it carried
//!   for the poll thread to rewind.

use crate::partition::PartitionHandle;
use crate::telemetry::Telemetry;
use crate::telemetry::events::CommitEnded;
use crate::transaction::{Transactions, TxnOutcome};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Instant;

/// How the pipeline commits: chosen at construction.
pub(crate) enum Committer {
    /// At-least-once: the completed prefixes as consumer offset commits.
    Offsets(OffsetCommits),
    /// Exactly-once: the completed prefixes and their outputs in one Kafka transaction.
    Transactions(Arc<Transactions>),
}

/// At-least-once commit state.
#[derive(Default)]
pub(crate) struct OffsetCommits {
    /// Set when an asynchronous commit failed, so the next tick commits every partition again.
    recommit: AtomicBool,
}

impl Committer {
    /// At-least-once.
    pub(crate) fn offsets() -> Self {
        Self::Offsets(OffsetCommits::default())
    }

    /// The transactions of exactly-once mode, if that is the mode.
    pub(crate) fn transactions(&self) -> Option<&Arc<Transactions>> {
        match self {
            Self::Transactions(txn) => Some(txn),
            Self::Offsets(_) => None,
        }
    }

    /// Periodic commit of the owned partitions `handles` (poll thread). At-least-once commits every
    /// partition whose completed prefix moved (all of them with `refresh`, or after a failed
    /// commit), asynchronously; exactly-once commits the open transaction.
    pub(crate) fn progress<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        handles: &[Arc<PartitionHandle>],
        refresh: bool,
        telemetry: &Telemetry,
    ) -> TxnOutcome {
        let offsets = match self {
            Self::Transactions(txn) => return txn.commit(consumer, handles),
            Self::Offsets(o) => o,
        };
        let force = offsets.recommit.swap(false, Relaxed) | refresh;
        let mut tpl = TopicPartitionList::new();
        let mut moved = Vec::new();
        for h in handles {
            let candidate = if force { h.committable() } else { h.commit_candidate() };
            if let Some(offset) = candidate {
                let _ = tpl.add_partition_offset(&h.topic, h.partition, Offset::Offset(offset));
                moved.push((h, offset));
            }
        }
        if moved.is_empty() {
            return TxnOutcome::Idle;
        }
        if commit_now(consumer, &tpl, CommitMode::Async, telemetry) {
            for (h, offset) in moved {
                h.set_committed(offset);
            }
        } else {
            offsets.recommit.store(true, Relaxed);
        }
        TxnOutcome::Committed
    }

    /// Commits what released partitions completed (revoke after the drain, or shutdown), and only
    /// then lets them go: synchronously (at-least-once), or in a transaction (exactly-once; if it
    /// aborts, their uncommitted work is redone by the next owner, and partitions still owned that
    /// were in it are left for the poll thread to rewind).
    pub(crate) fn released<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        handles: &[Arc<PartitionHandle>],
        telemetry: &Telemetry,
    ) {
        match self {
            Self::Transactions(txn) => {
                if let TxnOutcome::Aborted(carried) = txn.commit(consumer, handles) {
                    tracing::warn!(pipeline = %telemetry.name, "transaction of released partitions aborted; their uncommitted work will be redone");
                    txn.defer_rewind(carried);
                }
                discard_pending(handles);
            }
            Self::Offsets(_) => {
                let mut tpl = TopicPartitionList::new();
                for h in handles {
                    if let Some(offset) = h.committable() {
                        let _ = tpl.add_partition_offset(&h.topic, h.partition, Offset::Offset(offset));
                    }
                }
                commit_now(consumer, &tpl, CommitMode::Sync, telemetry);
            }
        }
    }

    /// Partitions lost (session expired: another member owns them): nothing of theirs is
    /// committed. Exactly-once: an open transaction holding their outputs aborts, and the
    /// partitions still owned that were in it are left for the poll thread to rewind.
    pub(crate) fn lost(&self, handles: &[Arc<PartitionHandle>]) {
        if let Self::Transactions(txn) = self {
            if let TxnOutcome::Aborted(carried) = txn.drop_partitions(handles) {
                txn.defer_rewind(carried);
            }
            discard_pending(handles);
        }
    }

    /// Stopping on an error: nothing more is committed; exactly-once drops the pending outputs.
    pub(crate) fn abandon(&self, handles: &[Arc<PartitionHandle>]) {
        if self.transactions().is_some() {
            discard_pending(handles);
        }
    }

    /// An asynchronous offset commit failed (the consumer's commit callback): commit again.
    pub(crate) fn async_commit_failed(&self) {
        if let Self::Offsets(o) = self {
            o.recommit.store(true, Relaxed);
        }
    }
}

/// Drops the pending outputs of partitions given up (exactly-once).
fn discard_pending(handles: &[Arc<PartitionHandle>]) {
    for h in handles {
        h.pending.discard();
    }
}

/// Commits `tpl` (if not empty), counting the outcome.
fn commit_now<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    tpl: &TopicPartitionList,
    mode: CommitMode,
    telemetry: &Telemetry,
) -> bool {
    if tpl.count() == 0 {
        return true;
    }
    let started = Instant::now();
    let result = consumer.commit(tpl, mode);
    let error = result.as_ref().err().map(|e| e as &dyn std::fmt::Display);
    CommitEnded { took: started.elapsed(), error }.emit(telemetry);
    result.is_ok()
}
