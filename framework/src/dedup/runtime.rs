//! The dedup store's run-time state, shared by the pipeline's tasks: the configuration, the local
//! store, the keys in flight, and how far each partition's changelog is applied locally. Writing
//! and restoring the changelog is [`crate::dedup::changelog`]'s.

use crate::dedup::entries;
use crate::dedup::group_commit::GroupCommit;
use crate::dedup::store::DedupStore;
use crate::dedup::{DedupConfig, InFlightKeys, changelog_topic};
use crate::record::OutputRecord;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// Header naming the source topic of a changelog entry.
pub const SOURCE_TOPIC_HEADER: &str = "millrace.source-topic";

/// Everything dedup needs at run time.
pub(crate) struct Dedup {
    pub(crate) config: DedupConfig,
    pub(crate) store: DedupStore,
    pub(crate) in_flight: Arc<InFlightKeys>,
    pub(crate) changelog: String,
    /// Whether the changelog topic was created (or found) in this run.
    pub(crate) changelog_ready: AtomicBool,
    /// Whether the first record keyed by its coordinates (the fallback) was warned about.
    pub(crate) fallback_warned: AtomicBool,
    /// Per topic-partition: the next changelog offset known to be applied locally, and how many
    /// writes happened since it was last saved. Saved every [`SAVE_POSITION_EVERY`] writes and when
    /// the partition stops: a stale saved position only makes a restore re-apply entries, which is
    /// harmless.
    positions: Mutex<HashMap<(String, i32), (i64, u32)>>,
    /// At-least-once: the keys waiting for their partition's next changelog batch.
    pub(crate) group_commit: GroupCommit,
}

/// Changelog batches written between two saves of the changelog position.
const SAVE_POSITION_EVERY: u32 = 100;

impl Dedup {
    /// Notes that the changelog of `topic`/`partition` is applied up to `next`; saves it now and
    /// then.
    pub(crate) fn note_position(&self, topic: &str, partition: i32, next: i64) -> Result<(), String> {
        let save = {
            let mut positions = self.positions.lock().unwrap_or_else(|p| p.into_inner());
            let (pos, unsaved) = positions.entry((topic.to_owned(), partition)).or_insert((0, 0));
            *pos = (*pos).max(next);
            *unsaved += 1;
            (*unsaved >= SAVE_POSITION_EVERY).then(|| {
                *unsaved = 0;
                *pos
            })
        };
        match save {
            Some(next) => self.save_position(topic, partition, next),
            None => Ok(()),
        }
    }

    fn save_position(&self, topic: &str, partition: i32, next: i64) -> Result<(), String> {
        self.store.partition(topic, partition).and_then(|p| p.set_changelog_position(next)).map_err(|e| e.to_string())
    }

    /// Saves the partition's changelog position (when the partition stops).
    pub(crate) fn save_position_of(&self, topic: &str, partition: i32) {
        let pending = self.positions.lock().unwrap_or_else(|p| p.into_inner()).remove(&(topic.to_owned(), partition));
        if let Some((next, unsaved)) = pending
            && unsaved > 0
            && let Err(e) = self.save_position(topic, partition, next)
        {
            tracing::warn!(topic, partition, error = %e, "saving the dedup changelog position failed");
        }
    }

    /// The changelog records of `keys` (`(key, first seen)` pairs) recorded for `topic`/`partition`:
    /// batches of them (see [`crate::dedup::entries`]).
    pub(crate) fn changelog_batches<'k>(
        &self,
        topic: &str,
        partition: i32,
        keys: impl IntoIterator<Item = (&'k [u8], i64)>,
    ) -> Vec<OutputRecord> {
        entries::encode(keys)
            .into_iter()
            .map(|value| {
                OutputRecord::to(&self.changelog)
                    .partition(partition)
                    .key(entries::batch_key())
                    .value(value)
                    .header(SOURCE_TOPIC_HEADER, topic.as_bytes().to_vec())
            })
            .collect()
    }

    /// Exactly-once: records the keys of a committed transaction in the local store, in one write;
    /// `partitions` gives each partition's `(key, first seen)` pairs.
    pub(crate) fn record_committed<'k, K>(
        &self,
        partitions: impl IntoIterator<Item = (&'k str, i32, K)>,
    ) -> Result<(), crate::dedup::store::DedupError>
    where
        K: IntoIterator<Item = (&'k [u8], i64)>,
    {
        let mut batch = self.store.batch();
        for (topic, partition, keys) in partitions {
            let part = self.store.partition(topic, partition)?;
            for (key, at) in keys {
                batch.record(&part, key, at);
            }
        }
        batch.write()
    }

    pub(crate) fn open(config: DedupConfig, group: &str) -> Result<Self, crate::dedup::store::DedupError> {
        let store = DedupStore::open(&config.dir, config.ttl, config.sync_writes)?;
        Ok(Self {
            changelog: changelog_topic(group),
            config,
            store,
            in_flight: Arc::default(),
            changelog_ready: AtomicBool::new(false),
            fallback_warned: AtomicBool::new(false),
            positions: Mutex::default(),
            group_commit: GroupCommit::default(),
        })
    }
}
