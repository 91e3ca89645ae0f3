//! Exactly-once mode's transactional producer and its lifecycle: created from the pipeline's
//! settings, initialised (`init_transactions`, retried while the brokers are unreachable), and
//! replaced by a fresh one when it was fenced or a broker outage left it unusable.
//!
//! Why replacing is needed: when a transaction stays open longer than `transaction_timeout` (the
//! brokers were away, or this process was paused, e.g. SIGSTOPped or stuck in a long GC), its
//! coordinator aborts it and bumps the producer epoch; librdkafka then reports the producer as
//! *fenced*, a fatal state no call recovers from. The pipeline creates a new producer with the same
//! transactional id, whose `init_transactions` settles whatever the old one left (the coordinator
//! completes or aborts it first), and redoes its uncommitted work. Real zombies (partitions that
//! moved to another member meanwhile) are refused by the group coordinator: every transaction
//! carries the consumer's group generation (KIP-447). So a fence is recovered from whatever its
//! cause, as Kafka Streams does since EOS-v2.
//!
//! The exception is two live instances sharing one transactional id (a misconfiguration): each
//! `init_transactions` fences the other, forever. A fence with no outage since the last commit is
//! counted ([`TxnClient::note_fence`]); more than [`FENCES_TOLERATED`] of them within
//! [`FENCE_WINDOW`] stop the pipeline with
//! [`Error::TransactionalIdConflict`](crate::Error::TransactionalIdConflict).

use crate::kafka::errors::{is_fatal, is_fence, is_outage};
use crate::kafka::log::KafkaLog;
use crate::record::OutputRecord;
use crate::rejected::{Rejections, Source};
use crate::retry::Backoff;
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message as _;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer as _, ProducerContext, ThreadedProducer};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Fences without a broker outage recovered from within [`FENCE_WINDOW`]; one more stops the
/// pipeline (another live instance appears to use the same transactional id).
pub(crate) const FENCES_TOLERATED: usize = 3;
/// The window in which fences are counted against [`FENCES_TOLERATED`].
pub(crate) const FENCE_WINDOW: Duration = Duration::from_secs(5 * 60);

/// Exactly-once mode's producer: no per-record delivery futures (the commit is the acknowledgement).
pub(crate) type TxnProducer = ThreadedProducer<TxnHooks>;

/// The transactional producer, replaceable, with what it takes to create another.
pub(crate) struct TxnClient {
    config: ClientConfig,
    log: Arc<KafkaLog>,
    /// Set by the producer's callbacks (and by failed calls) when the brokers were unreachable or
    /// requests timed out; cleared by a committed transaction.
    outage: Arc<AtomicBool>,
    producer: Mutex<Arc<TxnProducer>>,
    /// How long one call may block.
    call_timeout: Duration,
    /// Outputs rejected for their record, noted by the delivery callback.
    rejections: Arc<Rejections>,
    /// When the recent fences without an outage happened.
    fences: Mutex<FenceHistory>,
    /// Set by the delivery callback when an output was reported delivered without an offset (see
    /// [`crate::kafka::produce::confirmed`]): the open transaction may lack it and must not commit.
    unconfirmed: Arc<AtomicBool>,
}

impl TxnClient {
    /// Creates the producer (not initialised yet: see [`init`](Self::init)).
    pub(crate) fn new(
        config: ClientConfig,
        log: Arc<KafkaLog>,
        call_timeout: Duration,
        rejections: Arc<Rejections>,
    ) -> Result<Self, KafkaError> {
        let (outage, unconfirmed) = (Arc::default(), Arc::default());
        let producer = create(&config, &log, &outage, &unconfirmed, &rejections)?;
        Ok(Self {
            config,
            log,
            outage,
            producer: Mutex::new(Arc::new(producer)),
            call_timeout,
            rejections,
            fences: Mutex::default(),
            unconfirmed,
        })
    }

    /// Outputs rejected for their record.
    pub(crate) fn rejections(&self) -> &Rejections {
        &self.rejections
    }

    /// The current producer.
    pub(crate) fn get(&self) -> Arc<TxnProducer> {
        self.producer.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `init_transactions`: fences earlier producers of this transactional id and settles what they
    /// left open. Retried while the brokers are unreachable, until `stop`.
    pub(crate) fn init(&self, stop: &CancellationToken) -> Result<(), KafkaError> {
        let producer = self.get();
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
        loop {
            match producer.init_transactions(self.call_timeout) {
                Ok(()) => return Ok(()),
                Err(KafkaError::Transaction(r)) if r.is_fatal() => return Err(KafkaError::Transaction(r)),
                Err(e) if stop.is_cancelled() => return Err(e),
                Err(e) => {
                    self.mark_outage();
                    tracing::warn!(pipeline = %self.log.name, failures = backoff.failures() + 1, error = %e, "init_transactions failed; retrying");
                    backoff.sleep();
                }
            }
        }
    }

    /// Drops the current producer (purging what it still holds) and creates a fresh one with the same
    /// settings and transactional id; [`init`](Self::init) it before use.
    pub(crate) fn replace(&self) -> Result<(), KafkaError> {
        // A new producer talks to no coordinator before its `init_transactions`; the old one is
        // destroyed before that (the caller, the poll thread, holds no other reference to it).
        let fresh = Arc::new(create(&self.config, &self.log, &self.outage, &self.unconfirmed, &self.rejections)?);
        let old = std::mem::replace(&mut *self.producer.lock().unwrap_or_else(|p| p.into_inner()), fresh);
        drop(old);
        self.outage.store(false, Relaxed);
        self.unconfirmed.store(false, Relaxed);
        Ok(())
    }

    /// Whether an output of the open transaction was reported delivered without an offset since the
    /// last call; clears the mark. Such a transaction is aborted rather than committed.
    pub(crate) fn take_unconfirmed(&self) -> bool {
        self.unconfirmed.swap(false, Relaxed)
    }

    /// Whether the brokers were unreachable, or a request timed out, since the last committed
    /// transaction.
    pub(crate) fn saw_outage(&self) -> bool {
        self.outage.load(Relaxed)
    }

    /// Notes an outage seen by a failed call.
    pub(crate) fn mark_outage(&self) {
        self.outage.store(true, Relaxed);
    }

    /// After a committed transaction: the brokers answer.
    pub(crate) fn clear_outage(&self) {
        self.outage.store(false, Relaxed);
    }

    /// Queues one output in the open transaction, waiting while the producer queue is full; the
    /// output carries its input record (`source`) to its delivery report. An output librdkafka
    /// refuses at once for its record's sake is noted as rejected (see [`crate::rejected`]).
    pub(crate) fn send(&self, producer: &TxnProducer, out: &OutputRecord, source: Source) -> Result<(), KafkaError> {
        let mut record: BaseRecord<'_, [u8], [u8], Box<Source>> =
            crate::record::fill(BaseRecord::with_opaque_to(&out.topic, Box::new(source)), out);
        loop {
            match producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    // The producer's own thread drains the queue.
                    std::thread::sleep(Duration::from_micros(250));
                }
                Err((e, back)) => {
                    self.rejections.rejected(&back.delivery_opaque, &out.topic, &e);
                    return Err(e);
                }
            }
        }
    }

    /// This producer's `transactional.id`.
    pub(crate) fn transactional_id(&self) -> &str {
        self.config.get("transactional.id").unwrap_or_default()
    }

    /// Whether `e` (or the current producer's fatal state) says the producer was fenced: its epoch
    /// was bumped by the coordinator (a transaction timed out) or by another `init_transactions`.
    pub(crate) fn is_fenced(&self, e: &KafkaError) -> bool {
        is_fence(e.rdkafka_error_code())
            || self.get().client().fatal_error().is_some_and(|(code, _)| is_fence(Some(code)))
    }

    /// Counts a fence without an outage; returns how many there were within [`FENCE_WINDOW`],
    /// this one included.
    pub(crate) fn note_fence(&self) -> usize {
        self.fences.lock().unwrap_or_else(|p| p.into_inner()).record(Instant::now())
    }
}

/// The times of recent fences, oldest first, none older than [`FENCE_WINDOW`] before the newest.
#[derive(Debug, Default)]
struct FenceHistory(VecDeque<Instant>);

impl FenceHistory {
    /// Adds a fence at `now`; returns the fences within [`FENCE_WINDOW`] up to `now`.
    fn record(&mut self, now: Instant) -> usize {
        while self.0.front().is_some_and(|&t| now.duration_since(t) >= FENCE_WINDOW) {
            self.0.pop_front();
        }
        self.0.push_back(now);
        self.0.len()
    }
}

fn create(
    config: &ClientConfig,
    log: &Arc<KafkaLog>,
    outage: &Arc<AtomicBool>,
    unconfirmed: &Arc<AtomicBool>,
    rejections: &Arc<Rejections>,
) -> Result<TxnProducer, KafkaError> {
    config.create_with_context(TxnHooks {
        log: log.clone(),
        outage: outage.clone(),
        unconfirmed: unconfirmed.clone(),
        rejections: rejections.clone(),
    })
}

/// The transactional producer's context: librdkafka's logs go where the other clients' go;
/// connection errors and undelivered outputs mark an outage (the transaction's own calls report the
/// failure, so nothing here stops the pipeline); an output rejected for its record is noted by
/// record ([`Rejections`]).
pub(crate) struct TxnHooks {
    log: Arc<KafkaLog>,
    outage: Arc<AtomicBool>,
    unconfirmed: Arc<AtomicBool>,
    rejections: Arc<Rejections>,
}

impl ClientContext for TxnHooks {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        self.log.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if is_fence(error.rdkafka_error_code()) {
            // Usually recovered from: the pipeline decides (and logs) when a transaction call fails.
            tracing::info!(pipeline = %self.log.name, %error, reason, "transactional producer fenced");
        } else if is_fatal(&error) {
            // The failing transaction call reports it; the pipeline decides there.
            tracing::error!(pipeline = %self.log.name, %error, reason, "transactional producer failed");
        } else {
            self.outage.store(true, Relaxed);
            self.log.warn("transactional producer error", &format!("{error} ({reason})"));
        }
    }
}

impl ProducerContext for TxnHooks {
    /// The input record the output belongs to.
    type DeliveryOpaque = Box<Source>;

    fn delivery(&self, result: &DeliveryResult<'_>, source: Box<Source>) {
        if let Ok(message) = result
            && !crate::kafka::produce::confirmed(message.offset())
        {
            self.unconfirmed.store(true, Relaxed);
            tracing::warn!(
                pipeline = %self.log.name, topic = message.topic(), partition = message.partition(),
                "transactional output reported delivered without an offset; the transaction will abort"
            );
        }
        if let Err((e, message)) = result {
            if is_outage(e) {
                self.outage.store(true, Relaxed);
            }
            self.rejections.rejected(&source, message.topic(), e);
            self.log.warn(
                "transactional output not delivered; the transaction will abort",
                &format!("{e} (output to {})", message.topic()),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_are_counted_within_the_window_only() {
        let mut h = FenceHistory::default();
        let t0 = Instant::now();
        assert_eq!(h.record(t0), 1);
        assert_eq!(h.record(t0 + Duration::from_secs(60)), 2);
        assert_eq!(h.record(t0 + FENCE_WINDOW - Duration::from_secs(1)), 3);
        // The first has left the window; the other two have not.
        assert_eq!(h.record(t0 + FENCE_WINDOW), 3);
        assert_eq!(h.record(t0 + FENCE_WINDOW * 3), 1, "an old burst does not count against a new fence");
    }
}
