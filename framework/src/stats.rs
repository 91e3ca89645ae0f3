//! Live counters of a pipeline, readable while it runs (for tests, health checks and metrics export).

use crate::histogram::Histogram;
use crate::state::backpressure::InFlight;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Counters and gauges of one pipeline. Read them with [`Stats::snapshot`].
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) polled: AtomicU64,
    pub(crate) processed: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) parked: AtomicU64,
    pub(crate) keys_parked: AtomicU64,
    pub(crate) keys_released: AtomicU64,
    pub(crate) park_overflows: AtomicU64,
    pub(crate) dedup_hits: AtomicU64,
    pub(crate) dedup_misses: AtomicU64,
    pub(crate) dedup_restored: AtomicU64,
    pub(crate) dedup_restores: AtomicU64,
    pub(crate) dlq_produce_failures: AtomicU64,
    pub(crate) breaker_open: AtomicU64,
    pub(crate) breaker_trips: AtomicU64,
    pub(crate) breaker_probes: AtomicU64,
    pub(crate) rate_limited: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) panics: AtomicU64,
    pub(crate) attempts_cancelled: AtomicU64,
    pub(crate) attempts_dropped: AtomicU64,
    /// Records and bytes in flight: counted by the partition handles, bounded by
    /// [`Backpressure`](crate::state::backpressure::Backpressure), read here for the snapshot only.
    pub(crate) in_flight: Arc<InFlight>,
    pub(crate) running: AtomicU64,
    pub(crate) running_peak: AtomicU64,
    pub(crate) assigned_partitions: AtomicU64,
    pub(crate) paused_partitions: AtomicU64,
    pub(crate) assignments: AtomicU64,
    pub(crate) revocations: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) commit_failures: AtomicU64,
    pub(crate) discarded_on_revoke: AtomicU64,
    pub(crate) transactions_committed: AtomicU64,
    pub(crate) transactions_aborted: AtomicU64,
    pub(crate) transactions_injected_aborts: AtomicU64,
    pub(crate) rewinds: AtomicU64,
    pub(crate) producer_resets: AtomicU64,
    pub(crate) fenced_recoveries: AtomicU64,
    pub(crate) committed_outputs: AtomicU64,
    pub(crate) stalled_partitions: AtomicU64,
    pub(crate) blocked_calls: AtomicU64,
    pub(crate) cluster_unreachable: AtomicU64,
    pub(crate) missing_topics: AtomicU64,
    /// Messages the producers hold that the broker has not acknowledged yet (set once a second).
    pub(crate) producer_queue: AtomicU64,
    /// Duration of each processing attempt (processor call and acknowledgements).
    pub(crate) attempts: Histogram,
    /// From each processed record's timestamp to the end of its processing.
    pub(crate) latency: Histogram,
    /// When the poll thread last turned (ms since the epoch): the liveness probe.
    pub(crate) poll_turn_ms: AtomicI64,
    /// Set once the member joined its group (its first assignment, even an empty one).
    pub(crate) joined: AtomicU64,
}

/// A point-in-time copy of [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Records polled and dispatched.
    pub polled: u64,
    /// Records whose processing succeeded (outputs acknowledged).
    pub processed: u64,
    /// Records that failed permanently or exhausted their retries and were left uncommitted (DLQ off,
    /// or shutdown before their DLQ produce succeeded).
    pub failed: u64,
    /// Records written to the DLQ (their offsets then complete).
    pub dead_lettered: u64,
    /// Of those, records not run because their key was parked (key parking).
    pub parked: u64,
    /// Keys parked: a record failed for good and its key's later records are held behind it.
    pub keys_parked: u64,
    /// Parked keys released (the replay of the blocking record processed, or a release marker).
    pub keys_released: u64,
    /// Keys not parked on failure because their partition held `dlq.max_parked_keys` already.
    pub park_overflows: u64,
    /// Records skipped because their idempotency key was already processed.
    pub dedup_hits: u64,
    /// Records whose idempotency key was looked up and not found (so they were processed).
    pub dedup_misses: u64,
    /// Messages the producers hold that the broker has not acknowledged yet (as of the last
    /// second's publication).
    pub producer_queue: u64,
    /// Dedup entries restored from the changelog.
    pub dedup_restored: u64,
    /// Partition restores from the changelog that completed.
    pub dedup_restores: u64,
    /// DLQ produce attempts that failed (the record stayed unfinished and was retried).
    pub dlq_produce_failures: u64,
    /// Whether the circuit breaker is open or half-open now (the pipeline is unhealthy; paused
    /// while open, probing while half-open).
    pub breaker_open: bool,
    /// Times the breaker tripped (from closed).
    pub breaker_trips: u64,
    /// Probes the half-open breaker ran to a verdict (a success closed it, a failure reopened it).
    pub breaker_probes: u64,
    /// Attempts that waited for the rate limit before their processor call.
    pub rate_limited: u64,
    /// Retries scheduled after transient failures.
    pub retries: u64,
    /// Processor panics caught.
    pub panics: u64,
    /// Processor calls cancelled: past `attempt_timeout`, or still running when a revoke's or a
    /// shutdown's `drain_timeout` ended (by reason in `millrace_attempts_cancelled_total`).
    pub attempts_cancelled: u64,
    /// Cancelled calls whose future was dropped without returning (they never listened to
    /// `ctx.cancelled()`, or ran past `cancel_grace`).
    pub attempts_dropped: u64,
    /// Polled records not yet finished (queued in lanes or running).
    pub in_flight: u64,
    /// Highest `in_flight` seen.
    pub in_flight_peak: u64,
    /// Bytes of the in-flight records.
    pub buffered_bytes: u64,
    /// Records started and not finished: inside the processor, waiting for a concurrency permit,
    /// for their outputs' acknowledgements or for a retry's backoff. At most `bounds.max_concurrency`
    /// of them are inside the processor at once.
    pub running: u64,
    /// Highest `running` seen.
    pub running_peak: u64,
    /// Partitions owned now.
    pub assigned_partitions: u64,
    /// Partitions paused by backpressure now.
    pub paused_partitions: u64,
    /// Partitions ever assigned to this member.
    pub assignments: u64,
    /// Partitions ever revoked from this member.
    pub revocations: u64,
    /// Offset commits issued.
    pub commits: u64,
    /// Offset commits the broker refused or that timed out.
    pub commit_failures: u64,
    /// Queued records dropped (uncommitted, to be redelivered) because their partition was revoked.
    pub discarded_on_revoke: u64,
    /// Exactly-once: transactions committed.
    pub transactions_committed: u64,
    /// Exactly-once: transactions aborted (errors and injected aborts).
    pub transactions_aborted: u64,
    /// Exactly-once: transactions aborted on purpose by `inject_abort_ratio`.
    pub transactions_injected_aborts: u64,
    /// Exactly-once: partitions rewound to their last committed offset after an abort.
    pub rewinds: u64,
    /// Exactly-once: times the transactional producer was replaced because a broker outage, a fence
    /// or an unconfirmable abort left it unusable (every owned partition was then rewound to its
    /// committed offset).
    pub producer_resets: u64,
    /// Exactly-once: fences without a broker outage answered by replacing the producer (the
    /// coordinator aborted a transaction left open past `transaction_timeout`, e.g. by a paused
    /// process, or another producer initialised the transactional id).
    pub fenced_recoveries: u64,
    /// Exactly-once: output records (emitted and dead-lettered) in committed transactions.
    pub committed_outputs: u64,
    /// Owned partitions that have not moved for `stall_timeout` although records lie ahead of them
    /// (see [`PipelineConfig::stall_timeout`](crate::PipelineConfig::stall_timeout)); each was
    /// logged once at error level.
    pub stalled_partitions: u64,
    /// Processor calls blocking their thread now: one poll running longer than
    /// `blocked_poll_threshold` (see [`crate::blocking`]).
    pub blocked_calls: u64,
    /// Whether no broker can be reached now (from start-up until the first broker answers, and
    /// later while every broker connection is down).
    pub cluster_unreachable: bool,
    /// Input topics that do not exist now (see
    /// [`PipelineConfig::fail_on_missing_topic`](crate::PipelineConfig::fail_on_missing_topic)).
    pub missing_topics: u64,
}

impl Stats {
    /// Copies every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            polled: self.polled.load(Relaxed),
            processed: self.processed.load(Relaxed),
            failed: self.failed.load(Relaxed),
            dead_lettered: self.dead_lettered.load(Relaxed),
            parked: self.parked.load(Relaxed),
            keys_parked: self.keys_parked.load(Relaxed),
            keys_released: self.keys_released.load(Relaxed),
            park_overflows: self.park_overflows.load(Relaxed),
            dedup_hits: self.dedup_hits.load(Relaxed),
            dedup_misses: self.dedup_misses.load(Relaxed),
            producer_queue: self.producer_queue.load(Relaxed),
            dedup_restored: self.dedup_restored.load(Relaxed),
            dedup_restores: self.dedup_restores.load(Relaxed),
            dlq_produce_failures: self.dlq_produce_failures.load(Relaxed),
            breaker_open: self.breaker_open.load(Relaxed) != 0,
            breaker_trips: self.breaker_trips.load(Relaxed),
            breaker_probes: self.breaker_probes.load(Relaxed),
            rate_limited: self.rate_limited.load(Relaxed),
            retries: self.retries.load(Relaxed),
            panics: self.panics.load(Relaxed),
            attempts_cancelled: self.attempts_cancelled.load(Relaxed),
            attempts_dropped: self.attempts_dropped.load(Relaxed),
            in_flight: self.in_flight.records(),
            in_flight_peak: self.in_flight.peak(),
            buffered_bytes: self.in_flight.bytes(),
            running: self.running.load(Relaxed),
            running_peak: self.running_peak.load(Relaxed),
            assigned_partitions: self.assigned_partitions.load(Relaxed),
            paused_partitions: self.paused_partitions.load(Relaxed),
            assignments: self.assignments.load(Relaxed),
            revocations: self.revocations.load(Relaxed),
            commits: self.commits.load(Relaxed),
            commit_failures: self.commit_failures.load(Relaxed),
            discarded_on_revoke: self.discarded_on_revoke.load(Relaxed),
            transactions_committed: self.transactions_committed.load(Relaxed),
            transactions_aborted: self.transactions_aborted.load(Relaxed),
            transactions_injected_aborts: self.transactions_injected_aborts.load(Relaxed),
            rewinds: self.rewinds.load(Relaxed),
            producer_resets: self.producer_resets.load(Relaxed),
            fenced_recoveries: self.fenced_recoveries.load(Relaxed),
            committed_outputs: self.committed_outputs.load(Relaxed),
            stalled_partitions: self.stalled_partitions.load(Relaxed),
            blocked_calls: self.blocked_calls.load(Relaxed),
            cluster_unreachable: self.cluster_unreachable.load(Relaxed) != 0,
            missing_topics: self.missing_topics.load(Relaxed),
        }
    }

    pub(crate) fn started(&self) {
        let now = self.running.fetch_add(1, Relaxed) + 1;
        self.running_peak.fetch_max(now, Relaxed);
    }

    /// The poll thread is turning (liveness).
    pub(crate) fn beat(&self) {
        self.poll_turn_ms.store(crate::clock::now_ms(), Relaxed);
    }

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }
}
