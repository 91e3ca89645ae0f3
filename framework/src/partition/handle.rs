//! The poll thread's side of a partition task, and the one owner of the partition's commit state:
//! the committable offset the task publishes, the offset last committed, where a rewind goes, the
//! idle position, and (exactly-once) the completed records' pending outputs, for one epoch.

use super::Command;
use crate::record::Record;
use crate::state::backpressure::InFlight;
use crate::state::pending::PendingOutputs;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed};
use std::time::Instant;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

const NO_OFFSET: i64 = -1;

/// The poll thread's side of a partition task.
#[derive(Debug)]
pub(crate) struct PartitionHandle {
    pub(crate) topic: Arc<str>,
    pub(crate) partition: i32,
    pub(crate) epoch: u64,
    tx: UnboundedSender<Command>,
    /// Published by the task: the offset to commit, or [`NO_OFFSET`].
    pub(super) committable: AtomicI64,
    /// Records sent to the task and not finished or dropped yet.
    pub(super) buffered: AtomicUsize,
    /// Paused by backpressure (written by the poll thread only).
    paused: AtomicBool,
    /// The last offset committed successfully (poll thread only).
    last_committed: AtomicI64,
    /// The first offset handed to the task (poll thread only): where a rewind goes when nothing was
    /// committed in this epoch.
    first_offset: AtomicI64,
    /// The offset after the last record handed to the task (poll thread only).
    next_sent: AtomicI64,
    /// Set by the poll thread while the partition is caught up: the consumer's position, which
    /// librdkafka moves past transaction markers and aborted records that are never delivered (so
    /// the task never sees them). The committable offset is at least this (see
    /// [`PartitionHandle::advance_idle`]).
    idle_end: AtomicI64,
    /// Exactly-once: completed records' outputs awaiting their transaction.
    pub(crate) pending: PendingOutputs,
    /// The pipeline's in-flight counts ([`crate::state::backpressure`]), which this partition's
    /// buffered records count into.
    load: Arc<InFlight>,
}

impl PartitionHandle {
    /// A handle for one epoch, and the receiving end of its task's commands.
    pub(super) fn new(
        topic: Arc<str>,
        partition: i32,
        epoch: u64,
        load: Arc<InFlight>,
    ) -> (Arc<Self>, UnboundedReceiver<Command>) {
        let (tx, rx) = unbounded_channel();
        let handle = Arc::new(Self {
            topic,
            partition,
            epoch,
            tx,
            committable: AtomicI64::new(NO_OFFSET),
            buffered: AtomicUsize::new(0),
            paused: AtomicBool::new(false),
            last_committed: AtomicI64::new(NO_OFFSET),
            first_offset: AtomicI64::new(NO_OFFSET),
            next_sent: AtomicI64::new(NO_OFFSET),
            idle_end: AtomicI64::new(NO_OFFSET),
            pending: PendingOutputs::new(load.clone()),
            load,
        });
        (handle, rx)
    }

    /// Hands a batch of polled records to the task, counting them in flight. Returns the partition's
    /// buffered count after it.
    pub(crate) fn send(&self, records: Vec<Record>) -> usize {
        let n = records.len();
        if let Some(first) = records.first()
            && self.first_offset.load(Relaxed) == NO_OFFSET
        {
            self.first_offset.store(first.offset, Relaxed);
        }
        if let Some(last) = records.last() {
            self.next_sent.store(last.offset + 1, Relaxed);
        }
        let bytes: u64 = records.iter().map(|r| r.byte_len() as u64).sum();
        let now = self.buffered.fetch_add(n, Relaxed) + n;
        self.load.add(n as u64, bytes);
        if self.tx.send(Command::Records(records)).is_err() {
            // The task has exited: nothing was tracked, so nothing is committed; undo the count.
            self.buffered.fetch_sub(n, Relaxed);
            self.load.sub(n as u64, bytes);
        }
        now
    }

    /// The task finished (or dropped) `records` of `bytes`; returns the partition's buffered count
    /// after it.
    pub(crate) fn release(&self, records: usize, bytes: u64) -> usize {
        self.load.sub(records as u64, bytes);
        self.buffered.fetch_sub(records, Relaxed) - records
    }

    /// Asks the task to stop; [`StopRequest::wait`] waits for it. Ask every task first, then wait, so
    /// that partitions drain in parallel.
    pub(crate) fn stop(&self, finish_queued: bool, deadline: Instant) -> StopRequest {
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        let sent = self.tx.send(Command::Stop { finish_queued, deadline, done }).is_ok();
        StopRequest { wait: sent.then_some(wait), deadline }
    }

    /// The offset to commit (the end of the contiguous completed prefix, or the position the
    /// partition was idle at if that is further), if any.
    pub(crate) fn committable(&self) -> Option<i64> {
        // Acquire pairs with the task's Release in `publish`: the pending outputs of every record
        // below the offset read here are visible too.
        let done = self.committable.load(Acquire).max(self.idle_end.load(Relaxed));
        Some(done).filter(|o| *o != NO_OFFSET)
    }

    /// Whether every record handed to the task so far has completed (none is running, queued or
    /// failed), so that nothing of this partition below the consumer's position is unfinished.
    /// Poll thread only, with every polled record handed over.
    pub(crate) fn caught_up(&self) -> bool {
        let sent = self.next_sent.load(Relaxed);
        self.buffered() == 0 && (sent == NO_OFFSET || self.committable.load(Acquire) == sent)
    }

    /// A caught-up partition's committable offset moves to `position`, the consumer's position
    /// (the offset of the next record poll would return): the offsets between the last record
    /// handed over and it held only transaction markers or aborted records, which are never
    /// delivered, so without this a partition written by a transactional producer never shows lag
    /// 0. Every record polled later has an offset at or above `position`, so the completed
    /// prefix never falls below it. Poll thread only, right after [`caught_up`](Self::caught_up).
    pub(crate) fn advance_idle(&self, position: i64) {
        if self.committable().is_none_or(|c| position > c) {
            self.idle_end.store(position, Relaxed);
        }
    }

    /// Where to seek to redo this epoch's uncommitted work: the last committed offset, else the
    /// first offset the task received.
    pub(crate) fn rewind_target(&self) -> Option<i64> {
        [self.last_committed.load(Relaxed), self.first_offset.load(Relaxed)].into_iter().find(|o| *o != NO_OFFSET)
    }

    /// The committable offset, if it moved since the last successful commit.
    pub(crate) fn commit_candidate(&self) -> Option<i64> {
        self.committable().filter(|c| *c != self.last_committed.load(Relaxed))
    }

    /// The offset last committed in this epoch, if any.
    pub(crate) fn last_committed(&self) -> Option<i64> {
        Some(self.last_committed.load(Relaxed)).filter(|o| *o != NO_OFFSET)
    }

    /// Remembers a successful commit.
    pub(crate) fn set_committed(&self, offset: i64) {
        self.last_committed.store(offset, Relaxed);
    }

    pub(crate) fn buffered(&self) -> usize {
        self.buffered.load(Relaxed)
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(Relaxed)
    }

    pub(crate) fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Relaxed);
    }
}

/// A stop that was asked for.
pub(crate) struct StopRequest {
    wait: Option<std::sync::mpsc::Receiver<bool>>,
    deadline: Instant,
}

impl StopRequest {
    /// Waits until the task is idle or the deadline passed. True if nothing was left running.
    pub(crate) fn wait(self) -> bool {
        let Some(wait) = self.wait else { return true };
        let patience = self.deadline.saturating_duration_since(Instant::now()) + std::time::Duration::from_secs(1);
        wait.recv_timeout(patience).unwrap_or(false)
    }
}
