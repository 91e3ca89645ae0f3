//! What a processor can see and do besides its record: the attempt number, output emission whose
//! acknowledgement gates the record's completion, the shutdown signal and the attempt's cancellation.

use crate::error::EmitError;
use crate::kafka::log::Producer;
use crate::kafka::produce;
use crate::record::OutputRecord;
use crate::trace::TraceContext;
use rdkafka::producer::DeliveryFuture;
use std::sync::{Arc, Mutex, OnceLock};
use tokio_util::sync::CancellationToken;

/// Per-attempt context handed to [`Processor::process`](crate::Processor::process).
///
/// At-least-once: outputs emitted with [`emit`](Self::emit) are queued to the producer at once; the
/// record is completed (and its offset becomes committable) only after the broker has acknowledged
/// every one of them. An unacknowledged output fails the attempt as a transient error, so the record
/// is retried: at-least-once, never lost.
///
/// Exactly-once: outputs are kept with the record and produced in the Kafka transaction that
/// commits the record's offset; the outputs of a failed attempt are discarded.
pub struct Context {
    attempt: u32,
    epoch: u64,
    idempotency_key: IdempotencyKey,
    /// The coordinates key, formatted on the first [`idempotency_key`](Self::idempotency_key) call.
    coordinates_key: OnceLock<Vec<u8>>,
    trace: Option<TraceContext>,
    handles: Arc<RuntimeHandles>,
    pending: Mutex<Vec<(String, DeliveryFuture)>>,
    buffered: Mutex<Vec<OutputRecord>>,
    /// Made on the first [`cancelled`](Self::cancelled) or [`is_cancelled`](Self::is_cancelled):
    /// an attempt whose handler never asks is dropped when it is cancelled, without a grace period.
    cancel: OnceLock<CancellationToken>,
    reason: OnceLock<CancelReason>,
}

/// Why an attempt was cancelled (see [`Context::cancelled`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelReason {
    /// The attempt ran past [`attempt_timeout`](crate::PipelineConfig::attempt_timeout): it counts
    /// as a transient failure (retried, then dead-lettered with kind `timeout`).
    Timeout,
    /// The record's partition was revoked (or lost) and the call was still running at the end of
    /// [`drain_timeout`](crate::PipelineConfig::drain_timeout): the partition's next owner
    /// processes the record again.
    Revoked,
    /// The pipeline is shutting down and the call was still running at the end of
    /// [`drain_timeout`](crate::PipelineConfig::drain_timeout): the record is redelivered after a
    /// restart.
    Shutdown,
}

impl CancelReason {
    /// The reason's label in metrics: `timeout`, `revoked` or `shutdown`.
    pub fn as_str(self) -> &'static str {
        match self {
            CancelReason::Timeout => "timeout",
            CancelReason::Revoked => "revoked",
            CancelReason::Shutdown => "shutdown",
        }
    }
}

/// A partition task's drain deadline: fired when a revoke's or a shutdown's
/// [`drain_timeout`](crate::PipelineConfig::drain_timeout) ends, it cancels every attempt of the
/// partition still inside the processor.
#[derive(Default)]
pub(crate) struct DrainDeadline {
    token: CancellationToken,
    reason: OnceLock<CancelReason>,
}

impl DrainDeadline {
    /// Fires the deadline (the first reason given is kept).
    pub(crate) fn fire(&self, reason: CancelReason) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }

    /// Resolves with the reason once the deadline fired.
    pub(crate) async fn reached(&self) -> CancelReason {
        self.token.cancelled().await;
        *self.reason.get().unwrap_or(&CancelReason::Shutdown)
    }
}

/// What every context shares: the producer for outputs and the shutdown signal.
pub(crate) struct RuntimeHandles {
    pub(crate) producer: Producer,
    pub(crate) shutdown: CancellationToken,
    /// Exactly-once: outputs are buffered for the transaction instead of produced.
    pub(crate) transactional: bool,
    /// The producer's `message.max.bytes`: a larger output can never be produced.
    pub(crate) max_output_bytes: usize,
    /// Exactly-once: output topics known to exist.
    pub(crate) output_topics: crate::kafka::output_topics::OutputTopics,
    /// The pipeline's client errors, and its fatal one (a refused output stops the pipeline).
    pub(crate) log: std::sync::Arc<crate::kafka::log::KafkaLog>,
}

/// Where a record's [`Context::idempotency_key`] comes from.
#[derive(Debug, Clone)]
pub(crate) enum IdempotencyKey {
    /// The dedup store's key, or the record's `idempotency-key` header with the store off.
    Given(Vec<u8>),
    /// `topic/partition/offset`, formatted only when asked for (the store is off and the record has
    /// no header; or the store's fallback, which formats it itself).
    Coordinates { topic: Arc<str>, partition: i32, offset: i64 },
    /// The store is on and its rules give none (`fallback = "none"`).
    Absent,
}

impl Context {
    pub(crate) fn new(
        attempt: u32,
        epoch: u64,
        idempotency_key: IdempotencyKey,
        trace: Option<TraceContext>,
        handles: Arc<RuntimeHandles>,
    ) -> Self {
        Self {
            attempt,
            epoch,
            idempotency_key,
            coordinates_key: OnceLock::new(),
            trace,
            handles,
            pending: Mutex::new(Vec::new()),
            buffered: Mutex::new(Vec::new()),
            cancel: OnceLock::new(),
            reason: OnceLock::new(),
        }
    }

    /// Resolves when this attempt is cancelled: it ran past
    /// [`attempt_timeout`](crate::PipelineConfig::attempt_timeout), or its partition was revoked or
    /// the pipeline is shutting down and the call was still running when
    /// [`drain_timeout`](crate::PipelineConfig::drain_timeout) ended ([`cancel_reason`](Self::cancel_reason)
    /// says which). A handler that awaits it gets
    /// [`cancel_grace`](crate::PipelineConfig::cancel_grace) to stop cleanly (roll back, release a
    /// lock) before its future is dropped; one that never asked is dropped at once. Whatever the
    /// call returns after this, it is not the record's result: a timeout counts as a transient
    /// failure, a revoked or shut-down record is left uncommitted and processed again (by the
    /// partition's next owner, or after a restart). Outputs emitted after it fired are never
    /// committed in exactly-once mode; at-least-once they may already have been produced.
    ///
    /// ```no_run
    /// use millrace::{Context, ProcessError, Processor, Record};
    ///
    /// struct Upload;
    /// # async fn upload(_: &Record) -> Result<(), ProcessError> { Ok(()) }
    /// # async fn abort_upload() {}
    /// impl Processor for Upload {
    ///     async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
    ///         tokio::select! {
    ///             done = upload(record) => done,
    ///             _ = ctx.cancelled() => {
    ///                 abort_upload().await;
    ///                 Err(ProcessError::transient("cancelled"))
    ///             }
    ///         }
    ///     }
    /// }
    /// ```
    pub async fn cancelled(&self) {
        self.cancel.get_or_init(CancellationToken::new).cancelled().await
    }

    /// True once this attempt is cancelled (see [`cancelled`](Self::cancelled)).
    pub fn is_cancelled(&self) -> bool {
        // Asking makes the token: a handler that checks gets the grace period too.
        self.cancel.get_or_init(CancellationToken::new);
        self.reason.get().is_some()
    }

    /// Why this attempt was cancelled, once it is (see [`cancelled`](Self::cancelled)).
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.reason.get().copied()
    }

    /// Cancels the attempt; true when its handler listens (awaits [`cancelled`](Self::cancelled)),
    /// so it is worth giving it a grace period.
    pub(crate) fn cancel(&self, reason: CancelReason) -> bool {
        let _ = self.reason.set(reason);
        self.cancel.get().inspect(|t| t.cancel()).is_some()
    }

    /// The record's idempotency key, the same on every attempt and every redelivery. Pass it to
    /// downstream APIs that accept one, to absorb the one repeat dedup cannot prevent (a crash
    /// between the effect and the dedup write) or, with the dedup store off, every redelivery.
    ///
    /// With the store on, it is the key the store checks ([`DedupConfig::key_of`]
    /// (crate::DedupConfig::key_of)); `None` only with `fallback = "none"` and no key. With the store
    /// off, the same default rules: the record's `idempotency-key` header, else its coordinates
    /// `topic/partition/offset`. Coordinates change when a record is produced again or replayed
    /// from the DLQ (it gets a new offset), so give records a key of their own (docs/guarantees.md,
    /// "Dedup scope").
    pub fn idempotency_key(&self) -> Option<&[u8]> {
        match &self.idempotency_key {
            IdempotencyKey::Given(key) => Some(key),
            IdempotencyKey::Coordinates { topic, partition, offset } => {
                Some(self.coordinates_key.get_or_init(|| crate::dedup::coordinates_key(topic, *partition, *offset)))
            }
            IdempotencyKey::Absent => None,
        }
    }

    /// The record's place in a distributed trace, when its headers carry a W3C `traceparent` (see
    /// [`crate::trace`]): every output emitted gets this trace with the record's span as parent.
    pub fn trace(&self) -> Option<&TraceContext> {
        self.trace.as_ref()
    }

    /// 1 on the first attempt, 2 on the first retry, and so on.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The assignment epoch of the record's partition: it changes every time this member is (re)assigned
    /// the partition, so work from an earlier assignment can be told apart.
    pub fn assignment_epoch(&self) -> u64 {
        self.epoch
    }

    /// True once the pipeline is shutting down; long handlers may stop early and return a transient
    /// error (the record is then not committed and will be redelivered).
    pub fn is_shutting_down(&self) -> bool {
        self.handles.shutdown.is_cancelled()
    }

    /// Resolves when the pipeline starts shutting down (for `tokio::select!`).
    pub async fn shutdown_signal(&self) {
        self.handles.shutdown.cancelled().await
    }

    /// Queues `record` to the producer. Returns once it is queued (waiting while the producer's queue
    /// is full); its broker acknowledgement is awaited before the input record completes. In
    /// exactly-once mode the record is kept for the transaction that commits the input record.
    ///
    /// A record larger than the producer's `message.max.bytes` fails at once with
    /// [`EmitError::TooLarge`], a permanent error (the input record goes to the DLQ). In exactly-once
    /// mode an output to a topic that does not exist fails with [`EmitError::TopicUnavailable`], a
    /// transient error (retried, then dead-lettered), instead of aborting the transaction.
    ///
    /// When the input carried a `traceparent`, the output gets one of the same trace with this
    /// record's span as parent (and the input's `tracestate`), unless `record` has its own.
    pub async fn emit(&self, mut record: OutputRecord) -> Result<(), EmitError> {
        if let Some(trace) = &self.trace {
            trace.inject(&mut record.headers);
        }
        let size = record.byte_len();
        if size > self.handles.max_output_bytes {
            return Err(EmitError::TooLarge { topic: record.topic, size, max: self.handles.max_output_bytes });
        }
        if self.handles.transactional {
            // A missing topic would abort the whole transaction: fail this attempt instead.
            if let Err(e) = self.handles.output_topics.check(&self.handles.producer, &record.topic).await {
                self.handles.log.stop_if_refused("output topic", &record.topic, &e);
                return Err(e);
            }
            self.buffered.lock().expect("buffered outputs lock").push(record);
            return Ok(());
        }
        let delivery = produce::enqueue(&self.handles.producer, &record).await?;
        self.pending.lock().expect("pending outputs lock").push((record.topic, delivery));
        Ok(())
    }

    /// Encodes `value` as JSON and emits it to `topic` (see [`emit`](Self::emit)). An encoding failure
    /// is a permanent error.
    pub async fn emit_json<T: serde::Serialize>(
        &self,
        topic: &str,
        key: Option<Vec<u8>>,
        value: &T,
    ) -> Result<(), crate::ProcessError> {
        let bytes = serde_json::to_vec(value).map_err(crate::ProcessError::permanent)?;
        let mut out = OutputRecord::to(topic).value(bytes);
        out.key = key;
        self.emit(out).await?;
        Ok(())
    }

    /// Awaits the acknowledgement of every emitted output; returns the outputs kept for the
    /// transaction (exactly-once mode; none otherwise).
    pub(crate) async fn acknowledged(self) -> Result<Vec<OutputRecord>, EmitError> {
        let pending = self.pending.into_inner().expect("pending outputs lock");
        for (topic, delivery) in pending {
            if let Err(e) = produce::acknowledged(&topic, delivery).await {
                self.handles.log.stop_if_refused("output topic", &topic, &e);
                return Err(e);
            }
        }
        Ok(self.buffered.into_inner().expect("buffered outputs lock"))
    }
}
