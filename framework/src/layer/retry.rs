//! Layer 4, retry: the attempt loop around the processor call. Each attempt passes the circuit
//! breaker's gate (one probe at a time while half-open) and the rate limit, takes a concurrency
//! permit, runs the processor, awaits its outputs' acknowledgements and catches a panic as a
//! permanent failure, and cancels a call that runs past the attempt timeout (a transient failure) or
//! past its partition's drain deadline (left unfinished);
//! transient failures are retried under the [`RetryPolicy`](crate::RetryPolicy)
//! until it says stop.

use crate::blocking::Slot;
use crate::clock::now_ms;
use crate::context::{CancelReason, Context, DrainDeadline, IdempotencyKey};
use crate::dlq::{DlqErrorKind, Failure};
use crate::error::{Cause, ProcessError};
use crate::histogram::TaskHistogram;
use crate::layer::Outcome;
use crate::processor::Processor;
use crate::record::Record;
use crate::shared::Shared;
use crate::stats::Stats;
use crate::telemetry::events::{AttemptCancelled, AttemptTimedOut, ProcessorPanicked, RetryScheduled};
use crate::trace::TraceContext;
use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Runs `record` through the processor until it succeeds (`Ok`), fails for good (`Err` with how), or
/// `cancel` (shutdown, revoke) interrupts a backoff or the scope's drain deadline (the end of a
/// revoke's or shutdown's drain) a call (`Ok(Outcome::Abandoned)`).
pub(crate) async fn attempt_until_done<P: Processor>(
    shared: &Shared<P>,
    epoch: u64,
    record: &Record,
    idempotency_key: &IdempotencyKey,
    cancel: &CancellationToken,
    scope: &CallScope,
) -> Result<Outcome, Failure> {
    let mut attempt = 1;
    let mut first_failure_ms = None;
    let trace = TraceContext::of(&record.headers);
    let time_limit = shared.config.effective_attempt_timeout();
    loop {
        // A span per attempt that the processor's own events inherit (off unless the subscriber
        // enables target `millrace::record` at debug level: its cost is one callsite check). With
        // the `otel` feature, it is exported as a child of the input's `traceparent`.
        let span = tracing::debug_span!(target: "millrace::record", "record",
            topic = %record.topic, partition = record.partition, offset = record.offset,
            key = record.key_str().unwrap_or_default(), attempt,
            trace_id = trace.as_ref().map_or("", TraceContext::trace_id), span_id = tracing::field::Empty);
        let attempt_trace = trace.as_ref().map(|t| attempt_trace(t, &span));
        if let Some(t) = &attempt_trace {
            span.record("span_id", t.span_id());
        }
        let ctx = Context::new(attempt, epoch, idempotency_key.clone(), attempt_trace, shared.handles.clone());
        // A retry waits while the breaker is open instead of churning; half-open, one attempt probes.
        let Some(probe) = shared.breaker.gate(cancel).await else { return Ok(Outcome::Abandoned) };
        if let Some(limit) = &shared.rate_limit {
            match limit.ready(cancel).await {
                None => return Ok(Outcome::Abandoned),
                Some(true) => Stats::bump(&shared.telemetry.stats.rate_limited),
                Some(false) => {}
            }
        }
        // The concurrency bound counts records inside the processor: the permit is not held while
        // outputs await their acknowledgement or a retry waits out its backoff.
        let Some(permit) = permit(&shared.concurrency).await else { return Ok(Outcome::Abandoned) };
        let started = Instant::now();
        let processed = {
            // Scoped: the call borrows `ctx`, which `acknowledged` consumes below.
            let call = AssertUnwindSafe(shared.processor.process(record, &ctx).instrument(span)).catch_unwind();
            let call = std::pin::pin!(shared.blocking.watch(&scope.slot, record.offset, attempt, call));
            match bounded(call, &ctx, time_limit, &scope.drain, shared.config.cancel_grace).await {
                Ok(returned) => returned,
                Err((reason, dropped)) => {
                    AttemptCancelled { record, attempt, reason, dropped }.emit(&shared.telemetry);
                    if reason != CancelReason::Timeout {
                        // Revoked or shut down: whatever the call did is not this record's result.
                        return Ok(Outcome::Abandoned);
                    }
                    let limit = time_limit.expect("a timeout has a time limit");
                    AttemptTimedOut { record, attempt, after: limit }.emit(&shared.telemetry);
                    Ok(Err(ProcessError::timed_out(limit)))
                }
            }
        };
        drop(permit);
        // The breaker's transient trip counts the processor's own transient failures (a downstream
        // that is down), not those of Millrace's produces below.
        let transient = matches!(&processed, Ok(Err(e)) if e.is_transient());
        if transient && shared.breaker.transient_failure(&shared.telemetry) {
            shared.backpressure.wake(); // the poll thread pauses the partitions at once
        }
        let result = match processed {
            Ok(Ok(())) => ctx.acknowledged().await.map_err(ProcessError::from),
            Ok(Err(e)) => Err(e),
            Err(panic) => {
                ProcessorPanicked.emit(&shared.telemetry);
                Err(ProcessError::panic(format!("processor panicked: {}", panic_message(&*panic))))
            }
        };
        probe.finish(result.is_ok(), &shared.telemetry);
        scope.attempts.record(started.elapsed());
        if result.is_err() && shared.log.failed() {
            // The pipeline is stopping on a fatal error (an ACL refused an output, say): this failure
            // may be that error's, so the record is neither retried nor dead-lettered.
            return Ok(Outcome::Abandoned);
        }
        let error = match result {
            Ok(outputs) => {
                if let Some(ts) = record.timestamp {
                    scope.latency.record(Duration::from_millis((now_ms() - ts).max(0) as u64));
                }
                return Ok(Outcome::Done(outputs));
            }
            Err(e) => e,
        };
        let failed_at = now_ms();
        let first = *first_failure_ms.get_or_insert(failed_at);
        let Some(delay) = error.is_transient().then(|| shared.config.retry.delay_after(attempt)).flatten() else {
            let kind = match error.cause() {
                Cause::Panic => DlqErrorKind::Panic,
                Cause::Decode => DlqErrorKind::Decode,
                Cause::Timeout => DlqErrorKind::Timeout,
                Cause::Processor if error.is_transient() => DlqErrorKind::TransientExhausted,
                Cause::Processor => DlqErrorKind::Permanent,
            };
            return Err(Failure {
                kind,
                message: error.to_string(),
                attempts: attempt,
                first_failure_ms: first,
                last_failure_ms: failed_at,
            });
        };
        RetryScheduled { record, attempt, delay, error: &error }.emit(&shared.telemetry);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = cancel.cancelled() => return Ok(Outcome::Abandoned),
        }
        attempt += 1;
    }
}

/// The trace context of one processing attempt, whose span is `span`: the record's, with the span id
/// the OpenTelemetry layer gave `span` when the `otel` feature exports it.
fn attempt_trace(trace: &TraceContext, span: &tracing::Span) -> TraceContext {
    #[cfg(feature = "otel")]
    if let Some(span_id) = crate::otel::adopt(span, trace) {
        return trace.with_span_id(span_id);
    }
    let _ = span;
    trace.clone()
}

/// What a partition task gives each of its processor calls: the drain deadline that cancels them
/// the slot that watches their polls for blocking ([`crate::blocking`]), and the task's duration
/// histograms ([`crate::histogram`]), which the task flushes with its tally.
pub(crate) struct CallScope {
    pub(crate) drain: DrainDeadline,
    pub(crate) slot: Arc<Slot>,
    pub(crate) attempts: TaskHistogram,
    pub(crate) latency: TaskHistogram,
}

impl CallScope {
    pub(crate) fn new(slot: Arc<Slot>) -> Self {
        Self {
            drain: DrainDeadline::default(),
            slot,
            attempts: TaskHistogram::default(),
            latency: TaskHistogram::default(),
        }
    }
}

/// Runs a processor call until it returns, runs past `time_limit`, or its partition's drain deadline
/// fires. Cancelled either way (`Err` with why, and whether the future was dropped without
/// returning): a handler that listens to `ctx.cancelled()` gets `grace` to stop cleanly, then
/// (like one that does not) its future is dropped. A result it returns after the cancellation is
/// ignored: one deadline, one meaning.
/// The call comes pinned by the caller: pinning a by-value argument here would store it twice.
async fn bounded<F: Future>(
    mut call: Pin<&mut F>,
    ctx: &Context,
    time_limit: Option<Duration>,
    drain: &DrainDeadline,
    grace: Duration,
) -> Result<F::Output, (CancelReason, bool)> {
    let until_drained = async {
        // The call is polled first: one that is ready never registers with the deadline.
        tokio::select! {
            biased;
            done = call.as_mut() => Ok(done),
            reason = drain.reached() => Err(reason),
        }
    };
    // `timeout` polls the call first and arms its timer only if the call is still pending.
    let cut = match time_limit {
        None => until_drained.await,
        Some(limit) => tokio::time::timeout(limit, until_drained).await.unwrap_or(Err(CancelReason::Timeout)),
    };
    let reason = match cut {
        Ok(done) => return Ok(done),
        Err(reason) => reason,
    };
    let listens = ctx.cancel(reason);
    let returned = listens && tokio::time::timeout(grace, call).await.is_ok();
    Err((reason, !returned))
}

/// A concurrency permit. `try_acquire` first: `acquire().await` spends Tokio's cooperative budget,
/// and once a partition task has started ~128 records in one poll it would return Pending with
/// permits free, pushing every further record onto the slow (queued, woken) path.
async fn permit(semaphore: &tokio::sync::Semaphore) -> Option<tokio::sync::SemaphorePermit<'_>> {
    match semaphore.try_acquire() {
        Ok(permit) => Some(permit),
        Err(tokio::sync::TryAcquireError::NoPermits) => semaphore.acquire().await.ok(),
        Err(tokio::sync::TryAcquireError::Closed) => None,
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}
