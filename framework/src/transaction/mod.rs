//! Exactly-once mode: one Kafka transaction per commit interval (KIP-98/KIP-447).
//!
//! Records complete out of order (different keys run concurrently), so their outputs cannot be
//! produced when they are emitted: a transaction committing then could carry the output of a record
//! whose offset it does not commit (a crash would then repeat that output). Instead each completed
//! record's outputs wait in its partition's [`PendingOutputs`](crate::state::pending::PendingOutputs), by
//! offset. The poll thread moves them into the open transaction every few milliseconds
//! ([`Transactions::pump`]) and commits it every `commit_interval` ([`Transactions::commit`]):
//!
//! 1. pump: per partition, read the committable offset `c` (the contiguous completed prefix) and
//!    take the entries of offsets below `c`: exactly records that a commit of `c` covers, none still
//!    running; begin a transaction if none is open, produce them in offset order (so per-key order is
//!    kept in the output) plus a dedup changelog entry per recorded key, and remember `c`. The
//!    committable offset only grows, so everything produced stays covered by the offset committed;
//! 2. commit: pump once more, `send_offsets_to_transaction` with the remembered offsets and the
//!    consumer's group metadata (so a zombie whose group generation moved on is refused by the group
//!    coordinator), then `commit_transaction`, which only has to flush the tail.
//!
//! A partition lost (not revoked) while its outputs are in the open transaction aborts that
//! transaction: its offsets must not be committed by this member any more, and sent outputs cannot
//! be taken back.
//!
//! Errors, and what each leaves to the caller ([`TxnOutcome`]):
//! - a retriable error is retried until the transaction timeout (past it the coordinator aborts
//!   the transaction anyway);
//! - an abortable one (or the test-only injected abort) aborts the transaction; once
//!   `abort_transaction` succeeded nothing of it is visible, and the caller rewinds the partitions
//!   it carried to their last committed offsets ([`TxnOutcome::Aborted`]);
//! - when the outcome is uncertain (the abort itself failed or timed out, the producer was fenced,
//!   or it turned fatal after a broker outage: see [`crate::txn_producer`]) the producer is
//!   replaced and every owned partition is rewound to the offsets the group coordinator holds, read
//!   with `require_stable` once the new producer's `init_transactions` settled the old transaction
//!   ([`TxnOutcome::Reset`]);
//! - any other fatal error, or fences so frequent that another live instance must be using the
//!   transactional id, stops the instance without committing anything further
//!   ([`TxnOutcome::Fatal`]).
//!
//! Dedup keys reach the local store only after their transaction committed.

use crate::config::ExactlyOnce;
use crate::dedup::runtime::Dedup;
use crate::error::Error;
use crate::kafka::errors::{TxnCall, is_outage, txn_call};
use crate::kafka::txn_producer::{TxnClient, TxnProducer};
use crate::partition::PartitionHandle;
use crate::rejected::{Produced, Source};
use crate::retry::Backoff;
use crate::stats::Stats;
use crate::telemetry::Telemetry;
use crate::telemetry::events::{InjectedAbort, TransactionAborting, TransactionCommitted};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer as _;
use rdkafka::{Offset, TopicPartitionList};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

mod recovery;

/// How one transaction step ended.
#[derive(Debug)]
pub(crate) enum TxnOutcome {
    /// Nothing to commit.
    Idle,
    /// Committed.
    Committed,
    /// Aborted: these partitions' uncommitted work is lost and must be redone from their last
    /// committed offsets.
    Aborted(Vec<Arc<PartitionHandle>>),
    /// The producer is unusable and the open transaction's fate unknown: replace the producer
    /// ([`Transactions::reset`]) and rewind every owned partition to the coordinator's offsets.
    Reset,
    /// Fatal: this instance must stop committing.
    Fatal,
}

/// The transactional producer's side of exactly-once mode.
pub(crate) struct Transactions {
    client: TxnClient,
    telemetry: Arc<Telemetry>,
    dedup: Option<Arc<Dedup>>,
    settings: ExactlyOnce,
    name: String,
    /// The error that stopped transactions, for the poll loop to report.
    fatal: Mutex<Option<Error>>,
    /// Why the producer must be replaced before the next transaction, once it must.
    reset_cause: Mutex<Option<KafkaError>>,
    /// The transaction being filled (poll thread only; a mutex for the rebalance callbacks' sake).
    open: Mutex<OpenTxn>,
    /// Partitions to rewind once the poll thread is out of a rebalance callback.
    rewind_later: Mutex<Vec<Arc<PartitionHandle>>>,
    /// After a producer reset: partitions to rewind to the group coordinator's offsets once it
    /// answers (the poll thread asks on its turns; see `Hooks::rewind_to_group_offsets`).
    rewind_to_group: Mutex<recovery::GroupRewind>,
    /// Transactions that reached the injected-abort decision (`inject_abort_ratio`).
    injection_draws: AtomicU64,
}

/// Whether the `n`-th draw (from 1) is an injected abort at `ratio`.
fn injected(n: u64, ratio: f64) -> bool {
    (n as f64 * ratio).floor() > ((n - 1) as f64 * ratio).floor()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The transaction being filled between two commits.
#[derive(Default)]
struct OpenTxn {
    began: bool,
    /// When it began (set with `began`).
    began_at: Option<Instant>,
    /// Partitions with work in it, and the offset each commits (outputs were taken below it).
    parts: Vec<(Arc<PartitionHandle>, i64)>,
    /// Dedup keys whose changelog entries are in it.
    keys: Vec<SentKey>,
    /// Output records (emitted and DLQ) in it.
    outputs: u64,
}

/// A dedup key sent to the changelog in the open transaction.
struct SentKey {
    handle: Arc<PartitionHandle>,
    key: Vec<u8>,
    at: i64,
}

impl Transactions {
    pub(crate) fn new(
        client: TxnClient,
        telemetry: Arc<Telemetry>,
        dedup: Option<Arc<Dedup>>,
        settings: ExactlyOnce,
        name: String,
    ) -> Self {
        Self {
            client,
            telemetry,
            dedup,
            settings,
            name,
            fatal: Mutex::new(None),
            reset_cause: Mutex::new(None),
            open: Mutex::default(),
            rewind_later: Mutex::default(),
            rewind_to_group: Mutex::default(),
            injection_draws: AtomicU64::new(0),
        }
    }

    /// How long one transaction call may block, and how long a transaction step may keep retrying.
    /// Whether to abort this transaction on purpose: exactly `inject_abort_ratio` of them, spread
    /// evenly (the n-th when n × ratio passes a whole number: every third for 1/3), not drawn at
    /// random, so that a run with few transactions still has its aborts.
    fn inject_abort(&self) -> bool {
        let ratio = self.settings.inject_abort_ratio;
        if ratio <= 0.0 {
            return false;
        }
        injected(self.injection_draws.fetch_add(1, Relaxed) + 1, ratio)
    }

    fn call_timeout(&self) -> Duration {
        self.settings.transaction_timeout
    }

    /// Initialises the producer (see [`TxnClient::init`]).
    pub(crate) fn init(&self, stop: &CancellationToken) -> Result<(), KafkaError> {
        self.client.init(stop)
    }

    /// Messages the transactional producer holds that the broker has not acknowledged yet.
    pub(crate) fn queued(&self) -> i32 {
        self.client.get().in_flight_count()
    }

    /// The error that stopped this instance's transactions, if any.
    pub(crate) fn take_fatal(&self) -> Option<Error> {
        lock(&self.fatal).take()
    }

    fn open(&self) -> std::sync::MutexGuard<'_, OpenTxn> {
        lock(&self.open)
    }

    /// Moves completed work of `handles` into the open transaction (beginning one if needed): the
    /// kept entries of offsets below each partition's committable offset are produced now, and that
    /// offset is remembered for the commit. Called often between commits, so that producing overlaps
    /// processing and the commit itself only flushes the tail. `Err` when the transaction had to
    /// be aborted (or the producer is unusable).
    pub(crate) fn pump(&self, handles: &[Arc<PartitionHandle>]) -> Result<(), TxnOutcome> {
        if lock(&self.fatal).is_some() {
            return Err(TxnOutcome::Fatal);
        }
        if self.needs_reset() {
            return Err(TxnOutcome::Reset);
        }
        // Partitions waiting for a rewind lost entries in an abort, or a reset left their last
        // transaction's outcome unknown: nothing of theirs may commit before the rewind.
        let mut waiting: Vec<Arc<PartitionHandle>> = lock(&self.rewind_later).clone();
        waiting.extend(lock(&self.rewind_to_group).handles.iter().cloned());
        let producer = self.client.get();
        let mut open = self.open();
        for h in handles.iter().filter(|h| !waiting.iter().any(|w| Arc::ptr_eq(w, h))) {
            let Some(end) = h.committable() else { continue };
            let known = open.parts.iter().position(|(p, _)| Arc::ptr_eq(p, h));
            let moved = match known {
                Some(i) => open.parts[i].1 != end,
                None => h.commit_candidate().is_some(),
            };
            let entries = h.pending.take_below(end);
            if entries.is_empty() && !moved {
                continue;
            }
            // Carried from here on: if the transaction aborts below, this partition is rewound (its
            // entries were taken and are lost with the transaction).
            match known {
                Some(i) => open.parts[i].1 = end,
                None => open.parts.push((h.clone(), end)),
            }
            if !open.began {
                if let Err(e) = producer.begin_transaction() {
                    return Err(match txn_call(&e) {
                        TxnCall::Fatal => self.unusable(e),
                        // No transaction is open: the carried partitions only lost their entries.
                        _ => {
                            tracing::warn!(pipeline = %self.name, error = %e, "begin_transaction failed");
                            let lost = std::mem::take(&mut *open);
                            TransactionAborting.emit(&self.telemetry);
                            TxnOutcome::Aborted(lost.parts.into_iter().map(|(h, _)| h).collect())
                        }
                    });
                }
                open.began = true;
                open.began_at = Some(Instant::now());
                Stats::bump(&self.telemetry.stats.commits);
            }
            let now = crate::clock::now_ms();
            let (first_key, mut last_keyed) = (open.keys.len(), 0);
            for (offset, entry) in entries {
                let source =
                    |what| Source { topic: h.topic.clone(), partition: h.partition, offset, alone: entry.alone, what };
                let what = if entry.dead_letter { Produced::DeadLetter } else { Produced::Output };
                if entry.alone {
                    // Its own batch: wait for every earlier output's acknowledgement first.
                    self.await_deliveries(&producer);
                }
                for out in &entry.outputs {
                    if let Err(e) = self.client.send(&producer, out, source(what)) {
                        tracing::warn!(pipeline = %self.name, topic = %out.topic, error = %e, "transactional produce failed");
                        return Err(self.abort(&producer, &mut open));
                    }
                    open.outputs += 1;
                }
                if entry.alone {
                    // ... and for its own before anything else joins a batch.
                    self.await_deliveries(&producer);
                }
                if let (Some(key), Some(_)) = (entry.dedup_key, &self.dedup) {
                    open.keys.push(SentKey { handle: h.clone(), key, at: now });
                    last_keyed = offset;
                }
            }
            // The partition's new keys go to the changelog in batch records, inside the transaction.
            if let Some(dedup) = self.dedup.as_ref().filter(|d| d.config.changelog && open.keys.len() > first_key) {
                let keys = open.keys[first_key..].iter().map(|k| (&k.key[..], k.at));
                let source = || Source {
                    topic: h.topic.clone(),
                    partition: h.partition,
                    offset: last_keyed,
                    alone: false,
                    what: Produced::Changelog,
                };
                for out in dedup.changelog_batches(&h.topic, h.partition, keys) {
                    if let Err(e) = self.client.send(&producer, &out, source()) {
                        tracing::warn!(pipeline = %self.name, error = %e, "dedup changelog produce failed");
                        return Err(self.abort(&producer, &mut open));
                    }
                }
            }
        }
        Ok(())
    }

    /// Commits the open transaction after moving the latest completed work of `handles` into it:
    /// every partition in it commits the offset its outputs were taken below.
    pub(crate) fn commit<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        handles: &[Arc<PartitionHandle>],
    ) -> TxnOutcome {
        let started = Instant::now();
        if let Err(outcome) = self.pump(handles) {
            return outcome;
        }
        let pumped = started.elapsed();
        let producer = self.client.get();
        let mut open = self.open();
        if !open.began {
            return TxnOutcome::Idle;
        }
        let Some(group) = consumer.group_metadata() else {
            tracing::warn!(pipeline = %self.name, "no consumer group metadata; aborting the transaction");
            return self.abort(&producer, &mut open);
        };
        let mut offsets = TopicPartitionList::new();
        for (h, end) in &open.parts {
            let _ = offsets.add_partition_offset(&h.topic, h.partition, Offset::Offset(*end));
        }
        if let Some(outcome) = self.retrying("send_offsets_to_transaction", &producer, &mut open, |p| {
            p.send_offsets_to_transaction(&offsets, &group, self.call_timeout())
        }) {
            return outcome;
        }
        let offsets_sent = started.elapsed();
        if self.inject_abort() {
            InjectedAbort.emit(&self.telemetry);
            return self.abort(&producer, &mut open);
        }
        self.await_deliveries(&producer);
        if self.client.take_unconfirmed() {
            // An output may be missing from the transaction (see `produce::confirmed`): abort and
            // redo the work rather than commit offsets past it.
            return self.abort(&producer, &mut open);
        }
        if let Some(outcome) =
            self.retrying("commit_transaction", &producer, &mut open, |p| p.commit_transaction(self.call_timeout()))
        {
            return outcome;
        }
        self.client.clear_outage();
        let done = std::mem::take(&mut *open);
        TransactionCommitted {
            outputs: done.outputs,
            partitions: done.parts.len(),
            pumped,
            offsets_sent,
            took: started.elapsed(),
            open_for: done.began_at.map_or(Duration::ZERO, |t| t.elapsed()),
        }
        .emit(&self.telemetry);
        drop(open);
        for (h, end) in &done.parts {
            h.set_committed(*end);
            self.client.rejections().committed(&h.topic, h.partition, *end);
        }
        self.record_dedup_keys(done.keys);
        TxnOutcome::Committed
    }

    /// Sends what the producer holds at once and waits until the broker acknowledged it, so that
    /// `commit_transaction` has nothing left to flush. (rdkafka's own flush, which commit would run,
    /// waits for delivery events in slices of up to 100 ms that the producer's polling thread
    /// usually takes first: it turned a ~10 ms commit into ~110 ms.) Gives up quietly at the
    /// transaction timeout; the commit then flushes (and fails) as usual.
    fn await_deliveries(&self, producer: &TxnProducer) {
        let _ = producer.flush(Duration::ZERO); // starts sending without waiting for linger.ms
        let deadline = Instant::now() + self.call_timeout();
        while producer.in_flight_count() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(250));
        }
    }

    /// Lost partitions (another member owns them now) must not commit anything: if the open
    /// transaction carries any, it is aborted, and the other partitions it carried must be rewound.
    pub(crate) fn drop_partitions(&self, lost: &[Arc<PartitionHandle>]) -> TxnOutcome {
        let mut open = self.open();
        if !open.parts.iter().any(|(p, _)| lost.iter().any(|l| Arc::ptr_eq(p, l))) {
            return TxnOutcome::Idle;
        }
        tracing::warn!(pipeline = %self.name, "the open transaction carries lost partitions; aborting it");
        self.abort(&self.client.get(), &mut open)
    }

    /// Partitions whose rewind had to wait (an abort inside a rebalance callback).
    pub(crate) fn defer_rewind(&self, handles: Vec<Arc<PartitionHandle>>) {
        lock(&self.rewind_later).extend(handles);
    }

    /// Takes the partitions whose rewind was deferred.
    pub(crate) fn take_deferred_rewinds(&self) -> Vec<Arc<PartitionHandle>> {
        std::mem::take(&mut *lock(&self.rewind_later))
    }

    /// Runs a transaction call, retrying retriable errors for up to the transaction timeout (past
    /// it the coordinator aborts the transaction anyway). `None` when it succeeded; else how the
    /// transaction ended.
    fn retrying(
        &self,
        what: &str,
        producer: &TxnProducer,
        open: &mut OpenTxn,
        mut call: impl FnMut(&TxnProducer) -> Result<(), KafkaError>,
    ) -> Option<TxnOutcome> {
        let deadline = Instant::now() + self.call_timeout();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        loop {
            let e = match call(producer) {
                Ok(()) => return None,
                Err(e) => e,
            };
            if is_outage(&e) {
                self.client.mark_outage();
            }
            match txn_call(&e) {
                TxnCall::Fatal => return Some(self.unusable(e)),
                TxnCall::Retry if Instant::now() < deadline => {
                    tracing::warn!(pipeline = %self.name, failures = backoff.failures() + 1, error = %e, "{what} failed; retrying");
                    backoff.sleep();
                }
                _ => {
                    tracing::warn!(pipeline = %self.name, error = %e, "{what} failed; aborting the transaction");
                    return Some(self.abort(producer, open));
                }
            }
        }
    }

    /// Aborts the open transaction. [`TxnOutcome::Aborted`] (rewind the partitions it carried to
    /// their last committed offsets) only when `abort_transaction` succeeded; if it cannot be
    /// confirmed within the transaction timeout, the outcome is unknown and the producer is reset.
    fn abort(&self, producer: &TxnProducer, open: &mut OpenTxn) -> TxnOutcome {
        let aborted = std::mem::take(open);
        TransactionAborting.emit(&self.telemetry);
        let started = Instant::now();
        // Let the requests in flight finish first: after a produce error that needs an epoch bump,
        // the abort bumps the producer epoch, and a request of the old epoch answered after that
        // (INVALID_PRODUCER_EPOCH) would leave librdkafka's producer fenced for good.
        self.await_deliveries(producer);
        self.client.take_unconfirmed(); // nothing of this transaction will commit
        let deadline = started + self.call_timeout();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        loop {
            let e = match producer.abort_transaction(self.call_timeout()) {
                Ok(()) => break,
                Err(e) => e,
            };
            if is_outage(&e) {
                self.client.mark_outage();
            }
            match txn_call(&e) {
                TxnCall::Fatal => return self.unusable(e),
                _ if Instant::now() < deadline && e.rdkafka_error_code() != Some(RDKafkaErrorCode::State) => {
                    tracing::warn!(pipeline = %self.name, failures = backoff.failures() + 1, error = %e, "abort_transaction failed; retrying");
                    backoff.sleep();
                }
                // Out of time, or a state in which librdkafka will not abort (a commit under way):
                // whether the transaction committed is unknown.
                _ => return self.uncertain(e),
            }
        }
        tracing::info!(pipeline = %self.name, partitions = aborted.parts.len(), took = ?started.elapsed(), "transaction aborted; rewinding");
        TxnOutcome::Aborted(aborted.parts.into_iter().map(|(h, _)| h).collect())
    }

    /// After a commit: writes the transaction's dedup keys to the local store and forgets them as
    /// pending.
    fn record_dedup_keys(&self, keys: Vec<SentKey>) {
        let Some(dedup) = &self.dedup else { return };
        if keys.is_empty() {
            return;
        }
        // The keys were taken partition by partition, so each partition's keys are adjacent.
        let partitions = || keys.chunk_by(|a, b| Arc::ptr_eq(&a.handle, &b.handle));
        let entries = partitions()
            .map(|same| (&*same[0].handle.topic, same[0].handle.partition, same.iter().map(|k| (&k.key[..], k.at))));
        if let Err(e) = dedup.record_committed(entries) {
            // They are in the (committed) changelog, so a restore brings them back; until then a
            // duplicate of one of them is not recognised here.
            tracing::warn!(pipeline = %self.name, error = %e, "dedup store write after commit failed");
        }
        for same in partitions() {
            same[0].handle.pending.settle(same.iter().map(|k| &k.key));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::injected;

    #[test]
    fn injected_aborts_are_spread_evenly() {
        let third: Vec<u64> = (1..=12).filter(|&n| injected(n, 1.0 / 3.0)).collect();
        assert_eq!(third, [3, 6, 9, 12]);
        assert_eq!((1..=100).filter(|&n| injected(n, 0.25)).count(), 25);
        assert!((1..=100).all(|n| injected(n, 1.0)));
        assert!(!(1..=100).any(|n| injected(n, 0.0)));
    }
}
