//! At-least-once: the dedup writes of one partition grouped (a group commit). A record whose effect
//! is done adds its key to its partition's next batch and waits for that batch; one writer per
//! partition at a time takes every key added so far, produces them to the changelog as batch
//! records ([`crate::dedup::entries`]), awaits the acknowledgements, writes them to RocksDB in one
//! write, and then answers each waiting record. Keys added while a batch is being written form the
//! next one, so the batch grows with the load: under a burst a changelog record and a RocksDB write
//! serve many input records, and alone a record waits no longer than its own write.
//!
//! The order per key is unchanged (changelog acknowledged, then the local store, then the record's
//! offset may complete), so a crash loses a key only in the documented window (invariant D2).

use crate::processor::Processor;
use crate::shared::Shared;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::oneshot;

/// The result a waiting record gets: `Err` says why its batch was not written (it retries).
pub(crate) type Written = Result<(), String>;

/// Every partition's batch in the making.
#[derive(Default)]
pub(crate) struct GroupCommit {
    partitions: Mutex<HashMap<String, HashMap<i32, Arc<Batch>>>>,
}

/// One partition's keys waiting to be written, and whether a writer is at work.
#[derive(Default)]
struct Batch {
    waiting: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    entries: Vec<(Vec<u8>, i64)>,
    waiters: Vec<oneshot::Sender<Written>>,
    writing: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl GroupCommit {
    fn batch(&self, topic: &str, partition: i32) -> Arc<Batch> {
        let mut parts = lock(&self.partitions);
        if let Some(b) = parts.get(topic).and_then(|t| t.get(&partition)) {
            return b.clone();
        }
        parts.entry(topic.to_owned()).or_default().entry(partition).or_default().clone()
    }

    /// Adds `key`, first seen at `at`, to the next batch of `topic`/`partition`, starting a writer
    /// when none is at work; the receiver gets the batch's result.
    pub(crate) fn add<P: Processor>(
        &self,
        shared: &Arc<Shared<P>>,
        topic: &str,
        partition: i32,
        key: &[u8],
        at: i64,
    ) -> oneshot::Receiver<Written> {
        let batch = self.batch(topic, partition);
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut w = lock(&batch.waiting);
            w.entries.push((key.to_vec(), at));
            w.waiters.push(tx);
            !std::mem::replace(&mut w.writing, true)
        };
        if start {
            // A task of its own: the writer must not be cancelled with the record that started it.
            tokio::spawn(write_all(shared.clone(), batch, topic.to_owned(), partition));
        }
        rx
    }
}

/// The writer: writes batches until none is waiting.
async fn write_all<P: Processor>(shared: Arc<Shared<P>>, batch: Arc<Batch>, topic: String, partition: i32) {
    let _done = Done(&batch);
    loop {
        let (entries, waiters) = {
            let mut w = lock(&batch.waiting);
            if w.entries.is_empty() {
                w.writing = false;
                return;
            }
            (std::mem::take(&mut w.entries), std::mem::take(&mut w.waiters))
        };
        let written = crate::dedup::changelog::write_batch(&shared, &topic, partition, &entries).await;
        for w in waiters {
            let _ = w.send(written.clone());
        }
    }
}

/// Lets a later key start a writer again if this one panicked (its waiters see their sender
/// dropped and retry).
struct Done<'a>(&'a Batch);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            lock(&self.0.waiting).writing = false;
        }
    }
}
