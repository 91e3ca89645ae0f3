//! Idempotent processing: the idempotency key of each record, checked before the processor runs and
//! recorded (locally in RocksDB and in a compacted changelog topic) after it succeeded.
//!
//! The path of a record with dedup on: take its idempotency key ([`DedupConfig::header`], or
//! [`DedupConfig::key_fn`], or the fallback); wait while another record with the same key is in
//! flight; if the key is in the store, skip the processor (a dedup hit) and complete the offset;
//! otherwise run the processor and, once it succeeded, write the key to the changelog (awaiting the
//! broker's acknowledgement) and then to the store before the offset completes. The keys of one
//! partition are written in batches (`group_commit` at-least-once, one per
//! transaction pump exactly-once): one changelog record ([`entries`]) and one RocksDB write for all
//! the keys completed while the previous batch was written. A failed record is not recorded, so a
//! replay can process it.
//!
//! The one window left (invariant D2): a crash after the side effect and before the dedup write runs
//! the effect again on redelivery. [`Context::idempotency_key`](crate::Context::idempotency_key) is
//! stable across attempts, redeliveries and DLQ replays, so a downstream that accepts an idempotency
//! key absorbs that repeat.

pub(crate) mod changelog;
/// The changelog's record formats.
pub mod entries;
pub(crate) mod group_commit;
pub(crate) mod runtime;
/// The RocksDB store (the `rocksdb` feature, on by default).
#[cfg(feature = "rocksdb")]
pub mod store;
/// Without the `rocksdb` feature: the same API, whose `open` fails naming the feature.
#[cfg(not(feature = "rocksdb"))]
#[path = "store_unbuilt.rs"]
pub mod store;

pub use entries::changelog_entries;

use crate::record::Record;
use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The header that carries a record's idempotency key by default ([`DedupConfig::header`]).
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// The fallback key of a record: `topic/partition/offset`.
pub(crate) fn coordinates_key(topic: &str, partition: i32, offset: i64) -> Vec<u8> {
    format!("{topic}/{partition}/{offset}").into_bytes()
}

/// Computes a record's idempotency key.
pub type KeyFn = Arc<dyn Fn(&Record) -> Option<Vec<u8>> + Send + Sync>;

/// What to use when a record has no idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DedupFallback {
    /// `topic/partition/offset`: absorbs redeliveries of the same record (crash, rebalance), not
    /// producer duplicates or DLQ replays (those have new offsets).
    #[default]
    Coordinates,
    /// No dedup for such records.
    None,
}

/// The dedup store's settings.
#[derive(Clone, serde::Deserialize)]
#[serde(default = "DedupConfig::unset", deny_unknown_fields)]
pub struct DedupConfig {
    /// RocksDB directory (one per instance).
    pub dir: PathBuf,
    /// Header holding the idempotency key. Default `idempotency-key`.
    pub header: String,
    /// Computes the key from the record; tried before the header when set.
    #[serde(skip)]
    pub key_fn: Option<KeyFn>,
    /// When neither yields a key.
    pub fallback: DedupFallback,
    /// How long a key is remembered (default 7 days). Must exceed the longest retry and replay
    /// window, or a late replay would run the effect again.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// fsync every write (default false: the WAL is written but not fsynced; see
    /// [`dedup::store`](crate::dedup::store)).
    pub sync_writes: bool,
    /// Also write every key to the compacted changelog topic `<group>.dedup-changelog`, and restore
    /// a partition's keys from it on assignment (default true).
    pub changelog: bool,
    /// Longest a restore may take before the partition is processed anyway (with a warning).
    #[serde(with = "humantime_serde")]
    pub restore_timeout: Duration,
}

impl fmt::Debug for DedupConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DedupConfig")
            .field("dir", &self.dir)
            .field("header", &self.header)
            .field("key_fn", &self.key_fn.as_ref().map(|_| "<fn>"))
            .field("fallback", &self.fallback)
            .field("ttl", &self.ttl)
            .field("sync_writes", &self.sync_writes)
            .field("changelog", &self.changelog)
            .field("restore_timeout", &self.restore_timeout)
            .finish()
    }
}

impl DedupConfig {
    /// Defaults, with the store in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            header: IDEMPOTENCY_KEY_HEADER.into(),
            key_fn: None,
            fallback: DedupFallback::Coordinates,
            ttl: Duration::from_secs(7 * 24 * 3600),
            sync_writes: false,
            changelog: true,
            restore_timeout: Duration::from_secs(60),
        }
    }

    /// Defaults with no directory: what a configuration file's `[dedup]` table starts from (its
    /// `dir` is required, checked by [`PipelineConfig::validate`](crate::PipelineConfig::validate)).
    fn unset() -> Self {
        Self::new("")
    }

    /// The idempotency key of `record`, if it has one.
    ///
    /// ```
    /// use millrace::{DedupConfig, Record};
    /// let mut r = Record { topic: "orders".into(), partition: 1, offset: 9, timestamp: None,
    ///     key: None, value: None, headers: Default::default() };
    /// let config = DedupConfig::new("/tmp/x");
    /// assert_eq!(config.key_of(&r).unwrap(), b"orders/1/9"); // fallback: coordinates
    /// r.headers.push("idempotency-key", "order-7");
    /// assert_eq!(config.key_of(&r).unwrap(), b"order-7");
    /// ```
    pub fn key_of(&self, record: &Record) -> Option<Vec<u8>> {
        self.key_and_origin(record).map(|(key, _)| key)
    }

    /// [`key_of`](Self::key_of), and whether the key is the coordinates fallback.
    pub(crate) fn key_and_origin(&self, record: &Record) -> Option<(Vec<u8>, bool)> {
        if let Some(f) = &self.key_fn
            && let Some(k) = f(record)
        {
            return Some((k, false));
        }
        if let Some(k) = record.headers.get(&self.header) {
            return Some((k.to_vec(), false));
        }
        match self.fallback {
            DedupFallback::Coordinates => Some((coordinates_key(&record.topic, record.partition, record.offset), true)),
            DedupFallback::None => None,
        }
    }
}

/// The changelog topic of a group's dedup store.
pub fn changelog_topic(group: &str) -> String {
    format!("{group}.dedup-changelog")
}

/// Makes records with the same idempotency key wait for each other (never both run).
#[derive(Default)]
pub(crate) struct InFlightKeys {
    keys: Mutex<HashMap<Vec<u8>, Arc<tokio::sync::Mutex<()>>>>,
}

impl InFlightKeys {
    /// Waits until no other record with `key` is in flight and holds the key until the guard drops.
    pub(crate) async fn hold(self: &Arc<Self>, key: &[u8]) -> KeyGuard {
        let lock = self.keys.lock().unwrap_or_else(|p| p.into_inner()).entry(key.to_vec()).or_default().clone();
        // try_lock first: an uncontended `lock_owned().await` still spends Tokio's cooperative budget.
        let guard = match lock.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => lock.clone().lock_owned().await,
        };
        KeyGuard { owner: self.clone(), key: key.to_vec(), lock, _guard: Some(guard) }
    }
}

/// Holds an idempotency key; releases (and forgets it when nobody else waits) on drop.
pub(crate) struct KeyGuard {
    owner: Arc<InFlightKeys>,
    key: Vec<u8>,
    lock: Arc<tokio::sync::Mutex<()>>,
    _guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        self._guard.take();
        let mut keys = self.owner.keys.lock().unwrap_or_else(|p| p.into_inner());
        // The map and this guard hold the only references: nobody waits for the key.
        if Arc::strong_count(&self.lock) == 2 {
            keys.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn same_key_waits_other_keys_do_not() {
        let keys = Arc::new(InFlightKeys::default());
        let a = keys.hold(b"a").await;
        let _b = keys.hold(b"b").await; // another key: no wait
        let second_a = tokio::spawn({
            let keys = keys.clone();
            async move {
                let _g = keys.hold(b"a").await;
            }
        });
        tokio::task::yield_now().await;
        assert!(!second_a.is_finished(), "the second holder of `a` waits");
        drop(a);
        second_a.await.unwrap();
        assert!(!keys.keys.lock().unwrap().contains_key(&b"a"[..]), "forgotten once nobody holds it");
    }
}
