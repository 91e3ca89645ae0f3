//! The dedup store's API in a build without the `rocksdb` feature: [`DedupStore::open`] fails with
//! [`DedupError::NotBuilt`], so a pipeline configured with [`DedupConfig`](crate::DedupConfig)
//! refuses to start and says which feature to turn on. Everything else builds as usual; leaving
//! RocksDB's C++ out shortens a first build by minutes (see the README, Quick start).

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Errors of the dedup store.
#[derive(Debug, thiserror::Error)]
pub enum DedupError {
    /// This build of millrace has no dedup store.
    #[error(
        "dedup store at {dir}: millrace was built without its `rocksdb` feature (on by default); \
         depend on millrace with `features = [\"rocksdb\"]` to use DedupConfig"
    )]
    NotBuilt {
        /// The store's directory.
        dir: PathBuf,
    },
}

/// Processed idempotency keys, by topic-partition (absent from this build).
#[derive(Debug)]
pub struct DedupStore {
    never: Infallible,
}

impl DedupStore {
    /// Fails: this build has no RocksDB.
    pub fn open(dir: &Path, _ttl: Duration, _sync_writes: bool) -> Result<Self, DedupError> {
        Err(DedupError::NotBuilt { dir: dir.into() })
    }

    /// Whether the store had to start over (never called: no store opens).
    pub fn was_rebuilt(&self) -> bool {
        match self.never {}
    }

    /// The store of one topic-partition.
    pub fn partition(&self, _topic: &str, _partition: i32) -> Result<PartitionStore<'_>, DedupError> {
        match self.never {}
    }

    /// Records written together.
    pub fn batch(&self) -> RecordBatch<'_> {
        match self.never {}
    }

    /// Runs a full compaction.
    pub fn compact(&self, _topic: &str, _partition: i32) -> Result<(), DedupError> {
        match self.never {}
    }
}

/// The dedup entries of one topic-partition.
pub struct PartitionStore<'a> {
    store: &'a DedupStore,
}

impl PartitionStore<'_> {
    /// Whether `key` was processed within the TTL, as of now.
    pub fn seen(&self, _key: &[u8]) -> Result<bool, DedupError> {
        match self.store.never {}
    }

    /// Whether `key` was processed within the TTL, as of `now_ms`.
    pub fn seen_at(&self, _key: &[u8], _now_ms: i64) -> Result<bool, DedupError> {
        match self.store.never {}
    }

    /// Records `key` as processed.
    pub fn record(&self, _key: &[u8], _first_seen_ms: i64) -> Result<(), DedupError> {
        match self.store.never {}
    }

    /// The next changelog offset to apply to this partition.
    pub fn changelog_position(&self) -> Result<i64, DedupError> {
        match self.store.never {}
    }

    /// Remembers that the changelog was applied up to `next_offset`.
    pub fn set_changelog_position(&self, _next_offset: i64) -> Result<(), DedupError> {
        match self.store.never {}
    }
}

/// Keys to record in one write.
pub struct RecordBatch<'a> {
    store: &'a DedupStore,
}

impl RecordBatch<'_> {
    /// Adds `key` of partition `p`.
    pub fn record(&mut self, _p: &PartitionStore<'_>, _key: &[u8], _first_seen_ms: i64) {
        match self.store.never {}
    }

    /// Writes every key added.
    pub fn write(self) -> Result<(), DedupError> {
        match self.store.never {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_names_the_missing_feature() {
        let err = DedupStore::open(Path::new("/tmp/millrace-unbuilt"), Duration::from_secs(1), false).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("`rocksdb` feature") && text.contains("/tmp/millrace-unbuilt"), "{text}");
    }
}
