//! Exactly-once mode: what completed records of one partition leave for the next transaction.
//!
//! A record's outputs (its emitted records, or its DLQ record) and its dedup key are kept here, by
//! input offset, from the moment the record completes until a transaction takes them. The poll
//! thread takes exactly the entries below the partition's committable offset — the contiguous
//! completed prefix — so an output is never committed without its input's offset, and a record
//! still running (at or above that offset) never has anything in the transaction.
//!
//! Dedup keys stay visible to [`PendingOutputs::has_key`] until the transaction that carries them
//! has settled, so a duplicate arriving meanwhile is recognised although the key is not in the
//! store yet (it is written there only once the transaction commits).

use crate::record::OutputRecord;
use crate::state::backpressure::InFlight;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

/// What one completed record leaves for the transaction.
#[derive(Debug, Default)]
pub(crate) struct Entry {
    pub(crate) outputs: Vec<OutputRecord>,
    pub(crate) dedup_key: Option<Vec<u8>>,
    /// Produce the outputs in a batch of their own (an output of the record was rejected before:
    /// see [`crate::rejected`]).
    pub(crate) alone: bool,
    /// The outputs are the record's DLQ record.
    pub(crate) dead_letter: bool,
}

impl Entry {
    fn bytes(&self) -> u64 {
        self.outputs.iter().map(|o| o.byte_len() as u64).sum()
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Set when the partition's handle is retired: nothing is accepted or read any more.
    closed: bool,
    entries: BTreeMap<i64, Entry>,
    /// Dedup keys of records that completed and whose transaction has not settled yet.
    keys: HashSet<Vec<u8>>,
}

/// One partition's entries awaiting a transaction. Their output bytes count towards the pipeline's
/// buffered-bytes bound, so a backlog of uncommitted outputs throttles polling.
#[derive(Debug)]
pub(crate) struct PendingOutputs {
    inner: Mutex<Inner>,
    /// The pipeline's in-flight counts, which the kept outputs' bytes count into.
    load: Arc<InFlight>,
}

impl PendingOutputs {
    /// Nothing pending yet; kept outputs count into `load`.
    pub(crate) fn new(load: Arc<InFlight>) -> Self {
        Self { inner: Mutex::default(), load }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps a completed record's entry. Dropped (false) when the partition was retired.
    pub(crate) fn push(&self, offset: i64, entry: Entry) -> bool {
        let mut inner = self.lock();
        if inner.closed {
            return false;
        }
        self.load.add(0, entry.bytes());
        if let Some(key) = &entry.dedup_key {
            inner.keys.insert(key.clone());
        }
        inner.entries.insert(offset, entry);
        true
    }

    /// Takes the entries of offsets below `end`, in offset order, with their offsets. Their dedup
    /// keys stay known until [`settle`](Self::settle).
    pub(crate) fn take_below(&self, end: i64) -> Vec<(i64, Entry)> {
        let mut inner = self.lock();
        if inner.closed {
            return Vec::new();
        }
        let rest = inner.entries.split_off(&end);
        let taken = std::mem::replace(&mut inner.entries, rest);
        let entries: Vec<(i64, Entry)> = taken.into_iter().collect();
        self.load.sub(0, entries.iter().map(|(_, e)| e.bytes()).sum());
        entries
    }

    /// Forgets dedup keys whose transaction settled (committed: they are in the store now).
    pub(crate) fn settle<'k>(&self, keys: impl IntoIterator<Item = &'k Vec<u8>>) {
        let mut inner = self.lock();
        for key in keys {
            inner.keys.remove(key);
        }
    }

    /// Whether a record with this dedup key completed here and is not committed yet.
    pub(crate) fn has_key(&self, key: &[u8]) -> bool {
        self.lock().keys.contains(key)
    }

    /// Retires the partition's entries (revoke, abort, shutdown): everything kept is dropped and
    /// later pushes are refused.
    pub(crate) fn discard(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        let entries = std::mem::take(&mut inner.entries);
        self.load.sub(0, entries.values().map(Entry::bytes).sum());
        inner.keys.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(value: &str, key: Option<&str>) -> Entry {
        Entry {
            outputs: vec![OutputRecord::to("out").value(value.as_bytes().to_vec())],
            dedup_key: key.map(|k| k.as_bytes().to_vec()),
            alone: false,
            dead_letter: false,
        }
    }

    #[test]
    fn takes_only_the_completed_prefix_in_offset_order() {
        let load = Arc::new(InFlight::default());
        let p = PendingOutputs::new(load.clone());
        // Completed out of order: 12, 10, 11, 14 (13 still running).
        for (offset, v) in [(12, "c"), (10, "a"), (11, "b"), (14, "e")] {
            assert!(p.push(offset, entry(v, None)));
        }
        assert_eq!(load.bytes(), 4);
        let taken: Vec<_> = p.take_below(13).into_iter().map(|(_, e)| e.outputs[0].value.clone().unwrap()).collect();
        assert_eq!(taken, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(load.bytes(), 1, "14 stays until 13 completes");
        assert!(p.take_below(13).is_empty());
        assert_eq!(p.take_below(15).len(), 1);
        assert_eq!(load.bytes(), 0);
    }

    #[test]
    fn dedup_keys_stay_known_until_settled_and_discard_closes() {
        let load = Arc::new(InFlight::default());
        let p = PendingOutputs::new(load.clone());
        p.push(1, entry("x", Some("k1")));
        assert!(p.has_key(b"k1"));
        let taken = p.take_below(2);
        assert!(p.has_key(b"k1"), "taken but not committed yet");
        p.settle(taken.iter().filter_map(|(_, e)| e.dedup_key.as_ref()));
        assert!(!p.has_key(b"k1"));
        p.push(2, entry("y", Some("k2")));
        p.discard();
        assert!(!p.has_key(b"k2"));
        assert_eq!(load.bytes(), 0);
        assert!(!p.push(3, entry("z", None)), "a retired partition accepts nothing");
        assert_eq!(load.bytes(), 0);
    }
}
