//! Layer 3, with the dedup store on: never two records with the same idempotency key at once; a
//! key already processed is skipped; after the effect the key is recorded (at-least-once: changelog
//! first, then the local store, before the offset completes; exactly-once: when the record's
//! transaction commits). The store and the changelog are [`crate::dedup::store`]'s and
//! [`crate::dedup::changelog`]'s.

use super::Outcome;
use crate::context::IdempotencyKey;
use crate::dedup::IDEMPOTENCY_KEY_HEADER;
use crate::dedup::KeyGuard;
use crate::dedup::changelog;
use crate::dedup::runtime::Dedup;
use crate::processor::Processor;
use crate::record::Record;
use crate::shared::Shared;
use crate::state::pending::PendingOutputs;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use tokio_util::sync::CancellationToken;

/// What the store says of a record before it runs.
pub(crate) enum Check<'a> {
    /// The dedup store is off, or the record has no idempotency key: run it with this key for
    /// [`Context::idempotency_key`](crate::Context::idempotency_key).
    Off(IdempotencyKey),
    /// Its key was processed already: skip it.
    Duplicate,
    /// Not seen: run it while holding its key, then [`Held::after`].
    Fresh(Held<'a>),
    /// `cancel` fired while waiting for another record with the same key.
    Abandoned,
}

/// A key held for one record's run.
pub(crate) struct Held<'a> {
    dedup: &'a Dedup,
    key: Vec<u8>,
    _guard: KeyGuard,
}

/// Holds `record`'s idempotency key (waiting for another record with the same key to finish) and
/// looks it up. A failed lookup is logged and the record runs.
pub(crate) async fn check<'a, P: Processor>(
    shared: &'a Shared<P>,
    pending: &PendingOutputs,
    record: &Record,
    cancel: &CancellationToken,
) -> Check<'a> {
    let Some(dedup) = shared.dedup.as_ref() else { return Check::Off(key_without_store(record)) };
    let Some((key, fallback)) = dedup.config.key_and_origin(record) else { return Check::Off(IdempotencyKey::Absent) };
    if fallback && !dedup.fallback_warned.swap(true, Relaxed) {
        tracing::warn!(pipeline = %shared.config.name, topic = %record.topic, partition = record.partition,
            offset = record.offset,
            "a record without an idempotency key (no `{}` header, no key_fn result) is deduplicated by its \
             coordinates topic/partition/offset: a copy produced again or replayed from the DLQ has new \
             coordinates and runs again; give records a key, or set dedup.fallback = \"none\" (logged once)",
            dedup.config.header);
    }
    let guard = tokio::select! {
        held = dedup.in_flight.hold(&key) => held,
        _ = cancel.cancelled() => return Check::Abandoned,
    };
    // Exactly-once: a key whose transaction has not committed yet is not in the store.
    let seen = match shared.handles.transactional && pending.has_key(&key) {
        true => Ok(true),
        false => dedup.store.partition(&record.topic, record.partition).and_then(|p| p.seen(&key)),
    };
    match seen {
        Ok(true) => Check::Duplicate,
        Ok(false) => Check::Fresh(Held { dedup, key, _guard: guard }),
        Err(e) => {
            shared.log.warn("dedup lookup failed; processing the record", &e.to_string());
            Check::Fresh(Held { dedup, key, _guard: guard })
        }
    }
}

/// The key a record's context gives with the store off: the default header, else the coordinates.
fn key_without_store(record: &Record) -> IdempotencyKey {
    match record.headers.get(IDEMPOTENCY_KEY_HEADER) {
        Some(key) => IdempotencyKey::Given(key.to_vec()),
        None => IdempotencyKey::Coordinates {
            topic: record.topic.clone(),
            partition: record.partition,
            offset: record.offset,
        },
    }
}

impl Held<'_> {
    /// The idempotency key.
    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }

    /// Records the key of a record that took effect; returns the outcome, and in exactly-once mode
    /// the key to record when the transaction commits. A changelog write interrupted by `cancel`
    /// leaves the record unfinished (redelivered later).
    pub(crate) async fn after<P: Processor>(
        self,
        shared: &Arc<Shared<P>>,
        record: &Record,
        outcome: Outcome,
        cancel: &CancellationToken,
    ) -> (Outcome, Option<Vec<u8>>) {
        match outcome {
            Outcome::Done(outputs) if shared.handles.transactional => (Outcome::Done(outputs), Some(self.key)),
            Outcome::Done(outputs) => match changelog::record(shared, self.dedup, record, &self.key, cancel).await {
                true => (Outcome::Done(outputs), None),
                false => (Outcome::Abandoned, None),
            },
            outcome => (outcome, None),
        }
    }
}
