//! Per-partition gauges, from librdkafka's statistics (every `statistics.interval.ms`, on the poll
//! thread): the lag behind the partition's end, and how long its head-of-line record has held the
//! committable prefix back.

use super::Telemetry;
use super::blockers::Blocker;
use super::instruments::{COMMITTED_LAG, LAG, OLDEST};
use crate::state::assignments::Assignments;
use metrics::Gauge;
use rdkafka::statistics::Statistics;
use std::collections::HashMap;
use std::time::Instant;

/// One owned partition's gauges, and where its completed prefix stood since when.
pub(crate) struct Gauges {
    lag: Gauge,
    committed_lag: Gauge,
    oldest: Gauge,
    epoch: u64,
    head: Option<i64>,
    since: Instant,
    /// The figures last set, for the status page.
    last: PartitionStatus,
}

/// One owned partition as the status page shows it (as of the last statistics report).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub(crate) struct PartitionStatus {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    /// The partition's end (the last stable offset in exactly-once mode, else the high watermark).
    pub(crate) end: Option<i64>,
    /// The offset last committed.
    pub(crate) committed: Option<i64>,
    /// The end of the completed prefix: the head-of-line record's offset while records are unfinished.
    pub(crate) completed: Option<i64>,
    /// Records polled and not finished.
    pub(crate) in_flight: usize,
    /// How long the completed prefix has stood at `completed` with records unfinished.
    pub(crate) head_of_line_age_s: f64,
    /// The head-of-line record, when it has retried: its key, failed attempts and last error.
    pub(crate) blocker: Option<Blocker>,
    pub(crate) paused: bool,
}

pub(crate) type PartitionGauges = HashMap<(String, i32), Gauges>;

impl Telemetry {
    /// Updates the gauges of the owned partitions in `report`; zeroes those no longer owned (the
    /// exporter drops series that stay unchanged for two minutes). `read_committed`: the end is the
    /// last stable offset, else the high watermark.
    pub(crate) fn observe_partitions(&self, report: &Statistics, owned: &Assignments, read_committed: bool) {
        let now = Instant::now();
        let mut gauges = self.partitions.lock().unwrap_or_else(|p| p.into_inner());
        let mut retrying = self.retrying.lock().unwrap_or_else(|p| p.into_inner());
        let mut seen = Vec::new();
        for (topic, t) in &report.topics {
            for (&partition, p) in t.partitions.iter().filter(|(id, _)| **id >= 0) {
                let Some(handle) = owned.get(topic, partition) else { continue };
                let end = if read_committed { p.ls_offset } else { p.hi_offset };
                let key = (topic.clone(), partition);
                let g = gauges.entry(key.clone()).or_insert_with(|| Gauges {
                    lag: self.metrics.partition_gauge(LAG, topic, partition),
                    committed_lag: self.metrics.partition_gauge(COMMITTED_LAG, topic, partition),
                    oldest: self.metrics.partition_gauge(OLDEST, topic, partition),
                    epoch: handle.epoch,
                    head: None,
                    since: now,
                    last: PartitionStatus::default(),
                });
                seen.push(key);
                let committed = handle.last_committed().or_else(|| known(p.committed_offset));
                let done = handle.committable().or(committed);
                if end >= 0 {
                    if let Some(done) = done {
                        g.lag.set((end - done).max(0) as f64);
                    }
                    if let Some(committed) = committed {
                        g.committed_lag.set((end - committed).max(0) as f64);
                    }
                }
                // The head of line: the first unfinished record holds the prefix at `done`.
                if g.epoch != handle.epoch {
                    retrying.forget(topic, partition);
                }
                if g.epoch != handle.epoch || g.head != done || handle.buffered() == 0 {
                    (g.epoch, g.head, g.since) = (handle.epoch, done, now);
                }
                let blocker = done.filter(|_| handle.buffered() > 0).and_then(|d| retrying.at(topic, partition, d));
                let age = (now - g.since).as_secs_f64();
                g.oldest.set(age);
                g.last = PartitionStatus {
                    topic: topic.clone(),
                    partition,
                    end: (end >= 0).then_some(end),
                    committed,
                    completed: done,
                    in_flight: handle.buffered(),
                    head_of_line_age_s: age,
                    blocker,
                    paused: handle.is_paused(),
                };
            }
        }
        gauges.retain(|key, g| {
            let keep = seen.contains(key);
            if !keep {
                retrying.forget(&key.0, key.1);
                for gauge in [&g.lag, &g.committed_lag, &g.oldest] {
                    gauge.set(0.0);
                }
            }
            keep
        });
    }
}

impl Telemetry {
    /// The owned partitions as of the last statistics report, by topic and partition.
    pub(crate) fn partition_status(&self) -> Vec<PartitionStatus> {
        let gauges = self.partitions.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<_> = gauges.values().map(|g| g.last.clone()).collect();
        out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        out
    }
}

fn known(offset: i64) -> Option<i64> {
    (offset >= 0).then_some(offset)
}
