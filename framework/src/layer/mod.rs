//! The path of one record through the per-record concerns, each a module of its own, in this order
//! (the only place it is written):
//!
//! 0. [`park`] (with key parking): a record of a parked key is dead-lettered as `parked` without
//!    running the others; a Millrace control record is skipped.
//! 1. [`breaker`]: wait while the circuit breaker is open (records already polled do not start).
//! 2. [`rejected`] (exactly-once): a record whose output the broker rejected runs alone, or goes
//!    straight to the DLQ without running again.
//! 3. [`dedup`] (with the dedup store): hold the idempotency key, skip a key already processed, and
//!    record the key after the effect.
//! 4. [`retry`]: the attempt loop around the processor call, under the concurrency bound.
//! 5. [`dlq`]: a record that failed for good goes to the DLQ (or, with the DLQ off, stays failed).
//! 6. [`park`] (with key parking): the change the record makes to its key's parking (parked behind
//!    it, released) is made durable.
//!
//! What a layer decides is returned as a value ([`Outcome`], [`rejected::Gate`], [`dedup::Check`]),
//! so the order reads top to bottom in [`process`]. Offsets, lanes and the transaction are the
//! partition task's business; a layer only says how the record ended.

pub(crate) mod breaker;
pub(crate) mod dedup;
pub(crate) mod dlq;
pub(crate) mod park;
pub(crate) mod rejected;
pub(crate) mod retry;

use crate::context::IdempotencyKey;
use crate::dlq::Failure;
use crate::park::{Change, Decision};
use crate::processor::Processor;
use crate::record::{OutputRecord, Record};
use crate::shared::Shared;
use crate::state::pending::PendingOutputs;
pub(crate) use retry::CallScope;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// How a record's processing ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Processed; every output acknowledged (at-least-once), or kept here for the transaction
    /// (exactly-once).
    Done(Vec<OutputRecord>),
    /// Failed permanently or ran out of attempts; not dead-lettered (DLQ off), so left uncommitted.
    Failed(Failure),
    /// Failed for good and written to the DLQ (at-least-once), or with its DLQ record kept here for
    /// the transaction (exactly-once): its offset completes.
    DeadLettered(Vec<OutputRecord>),
    /// Skipped: its idempotency key was already processed. Its offset completes.
    Duplicate,
    /// Shutdown or revoke interrupted a retry: left unfinished, to be redelivered.
    Abandoned,
    /// A Millrace control record (a release marker): never run. Its offset completes.
    Skipped,
}

/// What the layers made of one record.
#[derive(Debug)]
pub(crate) struct Processed {
    /// How it ended.
    pub(crate) outcome: Outcome,
    /// Exactly-once with the dedup store: its idempotency key, recorded when its transaction commits.
    pub(crate) dedup_key: Option<Vec<u8>>,
    /// Exactly-once: it ran with its outputs produced alone (an output was rejected before).
    pub(crate) alone: bool,
    /// Its idempotency key was looked up and not found (a dedup miss).
    pub(crate) dedup_miss: bool,
    /// The change it made to its key's parking (made durable).
    pub(crate) park: Option<Change>,
    /// Exactly-once: the parked-keys record of that change, for the transaction.
    pub(crate) park_record: Option<OutputRecord>,
}

impl Processed {
    fn ended(outcome: Outcome) -> Self {
        Self { outcome, dedup_key: None, alone: false, dedup_miss: false, park: None, park_record: None }
    }
}

/// Runs `record` through every layer, in order. `pending` is its partition's exactly-once buffer (a
/// key whose transaction has not committed yet is there, not in the dedup store); `parking` is what
/// the record is to its key's parking, decided by its partition task when it started.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn process<P: Processor>(
    shared: &Arc<Shared<P>>,
    pending: &PendingOutputs,
    epoch: u64,
    record: &Record,
    parking: Decision,
    cancel: &CancellationToken,
    scope: &CallScope,
) -> Processed {
    // 0. Parking: a parked key's record goes behind its blocking record, a control record is skipped.
    let mut processed = match parking {
        Decision::Park { blocking } => Processed::ended(park::parked(shared, record, blocking, cancel).await),
        Decision::Control { .. } => Processed::ended(Outcome::Skipped),
        _ => unparked(shared, pending, epoch, record, cancel, scope).await,
    };
    // 6. Parking: the record's change to its key's parking, made durable.
    if parking != Decision::Off {
        let settled = park::settle(shared, record, parking, processed.outcome, cancel).await;
        processed.outcome = settled.outcome;
        processed.park = settled.change;
        processed.park_record = settled.record;
    }
    processed
}

/// Layers 1 to 5.
async fn unparked<P: Processor>(
    shared: &Arc<Shared<P>>,
    pending: &PendingOutputs,
    epoch: u64,
    record: &Record,
    cancel: &CancellationToken,
    scope: &CallScope,
) -> Processed {
    // 1. The circuit breaker.
    if !breaker::closed(shared, cancel).await {
        return Processed::ended(Outcome::Abandoned);
    }
    // 2. Rejected outputs (exactly-once).
    let alone = match rejected::gate(shared, record, cancel).await {
        rejected::Gate::Run { alone } => alone,
        rejected::Gate::Abandoned => return Processed::ended(Outcome::Abandoned),
        rejected::Gate::DeadLetter(failure) => {
            return Processed::ended(dlq::failed(shared, record, failure, cancel).await);
        }
    };
    // 3. Dedup, around 4 and 5.
    let mut dedup_miss = false;
    let (outcome, dedup_key) = match dedup::check(shared, pending, record, cancel).await {
        dedup::Check::Off(key) => (run(shared, epoch, record, key, cancel, scope).await, None),
        dedup::Check::Abandoned => (Outcome::Abandoned, None),
        dedup::Check::Duplicate => (Outcome::Duplicate, None),
        dedup::Check::Fresh(held) => {
            dedup_miss = true;
            let key = IdempotencyKey::Given(held.key().to_vec());
            let outcome = run(shared, epoch, record, key, cancel, scope).await;
            held.after(shared, record, outcome, cancel).await
        }
    };
    Processed { outcome, dedup_key, alone, dedup_miss, park: None, park_record: None }
}

/// 4 and 5: the attempt loop, then the DLQ for a record that failed for good.
async fn run<P: Processor>(
    shared: &Arc<Shared<P>>,
    epoch: u64,
    record: &Record,
    idempotency_key: IdempotencyKey,
    cancel: &CancellationToken,
    scope: &CallScope,
) -> Outcome {
    match retry::attempt_until_done(shared, epoch, record, &idempotency_key, cancel, scope).await {
        Ok(outcome) => outcome,
        Err(failure) => dlq::failed(shared, record, failure, cancel).await,
    }
}

/// Each layer without a broker: a pipeline's clients are created but never connect.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Context, DedupConfig, DlqConfig, Pipeline, PipelineConfig, ProcessError, RetryPolicy};
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    use std::time::Duration;

    /// How a failing call fails.
    #[derive(Clone, Copy)]
    enum Fail {
        Transient,
        Permanent,
        Hang,
        /// Waits for `ctx.cancelled()`, counts it, and returns an error.
        Listen,
    }

    /// Fails its first `failures` calls (transiently, permanently, or by never returning), then
    /// succeeds; counts calls.
    struct Flaky {
        failures: u32,
        how: Fail,
        calls: AtomicU32,
        saw_cancel: AtomicU32,
        last_reason: std::sync::Mutex<Option<crate::CancelReason>>,
    }

    impl Processor for Flaky {
        async fn process(&self, _: &Record, ctx: &Context) -> Result<(), ProcessError> {
            let n = self.calls.fetch_add(1, Relaxed) + 1;
            match (n <= self.failures, self.how) {
                (false, _) => Ok(()),
                (true, Fail::Transient) => Err(ProcessError::transient("not yet")),
                (true, Fail::Permanent) => Err(ProcessError::permanent("never")),
                (true, Fail::Hang) => std::future::pending().await,
                (true, Fail::Listen) => {
                    ctx.cancelled().await;
                    self.saw_cancel.fetch_add(1, Relaxed);
                    *self.last_reason.lock().unwrap() = ctx.cancel_reason();
                    Err(ProcessError::transient("stopped on cancel"))
                }
            }
        }
    }

    fn shared(failures: u32, how: Fail, config: impl FnOnce(PipelineConfig) -> PipelineConfig) -> Arc<Shared<Flaky>> {
        let retry =
            RetryPolicy { max_attempts: 3, base_delay: Duration::from_millis(1), max_delay: Duration::from_millis(2) };
        let config = config(PipelineConfig::new("127.0.0.1:1", "layers", ["t"]).retry(retry));
        let processor = Flaky {
            failures,
            how,
            calls: AtomicU32::new(0),
            saw_cancel: AtomicU32::new(0),
            last_reason: Default::default(),
        };
        Pipeline::new(config, processor).expect("clients are created without a broker").shared
    }

    fn record(offset: i64, key: &str) -> Record {
        let mut r = Record {
            topic: "t".into(),
            partition: 0,
            offset,
            timestamp: None,
            key: None,
            value: None,
            headers: Default::default(),
        };
        r.headers.push("idempotency-key", key);
        r
    }

    async fn run_one(shared: &Arc<Shared<Flaky>>, record: &Record, cancel: &CancellationToken) -> Processed {
        let scope = CallScope::new(shared.blocking.slot("t".into(), 0));
        let parking = Decision::Off;
        process(shared, &PendingOutputs::new(Default::default()), 1, record, parking, cancel, &scope).await
    }

    #[tokio::test]
    async fn transient_failures_are_retried_until_done() {
        let s = shared(2, Fail::Transient, |c| c);
        let done = run_one(&s, &record(0, "a"), &CancellationToken::new()).await;
        assert!(matches!(done.outcome, Outcome::Done(_)), "{done:?}");
        assert_eq!((s.processor.calls.load(Relaxed), s.telemetry.stats.retries.load(Relaxed)), (3, 2));
    }

    #[tokio::test]
    async fn a_failure_for_good_stays_failed_with_the_dlq_off() {
        let s = shared(1, Fail::Permanent, |c| c.dlq(DlqConfig { enabled: false, ..DlqConfig::default() }));
        let done = run_one(&s, &record(0, "a"), &CancellationToken::new()).await;
        let Outcome::Failed(failure) = done.outcome else { panic!("{done:?}") };
        assert_eq!((failure.kind, failure.attempts), (crate::dlq::DlqErrorKind::Permanent, 1), "permanent: no retry");
    }

    #[tokio::test]
    async fn exhausted_retries_end_the_record_transient_exhausted() {
        let s = shared(10, Fail::Transient, |c| c.dlq(DlqConfig { enabled: false, ..DlqConfig::default() }));
        let done = run_one(&s, &record(0, "a"), &CancellationToken::new()).await;
        let Outcome::Failed(failure) = done.outcome else { panic!("{done:?}") };
        assert_eq!((failure.kind, failure.attempts), (crate::dlq::DlqErrorKind::TransientExhausted, 3));
    }

    #[tokio::test]
    async fn a_call_past_the_attempt_timeout_is_cancelled_retried_then_ends_timeout() {
        let limit = Duration::from_millis(30);
        let no_dlq = DlqConfig { enabled: false, ..DlqConfig::default() };
        let s = shared(1, Fail::Hang, |c| c.attempt_timeout(limit).dlq(no_dlq.clone()));
        let started = std::time::Instant::now();
        let done = run_one(&s, &record(0, "a"), &CancellationToken::new()).await;
        assert!(matches!(done.outcome, Outcome::Done(_)), "the retry after the timeout succeeds: {done:?}");
        assert!(started.elapsed() >= limit, "the hung call was given its {limit:?}");
        assert_eq!((s.processor.calls.load(Relaxed), s.telemetry.stats.retries.load(Relaxed)), (2, 1));

        let s = shared(10, Fail::Hang, |c| c.attempt_timeout(limit).dlq(no_dlq));
        let done = run_one(&s, &record(0, "a"), &CancellationToken::new()).await;
        let Outcome::Failed(failure) = done.outcome else { panic!("{done:?}") };
        assert_eq!((failure.kind, failure.attempts), (crate::dlq::DlqErrorKind::Timeout, 3), "{failure:?}");
        assert!(failure.message.contains("timed out after 30ms"), "{}", failure.message);
    }

    #[tokio::test]
    async fn a_timed_out_call_that_listens_sees_cancelled_and_one_that_does_not_gets_no_grace() {
        let (limit, grace) = (Duration::from_millis(30), Duration::from_secs(2));
        let no_dlq = DlqConfig { enabled: false, ..DlqConfig::default() };
        let config = |c: PipelineConfig| c.attempt_timeout(limit).cancel_grace(grace).dlq(no_dlq.clone());
        let s = shared(10, Fail::Listen, config);
        let started = std::time::Instant::now();
        let done = run_one(&s, &record(0, "a"), &CancellationToken::new()).await;
        let Outcome::Failed(failure) = done.outcome else { panic!("{done:?}") };
        assert_eq!((failure.kind, failure.attempts), (crate::dlq::DlqErrorKind::Timeout, 3), "{failure:?}");
        assert_eq!(s.processor.saw_cancel.load(Relaxed), 3, "each attempt saw ctx.cancelled()");
        assert!(started.elapsed() < grace, "a call that stops on cancel is not waited for: {:?}", started.elapsed());

        let s = shared(10, Fail::Hang, config);
        let started = std::time::Instant::now();
        let done = run_one(&s, &record(0, "a"), &CancellationToken::new()).await;
        assert!(matches!(done.outcome, Outcome::Failed(_)), "{done:?}");
        assert!(started.elapsed() < grace, "a call that never asks is dropped at once: {:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_call_running_at_the_drain_deadline_is_cancelled_and_its_record_left_unfinished() {
        let grace = Duration::from_secs(2);
        for how in [Fail::Listen, Fail::Hang] {
            let s = shared(10, how, |c| c.cancel_grace(grace));
            let scope = Arc::new(CallScope::new(s.blocking.slot("t".into(), 0)));
            let fire = scope.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                fire.drain.fire(crate::CancelReason::Revoked);
            });
            let started = std::time::Instant::now();
            let pending = PendingOutputs::new(Default::default());
            let (r, cancel) = (record(0, "a"), CancellationToken::new());
            let call = process(&s, &pending, 1, &r, Decision::Off, &cancel, &scope);
            let done = tokio::time::timeout(Duration::from_secs(5), call).await.expect("the deadline ends the call");
            assert!(matches!(done.outcome, Outcome::Abandoned), "not retried, not dead-lettered: {done:?}");
            assert!(started.elapsed() < grace, "no wait past the call's end: {:?}", started.elapsed());
            assert_eq!(s.processor.calls.load(Relaxed), 1);
            let stats = s.telemetry.stats.snapshot();
            let listened = matches!(how, Fail::Listen);
            assert_eq!((stats.attempts_cancelled, stats.attempts_dropped), (1, u64::from(!listened)));
            let seen = *s.processor.last_reason.lock().unwrap();
            assert_eq!(seen, listened.then_some(crate::CancelReason::Revoked));
        }
    }

    #[tokio::test]
    async fn a_key_processed_once_is_a_duplicate_after() {
        let dir =
            std::env::temp_dir().join(format!("millrace-layers-{}-{:x}", std::process::id(), rand::random::<u32>()));
        let s = shared(0, Fail::Transient, |c| c.dedup(DedupConfig { changelog: false, ..DedupConfig::new(&dir) }));
        let cancel = CancellationToken::new();
        assert!(matches!(run_one(&s, &record(0, "order-1"), &cancel).await.outcome, Outcome::Done(_)));
        assert!(matches!(run_one(&s, &record(1, "order-1"), &cancel).await.outcome, Outcome::Duplicate));
        assert!(matches!(run_one(&s, &record(2, "order-2"), &cancel).await.outcome, Outcome::Done(_)));
        assert_eq!(s.processor.calls.load(Relaxed), 2, "the duplicate never reached the processor");
        drop(s);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[tokio::test]
    async fn an_open_breaker_holds_records_until_cancelled() {
        let breaker = crate::CircuitBreakerConfig { enabled: true, max_consecutive: 1, ..Default::default() };
        let s = shared(0, Fail::Transient, |c| c.circuit_breaker(breaker));
        assert!(s.breaker.record(1, true, &s.telemetry), "one dead-lettered record trips it");
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            stop.cancel();
        });
        let done = run_one(&s, &record(0, "a"), &cancel).await;
        assert!(matches!(done.outcome, Outcome::Abandoned), "{done:?}");
        assert_eq!(s.processor.calls.load(Relaxed), 0, "nothing ran while the breaker was open");
    }
}
