//! What is known of the records that retry, per owned partition, so that the status page can name
//! the head-of-line blocker: when the record holding a partition's committable prefix back has
//! retried, its key, how many of its attempts failed and the last error stand next to its offset
//! and age. Fed by [`RetryScheduled`](super::events::RetryScheduled) (a slow path: each is followed
//! by a backoff sleep), read on every statistics report, bounded per partition, and pruned as the
//! prefix moves past the records.

use crate::record::Record;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Display;
use std::sync::Arc;

/// Records kept per partition: the lowest offsets (the head of line is the lowest unfinished one).
const PER_PARTITION: usize = 64;
/// Characters kept of a key and of an error message.
const TEXT: usize = 200;

/// A record that has retried, as the status page shows it when it holds its partition back.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Blocker {
    pub(crate) offset: i64,
    /// The key as text (UTF-8), else as hex; cut at 200 characters.
    pub(crate) key: Option<String>,
    /// Attempts that failed so far (it is in its backoff, or in its next attempt).
    pub(crate) failed_attempts: u32,
    /// The last attempt's error, cut at 200 characters.
    pub(crate) last_error: String,
}

/// The retrying records of every partition, by topic, partition and offset.
#[derive(Debug, Default)]
pub(crate) struct Retrying(HashMap<Arc<str>, HashMap<i32, BTreeMap<i64, Blocker>>>);

impl Retrying {
    /// `record`'s attempt `attempt` failed with `error` and will be retried.
    pub(crate) fn note(&mut self, record: &Record, attempt: u32, error: &dyn Display) {
        let entries = self.0.entry(record.topic.clone()).or_default().entry(record.partition).or_default();
        let key = record.key.as_deref().map(|k| match std::str::from_utf8(k) {
            Ok(text) => cut(text),
            Err(_) => cut(&k.iter().map(|b| format!("{b:02x}")).collect::<String>()),
        });
        let last_error = cut(&error.to_string());
        entries.insert(record.offset, Blocker { offset: record.offset, key, failed_attempts: attempt, last_error });
        if entries.len() > PER_PARTITION {
            entries.pop_last();
        }
    }

    /// The retrying record at `head` (the partition's lowest unfinished offset), if it retried;
    /// forgets the records below it, which have finished.
    pub(crate) fn at(&mut self, topic: &str, partition: i32, head: i64) -> Option<Blocker> {
        let entries = self.0.get_mut(topic)?.get_mut(&partition)?;
        *entries = entries.split_off(&head);
        entries.get(&head).cloned()
    }

    /// Forgets a partition (no longer owned, or owned in a new epoch).
    pub(crate) fn forget(&mut self, topic: &str, partition: i32) {
        if let Some(partitions) = self.0.get_mut(topic) {
            partitions.remove(&partition);
            if partitions.is_empty() {
                self.0.remove(topic);
            }
        }
    }
}

fn cut(text: &str) -> String {
    text.chars().take(TEXT).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(offset: i64, key: &[u8]) -> Record {
        Record {
            topic: "t".into(),
            partition: 0,
            offset,
            timestamp: None,
            key: Some(key.to_vec()),
            value: None,
            headers: Default::default(),
        }
    }

    #[test]
    fn the_head_is_named_and_finished_records_are_forgotten() {
        let mut r = Retrying::default();
        r.note(&rec(5, b"a"), 1, &"down");
        r.note(&rec(5, b"a"), 2, &"still down");
        r.note(&rec(9, &[0xff, 0x01]), 1, &"x");
        let head = r.at("t", 0, 5).expect("5 retried");
        assert_eq!((head.key.as_deref(), head.failed_attempts, head.last_error.as_str()), (Some("a"), 2, "still down"));
        assert_eq!(r.at("t", 0, 7), None, "7 never retried");
        assert_eq!(r.at("t", 0, 5), None, "5 was forgotten once the head moved past it");
        assert_eq!(r.at("t", 0, 9).and_then(|b| b.key), Some("ff01".into()), "a binary key shows as hex");
        r.forget("t", 0);
        assert_eq!(r.at("t", 0, 9), None);
    }

    #[test]
    fn it_keeps_the_lowest_offsets_of_a_partition() {
        let mut r = Retrying::default();
        for offset in (0..200).rev() {
            r.note(&rec(offset, b"k"), 1, &"e");
        }
        assert!(r.at("t", 0, 0).is_some());
        assert_eq!(r.0["t"][&0].len(), PER_PARTITION);
        assert_eq!(r.0["t"][&0].last_key_value().map(|(o, _)| *o), Some(PER_PARTITION as i64 - 1));
    }
}
