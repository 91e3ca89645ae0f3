//! Exactly-once mode: one Kafka transaction per commit interval (KIP-98/KIP-447).
//!
//! Records complete out of order (different keys run concurrently), so their outputs cannot be
//! produced when they are emitted: a transaction committing then could carry the output of a record
//! whose offset it does not commit (a crash would then repeat that output). Instead each completed
//! record's outputs wait in its partition's [`PendingOutputs`](crate::pending::PendingOutputs), by
//! offset. Every `commit_interval` the poll thread runs [`Transactions::commit`]:
//!
//! 1. per partition, read the committable offset `c` (the contiguous completed prefix) and take the
//!    entries of offsets below `c`: exactly the records that offset commit, none still running;
//! 2. `begin_transaction`, produce those outputs partition by partition in offset order (so per-key
//!    order is kept in the output), plus a dedup changelog entry per recorded key;
//! 3. `send_offsets_to_transaction` with the consumer's group metadata (so a zombie whose group
//!    generation moved on is fenced by the group coordinator), then `commit_transaction`.
//!
//! Errors: a retriable error is retried; an abortable one (or the test-only injected abort) aborts
//! the transaction, and the caller rewinds the partitions it carried to their last committed offsets
//! (their outputs are gone, so the records are redone); a fatal one (`ProducerFenced`,
//! `InvalidProducerEpoch`, …) stops the instance without committing anything further. Dedup keys
//! reach the local store only after their transaction committed.

use crate::config::ExactlyOnce;
use crate::dedup_changelog::Dedup;
use crate::kafka_log::Producer;
use crate::partition::PartitionHandle;
use crate::pending::Entry;
use crate::rebalance::Hooks;
use crate::record::OutputRecord;
use crate::stats::Stats;
use futures::FutureExt;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureRecord, Producer as _};
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
    producer: Producer,
    stats: Arc<Stats>,
    dedup: Option<Arc<Dedup>>,
    settings: ExactlyOnce,
    name: String,
    /// The fatal error that stopped transactions, for the poll loop to report.
    fatal: Mutex<Option<KafkaError>>,
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

/// One partition's share of a transaction.
struct Part {
    handle: Arc<PartitionHandle>,
    end: i64,
    entries: Vec<Entry>,
}

impl Transactions {
    pub(crate) fn new(
        producer: Producer,
        stats: Arc<Stats>,
        dedup: Option<Arc<Dedup>>,
        settings: ExactlyOnce,
        name: String,
    ) -> Self {
        Self { producer, stats, dedup, settings, name, fatal: Mutex::new(None) }
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

    /// Commits, in one transaction, the completed prefix of each of `handles` with the outputs of
    /// the records in it.
    pub(crate) fn commit(&self, consumer: &BaseConsumer<Hooks>, handles: &[Arc<PartitionHandle>]) -> TxnOutcome {
        if self.fatal.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
            return TxnOutcome::Fatal;
        }
        let parts: Vec<Part> = handles
            .iter()
            .filter_map(|h| {
                let end = h.committable()?;
                let entries = h.pending.take_below(end, &self.stats);
                (!entries.is_empty() || h.commit_candidate().is_some()).then(|| Part {
                    handle: h.clone(),
                    end,
                    entries,
                })
            })
            .collect();
        if parts.is_empty() {
            return TxnOutcome::Idle;
        }
        let aborted = |parts: &[Part]| TxnOutcome::Aborted(parts.iter().map(|p| p.handle.clone()).collect());
        let Some(group) = consumer.group_metadata() else {
            tracing::warn!(pipeline = %self.name, "no consumer group metadata; transaction skipped");
            return aborted(&parts);
        };
        Stats::bump(&self.stats.commits);
        if let Err(e) = self.producer.begin_transaction() {
            return match classify(&e) {
                Class::Fatal => self.set_fatal(e),
                _ => {
                    tracing::warn!(pipeline = %self.name, error = %e, "begin_transaction failed");
                    self.abort(&parts)
                }
            };
        }
        let now = crate::dlq::now_ms();
        let mut changelog: Vec<(usize, usize, Option<DeliveryFuture>)> = Vec::new();
        let mut offsets = TopicPartitionList::new();
        for (pi, part) in parts.iter().enumerate() {
            for (ei, entry) in part.entries.iter().enumerate() {
                for out in &entry.outputs {
                    if let Err(e) = self.send(out) {
                        tracing::warn!(pipeline = %self.name, topic = %out.topic, error = %e, "transactional produce failed");
                        return self.abort(&parts);
                    }
                }
                if let (Some(key), Some(dedup)) = (&entry.dedup_key, &self.dedup) {
                    let delivery = if dedup.config.changelog {
                        let out = dedup.changelog_entry(&part.handle.topic, part.handle.partition, key, now);
                        match self.send(&out) {
                            Ok(d) => Some(d),
                            Err(e) => {
                                tracing::warn!(pipeline = %self.name, error = %e, "dedup changelog produce failed");
                                return self.abort(&parts);
                            }
                        }
                    } else {
                        None
                    };
                    changelog.push((pi, ei, delivery));
                }
            }
            let _ = offsets.add_partition_offset(&part.handle.topic, part.handle.partition, Offset::Offset(part.end));
        }
        if let Some(outcome) = self.retrying("send_offsets_to_transaction", &parts, || {
            self.producer.send_offsets_to_transaction(&offsets, &group, self.call_timeout())
        }) {
            return outcome;
        }
        let ratio = self.settings.inject_abort_ratio;
        if ratio > 0.0 && rand::random::<f64>() < ratio {
            tracing::info!(pipeline = %self.name, "aborting this transaction on purpose (inject_abort_ratio)");
            Stats::bump(&self.stats.transactions_injected_aborts);
            return self.abort(&parts);
        }
        if let Some(outcome) =
            self.retrying("commit_transaction", &parts, || self.producer.commit_transaction(self.call_timeout()))
        {
            return outcome;
        }
        Stats::bump(&self.stats.transactions_committed);
        for part in &parts {
            part.handle.set_committed(part.end);
        }
        self.record_dedup_keys(&parts, changelog, now);
        TxnOutcome::Committed
    }

    /// Runs a transaction call, retrying retriable errors. `None` when it succeeded; else how the
    /// transaction ended (aborted, or fatal).
    fn retrying(
        &self,
        what: &str,
        parts: &[Part],
        mut call: impl FnMut() -> Result<(), KafkaError>,
    ) -> Option<TxnOutcome> {
        let mut attempt = 0;
        loop {
            let e = match call() {
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
                    return Some(self.abort(parts));
                }
            }
        }
    }

    /// Aborts the open transaction; the partitions it carried must be rewound.
    fn abort(&self, parts: &[Part]) -> TxnOutcome {
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
        tracing::info!(pipeline = %self.name, partitions = parts.len(), took = ?started.elapsed(), "transaction aborted; rewinding");
        TxnOutcome::Aborted(parts.iter().map(|p| p.handle.clone()).collect())
    }

    /// Queues one output in the open transaction, waiting while the producer queue is full.
    fn send(&self, out: &OutputRecord) -> Result<DeliveryFuture, KafkaError> {
        let mut headers = OwnedHeaders::new_with_capacity(out.headers.len());
        for h in out.headers.iter() {
            headers = headers.insert(KafkaHeader { key: &h.name, value: h.value.as_deref() });
        }
        let mut headers = Some(headers);
        loop {
            let mut fr: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&out.topic);
            if let Some(h) = headers.take() {
                fr = fr.headers(h);
            }
            if let Some(k) = out.key.as_deref() {
                fr = fr.key(k);
            }
            if let Some(v) = out.value.as_deref() {
                fr = fr.payload(v);
            }
            if let Some(p) = out.partition {
                fr = fr.partition(p);
            }
            match self.producer.send_result(fr) {
                Ok(delivery) => return Ok(delivery),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    headers = back.headers;
                    // The producer's own thread drains the queue.
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// After a commit: writes the transaction's dedup keys to the local store and forgets them as
    /// pending.
    fn record_dedup_keys(&self, parts: &[Part], changelog: Vec<(usize, usize, Option<DeliveryFuture>)>, now: i64) {
        let Some(dedup) = &self.dedup else { return };
        for (pi, ei, delivery) in changelog {
            let part = &parts[pi];
            let Some(key) = &part.entries[ei].dedup_key else { continue };
            // The commit flushed every message, so the delivery report is there.
            let offset = delivery.and_then(|d| d.now_or_never()).and_then(|r| r.ok()?.ok()).map(|d| d.offset);
            if let Err(e) = dedup.record_committed(&part.handle.topic, part.handle.partition, key, now, offset) {
                tracing::warn!(pipeline = %self.name, error = %e, "dedup store write after commit failed");
            }
        }
        for part in parts {
            part.handle.pending.settle(part.entries.iter().filter_map(|e| e.dedup_key.as_ref()));
        }
    }
}
