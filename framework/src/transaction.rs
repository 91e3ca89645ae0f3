//! Exactly-once mode: one Kafka transaction per commit interval (KIP-98/KIP-447).
//!
//! Records complete out of order (different keys run concurrently), so their outputs cannot be
//! produced when they are emitted: a transaction committing then could carry the output of a record
//! whose offset it does not commit (a crash would then repeat that output). Instead each completed
//! record's outputs wait in its partition's [`PendingOutputs`](crate::pending::PendingOutputs), by
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
//! Errors: a retriable error is retried; an abortable one (or the test-only injected abort) aborts
//! the transaction, and the caller rewinds the partitions it carried to their last committed offsets
//! (their outputs are gone, so the records are redone); a fatal one (`ProducerFenced`,
//! `InvalidProducerEpoch`, …) stops the instance without committing anything further. Dedup keys
//! reach the local store only after their transaction committed.

use crate::config::ExactlyOnce;
use crate::dedup_changelog::Dedup;
use crate::kafka_log::KafkaLog;
use crate::partition::PartitionHandle;
use crate::rebalance::Hooks;
use crate::record::OutputRecord;
use crate::stats::Stats;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer as _, ProducerContext, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Retries of a retriable transaction call before giving up on the transaction (aborting it).
const RETRIES: u32 = 10;

/// How one transaction ended.
#[derive(Debug)]
pub(crate) enum TxnOutcome {
    /// Nothing to commit.
    Idle,
    /// Committed.
    Committed,
    /// Aborted: these partitions' uncommitted work is lost and must be redone from their last
    /// committed offsets.
    Aborted(Vec<Arc<PartitionHandle>>),
    /// Fatal: this instance must stop committing.
    Fatal,
}

/// The transactional producer's side of exactly-once mode.
pub(crate) struct Transactions {
    producer: TxnProducer,
    stats: Arc<Stats>,
    dedup: Option<Arc<Dedup>>,
    settings: ExactlyOnce,
    name: String,
    /// The fatal error that stopped transactions, for the poll loop to report.
    fatal: Mutex<Option<KafkaError>>,
    /// The transaction being filled (poll thread only; a mutex for the rebalance callbacks' sake).
    open: Mutex<OpenTxn>,
    /// Partitions to rewind once the poll thread is out of a rebalance callback.
    rewind_later: Mutex<Vec<Arc<PartitionHandle>>>,
}

/// How to treat a failed transaction call.
enum Class {
    Retry,
    Abort,
    Fatal,
}

fn classify(e: &KafkaError) -> Class {
    match e {
        KafkaError::Transaction(r) if r.is_fatal() => Class::Fatal,
        KafkaError::Transaction(r) if r.txn_requires_abort() => Class::Abort,
        KafkaError::Transaction(r) if r.is_retriable() => Class::Retry,
        _ => Class::Abort,
    }
}

/// The transaction being filled between two commits.
#[derive(Default)]
struct OpenTxn {
    began: bool,
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
        producer: TxnProducer,
        stats: Arc<Stats>,
        dedup: Option<Arc<Dedup>>,
        settings: ExactlyOnce,
        name: String,
    ) -> Self {
        Self {
            producer,
            stats,
            dedup,
            settings,
            name,
            fatal: Mutex::new(None),
            open: Mutex::default(),
            rewind_later: Mutex::default(),
        }
    }

    /// How long one transaction call may block.
    fn call_timeout(&self) -> Duration {
        self.settings.transaction_timeout
    }

    /// `init_transactions`: fences earlier incarnations of this transactional id and aborts what
    /// they left open. Retried while the brokers are unreachable, until `stop`.
    pub(crate) fn init(&self, stop: &CancellationToken) -> Result<(), KafkaError> {
        let mut attempt = 0u32;
        loop {
            match self.producer.init_transactions(self.call_timeout()) {
                Ok(()) => return Ok(()),
                Err(e) if matches!(classify(&e), Class::Fatal) || stop.is_cancelled() => return Err(e),
                Err(e) => {
                    attempt += 1;
                    tracing::warn!(pipeline = %self.name, attempt, error = %e, "init_transactions failed; retrying");
                    std::thread::sleep(Duration::from_millis(200 * u64::from(attempt.min(10))));
                }
            }
        }
    }

    /// The fatal error that stopped this instance's transactions, if any.
    pub(crate) fn take_fatal(&self) -> Option<KafkaError> {
        self.fatal.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn set_fatal(&self, e: KafkaError) -> TxnOutcome {
        tracing::error!(pipeline = %self.name, error = %e, "fatal transaction error: this instance stops committing");
        self.fatal.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
        TxnOutcome::Fatal
    }

    fn open(&self) -> std::sync::MutexGuard<'_, OpenTxn> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves completed work of `handles` into the open transaction (beginning one if needed): the
    /// kept entries of offsets below each partition's committable offset are produced now, and that
    /// offset is remembered for the commit. Called often between commits, so that producing overlaps
    /// processing and the commit itself only flushes the tail. `Err` when the transaction had to
    /// be aborted (or failed fatally).
    pub(crate) fn pump(&self, handles: &[Arc<PartitionHandle>]) -> Result<(), TxnOutcome> {
        if self.fatal.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
            return Err(TxnOutcome::Fatal);
        }
        // Partitions waiting for a rewind lost entries in an abort: nothing of theirs may commit.
        let waiting: Vec<Arc<PartitionHandle>> = self.rewind_later.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut open = self.open();
        for h in handles.iter().filter(|h| !waiting.iter().any(|w| Arc::ptr_eq(w, h))) {
            let Some(end) = h.committable() else { continue };
            let known = open.parts.iter().position(|(p, _)| Arc::ptr_eq(p, h));
            let moved = match known {
                Some(i) => open.parts[i].1 != end,
                None => h.commit_candidate().is_some(),
            };
            let entries = h.pending.take_below(end, &self.stats);
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
                if let Err(e) = self.producer.begin_transaction() {
                    return Err(match classify(&e) {
                        Class::Fatal => self.set_fatal(e),
                        _ => {
                            tracing::warn!(pipeline = %self.name, error = %e, "begin_transaction failed");
                            self.abort(&mut open)
                        }
                    });
                }
                open.began = true;
                Stats::bump(&self.stats.commits);
            }
            let now = crate::dlq::now_ms();
            for entry in entries {
                for out in &entry.outputs {
                    if let Err(e) = self.send(out) {
                        tracing::warn!(pipeline = %self.name, topic = %out.topic, error = %e, "transactional produce failed");
                        return Err(self.abort(&mut open));
                    }
                    open.outputs += 1;
                }
                if let (Some(key), Some(dedup)) = (entry.dedup_key, &self.dedup) {
                    if dedup.config.changelog
                        && let Err(e) = self.send(&dedup.changelog_entry(&h.topic, h.partition, &key, now))
                    {
                        tracing::warn!(pipeline = %self.name, error = %e, "dedup changelog produce failed");
                        return Err(self.abort(&mut open));
                    }
                    open.keys.push(SentKey { handle: h.clone(), key, at: now });
                }
            }
        }
        Ok(())
    }

    /// Commits the open transaction after moving the latest completed work of `handles` into it:
    /// every partition in it commits the offset its outputs were taken below.
    pub(crate) fn commit(&self, consumer: &BaseConsumer<Hooks>, handles: &[Arc<PartitionHandle>]) -> TxnOutcome {
        let started = Instant::now();
        if let Err(outcome) = self.pump(handles) {
            return outcome;
        }
        let pumped = started.elapsed();
        let mut open = self.open();
        if !open.began {
            return TxnOutcome::Idle;
        }
        let Some(group) = consumer.group_metadata() else {
            tracing::warn!(pipeline = %self.name, "no consumer group metadata; aborting the transaction");
            return self.abort(&mut open);
        };
        let mut offsets = TopicPartitionList::new();
        for (h, end) in &open.parts {
            let _ = offsets.add_partition_offset(&h.topic, h.partition, Offset::Offset(*end));
        }
        if let Some(outcome) = self.retrying("send_offsets_to_transaction", &mut open, |p| {
            p.send_offsets_to_transaction(&offsets, &group, self.call_timeout())
        }) {
            return outcome;
        }
        let offsets_sent = started.elapsed();
        let ratio = self.settings.inject_abort_ratio;
        if ratio > 0.0 && rand::random::<f64>() < ratio {
            tracing::info!(pipeline = %self.name, "aborting this transaction on purpose (inject_abort_ratio)");
            Stats::bump(&self.stats.transactions_injected_aborts);
            return self.abort(&mut open);
        }
        self.await_deliveries();
        if let Some(outcome) =
            self.retrying("commit_transaction", &mut open, |p| p.commit_transaction(self.call_timeout()))
        {
            return outcome;
        }
        Stats::bump(&self.stats.transactions_committed);
        let done = std::mem::take(&mut *open);
        tracing::debug!(pipeline = %self.name, outputs = done.outputs, partitions = done.parts.len(), ?pumped, ?offsets_sent, took = ?started.elapsed(), "transaction committed");
        self.stats.committed_outputs.fetch_add(done.outputs, std::sync::atomic::Ordering::Relaxed);
        drop(open);
        for (h, end) in &done.parts {
            h.set_committed(*end);
        }
        self.record_dedup_keys(done.keys);
        TxnOutcome::Committed
    }

    /// Sends what the producer holds at once and waits until the broker acknowledged it, so that
    /// `commit_transaction` has nothing left to flush. (rdkafka's own flush, which commit would run,
    /// waits for delivery events in slices of up to 100 ms that the producer's polling thread
    /// usually takes first: it turned a ~10 ms commit into ~110 ms.) Gives up quietly at the
    /// transaction timeout; the commit then flushes (and fails) as usual.
    fn await_deliveries(&self) {
        let _ = self.producer.flush(Duration::ZERO); // starts sending without waiting for linger.ms
        let deadline = Instant::now() + self.call_timeout();
        while self.producer.in_flight_count() > 0 && Instant::now() < deadline {
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
        self.abort(&mut open)
    }

    /// Partitions whose rewind had to wait (an abort inside a rebalance callback).
    pub(crate) fn defer_rewind(&self, handles: Vec<Arc<PartitionHandle>>) {
        self.rewind_later.lock().unwrap_or_else(|p| p.into_inner()).extend(handles);
    }

    /// Takes the partitions whose rewind was deferred.
    pub(crate) fn take_deferred_rewinds(&self) -> Vec<Arc<PartitionHandle>> {
        std::mem::take(&mut *self.rewind_later.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Runs a transaction call, retrying retriable errors. `None` when it succeeded; else how the
    /// transaction ended (aborted, or fatal).
    fn retrying(
        &self,
        what: &str,
        open: &mut OpenTxn,
        mut call: impl FnMut(&TxnProducer) -> Result<(), KafkaError>,
    ) -> Option<TxnOutcome> {
        let mut attempt = 0;
        loop {
            let e = match call(&self.producer) {
                Ok(()) => return None,
                Err(e) => e,
            };
            attempt += 1;
            match classify(&e) {
                Class::Fatal => return Some(self.set_fatal(e)),
                Class::Retry if attempt < RETRIES => {
                    tracing::warn!(pipeline = %self.name, attempt, error = %e, "{what} failed; retrying");
                    std::thread::sleep(Duration::from_millis(100 * u64::from(attempt)));
                }
                _ => {
                    tracing::warn!(pipeline = %self.name, error = %e, "{what} failed; aborting the transaction");
                    return Some(self.abort(open));
                }
            }
        }
    }

    /// Aborts the open transaction; the partitions it carried must be rewound.
    fn abort(&self, open: &mut OpenTxn) -> TxnOutcome {
        let aborted = std::mem::take(open);
        Stats::bump(&self.stats.transactions_aborted);
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            match self.producer.abort_transaction(self.call_timeout()) {
                Ok(()) => break,
                // Nothing open (begin failed): nothing to abort.
                Err(KafkaError::Transaction(r)) if r.code() == RDKafkaErrorCode::State => break,
                Err(e) => match classify(&e) {
                    Class::Retry | Class::Abort if attempt < RETRIES => {
                        attempt += 1;
                        tracing::warn!(pipeline = %self.name, attempt, error = %e, "abort_transaction failed; retrying");
                        std::thread::sleep(Duration::from_millis(100 * u64::from(attempt)));
                    }
                    _ => return self.set_fatal(e),
                },
            }
        }
        tracing::info!(pipeline = %self.name, partitions = aborted.parts.len(), took = ?started.elapsed(), "transaction aborted; rewinding");
        TxnOutcome::Aborted(aborted.parts.into_iter().map(|(h, _)| h).collect())
    }

    /// Queues one output in the open transaction, waiting while the producer queue is full.
    fn send(&self, out: &OutputRecord) -> Result<(), KafkaError> {
        let mut headers = crate::produce::kafka_headers(&out.headers);
        loop {
            let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&out.topic);
            if let Some(h) = headers.take() {
                record = record.headers(h);
            }
            if let Some(k) = out.key.as_deref() {
                record = record.key(k);
            }
            if let Some(v) = out.value.as_deref() {
                record = record.payload(v);
            }
            if let Some(p) = out.partition {
                record = record.partition(p);
            }
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    headers = back.headers;
                    // The producer's own thread drains the queue.
                    std::thread::sleep(Duration::from_micros(250));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// After a commit: writes the transaction's dedup keys to the local store and forgets them as
    /// pending.
    fn record_dedup_keys(&self, keys: Vec<SentKey>) {
        let Some(dedup) = &self.dedup else { return };
        for k in keys {
            if let Err(e) = dedup.record_committed(&k.handle.topic, k.handle.partition, &k.key, k.at, None) {
                tracing::warn!(pipeline = %self.name, error = %e, "dedup store write after commit failed");
            }
            k.handle.pending.settle([&k.key]);
        }
    }
}

/// The transactional producer's context: librdkafka's logs and errors go where the other clients'
/// go; a failed delivery is only logged (it fails the transaction's commit, which then aborts).
pub(crate) struct TxnHooks(pub(crate) Arc<KafkaLog>);

/// Exactly-once mode's producer: no per-record delivery futures (the commit is the acknowledgement).
pub(crate) type TxnProducer = ThreadedProducer<TxnHooks>;

impl ClientContext for TxnHooks {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        self.0.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.0.error(error, reason);
    }
}

impl ProducerContext for TxnHooks {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.0.warn("transactional output not delivered; the transaction will abort", &e.to_string());
        }
    }
}
