//! One owned partition: its offset tracker, its key lanes and its in-flight accounting.
//!
//! A [`PartitionHandle`] lives for one assignment (one epoch). When the partition is revoked the
//! handle is marked so; workers still holding it finish their current record but the result is
//! never committed, because the poll thread only commits through handles it still owns (I5).

use crate::config::Ordering;
use crate::offsets::OffsetTracker;
use crate::record::Record;
use crate::stats::Stats;
use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
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
    pub(crate) fn of(ordering: Ordering, record: &Record) -> Self {
        match (ordering, &record.key) {
            (Ordering::Key, Some(key)) => {
                let mut h = DefaultHasher::new();
                key.hash(&mut h);
                LaneId::Key(h.finish())
            }
            (Ordering::Key, None) | (Ordering::Partition, _) => LaneId::Partition,
            (Ordering::Unordered, _) => LaneId::Record(record.offset),
        }
    }
}

/// What the poll thread must do with a freshly polled record.
pub(crate) enum Admit {
    /// The lane was idle: start a worker with this record.
    Spawn(Record),
    /// The lane already has a worker; the record waits in its queue.
    Queued,
    /// The handle was revoked or the offset was already tracked; nothing to do.
    Ignored,
}

#[derive(Debug, Default)]
struct State {
    tracker: OffsetTracker,
    /// A lane is present exactly while a worker task serves it; the queue holds its waiting records.
    lanes: HashMap<LaneId, VecDeque<Record>>,
    buffered: usize,
    running: usize,
    revoked: bool,
    paused: bool,
    last_committed: Option<i64>,
}

/// The state of one partition for one assignment epoch.
#[derive(Debug)]
pub(crate) struct PartitionHandle {
    pub(crate) topic: Arc<str>,
    pub(crate) partition: i32,
    pub(crate) epoch: u64,
    state: Mutex<State>,
    idle: Condvar,
}

impl PartitionHandle {
    pub(crate) fn new(topic: Arc<str>, partition: i32, epoch: u64) -> Self {
        Self { topic, partition, epoch, state: Mutex::default(), idle: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Tracks a polled record and routes it to its lane. Returns the buffered count after admission.
    pub(crate) fn admit(&self, record: Record, lane: LaneId, stats: &Stats) -> (Admit, usize) {
        let mut st = self.lock();
        if st.revoked || !st.tracker.track(record.offset) {
            return (Admit::Ignored, st.buffered);
        }
        st.buffered += 1;
        stats.add_in_flight(1, record.byte_len() as u64);
        let admit = match st.lanes.entry(lane) {
            Entry::Occupied(mut queue) => {
                queue.get_mut().push_back(record);
                Admit::Queued
            }
            Entry::Vacant(slot) => {
                slot.insert(VecDeque::new());
                Admit::Spawn(record)
            }
        };
        (admit, st.buffered)
    }

    /// Called by a worker before running `record`. False when the partition was revoked meanwhile: the
    /// record is then dropped uncommitted and the worker must stop.
    pub(crate) fn start(&self, record: &Record, lane: LaneId, stats: &Stats) -> bool {
        let mut st = self.lock();
        if st.revoked {
            self.release(&mut st, record, stats);
            st.lanes.remove(&lane);
            self.idle.notify_all();
            return false;
        }
        st.running += 1;
        stats.started();
        true
    }

    /// Called by a worker after running `record`. Completes its offset when `succeeded` (a failed
    /// record stays incomplete, so the commit never passes it) and hands back the lane's next record.
    pub(crate) fn finish(&self, record: &Record, lane: LaneId, succeeded: bool, stats: &Stats) -> Finished {
        let mut st = self.lock();
        st.running -= 1;
        stats.running.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        if succeeded {
            st.tracker.complete(record.offset);
        }
        self.release(&mut st, record, stats);
        let next = if st.revoked { None } else { st.lanes.get_mut(&lane).and_then(VecDeque::pop_front) };
        if next.is_none() {
            st.lanes.remove(&lane);
        }
        if st.running == 0 {
            self.idle.notify_all();
        }
        Finished { next, paused: st.paused, buffered: st.buffered }
    }

    fn release(&self, st: &mut State, record: &Record, stats: &Stats) {
        st.buffered -= 1;
        stats.sub_in_flight(1, record.byte_len() as u64);
    }

    /// Marks the handle revoked and drops every queued (not yet started) record. Returns how many were
    /// dropped; they stay uncommitted and will be redelivered to the next owner.
    pub(crate) fn revoke(&self, stats: &Stats) -> usize {
        let mut st = self.lock();
        st.revoked = true;
        let mut dropped = 0;
        let mut bytes = 0u64;
        for queue in st.lanes.values_mut() {
            dropped += queue.len();
            bytes += queue.drain(..).map(|r| r.byte_len() as u64).sum::<u64>();
        }
        st.buffered -= dropped;
        stats.sub_in_flight(dropped as u64, bytes);
        dropped
    }

    /// Waits until no record of this handle is running, or until `deadline`. True if idle.
    pub(crate) fn wait_idle(&self, deadline: Instant) -> bool {
        let mut st = self.lock();
        while st.running > 0 {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            st = match self.idle.wait_timeout(st, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        true
    }

    /// The committable offset, if it moved since the last successful commit.
    pub(crate) fn commit_candidate(&self) -> Option<i64> {
        let st = self.lock();
        st.tracker.committable().filter(|c| st.last_committed != Some(*c))
    }

    /// The committable offset, whether or not it moved.
    pub(crate) fn committable(&self) -> Option<i64> {
        self.lock().tracker.committable()
    }

    /// Remembers that `offset` was committed (or forgets it after a failed commit with `None`).
    pub(crate) fn set_committed(&self, offset: Option<i64>) {
        self.lock().last_committed = offset;
    }

    /// Records that are buffered or running.
    pub(crate) fn buffered(&self) -> usize {
        self.lock().buffered
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.lock().paused
    }

    pub(crate) fn set_paused(&self, paused: bool) {
        self.lock().paused = paused;
    }
}

/// What a worker learns when it finishes a record.
pub(crate) struct Finished {
    /// The next record of its lane, if any.
    pub(crate) next: Option<Record>,
    /// Whether the partition is paused by backpressure.
    pub(crate) paused: bool,
    /// Records still buffered in the partition.
    pub(crate) buffered: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(offset: i64, key: &str) -> Record {
        Record {
            topic: "t".into(),
            partition: 0,
            offset,
            timestamp: None,
            key: Some(key.as_bytes().to_vec()),
            value: None,
            headers: Default::default(),
        }
    }

    #[test]
    fn same_key_queues_behind_running_record() {
        let stats = Stats::default();
        let h = PartitionHandle::new("t".into(), 0, 1);
        let lane_a = LaneId::of(Ordering::Key, &rec(0, "a"));
        let (first, _) = h.admit(rec(0, "a"), lane_a, &stats);
        let Admit::Spawn(first) = first else { panic!("first record must start a worker") };
        assert!(matches!(h.admit(rec(1, "a"), lane_a, &stats).0, Admit::Queued));
        let lane_b = LaneId::of(Ordering::Key, &rec(2, "b"));
        assert!(matches!(h.admit(rec(2, "b"), lane_b, &stats).0, Admit::Spawn(_)));

        assert!(h.start(&first, lane_a, &stats));
        let done = h.finish(&first, lane_a, true, &stats);
        assert_eq!(done.next.map(|r| r.offset), Some(1));
        assert_eq!(h.committable(), Some(1));
        assert_eq!(stats.snapshot().in_flight, 2);
    }

    #[test]
    fn revoke_drops_queued_and_stops_workers() {
        let stats = Stats::default();
        let h = PartitionHandle::new("t".into(), 0, 1);
        let lane = LaneId::Partition;
        let Admit::Spawn(first) = h.admit(rec(0, "a"), lane, &stats).0 else { panic!() };
        h.admit(rec(1, "a"), lane, &stats);
        h.admit(rec(2, "a"), lane, &stats);
        assert!(h.start(&first, lane, &stats));
        assert_eq!(h.revoke(&stats), 2);
        let done = h.finish(&first, lane, true, &stats);
        assert!(done.next.is_none(), "a revoked partition hands out no more work");
        assert_eq!(stats.snapshot().in_flight, 0);
        assert!(h.wait_idle(Instant::now()));
        assert!(matches!(h.admit(rec(3, "a"), lane, &stats).0, Admit::Ignored));
    }

    #[test]
    fn failed_record_blocks_the_commit() {
        let stats = Stats::default();
        let h = PartitionHandle::new("t".into(), 0, 1);
        let Admit::Spawn(r0) = h.admit(rec(0, "a"), LaneId::Record(0), &stats).0 else { panic!() };
        let Admit::Spawn(r1) = h.admit(rec(1, "b"), LaneId::Record(1), &stats).0 else { panic!() };
        h.start(&r0, LaneId::Record(0), &stats);
        h.start(&r1, LaneId::Record(1), &stats);
        h.finish(&r1, LaneId::Record(1), true, &stats);
        h.finish(&r0, LaneId::Record(0), false, &stats);
        assert_eq!(h.committable(), Some(0));
    }
}
