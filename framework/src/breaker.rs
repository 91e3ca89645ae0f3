//! The DLQ circuit breaker: counts finished records and dead-lettered ones, and opens (pausing the
//! pipeline) when the DLQ would be flooded. See [`CircuitBreakerConfig`].
//!
//! The window is a tumbling window of `window` finished records (a cheap stand-in for a sliding one:
//! a burst straddling two windows trips the consecutive limit instead).

use crate::config::CircuitBreakerConfig;
use crate::telemetry::Telemetry;
use crate::telemetry::events::{BreakerClosed, BreakerTripped};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::time::Instant;

pub(crate) struct Breaker {
    config: CircuitBreakerConfig,
    /// Open or closed, for records waiting to start.
    state: tokio::sync::watch::Sender<bool>,
    /// The same, for the cheap check on every record and poll turn (the breaker owns this state;
    /// `Stats::breaker_open` only mirrors it for telemetry).
    open: AtomicBool,
    total: AtomicU32,
    dead: AtomicU32,
    consecutive: AtomicU32,
    open_until: Mutex<Option<Instant>>,
}

impl Breaker {
    pub(crate) fn new(config: CircuitBreakerConfig) -> Self {
        Self {
            config,
            state: tokio::sync::watch::Sender::new(false),
            open: AtomicBool::new(false),
            total: AtomicU32::new(0),
            dead: AtomicU32::new(0),
            consecutive: AtomicU32::new(0),
            open_until: Mutex::new(None),
        }
    }

    /// Counts `n` finished records, all dead-lettered or all not. Returns true if this tripped the
    /// breaker.
    pub(crate) fn record(&self, n: u32, dead_lettered: bool, telemetry: &Telemetry) -> bool {
        if !self.config.enabled || n == 0 {
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
        let Some(reason) = trip else { return false };
        let mut open = self.open_until.lock().unwrap_or_else(|p| p.into_inner());
        let was_open = open.is_some();
        *open = Some(Instant::now() + self.config.cooldown);
        self.consecutive.store(0, Relaxed);
        if !was_open {
            self.open.store(true, Relaxed);
            self.state.send_replace(true);
            BreakerTripped { reason: &reason, cooldown: self.config.cooldown }.emit(telemetry);
        }
        !was_open
    }

    /// Waits while the breaker is open: records already polled do not start either, so the flood
    /// stops at once rather than after the buffered records.
    pub(crate) async fn closed(&self) {
        if !self.tripped() {
            return;
        }
        let mut state = self.state.subscribe();
        let _ = state.wait_for(|open| !open).await;
    }

    /// Whether the breaker tripped and has not closed yet (one atomic load; the cool-down is
    /// checked by [`is_open`](Self::is_open)).
    pub(crate) fn tripped(&self) -> bool {
        self.open.load(Relaxed)
    }

    /// Whether consumption must stay paused; closes the breaker once the cool-down has passed.
    pub(crate) fn is_open(&self, telemetry: &Telemetry) -> bool {
        let mut open = self.open_until.lock().unwrap_or_else(|p| p.into_inner());
        match *open {
            Some(until) if Instant::now() >= until => {
                *open = None;
                self.open.store(false, Relaxed);
                BreakerClosed.emit(telemetry);
                self.state.send_replace(false);
                false
            }
            Some(_) => true,
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn breaker(window: u32, share: f64, consecutive: u32) -> Breaker {
        Breaker::new(CircuitBreakerConfig {
            enabled: true,
            window,
            max_dlq_share: share,
            max_consecutive: consecutive,
            cooldown: Duration::from_secs(60),
        })
    }

    #[test]
    fn trips_on_consecutive_dead_letters() {
        let (b, s) = (breaker(1000, 1.0, 3), Telemetry::new("t", "g", std::time::Duration::ZERO));
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
        let (b, s) = (breaker(10, 0.5, 100), Telemetry::new("t", "g", std::time::Duration::ZERO));
        for i in 0..10 {
            b.record(1, i % 3 == 0, &s); // 4 of 10
        }
        assert!(!b.is_open(&s));
        let trips: Vec<bool> = (0..10).map(|i| b.record(1, i % 2 == 0 || i == 9, &s)).collect(); // 6 of 10
        let tripped = trips.contains(&true);
        assert!(tripped && b.is_open(&s));
    }

    #[test]
    fn closes_after_cooldown_and_can_be_disabled() {
        let s = Telemetry::new("t", "g", std::time::Duration::ZERO);
        let b =
            Breaker::new(CircuitBreakerConfig { cooldown: Duration::ZERO, max_consecutive: 1, ..Default::default() });
        assert!(b.record(1, true, &s));
        assert!(!b.is_open(&s), "zero cool-down closes at once");
        let off = Breaker::new(CircuitBreakerConfig { enabled: false, max_consecutive: 1, ..Default::default() });
        assert!(!off.record(1, true, &s));
    }
}
