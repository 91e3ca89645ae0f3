//! Backpressure: the one owner of how much work is in flight (records polled and not finished, and
//! the bytes they and exactly-once mode's pending outputs hold) and of the poll thread's wait for
//! room under the total bounds ([`Bounds`]). Partition handles count into [`InFlight`]; the poll
//! thread asks [`Backpressure::over_total`] before handing a batch over and waits in
//! [`Backpressure::wait_for_room`]; partition tasks wake it as they finish work. [`crate::Stats`]
//! only reads the counts for telemetry.
//!
//! The per-partition bound (pause a partition whose task holds too much) is the poll thread's,
//! with the partition's own buffered count; a drained paused partition leaves a resume hint here.

use crate::config::Bounds;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Records and bytes in flight, with the peak record count. Shared by the partition handles that
/// count into it, [`Backpressure`] that bounds it and [`crate::Stats`] that reports it.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    records: AtomicU64,
    bytes: AtomicU64,
    peak: AtomicU64,
}

impl InFlight {
    /// Counts `records` more records (and `bytes` more bytes) in flight.
    pub(crate) fn add(&self, records: u64, bytes: u64) {
        if records > 0 {
            let now = self.records.fetch_add(records, Relaxed) + records;
            self.peak.fetch_max(now, Relaxed);
        }
        self.bytes.fetch_add(bytes, Relaxed);
    }

    /// Counts `records` (and `bytes`) finished or dropped.
    pub(crate) fn sub(&self, records: u64, bytes: u64) {
        if records > 0 {
            self.records.fetch_sub(records, Relaxed);
        }
        self.bytes.fetch_sub(bytes, Relaxed);
    }

    /// Records in flight.
    pub(crate) fn records(&self) -> u64 {
        self.records.load(Relaxed)
    }

    /// Bytes in flight.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Relaxed)
    }

    /// The most records ever in flight at once.
    pub(crate) fn peak(&self) -> u64 {
        self.peak.load(Relaxed)
    }
}

/// The total bounds on in-flight work and the poll thread's wait for room under them.
pub(crate) struct Backpressure {
    load: Arc<InFlight>,
    max_records: u64,
    max_bytes: u64,
    /// Set while the poll thread waits in [`wait_for_room`](Self::wait_for_room).
    waiting: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
    /// Set by partition tasks when a paused partition has drained enough to resume.
    resume_hint: AtomicBool,
}

impl Backpressure {
    /// Bounds `load` by `bounds`' totals.
    pub(crate) fn new(bounds: &Bounds, load: Arc<InFlight>) -> Self {
        Self {
            load,
            max_records: bounds.max_in_flight_total as u64,
            max_bytes: bounds.max_buffered_bytes as u64,
            waiting: AtomicBool::new(false),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            resume_hint: AtomicBool::new(false),
        }
    }

    /// The counts this bounds (for partition handles to count into).
    pub(crate) fn load(&self) -> &Arc<InFlight> {
        &self.load
    }

    /// Whether in-flight work, plus `pending` records of `pending_bytes` not handed over yet, reached
    /// the total bounds.
    pub(crate) fn over_total(&self, pending: usize, pending_bytes: usize) -> bool {
        self.load.records() + pending as u64 >= self.max_records
            || self.load.bytes() + pending_bytes as u64 >= self.max_bytes
    }

    /// Whether in-flight work is above three quarters of the total bounds: the poll thread, once
    /// throttled, resumes below that, so that it refills in large batches rather than one by one.
    fn over_low_water(&self) -> bool {
        self.load.records() > self.max_records * 3 / 4 || self.load.bytes() > self.max_bytes * 3 / 4
    }

    /// Blocks the poll thread until in-flight work drops under the low-water mark, or `wait` passed.
    pub(crate) fn wait_for_room(&self, wait: Duration) {
        let guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.waiting.swap(true, SeqCst);
        let _ = self.cv.wait_timeout_while(guard, wait, |_| self.over_low_water());
        self.waiting.store(false, SeqCst);
    }

    /// Wakes the poll thread if it waits for room (cheap when it does not). Called after work left.
    pub(crate) fn wake(&self) {
        // SeqCst pairs with the swap in `wait_for_room` (the in-flight count was just decremented by
        // an atomic read-modify-write), so a waiting poll thread is never missed.
        if self.waiting.load(SeqCst) && !self.over_low_water() {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.cv.notify_one();
        }
    }

    /// A paused partition drained enough to resume.
    pub(crate) fn hint_resume(&self) {
        self.resume_hint.store(true, Relaxed);
    }

    /// Whether a paused partition drained enough to resume since the last call; clears the hint.
    pub(crate) fn take_resume_hint(&self) -> bool {
        self.resume_hint.swap(false, Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn bounds(records: usize, bytes: usize) -> Bounds {
        Bounds { max_in_flight_total: records, max_buffered_bytes: bytes, ..Bounds::default() }
    }

    #[test]
    fn counts_records_bytes_and_the_peak() {
        let load = InFlight::default();
        load.add(3, 30);
        load.add(0, 5); // a pending output's bytes only
        load.sub(2, 20);
        assert_eq!((load.records(), load.bytes(), load.peak()), (1, 15, 3));
    }

    #[test]
    fn either_total_bound_throttles() {
        let bp = Backpressure::new(&bounds(10, 1000), Arc::default());
        bp.load().add(8, 100);
        assert!(!bp.over_total(1, 0));
        assert!(bp.over_total(2, 0), "8 in flight + 2 pending reach 10 records");
        assert!(bp.over_total(0, 900), "100 + 900 bytes reach 1000 bytes");
    }

    #[test]
    fn a_waiting_poll_thread_is_woken_below_the_low_water_mark() {
        let bp = Arc::new(Backpressure::new(&bounds(100, 1 << 20), Arc::default()));
        bp.load().add(100, 0);
        let finisher = {
            let bp = bp.clone();
            std::thread::spawn(move || {
                while !bp.waiting.load(SeqCst) {
                    std::thread::yield_now();
                }
                bp.load().sub(30, 0); // 70 left: under three quarters
                bp.wake();
            })
        };
        let started = Instant::now();
        bp.wait_for_room(Duration::from_secs(30));
        finisher.join().unwrap();
        assert!(started.elapsed() < Duration::from_secs(10), "woken, not timed out: {:?}", started.elapsed());
        assert!(!bp.over_total(0, 0));
    }
}
