//! The stall watchdog: reports a partition that cannot make progress, and a cluster that cannot be
//! reached, instead of leaving a pipeline silently idle.
//!
//! It reads librdkafka's statistics (`statistics.interval.ms`, set by Millrace from
//! [`stall_timeout`](crate::PipelineConfig::stall_timeout)), which the consumer delivers on the poll
//! thread. Per owned partition librdkafka reports its fetch position (`next_offset`, the next offset
//! it will fetch: it moves past control records and aborted data too), its high watermark
//! (`hi_offset`) and its last stable offset (`ls_offset`, the end a `read_committed` reader may read
//! to). A partition is **stalled** when, for `stall_timeout` without its fetch position moving,
//! - Millrace owns it, has not paused it (backpressure, circuit breaker) and holds none of its
//!   records, and (while librdkafka fetches it) librdkafka has none of them queued for the
//!   application, and
//! - either records it may read lie ahead of its fetch position (the fetch keeps failing: a codec
//!   librdkafka cannot decompress, a corrupt batch, an offset it cannot resolve), or
//! - in `read_committed` mode, the fetch position reached the last stable offset but the high
//!   watermark is beyond it: a transaction left open holds the partition back (a *hanging*
//!   transaction; a transaction normally commits or is aborted by its `transaction.timeout.ms`), or
//! - librdkafka does not fetch it at all (fetch state other than `active`): the offset to start
//!   from was never resolved. A consumer
//!   reading `read_committed` fetches the group's committed offsets with `require_stable`, which
//!   waits (librdkafka retries without end) while a transaction holds offsets of this group
//!   pending: a hanging transaction on `__consumer_offsets` stalls the partition before its first
//!   fetch. A group coordinator that does not answer looks the same.
//!
//! librdkafka itself counts the second case as caught up (its consumer lag is measured to the last
//! stable offset), but for the pipeline the records behind the open transaction are work it cannot
//! reach, so it is reported: a transaction open longer than `stall_timeout` is what an operator
//! must look at (Kafka's `kafka-transactions.sh find-hanging` / `abort`).
//!
//! Each stall is logged once at error level, naming the topic, partition, position and end, and
//! counted in [`StatsSnapshot::stalled_partitions`](crate::StatsSnapshot::stalled_partitions); it
//! is cleared (logged at info level) when the position moves or the partition is no longer owned.
//! The cluster is **unreachable** while no broker connection is up; that is shown by
//! [`StatsSnapshot::cluster_unreachable`](crate::StatsSnapshot::cluster_unreachable) and logged once
//! at error level when it lasts `stall_timeout`.

use crate::state::assignments::Assignments;
use crate::telemetry::Telemetry;
use crate::telemetry::health_events::{ClusterReach, PartitionStalled, Stall, StallCleared};
use rdkafka::statistics::{Partition, Statistics};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One partition's progress as the watchdog last saw it.
#[derive(Debug)]
struct Track {
    position: i64,
    since: Instant,
    reported: bool,
}

/// The watchdog's state; lives in the consumer's context and is fed every statistics report.
#[derive(Debug)]
pub(crate) struct Watchdog {
    bootstrap: String,
    timeout: Duration,
    read_committed: bool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    partitions: HashMap<(String, i32), Track>,
    /// Since when no broker connection has been up, and whether that was reported.
    unreachable: Option<(Instant, bool)>,
}

impl Watchdog {
    pub(crate) fn new(bootstrap: String, timeout: Duration, read_committed: bool) -> Self {
        Self { bootstrap, timeout, read_committed, state: Mutex::default() }
    }

    /// Whether the consumer reads `read_committed` (exactly-once).
    pub(crate) fn read_committed(&self) -> bool {
        self.read_committed
    }

    /// Takes one statistics report: updates the cluster and partition gauges, and reports what
    /// changed. `busy` is whether the pipeline holds back every partition now (circuit breaker).
    pub(crate) fn observe(&self, report: &Statistics, owned: &Assignments, telemetry: &Telemetry, busy: bool) {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.observe_cluster(report, &mut state, telemetry, now);
        let mut seen = Vec::new();
        for (topic, t) in &report.topics {
            for (&partition, p) in t.partitions.iter().filter(|(id, _)| **id >= 0) {
                let Some(handle) = owned.get(topic, partition) else { continue };
                let idle = !busy && !handle.is_paused() && handle.buffered() == 0;
                let stall = if idle { self.stall(p) } else { None };
                let key = (topic.clone(), partition);
                seen.push(key.clone());
                let track = state.partitions.entry(key).or_insert(Track {
                    position: p.next_offset,
                    since: now,
                    reported: false,
                });
                if stall.is_none() || track.position != p.next_offset {
                    if track.reported {
                        StallCleared { topic, partition, position: Some(p.next_offset) }.emit(telemetry);
                    }
                    *track = Track { position: p.next_offset, since: now, reported: false };
                    continue;
                }
                if let Some(kind) = stall.filter(|_| !track.reported && now - track.since >= self.timeout) {
                    track.reported = true;
                    PartitionStalled {
                        topic,
                        partition,
                        kind,
                        position: p.next_offset,
                        end: p.hi_offset,
                        last_stable: p.ls_offset,
                        fetch_state: &p.fetch_state,
                        stuck: now - track.since,
                    }
                    .emit(telemetry);
                }
            }
        }
        // Partitions no longer owned (or no longer in the report) are no longer stalled here.
        state.partitions.retain(|key, track| {
            let keep = seen.contains(key);
            if !keep && track.reported {
                StallCleared { topic: &key.0, partition: key.1, position: None }.emit(telemetry);
            }
            keep
        });
    }

    /// Whether `p`, idle on Millrace's side, is held back, and by what.
    fn stall(&self, p: &Partition) -> Option<Stall> {
        if p.fetch_state != "active" {
            // Owned and not paused, yet librdkafka does not fetch it: the offset to start from (the
            // group's committed offset) is not resolved. Seen as fetch state `none` on a first
            // assignment, and as `stopped` with one outdated op still counted in the fetch queue on
            // a partition assigned again (so the queue count says nothing here). Normal for the
            // moments after an assignment; for `stall_timeout` it means the offset fetch does not
            // complete.
            return Some(Stall::NotFetching);
        }
        if p.next_offset < 0 || p.hi_offset < 0 || p.fetchq_cnt > 0 {
            return None; // nothing known about its position or end yet, or records queued for it
        }
        let end = if self.read_committed { p.ls_offset } else { p.hi_offset };
        if end >= 0 && p.next_offset < end {
            Some(Stall::Fetch)
        } else if self.read_committed && p.ls_offset >= 0 && p.ls_offset < p.hi_offset {
            Some(Stall::OpenTransaction)
        } else {
            None
        }
    }

    /// The cluster is reachable while at least one broker connection is up.
    fn observe_cluster(&self, report: &Statistics, state: &mut State, telemetry: &Telemetry, now: Instant) {
        let bootstrap = &self.bootstrap;
        if report.brokers.values().any(|b| b.state == "UP") {
            let recovered = matches!(state.unreachable.take(), Some((_, true)));
            ClusterReach { bootstrap, reachable: true, report: None, recovered }.emit(telemetry);
            return;
        }
        let (since, reported) = state.unreachable.get_or_insert((now, false));
        let report = (!*reported && now - *since >= self.timeout).then(|| now - *since);
        *reported |= report.is_some();
        ClusterReach { bootstrap, reachable: false, report, recovered: false }.emit(telemetry);
    }
}
