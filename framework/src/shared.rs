//! What the poll thread and the partition tasks share: the processor, the configuration, the
//! clients and the run-time state of the layers, and the poll thread's backpressure wake-up.

use crate::breaker::Breaker;
use crate::config::PipelineConfig;
use crate::context::RuntimeHandles;
use crate::dedup::runtime::Dedup;
use crate::kafka::log::KafkaLog;
use crate::rejected::Rejections;
use crate::telemetry::Telemetry;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// Longest the poll thread blocks in one poll or one backpressure wait.
pub(crate) const POLL_WAIT: Duration = Duration::from_millis(100);

/// What the poll thread and the partition tasks share.
pub(crate) struct Shared<P> {
    pub(crate) processor: P,
    pub(crate) config: PipelineConfig,
    pub(crate) handles: Arc<RuntimeHandles>,
    /// Counters, logs and metrics ([`crate::telemetry`]).
    pub(crate) telemetry: Arc<Telemetry>,
    pub(crate) concurrency: Semaphore,
    /// Set by partition tasks when a paused partition has drained enough to resume.
    pub(crate) resume_hint: AtomicBool,
    pub(crate) poller: PollerWake,
    /// For creating DLQ topics.
    pub(crate) admin: Arc<AdminClient<DefaultClientContext>>,
    /// DLQ topics known to exist in this run.
    pub(crate) dlq_topics: Mutex<HashSet<String>>,
    pub(crate) breaker: Arc<Breaker>,
    pub(crate) log: Arc<KafkaLog>,
    /// The dedup store, when on.
    pub(crate) dedup: Option<Arc<Dedup>>,
    /// Exactly-once: outputs rejected for their record.
    pub(crate) rejections: Option<Arc<Rejections>>,
}

/// Lets partition tasks wake the poll thread while it waits for in-flight room.
#[derive(Default)]
pub(crate) struct PollerWake {
    waiting: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl<P> Shared<P> {
    /// Wakes the poll thread if it waits for room (cheap when it does not).
    pub(crate) fn wake_poller(&self) {
        // SeqCst pairs with the swap in `wait_for_room` (the in-flight count was just decremented by
        // an atomic read-modify-write), so a waiting poll thread is never missed.
        if self.poller.waiting.load(SeqCst) && !self.over_low_water() {
            let _guard = self.poller.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.poller.cv.notify_one();
        }
    }

    /// Whether in-flight work, plus `pending` records of `pending_bytes` not handed over yet, reached
    /// the total bounds.
    pub(crate) fn over_total(&self, pending: usize, pending_bytes: usize) -> bool {
        let b = &self.config.bounds;
        self.telemetry.stats.in_flight.load(Relaxed) + pending as u64 >= b.max_in_flight_total as u64
            || self.telemetry.stats.buffered_bytes.load(Relaxed) + pending_bytes as u64 >= b.max_buffered_bytes as u64
    }

    /// Whether in-flight work is above three quarters of the total bounds: the poll thread, once
    /// throttled, resumes below that, so that it refills in large batches rather than one by one.
    fn over_low_water(&self) -> bool {
        let b = &self.config.bounds;
        self.telemetry.stats.in_flight.load(Relaxed) > (b.max_in_flight_total as u64 * 3 / 4)
            || self.telemetry.stats.buffered_bytes.load(Relaxed) > (b.max_buffered_bytes as u64 * 3 / 4)
    }

    /// Blocks the poll thread until in-flight work drops under the low-water mark, or `POLL_WAIT` passed.
    pub(crate) fn wait_for_room(&self) {
        let guard = self.poller.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.poller.waiting.swap(true, SeqCst);
        let _ = self.poller.cv.wait_timeout_while(guard, POLL_WAIT, |_| self.over_low_water());
        self.poller.waiting.store(false, SeqCst);
    }
}
