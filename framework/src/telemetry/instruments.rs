//! The pipeline's metrics: names, help texts and handles, labelled `pipeline` and `group`.
//!
//! Names follow Prometheus conventions (`millrace_` prefix, `_total` for counters, base units such
//! as `_seconds` and `_bytes`). Handles are registered once, when the pipeline is built, with the
//! recorder installed at that moment (install an application recorder before `Pipeline::new`).
//! Without a recorder every handle is a no-op.

use crate::histogram::HistogramSnapshot;
use crate::stats::{Stats, StatsSnapshot};
use metrics::{
    Counter, Gauge, Histogram, Label, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge,
    histogram,
};
use std::sync::Once;

/// Counters copied from [`StatsSnapshot`] (name, help, field).
type Field = fn(&StatsSnapshot) -> u64;
const COUNTERS: [(&str, &str, Field); 23] = [
    ("millrace_records_polled_total", "Records polled and handed to their partitions.", |s| s.polled),
    ("millrace_records_processed_total", "Records processed successfully (outputs acknowledged).", |s| s.processed),
    ("millrace_records_failed_total", "Records that failed for good with the DLQ off (left uncommitted).", |s| {
        s.failed
    }),
    ("millrace_dedup_hits_total", "Records skipped because their idempotency key was already processed.", |s| {
        s.dedup_hits
    }),
    ("millrace_dedup_misses_total", "Records whose idempotency key was not found (so they were processed).", |s| {
        s.dedup_misses
    }),
    ("millrace_dedup_restored_entries_total", "Dedup entries restored from the changelog.", |s| s.dedup_restored),
    ("millrace_keys_parked_total", "Keys parked behind a record that failed for good (key parking).", |s| {
        s.keys_parked
    }),
    ("millrace_keys_released_total", "Parked keys released (blocking record replayed, or a release marker).", |s| {
        s.keys_released
    }),
    ("millrace_park_overflows_total", "Keys not parked on failure: their partition held dlq.max_parked_keys.", |s| {
        s.park_overflows
    }),
    ("millrace_panics_total", "Processor panics caught (each fails its record permanently).", |s| s.panics),
    ("millrace_dlq_produce_failures_total", "DLQ produce attempts that failed (retried).", |s| s.dlq_produce_failures),
    ("millrace_breaker_trips_total", "Times the circuit breaker opened (DLQ flood or transient storm).", |s| {
        s.breaker_trips
    }),
    ("millrace_breaker_probes_total", "Probes the half-open circuit breaker ran.", |s| s.breaker_probes),
    ("millrace_rate_limited_total", "Attempts that waited for the rate limit.", |s| s.rate_limited),
    ("millrace_partitions_assigned_total", "Partitions assigned to this member.", |s| s.assignments),
    ("millrace_partitions_revoked_total", "Partitions revoked from (or lost by) this member.", |s| s.revocations),
    ("millrace_commits_total", "Offset commits and transaction commits issued.", |s| s.commits),
    ("millrace_commit_failures_total", "Offset commits refused or timed out (retried).", |s| s.commit_failures),
    ("millrace_transactions_committed_total", "Exactly-once: transactions committed.", |s| s.transactions_committed),
    ("millrace_transactions_aborted_total", "Exactly-once: transactions aborted.", |s| s.transactions_aborted),
    ("millrace_rewinds_total", "Exactly-once: partitions rewound to their committed offset.", |s| s.rewinds),
    ("millrace_producer_resets_total", "Exactly-once: transactional producers replaced.", |s| s.producer_resets),
    ("millrace_discarded_on_revoke_total", "Queued records dropped on revoke (redelivered to the next owner).", |s| {
        s.discarded_on_revoke
    }),
];

/// Gauges copied from [`StatsSnapshot`] (name, help, field).
const GAUGES: [(&str, &str, Field); 11] = [
    ("millrace_in_flight_records", "Records polled and not finished.", |s| s.in_flight),
    ("millrace_in_flight_bytes", "Bytes of the in-flight records.", |s| s.buffered_bytes),
    ("millrace_producer_queue_messages", "Messages the producers hold, not acknowledged by the broker yet.", |s| {
        s.producer_queue
    }),
    ("millrace_running_records", "Records started and not finished.", |s| s.running),
    ("millrace_assigned_partitions", "Partitions owned now.", |s| s.assigned_partitions),
    ("millrace_paused_partitions", "Partitions paused by backpressure or the breaker now.", |s| s.paused_partitions),
    ("millrace_stalled_partitions", "Owned partitions reported stalled now.", |s| s.stalled_partitions),
    ("millrace_blocked_calls", "Processor calls blocking their thread (no await) now.", |s| s.blocked_calls),
    ("millrace_missing_topics", "Input topics that do not exist now.", |s| s.missing_topics),
    ("millrace_breaker_open", "1 while the circuit breaker is open or half-open.", |s| u64::from(s.breaker_open)),
    ("millrace_cluster_reachable", "0 while no broker can be reached.", |s| u64::from(!s.cluster_unreachable)),
];

const READY: &str = "millrace_ready";
pub(crate) const DEAD_LETTERED: &str = "millrace_dead_lettered_total";
pub(crate) const RETRIES: &str = "millrace_retries_total";
pub(crate) const ATTEMPT_TIMEOUTS: &str = "millrace_attempt_timeouts_total";
pub(crate) const ATTEMPTS_CANCELLED: &str = "millrace_attempts_cancelled_total";
pub(crate) const ATTEMPTS_DROPPED: &str = "millrace_attempts_dropped_total";
const ATTEMPT: &str = "millrace_attempt_duration_seconds";
const LATENCY: &str = "millrace_record_latency_seconds";
const COMMIT: &str = "millrace_commit_duration_seconds";
const TRANSACTION: &str = "millrace_transaction_duration_seconds";
pub(crate) const LAG: &str = "millrace_consumer_lag_records";
pub(crate) const COMMITTED_LAG: &str = "millrace_consumer_committed_lag_records";
pub(crate) const OLDEST: &str = "millrace_oldest_unfinished_age_seconds";

pub(crate) use crate::histogram::BUCKETS;

fn describe() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for (name, help, _) in COUNTERS {
            describe_counter!(name, help);
        }
        for (name, help, _) in GAUGES {
            describe_gauge!(name, help);
        }
        describe_counter!(DEAD_LETTERED, "Records written to the DLQ, by kind (permanent, transient-exhausted, ...).");
        describe_gauge!(READY, "1 when the pipeline is ready (see /health/ready for the reasons when not).");
        describe_counter!(RETRIES, "Retries scheduled after transient failures.");
        describe_counter!(ATTEMPT_TIMEOUTS, "Processor calls cancelled for running past attempt_timeout.");
        describe_counter!(
            ATTEMPTS_CANCELLED,
            "Processor calls cancelled, by reason (timeout; revoked or shutdown: still running when drain_timeout ended)."
        );
        describe_counter!(
            ATTEMPTS_DROPPED,
            "Cancelled processor calls dropped without returning (not listening to ctx.cancelled(), or past cancel_grace)."
        );
        for (name, help) in [
            (ATTEMPT, "Duration of one processing attempt (processor call and acknowledgements)."),
            (LATENCY, "From the record's timestamp to the end of its processing."),
        ] {
            let describe = |suffix: &str, what: &str| format!("{name}_{suffix}: {help} {what}");
            describe_counter!(format!("{name}_bucket"), describe("bucket", "(attempts at or under le seconds)"));
            describe_counter!(format!("{name}_count"), describe("count", "(attempts)"));
            describe_gauge!(format!("{name}_sum"), Unit::Seconds, describe("sum", "(seconds in all)"));
        }
        describe_histogram!(COMMIT, Unit::Seconds, "Duration of a commit (offsets, or the transaction).");
        describe_histogram!(
            TRANSACTION,
            Unit::Seconds,
            "Exactly-once: how long each committed transaction was open (begin to commit)."
        );
        describe_gauge!(LAG, "High watermark minus the consumer's position, per owned partition.");
        describe_gauge!(COMMITTED_LAG, "High watermark minus the committed offset, per owned partition.");
        describe_gauge!(OLDEST, "Age of the oldest unfinished record (the head-of-line blocker), per owned partition.");
    });
}

/// A per-record duration histogram's series: `_bucket{le}` and `_count` counters and a `_sum`
/// gauge, copied from a [`crate::histogram::Histogram`] (see there why it is not recorded per
/// sample).
struct BucketSeries {
    buckets: Vec<Counter>,
    count: Counter,
    sum: Gauge,
}

impl BucketSeries {
    fn new(name: &str, labels: &[(&'static str, String); 2]) -> Self {
        let bounds = BUCKETS.iter().map(f64::to_string).chain(["+Inf".to_owned()]);
        let buckets = bounds
            .map(|le| {
                let mut with_le: Vec<Label> = labels.iter().map(|(k, v)| Label::new(*k, v.clone())).collect();
                with_le.push(Label::new("le", le));
                counter!(format!("{name}_bucket"), with_le)
            })
            .collect();
        Self { buckets, count: counter!(format!("{name}_count"), labels), sum: gauge!(format!("{name}_sum"), labels) }
    }

    fn publish(&self, h: &HistogramSnapshot) {
        for (c, n) in self.buckets.iter().zip(h.cumulative) {
            c.absolute(n);
        }
        self.count.absolute(h.count());
        self.sum.set(h.sum_seconds);
    }
}

/// One pipeline's metric handles.
pub(crate) struct Instruments {
    pub(crate) pipeline: String,
    pub(crate) group: String,
    counters: Vec<(Counter, Field)>,
    gauges: Vec<(Gauge, Field)>,
    attempt: BucketSeries,
    latency: BucketSeries,
    pub(crate) commit: Histogram,
    pub(crate) transaction: Histogram,
    ready: Gauge,
}

impl Instruments {
    pub(crate) fn new(pipeline: &str, group: &str) -> Self {
        describe();
        let labels = [("pipeline", pipeline.to_owned()), ("group", group.to_owned())];
        Self {
            pipeline: pipeline.to_owned(),
            group: group.to_owned(),
            counters: COUNTERS.iter().map(|(name, _, f)| (counter!(*name, &labels), *f)).collect(),
            gauges: GAUGES.iter().map(|(name, _, f)| (gauge!(*name, &labels), *f)).collect(),
            attempt: BucketSeries::new(ATTEMPT, &labels),
            latency: BucketSeries::new(LATENCY, &labels),
            commit: histogram!(COMMIT, &labels),
            transaction: histogram!(TRANSACTION, &labels),
            ready: gauge!(READY, &labels),
        }
    }

    /// Copies `s` into the counters and gauges, and the per-record histograms into their series.
    pub(crate) fn publish(&self, s: &StatsSnapshot, stats: &Stats, ready: bool) {
        self.ready.set(f64::from(u8::from(ready)));
        self.attempt.publish(&stats.attempts.snapshot());
        self.latency.publish(&stats.latency.snapshot());
        for (c, f) in &self.counters {
            c.absolute(f(s));
        }
        for (g, f) in &self.gauges {
            g.set(f(s) as f64);
        }
    }

    /// A counter of this pipeline with one more label (rare events: registered when used).
    pub(crate) fn count(&self, name: &'static str, label: &'static str, value: impl Into<metrics::SharedString>) {
        counter!(name, "pipeline" => self.pipeline.clone(), "group" => self.group.clone(), label => value).increment(1);
    }

    /// A counter of this pipeline with two more labels (rare events: registered when used).
    pub(crate) fn count2(
        &self,
        name: &'static str,
        (label1, value1): (&'static str, String),
        (label2, value2): (&'static str, &'static str),
    ) {
        counter!(name, "pipeline" => self.pipeline.clone(), "group" => self.group.clone(),
            label1 => value1, label2 => value2)
        .increment(1);
    }

    /// A per-partition gauge of this pipeline.
    pub(crate) fn partition_gauge(&self, name: &'static str, topic: &str, partition: i32) -> Gauge {
        gauge!(name, "pipeline" => self.pipeline.clone(), "group" => self.group.clone(),
            "topic" => topic.to_owned(), "partition" => partition.to_string())
    }
}
