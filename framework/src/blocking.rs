//! The blocked-call detector: a processor call that holds its thread without reaching an await
//! (a blocking client, a long computation, `std::thread::sleep`) cannot be timed out, cancelled or
//! dropped: it freezes its partition's task and ties up a runtime worker. It can be seen, though.
//!
//! Every poll of a processor call notes, in its partition task's [`Slot`], the record it serves
//! and the tick it started at, and clears the tick when the poll returns. A plain thread
//! (`millrace-blocking`, neither a runtime worker nor the poll thread, so a blocked worker or a
//! rebalance callback cannot hold it up) advances the tick every quarter of
//! [`blocked_poll_threshold`](crate::PipelineConfig::blocked_poll_threshold) and scans the slots: a
//! poll older than the threshold is reported once at error level with its record's coordinates
//! and counted in [`StatsSnapshot::blocked_calls`](crate::StatsSnapshot::blocked_calls) (and the
//! `millrace_blocked_calls` gauge, and a readiness reason) until it returns. The hot path pays one
//! shared load and three stores to its own slot per poll; no clock is read.

use crate::telemetry::Telemetry;
use crate::telemetry::health_events::{CallBlocking, CallUnblocked};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering::Acquire, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Ticks per threshold: a poll is reported once it has lasted this many ticks (with one more of
/// slack, it is older than the threshold for sure).
const TICKS: u64 = 4;

/// The detector: the tick, and one slot per partition task.
pub(crate) struct Blocking {
    tick: AtomicU64,
    /// How often the tick advances (a quarter of the threshold).
    quantum: Duration,
    slots: Mutex<Vec<Weak<Slot>>>,
}

pin_project_lite::pin_project! {
    /// A processor call whose polls are noted in its task's [`Slot`] ([`Blocking::watch`]).
    pub(crate) struct Watched<'a, F> {
        #[pin]
        call: F,
        tick: &'a AtomicU64,
        slot: &'a Slot,
        offset: i64,
        attempt: u32,
    }
}

impl<F: Future> Future for Watched<'_, F> {
    type Output = F::Output;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        let this = self.project();
        let slot = *this.slot;
        slot.offset.store(*this.offset, Relaxed);
        slot.attempt.store(*this.attempt, Relaxed);
        slot.since.store(this.tick.load(Relaxed), std::sync::atomic::Ordering::Release);
        let polled = this.call.poll(cx);
        slot.since.store(0, std::sync::atomic::Ordering::Release);
        polled
    }
}

/// What one partition task's processor poll is doing now (one poll at a time per task).
pub(crate) struct Slot {
    topic: Arc<str>,
    partition: i32,
    /// The tick the current poll started at; 0 between polls.
    since: AtomicU64,
    offset: AtomicI64,
    attempt: AtomicU32,
    /// The `since` of the poll reported as blocking (0: none); the detector's thread alone
    /// writes it.
    reported: AtomicU64,
}

impl Blocking {
    pub(crate) fn new(threshold: Duration) -> Self {
        Self { tick: AtomicU64::new(1), quantum: threshold / TICKS as u32, slots: Mutex::default() }
    }

    /// A slot for a partition task, watched while the task holds it.
    pub(crate) fn slot(&self, topic: Arc<str>, partition: i32) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            topic,
            partition,
            since: AtomicU64::new(0),
            offset: AtomicI64::new(-1),
            attempt: AtomicU32::new(0),
            reported: AtomicU64::new(0),
        });
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).push(Arc::downgrade(&slot));
        slot
    }

    /// `call` (one attempt of the record at `offset`), each poll noted in `slot`. A plain struct,
    /// not an `async fn`: the call is stored once, in place, not moved into a second pinned copy.
    pub(crate) fn watch<'a, F: Future>(&'a self, slot: &'a Slot, offset: i64, attempt: u32, call: F) -> Watched<'a, F> {
        Watched { call, tick: &self.tick, slot, offset, attempt }
    }

    /// Advances the tick and reports what changed; returns the number of polls blocking now.
    fn scan(&self, telemetry: &Telemetry) -> u64 {
        let tick = self.tick.fetch_add(1, Relaxed) + 1;
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.retain(|s| s.strong_count() > 0);
        let mut blocked = 0;
        for slot in slots.iter().filter_map(Weak::upgrade) {
            let since = slot.since.load(Acquire);
            let reported = slot.reported.load(Relaxed);
            if since != 0 && tick - since > TICKS {
                blocked += 1;
                if reported != since {
                    slot.reported.store(since, Relaxed);
                    let s = &slot;
                    let (offset, attempt) = (s.offset.load(Relaxed), s.attempt.load(Relaxed));
                    let at_least = self.quantum * (tick - since - 1) as u32;
                    CallBlocking { topic: &s.topic, partition: s.partition, offset, attempt, at_least }.emit(telemetry);
                }
            } else if reported != 0 {
                slot.reported.store(0, Relaxed);
                CallUnblocked { topic: &slot.topic, partition: slot.partition }.emit(telemetry);
            }
        }
        blocked
    }

    /// Starts the detector's thread; it stops when `stop` is cancelled.
    pub(crate) fn start(self: &Arc<Self>, telemetry: Arc<Telemetry>, stop: CancellationToken) -> std::io::Result<()> {
        let this = self.clone();
        std::thread::Builder::new().name("millrace-blocking".into()).spawn(move || {
            while !stop.is_cancelled() {
                std::thread::sleep(this.quantum);
                let blocked = this.scan(&telemetry);
                telemetry.stats.blocked_calls.store(blocked, Relaxed);
            }
            telemetry.stats.blocked_calls.store(0, Relaxed);
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn a_poll_longer_than_the_threshold_is_reported_until_it_returns() {
        let telemetry = Telemetry::new("t", "g", Duration::ZERO);
        let blocking = Blocking::new(Duration::from_millis(400));
        let slot = blocking.slot("t".into(), 3);
        assert_eq!(blocking.scan(&telemetry), 0, "nothing runs");
        // A call that blocks: the scans run from inside its poll, as the detector's thread would.
        let scans = std::cell::RefCell::new(Vec::new());
        let call = async {
            for _ in 0..6 {
                scans.borrow_mut().push(blocking.scan(&telemetry));
            }
        };
        blocking.watch(&slot, 42, 2, call).now_or_never().expect("never waits");
        assert_eq!(scans.into_inner(), [0, 0, 0, 0, 1, 1], "reported once older than the threshold");
        assert_eq!(slot.reported.load(Relaxed), 2, "reported with its start tick (the first scan moved it to 2)");
        assert_eq!((slot.offset.load(Relaxed), slot.attempt.load(Relaxed)), (42, 2));
        assert_eq!(blocking.scan(&telemetry), 0, "it returned");
        assert_eq!(slot.reported.load(Relaxed), 0);
        drop(slot);
        blocking.scan(&telemetry);
        assert!(blocking.slots.lock().unwrap().is_empty(), "a finished task's slot is forgotten");
    }

    #[test]
    fn polls_that_wait_are_not_blocking() {
        let telemetry = Telemetry::new("t", "g", Duration::ZERO);
        let blocking = Blocking::new(Duration::from_millis(400));
        let slot = blocking.slot("t".into(), 0);
        let mut call = Box::pin(blocking.watch(&slot, 1, 1, std::future::pending::<()>()));
        for _ in 0..10 {
            assert!((&mut call).now_or_never().is_none());
            assert_eq!(blocking.scan(&telemetry), 0, "between polls the slot is clear");
        }
    }
}
