//! One owned partition, run by one task for one assignment epoch: [`PartitionHandle`] (`handle`),
//! the poll thread's side and the one owner of the partition's commit state, and the task (`task`).
//!
//!
//! The poll thread sends the partition's records in batches to its task; the task alone owns the
//! partition's [`OffsetTracker`] and key lanes, so nothing on the per-record path takes a lock. A lane
//! is present while one of its records is being processed; later records of the same lane wait in
//! its queue (I3). Processing futures of all lanes run concurrently inside the task, bounded by the
//! pipeline's concurrency semaphore. After every completion the task publishes the committable offset
//! in an atomic that the poll thread reads when it commits.
//!
//! A task stops on [`Command::Stop`]: on revoke it drops queued records and waits for running ones,
//! on shutdown it first finishes queued records too; either way until a deadline. At the deadline
//! the poll thread commits what completed, and calls still inside the processor are cancelled
//! (`ctx.cancelled()` fires with reason revoked or shutdown), given `cancel_grace`, then dropped;
//! whatever they return is ignored, and nothing reads this task's offsets any more: the handle was
//! removed from the assignment, so no later completion is committed (I5). A call that blocks its
//! thread cannot be dropped; the poll thread stops waiting for it one second past the deadline.

mod handle;
mod task;

pub(crate) use handle::PartitionHandle;
pub(crate) use task::start;

use crate::config::ProcessingOrder;
use crate::record::Record;
use rustc_hash::FxBuildHasher;
use std::hash::BuildHasher;
use std::time::Instant;

/// Which records must run one after another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum LaneId {
    /// The whole partition (Partition mode, and null keys in Key mode).
    Partition,
    /// All records whose key hashes to this value (a collision only serialises two keys).
    Key(u64),
    /// A single record (Unordered mode).
    Record(i64),
}

impl LaneId {
    pub(crate) fn of(ordering: ProcessingOrder, record: &Record) -> Self {
        match (ordering, &record.key) {
            (ProcessingOrder::Key, Some(key)) => LaneId::Key(FxBuildHasher.hash_one(key)),
            (ProcessingOrder::Key, None) | (ProcessingOrder::Partition, _) => LaneId::Partition,
            (ProcessingOrder::Unordered, _) => LaneId::Record(record.offset),
        }
    }
}

/// Orders from the poll thread to a partition task.
pub(crate) enum Command {
    /// Newly polled records, in offset order.
    Records(Vec<Record>),
    /// Stop: `finish_queued` decides whether queued records still run (shutdown) or are dropped
    /// (revoke). `done` is signalled when nothing runs any more or `deadline` passed.
    Stop { finish_queued: bool, deadline: Instant, done: std::sync::mpsc::SyncSender<bool> },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(offset: i64, key: Option<&str>) -> Record {
        Record {
            topic: "t".into(),
            partition: 0,
            offset,
            timestamp: None,
            key: key.map(|k| k.as_bytes().to_vec()),
            value: None,
            headers: Default::default(),
        }
    }

    #[test]
    fn lanes_follow_the_ordering_mode() {
        let (a0, a1, b, null) = (rec(0, Some("a")), rec(1, Some("a")), rec(2, Some("b")), rec(3, None));
        let key = |r| LaneId::of(ProcessingOrder::Key, r);
        assert_eq!(key(&a0), key(&a1), "same key, same lane");
        assert_ne!(key(&a0), key(&b), "different keys run concurrently");
        assert_eq!(key(&null), LaneId::Partition, "null keys are ordered by partition");
        assert_eq!(LaneId::of(ProcessingOrder::Partition, &a0), LaneId::of(ProcessingOrder::Partition, &b));
        assert_ne!(LaneId::of(ProcessingOrder::Unordered, &a0), LaneId::of(ProcessingOrder::Unordered, &a1));
    }
}
