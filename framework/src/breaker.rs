//! The circuit breaker: counts finished records, dead-lettered ones and attempts that failed
//! transiently, and opens (pausing the pipeline) when the DLQ would be flooded or the processor's
//! downstream looks down. After its cool-down it is half-open: one attempt at a time, the probe,
//! runs; its success closes the breaker, its failure opens it again. See [`CircuitBreakerConfig`].
//!
//! Both windows are tumbling windows (a cheap stand-in for sliding ones: a burst straddling two
//! windows trips the consecutive limit instead, or the next window). Successes are counted in bulk
//! by the partition tasks as records finish, failures one by one, so the hot path pays nothing.

use crate::config::CircuitBreakerConfig;
use crate::telemetry::Telemetry;
use crate::telemetry::events::{BreakerClosed, BreakerHalfOpen, BreakerProbeFailed, BreakerTripped};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::time::Instant;
use tokio_util::sync::CancellationToken;

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

pub(crate) struct Breaker {
    config: CircuitBreakerConfig,
    /// The phase, for records and attempts waiting at the breaker.
    state: tokio::sync::watch::Sender<u8>,
    /// The same, for the cheap check on every record, attempt and poll turn (the breaker owns this
    /// state; `Stats::breaker_open` only mirrors it for telemetry). Written under `open_until`.
    phase: AtomicU8,
    /// Whether the half-open breaker's probe is running.
    probing: AtomicBool,
    total: AtomicU32,
    dead: AtomicU32,
    consecutive: AtomicU32,
    attempts: AtomicU32,
    transient: AtomicU32,
    open_until: Mutex<Option<Instant>>,
}

/// The right to run one attempt: a plain pass while the breaker is closed, the probe while it is
/// half-open. The probe's verdict closes or reopens the breaker; dropped without one (its attempt
/// was cancelled) it frees the probe for another attempt.
pub(crate) struct Probe<'a> {
    breaker: Option<&'a Breaker>,
}

impl Probe<'_> {
    /// The attempt ended: for the probe, `ok` closes the breaker and a failure opens it for another
    /// cool-down.
    pub(crate) fn finish(mut self, ok: bool, telemetry: &Telemetry) {
        let Some(b) = self.breaker.take() else { return };
        if ok {
            let _phase = b.lock();
            b.reset_windows();
            b.phase.store(CLOSED, Relaxed);
            b.probing.store(false, Release);
            BreakerClosed.emit(telemetry);
            b.state.send_replace(CLOSED);
        } else {
            BreakerProbeFailed { cooldown: b.config.cooldown }.emit(telemetry);
            b.open(telemetry, None);
            b.probing.store(false, Release);
        }
    }
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.breaker.take() {
            b.probing.store(false, Release);
            b.state.send_modify(|_| {}); // wakes the attempts waiting for the probe
        }
    }
}

impl Breaker {
    pub(crate) fn new(config: CircuitBreakerConfig) -> Self {
        Self {
            config,
            state: tokio::sync::watch::Sender::new(CLOSED),
            phase: AtomicU8::new(CLOSED),
            probing: AtomicBool::new(false),
            total: AtomicU32::new(0),
            dead: AtomicU32::new(0),
            consecutive: AtomicU32::new(0),
            attempts: AtomicU32::new(0),
            transient: AtomicU32::new(0),
            open_until: Mutex::new(None),
        }
    }

    /// Counts `n` finished records, all dead-lettered or all not (each ended by one attempt that did
    /// not fail transiently). Returns true if this tripped the breaker. Counts only while closed.
    pub(crate) fn record(&self, n: u32, dead_lettered: bool, telemetry: &Telemetry) -> bool {
        if !self.config.enabled || n == 0 || self.tripped() {
            return false;
        }
        let mut trip = None;
        if dead_lettered {
            let run = self.consecutive.fetch_add(n, Relaxed) + n;
            self.dead.fetch_add(n, Relaxed);
            if run >= self.config.max_consecutive {
                trip = Some(format!("{run} dead-lettered records in a row"));
            }
        } else if self.consecutive.load(Relaxed) != 0 {
            self.consecutive.store(0, Relaxed);
        }
        let total = self.total.fetch_add(n, Relaxed) + n;
        if total >= self.config.window {
            let dead = self.dead.swap(0, Relaxed);
            self.total.store(0, Relaxed);
            let share = f64::from(dead) / f64::from(total);
            if trip.is_none() && share > self.config.max_dlq_share {
                trip = Some(format!("{dead} of the last {total} records dead-lettered"));
            }
        }
        let trip = trip.or_else(|| self.attempts_ended(n));
        trip.is_some_and(|reason| self.open(telemetry, Some(&reason)))
    }

    /// Counts an attempt whose processor call failed transiently (an error it returned, or the
    /// attempt timeout): a downstream that is down. Returns true if this tripped the breaker.
    pub(crate) fn transient_failure(&self, telemetry: &Telemetry) -> bool {
        if !self.config.enabled || self.config.max_transient_share <= 0.0 || self.tripped() {
            return false;
        }
        self.transient.fetch_add(1, Relaxed);
        self.attempts_ended(1).is_some_and(|reason| self.open(telemetry, Some(&reason)))
    }

    /// Adds `n` ended attempts to the transient window; the reason to trip when it closes over the
    /// share.
    fn attempts_ended(&self, n: u32) -> Option<String> {
        if self.config.max_transient_share <= 0.0 {
            return None;
        }
        let attempts = self.attempts.fetch_add(n, Relaxed) + n;
        if attempts < self.config.transient_window {
            return None;
        }
        let failed = self.transient.swap(0, Relaxed);
        self.attempts.store(0, Relaxed);
        (f64::from(failed) / f64::from(attempts) > self.config.max_transient_share)
            .then(|| format!("{failed} of the last {attempts} attempts failed transiently"))
    }

    /// Opens the breaker for a cool-down (`reason` when it trips from closed). True if it was
    /// closed.
    fn open(&self, telemetry: &Telemetry, reason: Option<&str>) -> bool {
        let mut until = self.lock();
        *until = Some(Instant::now() + self.config.cooldown);
        let was = self.phase.swap(OPEN, Relaxed);
        if was == OPEN {
            return false;
        }
        if let (CLOSED, Some(reason)) = (was, reason) {
            BreakerTripped { reason, cooldown: self.config.cooldown }.emit(telemetry);
        }
        self.state.send_replace(OPEN);
        was == CLOSED
    }

    fn reset_windows(&self) {
        for count in [&self.total, &self.dead, &self.consecutive, &self.attempts, &self.transient] {
            count.store(0, Relaxed);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.open_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Layer 1: waits while the breaker is open, so that records already polled do not start either
    /// and the flood stops at once rather than after the buffered records. A half-open breaker lets
    /// records through to [`gate`](Self::gate). False when `cancel` fired first.
    pub(crate) async fn admits(&self, cancel: &CancellationToken) -> bool {
        if !self.tripped() {
            return true;
        }
        let mut state = self.state.subscribe();
        tokio::select! {
            open = state.wait_for(|phase| *phase != OPEN) => open.is_ok(),
            _ = cancel.cancelled() => false,
        }
    }

    /// In front of every attempt: passes while closed, waits while open, and while half-open lets
    /// one attempt at a time through as the probe. `None` when `cancel` fired first.
    pub(crate) async fn gate(&self, cancel: &CancellationToken) -> Option<Probe<'_>> {
        if !self.tripped() {
            return Some(Probe { breaker: None });
        }
        let mut state = self.state.subscribe();
        loop {
            // The watch only wakes; the phase decides (a woken waiter could otherwise read a stale
            // half-open and probe again after the probe had closed the breaker).
            state.borrow_and_update();
            match self.phase.load(Acquire) {
                CLOSED => return Some(Probe { breaker: None }),
                HALF_OPEN if self.probing.compare_exchange(false, true, Acquire, Relaxed).is_ok() => {
                    // The probe's verdict sets the phase before it frees the slot (Release).
                    if self.phase.load(Relaxed) == HALF_OPEN {
                        return Some(Probe { breaker: Some(self) });
                    }
                    self.probing.store(false, Release);
                    continue;
                }
                _ => {}
            }
            tokio::select! {
                changed = state.changed() => changed.ok()?,
                _ = cancel.cancelled() => return None,
            }
        }
    }

    /// Whether the breaker tripped and has not closed yet (open or half-open; one atomic load).
    pub(crate) fn tripped(&self) -> bool {
        self.phase.load(Relaxed) != CLOSED
    }

    /// Whether consumption must stay paused (open); once the cool-down has passed the breaker turns
    /// half-open, consumption resumes and the next attempt probes.
    pub(crate) fn is_open(&self, telemetry: &Telemetry) -> bool {
        let mut until = self.lock();
        if self.phase.load(Relaxed) != OPEN {
            return false;
        }
        if until.is_some_and(|u| Instant::now() < u) {
            return true;
        }
        *until = None;
        self.phase.store(HALF_OPEN, Relaxed);
        BreakerHalfOpen.emit(telemetry);
        self.state.send_replace(HALF_OPEN);
        false
    }

    /// Whether the breaker holds consumption paused (open, not yet half-open).
    pub(crate) fn pausing(&self) -> bool {
        self.phase.load(Relaxed) == OPEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use std::time::Duration;

    fn breaker(window: u32, share: f64, consecutive: u32) -> Breaker {
        Breaker::new(CircuitBreakerConfig {
            window,
            max_dlq_share: share,
            max_consecutive: consecutive,
            cooldown: Duration::from_secs(60),
            ..Default::default()
        })
    }

    fn telemetry() -> Telemetry {
        Telemetry::new("t", "g", Duration::ZERO)
    }

    #[test]
    fn trips_on_consecutive_dead_letters() {
        let (b, s) = (breaker(1000, 1.0, 3), telemetry());
        assert!(!b.record(1, true, &s));
        assert!(!b.record(1, false, &s), "a success resets the run");
        assert!(!b.record(1, true, &s));
        assert!(!b.record(1, true, &s));
        assert!(b.record(1, true, &s));
        assert!(b.is_open(&s));
        assert!(s.stats.snapshot().breaker_open);
    }

    #[test]
    fn trips_on_share_of_a_window() {
        let (b, s) = (breaker(10, 0.5, 100), telemetry());
        for i in 0..10 {
            b.record(1, i % 3 == 0, &s); // 4 of 10
        }
        assert!(!b.is_open(&s));
        let trips: Vec<bool> = (0..10).map(|i| b.record(1, i % 2 == 0 || i == 9, &s)).collect(); // 6 of 10
        let tripped = trips.contains(&true);
        assert!(tripped && b.is_open(&s));
    }

    #[test]
    fn trips_when_a_window_of_attempts_fails_transiently_over_the_share() {
        let config = CircuitBreakerConfig { transient_window: 10, max_transient_share: 0.8, ..Default::default() };
        let (b, s) = (Breaker::new(config), telemetry());
        b.record(2, false, &s);
        assert!((0..8).all(|_| !b.transient_failure(&s)), "8 of 10 is not over 0.8");
        b.record(1, false, &s);
        assert!((0..9).any(|_| b.transient_failure(&s)), "9 of the next 10");
        assert!(b.is_open(&s) && s.stats.snapshot().breaker_trips == 1);
        let off = Breaker::new(CircuitBreakerConfig { transient_window: 1, max_transient_share: 0.0, ..config });
        assert!(!off.transient_failure(&s), "a share of 0 turns the transient trip off");
    }

    #[test]
    fn half_open_lets_one_probe_through_whose_verdict_closes_or_reopens() {
        let cancel = CancellationToken::new();
        let (b, s) = (breaker(1000, 1.0, 1), telemetry());
        assert!(b.gate(&cancel).now_or_never().expect("closed passes").is_some());
        assert!(b.record(1, true, &s));
        assert!(b.gate(&cancel).now_or_never().is_none(), "open: the attempt waits");
        assert!(b.admits(&cancel).now_or_never().is_none(), "open: records wait");
        let b =
            Breaker::new(CircuitBreakerConfig { cooldown: Duration::ZERO, max_consecutive: 1, ..Default::default() });
        assert!(b.record(1, true, &s));
        assert!(!b.is_open(&s) && b.tripped(), "after the cool-down: half-open, consumption resumes");
        assert_eq!(b.admits(&cancel).now_or_never(), Some(true));
        let probe = b.gate(&cancel).now_or_never().flatten().expect("the first attempt probes");
        assert!(b.gate(&cancel).now_or_never().is_none(), "one probe at a time");
        probe.finish(false, &s);
        assert!(b.pausing(), "a failed probe opens the breaker again");
        assert!(!b.is_open(&s));
        drop(b.gate(&cancel).now_or_never().flatten().expect("a probe"));
        let probe = b.gate(&cancel).now_or_never().flatten().expect("a cancelled probe frees the slot");
        probe.finish(true, &s);
        assert!(!b.tripped() && !s.stats.snapshot().breaker_open, "a good probe closes it");
        cancel.cancel();
    }

    #[test]
    fn can_be_disabled() {
        let s = telemetry();
        let off = Breaker::new(CircuitBreakerConfig { enabled: false, max_consecutive: 1, ..Default::default() });
        assert!(!off.record(1, true, &s));
        assert!(!off.transient_failure(&s));
    }
}
