//! The RocksDB dedup store: which idempotency keys were processed, per topic-partition, with a TTL.
//!
//! One column family per topic-partition, so a partition's state can be dropped or rebuilt on its
//! own. Each entry's value is its first-seen time (milliseconds since the epoch, 8 bytes big-endian);
//! entries older than the TTL are removed by a compaction filter (never by scans on the hot path), and
//! a lookup also treats an expired entry as absent, so the TTL holds before compaction runs too. A
//! reserved key per column family remembers how far the partition's changelog was applied. Whole-key
//! bloom filters (SST files and memtable) answer most lookups of a new key, the common case, without
//! searching.
//!
//! Durability: the write-ahead log is always on. By default a write is not fsynced
//! ([`DedupConfig::sync_writes`](crate::DedupConfig::sync_writes) = false): it survives the process
//! being killed (the operating system has it) but not a power loss of the machine, where the
//! changelog topic rebuilds it. With `sync_writes` every write is fsynced before the record completes.

use rocksdb::compaction_filter::Decision;
use rocksdb::{BlockBasedOptions, BoundColumnFamily, ColumnFamilyDescriptor, DB, Options, WriteBatch, WriteOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Reserved key holding the next changelog offset to apply (never expired by the TTL).
const CHANGELOG_POSITION: &[u8] = b"\x00millrace.changelog.next-offset";

/// Errors of the dedup store.
#[derive(Debug, thiserror::Error)]
pub enum DedupError {
    /// RocksDB failed.
    #[error("dedup store at {dir}: {source}")]
    Rocks {
        /// The store's directory.
        dir: PathBuf,
        /// RocksDB's error.
        #[source]
        source: rocksdb::Error,
    },
    /// The store's directory could not be reset.
    #[error("dedup store at {dir}: {source}")]
    Io {
        /// The store's directory.
        dir: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Processed idempotency keys, by topic-partition.
///
/// ```
/// use millrace::dedup::store::DedupStore;
/// use std::time::Duration;
///
/// let dir = std::env::temp_dir().join(format!("millrace-doc-{}", std::process::id()));
/// let store = DedupStore::open(&dir, Duration::from_secs(3600), false).unwrap();
/// let p = store.partition("orders", 0).unwrap();
/// assert!(!p.seen(b"order-7").unwrap());
/// p.record(b"order-7", 1_700_000_000_000).unwrap();
/// assert!(p.seen_at(b"order-7", 1_700_000_001_000).unwrap());
/// # drop(p); drop(store); std::fs::remove_dir_all(&dir).ok();
/// ```
pub struct DedupStore {
    db: DB,
    /// Options of column families created after opening: RocksDB keeps raw pointers into them (the
    /// TTL compaction filter), so they must outlive `db` (fields drop in declaration order).
    created_cf_options: std::sync::Mutex<Vec<Options>>,
    dir: PathBuf,
    ttl_ms: i64,
    write: WriteOptions,
    rebuilt: bool,
}

impl std::fmt::Debug for DedupStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DedupStore").field("dir", &self.dir).field("ttl_ms", &self.ttl_ms).finish()
    }
}

impl DedupStore {
    /// Opens (or creates) the store in `dir`. A store that cannot be opened (corrupted) is moved
    /// aside to `<dir>.corrupt-<time>` with a warning and started empty: the changelog rebuilds it.
    pub fn open(dir: &Path, ttl: Duration, sync_writes: bool) -> Result<Self, DedupError> {
        let ttl_ms = ttl.as_millis().min(i64::MAX as u128) as i64;
        let mut write = WriteOptions::default();
        write.set_sync(sync_writes);
        let (db, rebuilt) = match Self::open_db(dir, ttl_ms) {
            Ok(db) => (db, false),
            Err(e) if dir.exists() => {
                let aside = PathBuf::from(format!("{}.corrupt-{}", dir.display(), crate::clock::now_ms()));
                tracing::warn!(dir = %dir.display(), error = %e, aside = %aside.display(),
                    "dedup store unreadable; moved aside and rebuilding it from the changelog");
                std::fs::rename(dir, &aside).map_err(|source| DedupError::Io { dir: dir.into(), source })?;
                (Self::open_db(dir, ttl_ms)?, true)
            }
            Err(e) => return Err(e),
        };
        Ok(Self { db, created_cf_options: std::sync::Mutex::default(), dir: dir.into(), ttl_ms, write, rebuilt })
    }

    /// Whether [`open`](Self::open) had to start over from an empty store.
    pub fn was_rebuilt(&self) -> bool {
        self.rebuilt
    }

    fn cf_options(ttl_ms: i64) -> Options {
        let mut o = Options::default();
        // Most lookups miss (a duplicate is the exception): bloom filters on the whole key, in the
        // SST files and in the memtable, answer a miss without searching either.
        let mut table = BlockBasedOptions::default();
        table.set_bloom_filter(10.0, false);
        table.set_whole_key_filtering(true);
        o.set_block_based_table_factory(&table);
        o.set_memtable_prefix_bloom_ratio(0.1);
        o.set_memtable_whole_key_filtering(true);
        o.set_compaction_filter("millrace-ttl", move |_level: u32, key: &[u8], value: &[u8]| {
            if key != CHANGELOG_POSITION && expired(value, ttl_ms, crate::clock::now_ms()) {
                Decision::Remove
            } else {
                Decision::Keep
            }
        });
        o
    }

    fn open_db(dir: &Path, ttl_ms: i64) -> Result<DB, DedupError> {
        let rocks = |source| DedupError::Rocks { dir: dir.into(), source };
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let existing = if dir.join("CURRENT").exists() { DB::list_cf(&opts, dir).map_err(rocks)? } else { Vec::new() };
        let cfs = existing.into_iter().map(|name| ColumnFamilyDescriptor::new(name, Self::cf_options(ttl_ms)));
        DB::open_cf_descriptors(&opts, dir, cfs).map_err(rocks)
    }

    /// The store of one topic-partition (its column family is created on first use).
    pub fn partition(&self, topic: &str, partition: i32) -> Result<PartitionStore<'_>, DedupError> {
        let name = format!("{topic}/{partition}");
        if self.db.cf_handle(&name).is_none() {
            let mut kept = self.created_cf_options.lock().unwrap_or_else(|p| p.into_inner());
            if self.db.cf_handle(&name).is_none() {
                let opts = Self::cf_options(self.ttl_ms);
                self.db.create_cf(&name, &opts).map_err(|e| self.err(e))?;
                kept.push(opts);
            }
        }
        let cf = self.db.cf_handle(&name).expect("column family created above");
        Ok(PartitionStore { store: self, cf })
    }

    /// Records written together: one write (one write-ahead-log append, one fsync with
    /// `sync_writes`) for all of them, e.g. every key of a committed transaction.
    ///
    /// ```
    /// use millrace::dedup::store::DedupStore;
    /// use std::time::Duration;
    ///
    /// let dir = std::env::temp_dir().join(format!("millrace-doc-batch-{}", std::process::id()));
    /// let store = DedupStore::open(&dir, Duration::from_secs(3600), false).unwrap();
    /// let (p0, p1) = (store.partition("orders", 0).unwrap(), store.partition("orders", 1).unwrap());
    /// let mut batch = store.batch();
    /// batch.record(&p0, b"order-7", 1_700_000_000_000);
    /// batch.record(&p1, b"order-8", 1_700_000_000_000);
    /// assert!(!p0.seen_at(b"order-7", 1_700_000_001_000).unwrap(), "nothing before the write");
    /// batch.write().unwrap();
    /// assert!(p0.seen_at(b"order-7", 1_700_000_001_000).unwrap() && p1.seen_at(b"order-8", 1_700_000_001_000).unwrap());
    /// # drop((p0, p1)); drop(store); std::fs::remove_dir_all(&dir).ok();
    /// ```
    pub fn batch(&self) -> RecordBatch<'_> {
        RecordBatch { store: self, batch: WriteBatch::default() }
    }

    /// Runs a full compaction (applies the TTL now); for tests and maintenance.
    pub fn compact(&self, topic: &str, partition: i32) -> Result<(), DedupError> {
        if let Some(cf) = self.db.cf_handle(&format!("{topic}/{partition}")) {
            self.db.compact_range_cf(&cf, None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }

    fn err(&self, source: rocksdb::Error) -> DedupError {
        DedupError::Rocks { dir: self.dir.clone(), source }
    }
}

fn expired(value: &[u8], ttl_ms: i64, now_ms: i64) -> bool {
    let Ok(bytes) = <[u8; 8]>::try_from(value) else { return false };
    now_ms.saturating_sub(i64::from_be_bytes(bytes)) > ttl_ms
}

/// The dedup entries of one topic-partition.
pub struct PartitionStore<'a> {
    store: &'a DedupStore,
    cf: std::sync::Arc<BoundColumnFamily<'a>>,
}

impl PartitionStore<'_> {
    fn cf(&self) -> &std::sync::Arc<BoundColumnFamily<'_>> {
        &self.cf
    }

    /// Whether `key` was processed within the TTL, as of now.
    pub fn seen(&self, key: &[u8]) -> Result<bool, DedupError> {
        self.seen_at(key, crate::clock::now_ms())
    }

    /// Whether `key` was processed within the TTL, as of `now_ms`.
    pub fn seen_at(&self, key: &[u8], now_ms: i64) -> Result<bool, DedupError> {
        let value = self.store.db.get_pinned_cf(self.cf(), key).map_err(|e| self.store.err(e))?;
        Ok(value.is_some_and(|v| !expired(&v, self.store.ttl_ms, now_ms)))
    }

    /// Records `key` as processed, first seen at `first_seen_ms` (kept if already present and newer
    /// entries arrive from the changelog).
    pub fn record(&self, key: &[u8], first_seen_ms: i64) -> Result<(), DedupError> {
        self.store
            .db
            .put_cf_opt(self.cf(), key, first_seen_ms.to_be_bytes(), &self.store.write)
            .map_err(|e| self.store.err(e))
    }

    /// The next changelog offset to apply to this partition (0 when nothing was applied).
    pub fn changelog_position(&self) -> Result<i64, DedupError> {
        let v = self.store.db.get_pinned_cf(self.cf(), CHANGELOG_POSITION).map_err(|e| self.store.err(e))?;
        Ok(v.and_then(|v| <[u8; 8]>::try_from(&*v).ok()).map_or(0, i64::from_be_bytes))
    }

    /// Remembers that the changelog was applied up to (not including) `next_offset`.
    pub fn set_changelog_position(&self, next_offset: i64) -> Result<(), DedupError> {
        if next_offset <= self.changelog_position()? {
            return Ok(());
        }
        self.store
            .db
            .put_cf_opt(self.cf(), CHANGELOG_POSITION, next_offset.to_be_bytes(), &self.store.write)
            .map_err(|e| self.store.err(e))
    }
}

/// Keys to record in one write: see [`DedupStore::batch`].
pub struct RecordBatch<'a> {
    store: &'a DedupStore,
    batch: WriteBatch,
}

impl RecordBatch<'_> {
    /// Adds `key` of partition `p`, first seen at `first_seen_ms` (as [`PartitionStore::record`]).
    pub fn record(&mut self, p: &PartitionStore<'_>, key: &[u8], first_seen_ms: i64) {
        self.batch.put_cf(p.cf(), key, first_seen_ms.to_be_bytes());
    }

    /// Writes every key added, atomically.
    pub fn write(self) -> Result<(), DedupError> {
        self.store.db.write_opt(self.batch, &self.store.write).map_err(|e| self.store.err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "millrace-dedup-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::remove_dir_all(&d).ok();
        d
    }

    #[test]
    fn survives_reopen_and_keeps_partitions_apart() {
        let d = dir("reopen");
        {
            let s = DedupStore::open(&d, Duration::from_secs(60), true).unwrap();
            s.partition("t", 0).unwrap().record(b"k", crate::clock::now_ms()).unwrap();
            s.partition("t", 0).unwrap().set_changelog_position(42).unwrap();
        }
        let s = DedupStore::open(&d, Duration::from_secs(60), false).unwrap();
        assert!(!s.was_rebuilt());
        assert!(s.partition("t", 0).unwrap().seen(b"k").unwrap());
        assert!(!s.partition("t", 1).unwrap().seen(b"k").unwrap(), "partitions are separate");
        assert_eq!(s.partition("t", 0).unwrap().changelog_position().unwrap(), 42);
        drop(s);
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn expired_entries_are_absent_and_compacted_away() {
        let d = dir("ttl");
        let s = DedupStore::open(&d, Duration::from_millis(1_000), false).unwrap();
        let p = s.partition("t", 0).unwrap();
        let now = crate::clock::now_ms();
        p.record(b"old", now - 5_000).unwrap();
        p.record(b"new", now).unwrap();
        p.set_changelog_position(7).unwrap();
        assert!(!p.seen(b"old").unwrap(), "older than the TTL reads as absent");
        assert!(p.seen(b"new").unwrap());
        s.compact("t", 0).unwrap();
        let raw = s.db.get_cf(p.cf(), b"old").unwrap();
        assert!(raw.is_none(), "compaction removed the expired entry");
        assert!(s.db.get_cf(p.cf(), b"new").unwrap().is_some());
        assert_eq!(p.changelog_position().unwrap(), 7, "the changelog position never expires");
        drop(p);
        drop(s);
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn corrupted_store_is_moved_aside_and_rebuilt() {
        let d = dir("corrupt");
        drop(DedupStore::open(&d, Duration::from_secs(60), false).unwrap());
        std::fs::write(d.join("CURRENT"), b"garbage\n").unwrap();
        let s = DedupStore::open(&d, Duration::from_secs(60), false).unwrap();
        assert!(s.was_rebuilt());
        assert!(!s.partition("t", 0).unwrap().seen(b"k").unwrap());
        drop(s);
        let parent = d.parent().unwrap();
        let name = d.file_name().unwrap().to_string_lossy().to_string();
        for e in std::fs::read_dir(parent).unwrap().flatten() {
            if e.file_name().to_string_lossy().starts_with(&name) {
                std::fs::remove_dir_all(e.path()).ok();
            }
        }
    }
}
