//! Liveness and readiness, for the HTTP probes and the `millrace_ready` gauge.

use super::Telemetry;
use crate::clock::now_ms;
use std::sync::atomic::Ordering::Relaxed;

impl Telemetry {
    /// Whether the poll thread turned within `live_within` (`drain_timeout` + twice the commit
    /// interval + the transaction timeout + 60 s: a revoke's drain or a slow transaction call is not
    /// a hang). A pipeline that is not live will not recover by itself: restarting it helps.
    pub(crate) fn live(&self) -> bool {
        now_ms() - self.stats.poll_turn_ms.load(Relaxed) <= self.live_within.as_millis() as i64
    }

    /// Why the pipeline is not ready to do its work now; empty when it is. Each reason is also a
    /// gauge or log line of its own.
    pub(crate) fn not_ready(&self) -> Vec<String> {
        let s = self.stats.snapshot();
        let mut reasons = Vec::new();
        if !self.live() {
            reasons.push("the poll thread has not turned within its deadline".to_owned());
        }
        if s.cluster_unreachable {
            reasons.push("no broker of the cluster can be reached".to_owned());
        }
        if self.stats.joined.load(Relaxed) == 0 {
            reasons.push("not joined to the consumer group yet".to_owned());
        }
        if s.stalled_partitions > 0 {
            reasons.push(format!("{} owned partition(s) stalled", s.stalled_partitions));
        }
        if s.blocked_calls > 0 {
            reasons.push(format!("{} processor call(s) blocking their thread", s.blocked_calls));
        }
        if s.missing_topics > 0 {
            reasons.push(format!("{} input topic(s) missing", s.missing_topics));
        }
        if s.breaker_open {
            reasons.push("the circuit breaker is open".to_owned());
        }
        reasons
    }
}
