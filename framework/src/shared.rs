//! What the poll thread and the partition tasks share: the processor, the configuration, the
//! clients, and the run-time state of the layers and of backpressure.

use crate::blocking::Blocking;
use crate::breaker::Breaker;
use crate::config::PipelineConfig;
use crate::context::RuntimeHandles;
use crate::dedup::runtime::Dedup;
use crate::kafka::log::KafkaLog;
use crate::limit::RateLimiter;
use crate::rejected::Rejections;
use crate::state::backpressure::Backpressure;
use crate::telemetry::Telemetry;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
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
    /// In-flight work under the total bounds, and the poll thread's wait for room.
    pub(crate) backpressure: Backpressure,
    /// For creating DLQ topics.
    pub(crate) admin: Arc<AdminClient<DefaultClientContext>>,
    /// DLQ topics known to exist in this run.
    pub(crate) dlq_topics: Mutex<HashSet<String>>,
    pub(crate) breaker: Arc<Breaker>,
    /// Watches processor polls for calls that block their thread.
    pub(crate) blocking: Arc<Blocking>,
    /// The rate limit on processor calls, when set.
    pub(crate) rate_limit: Option<RateLimiter>,
    pub(crate) log: Arc<KafkaLog>,
    /// The dedup store, when on.
    pub(crate) dedup: Option<Arc<Dedup>>,
    /// Exactly-once: outputs rejected for their record.
    pub(crate) rejections: Option<Arc<Rejections>>,
}
