//! Key parking ([`DlqConfig::park_keys`](crate::DlqConfig::park_keys)): once a record of key K fails
//! for good, K's later records in its partition are dead-lettered behind it (kind `parked`) instead
//! of running, until K is released, so that K's effects never happen out of order.
//!
//! Each partition task owns its partition's [`ParkedKeys`] (restored from the parked-keys topic,
//! `store`, before the partition's first record) and decides, when it starts a record, what the
//! record is to the parking ([`ParkedKeys::decide`]). A key's records start one at a time in offset
//! order, and a parking change is applied before the key's next record starts, so a decision
//! always sees every earlier record's change. The change is made durable before the record's offset
//! completes (at-least-once: acknowledged; exactly-once: in the record's transaction) by the park
//! layer.
//!
//! A key is released when the replay of its blocking record (a record whose
//! [`REPLAY_OF`](crate::dlq::headers::REPLAY_OF) names the blocking record) is processed, or by a
//! release marker (a record with [`CONTROL`](crate::dlq::headers::CONTROL) `release`, produced by
//! `millrace dlq release`, naming the parking it releases). A replayed blocking record that fails
//! again parks the key behind itself.

pub(crate) mod store;

pub use store::{entry_key, read_entry, topic_for_group};

use crate::dlq::{Coordinates, headers};
use crate::record::Record;
use rustc_hash::FxHashMap;

/// The value of [`headers::CONTROL`] on a release marker.
pub const RELEASE: &str = "release";

/// What a record is to the parking, decided when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Parking is off, or the record has no key: it runs as usual.
    Off,
    /// Its key is not parked: it runs; a failure for good parks the key when there is `room`.
    Run {
        /// The partition holds fewer than `max_parked_keys`.
        room: bool,
    },
    /// Its key's blocking record, replayed (or redelivered): it runs; processed, it releases the
    /// key; failed again, it parks the key behind itself.
    RunBlocking,
    /// Its key is parked behind the record at `blocking`: dead-lettered as `parked`, not run.
    Park {
        /// Offset of the blocking record in this partition.
        blocking: i64,
    },
    /// A Millrace control record: never run; releases its key when `releases`.
    Control {
        /// It is a release marker for the key's current parking.
        releases: bool,
    },
}

/// How a finished record changes its key's parking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// The key is parked behind the record at this offset (now, or instead of before).
    Park(i64),
    /// The key is released.
    Release,
}

/// The parked keys of one partition: key → offset of its blocking record.
#[derive(Debug, Default)]
pub(crate) struct ParkedKeys {
    keys: FxHashMap<Vec<u8>, i64>,
    max: usize,
}

impl ParkedKeys {
    /// No key parked, at most `max`.
    pub(crate) fn new(max: usize) -> Self {
        Self { keys: FxHashMap::default(), max }
    }

    /// Keys parked now.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Where `key` is parked, if it is.
    pub(crate) fn blocking(&self, key: &[u8]) -> Option<i64> {
        self.keys.get(key).copied()
    }

    /// Applies a change to `key` (restored, or made by a finished record).
    pub(crate) fn apply(&mut self, key: &[u8], change: Change) {
        match change {
            Change::Park(at) => {
                self.keys.insert(key.to_vec(), at);
            }
            Change::Release => {
                self.keys.remove(key);
            }
        }
    }

    /// What `record` (of this task's `topic`/`partition`) is to the parking.
    pub(crate) fn decide(&self, topic: &str, partition: i32, record: &Record) -> Decision {
        let here = |c: &Coordinates| c.topic == topic && c.partition == partition;
        if let Some(control) = record.headers.get(headers::CONTROL) {
            let marker = control == RELEASE.as_bytes();
            let names = Coordinates::from_header(&record.headers, headers::PARKED_BY);
            let current = record.key.as_deref().and_then(|k| self.blocking(k));
            let releases = marker && matches!((&names, current), (Some(c), Some(at)) if here(c) && c.offset == at);
            return Decision::Control { releases };
        }
        let Some(key) = record.key.as_deref() else { return Decision::Off };
        if self.max == 0 {
            return Decision::Off;
        }
        match self.blocking(key) {
            None => Decision::Run { room: self.keys.len() < self.max },
            // A record before the blocking one, redelivered (a crash before their offsets were
            // committed): it ran before the failure and runs again, as it would have without the
            // parking (the key is in the set already, so there is room to park it again).
            Some(at) if record.offset < at => Decision::Run { room: true },
            // The blocking record itself, redelivered: it runs again too.
            Some(at) if record.offset == at => Decision::RunBlocking,
            Some(at) => {
                let of = Coordinates::from_header(&record.headers, headers::REPLAY_OF);
                match of {
                    Some(c) if here(&c) && c.offset == at => Decision::RunBlocking,
                    _ => Decision::Park { blocking: at },
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: i64, key: Option<&str>, extra: &[(&str, &str)]) -> Record {
        let mut r = Record {
            topic: "t".into(),
            partition: 2,
            offset,
            timestamp: None,
            key: key.map(|k| k.as_bytes().to_vec()),
            value: Some(b"v".to_vec()),
            headers: Default::default(),
        };
        for (name, value) in extra {
            r.headers.push(*name, *value);
        }
        r
    }

    #[test]
    fn a_parked_key_holds_its_records_until_its_blocking_record_is_replayed() {
        let mut parked = ParkedKeys::new(2);
        assert_eq!(parked.decide("t", 2, &record(9, Some("k"), &[])), Decision::Run { room: true });
        parked.apply(b"k", Change::Park(10));
        assert_eq!(parked.decide("t", 2, &record(11, Some("k"), &[])), Decision::Park { blocking: 10 });
        assert_eq!(parked.decide("t", 2, &record(12, Some("other"), &[])), Decision::Run { room: true });
        assert_eq!(parked.decide("t", 2, &record(13, None, &[])), Decision::Off, "no key, nothing to park");
        // A replay of another record of the key, or of the same offset elsewhere, stays parked.
        let of = |c: &str| record(50, Some("k"), &[(headers::REPLAY_OF, c)]);
        assert_eq!(parked.decide("t", 2, &of("t/2/11")), Decision::Park { blocking: 10 });
        assert_eq!(parked.decide("t", 2, &of("t/1/10")), Decision::Park { blocking: 10 });
        assert_eq!(parked.decide("t", 2, &of("t/2/10")), Decision::RunBlocking);
        assert_eq!(parked.decide("t", 2, &record(10, Some("k"), &[])), Decision::RunBlocking, "redelivered");
        assert_eq!(parked.decide("t", 2, &record(9, Some("k"), &[])), Decision::Run { room: true }, "before it");
        parked.apply(b"j", Change::Park(3));
        assert_eq!(parked.decide("t", 2, &record(14, Some("new"), &[])), Decision::Run { room: false }, "at the bound");
        parked.apply(b"k", Change::Release);
        assert_eq!((parked.len(), parked.blocking(b"k")), (1, None));
    }

    #[test]
    fn a_release_marker_releases_only_the_parking_it_names_and_never_runs() {
        let mut parked = ParkedKeys::new(10);
        parked.apply(b"k", Change::Park(10));
        let marker = |by: &str| record(60, Some("k"), &[(headers::CONTROL, RELEASE), (headers::PARKED_BY, by)]);
        assert_eq!(parked.decide("t", 2, &marker("t/2/10")), Decision::Control { releases: true });
        assert_eq!(parked.decide("t", 2, &marker("t/2/9")), Decision::Control { releases: false }, "an older parking");
        let unknown = record(61, Some("k"), &[(headers::CONTROL, "other")]);
        assert_eq!(parked.decide("t", 2, &unknown), Decision::Control { releases: false });
        assert_eq!(ParkedKeys::new(10).decide("t", 2, &marker("t/2/10")), Decision::Control { releases: false });
    }
}
