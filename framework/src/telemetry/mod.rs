//! Telemetry: what happens in a pipeline, said in one place.
//!
//! Every happening worth an operator's attention is a typed event ([`events`]; the watchdog's and
//! the transactional producer's in [`health_events`]): one struct per
//! happening (a retry scheduled, a record dead-lettered, a commit failed, partitions revoked, a
//! transaction aborted, the breaker tripped, ...) whose `emit` logs it, counts it in [`Stats`] and
//! records it through the [`metrics`](::metrics) facade. Call sites build the event and emit it;
//! they never pair a log line with a counter by hand.
//!
//! [`Stats`] stays the in-process view (tests, [`Pipeline::stats`](crate::Pipeline::stats)); the
//! [`instruments`] publish it to whatever `metrics` recorder the process installed: the pipeline's
//! own Prometheus endpoint ([`PipelineConfig::http`](crate::PipelineConfig::http)), or the
//! application's recorder. Counters on the per-record path are counted in `Stats` in batches and
//! published from there, so the hot path pays nothing for metrics.

mod blockers;
pub(crate) mod events;
mod health;
pub(crate) mod health_events;
pub(crate) mod http;
pub(crate) mod instruments;
mod partitions;
mod status;

use crate::stats::Stats;
use instruments::Instruments;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One pipeline's telemetry: its name (for logs), its counters and its metric handles.
pub(crate) struct Telemetry {
    pub(crate) name: String,
    pub(crate) stats: Arc<Stats>,
    pub(crate) metrics: Instruments,
    /// Per owned partition: lag and head-of-line gauges.
    partitions: Mutex<partitions::PartitionGauges>,
    /// Per owned partition: the records that retried, to name the head-of-line blocker.
    retrying: Mutex<blockers::Retrying>,
    /// How long the poll thread may go without a turn and still be live.
    live_within: Duration,
}

impl Telemetry {
    pub(crate) fn new(name: &str, group: &str, live_within: Duration) -> Self {
        Self {
            name: name.to_owned(),
            stats: Arc::default(),
            metrics: Instruments::new(name, group),
            partitions: Mutex::default(),
            retrying: Mutex::default(),
            live_within,
        }
    }

    /// Copies the counters and gauges of [`Stats`] to the metrics recorder (every second from the
    /// poll thread, and before each scrape).
    pub(crate) fn publish(&self) {
        self.metrics.publish(&self.stats.snapshot(), &self.stats, self.not_ready().is_empty());
    }
}
