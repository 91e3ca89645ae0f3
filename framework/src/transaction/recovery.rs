//! Recovery of the transactional producer: replacing it after an outage, a fence or an unknown
//! transaction outcome, and deciding when an error leaves it unusable for good.

use super::{OpenTxn, Transactions, TxnOutcome, lock};
use crate::error::Error;
use crate::kafka::txn_producer::{FENCE_WINDOW, FENCES_TOLERATED};
use crate::partition::PartitionHandle;
use crate::telemetry::health_events::{FencedRecovering, ProducerReplaced, ProducerReplacing, TransactionsStopped};
use rdkafka::error::KafkaError;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often a rewind to the group's offsets that keeps failing is reported while it waits.
const REPORT_WAIT_EVERY: Duration = Duration::from_secs(10);

/// After a producer reset: the partitions waiting to be rewound to the offsets the group
/// coordinator holds (they commit nothing until then), and since when.
#[derive(Debug, Default)]
pub(super) struct GroupRewind {
    pub(super) handles: Vec<Arc<PartitionHandle>>,
    since: Option<Instant>,
    tries: u32,
    reported: Option<Instant>,
}

impl Transactions {
    /// Whether the producer must be replaced ([`reset`](Self::reset)) before anything else commits.
    pub(crate) fn needs_reset(&self) -> bool {
        lock(&self.reset_cause).is_some()
    }

    /// Replaces the producer by a fresh one with the same transactional id and initialises it
    /// (retrying while the brokers are away, until `stop`); the open transaction is forgotten. The
    /// caller then rewinds every owned partition to the group coordinator's offsets. `Ok(false)`
    /// when `stop` came first.
    pub(crate) fn reset(&self, stop: &CancellationToken) -> Result<bool, KafkaError> {
        let cause = lock(&self.reset_cause).take();
        // The reason was logged at warn where the reset was decided.
        ProducerReplacing { cause: cause.as_ref().map(|c| c as &dyn std::fmt::Display) }.emit(&self.telemetry);
        *self.open() = OpenTxn::default();
        // Every owned partition is rewound to the group's offsets (the caller defers that).
        lock(&self.rewind_later).clear();
        *lock(&self.rewind_to_group) = GroupRewind::default();
        self.client.replace()?;
        match self.client.init(stop) {
            Ok(()) => {
                ProducerReplaced.emit(&self.telemetry);
                Ok(true)
            }
            Err(_) if stop.is_cancelled() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// After a reset: `handles` commit nothing until they are rewound to the group's offsets
    /// ([`group_rewound`](Self::group_rewound)).
    pub(crate) fn defer_group_rewind(&self, handles: Vec<Arc<PartitionHandle>>) {
        let mut g = lock(&self.rewind_to_group);
        g.handles.extend(handles);
        g.since.get_or_insert_with(Instant::now);
    }

    /// The partitions waiting for a rewind to the group's offsets (they stay waiting until
    /// [`group_rewound`](Self::group_rewound)).
    pub(crate) fn awaiting_group_rewind(&self) -> Vec<Arc<PartitionHandle>> {
        lock(&self.rewind_to_group).handles.clone()
    }

    /// The partitions waiting for a rewind to the group's offsets were rewound (or retired).
    pub(crate) fn group_rewound(&self) {
        let g = std::mem::take(&mut *lock(&self.rewind_to_group));
        if g.tries > 0 {
            let waited = g.since.map(|t| t.elapsed());
            tracing::info!(pipeline = %self.name, partitions = g.handles.len(), failed_tries = g.tries, ?waited, "rewound to the group's committed offsets");
        }
    }

    /// A try to fetch the group's committed offsets for the rewind failed; reported at once, then
    /// every [`REPORT_WAIT_EVERY`] while it keeps failing.
    pub(crate) fn group_rewind_failed(&self, e: &KafkaError) {
        let mut g = lock(&self.rewind_to_group);
        g.tries += 1;
        if g.reported.is_none_or(|t| t.elapsed() >= REPORT_WAIT_EVERY) {
            g.reported = Some(Instant::now());
            let waited = g.since.map(|t| t.elapsed());
            tracing::warn!(pipeline = %self.name, error = %e, tries = g.tries, ?waited, partitions = g.handles.len(),
                "fetching the group's committed offsets for a rewind failed; polling on and asking again (these partitions commit nothing until then)");
        }
    }

    /// A call failed in a way no retry or abort mends. After a broker outage, or on a fence, the
    /// producer is replaced ([`TxnOutcome::Reset`]); any other fatal error, or a fence that is one
    /// too many within [`FENCE_WINDOW`] (another live instance takes the transactional id back and
    /// forth), stops this instance ([`TxnOutcome::Fatal`]).
    pub(super) fn unusable(&self, e: KafkaError) -> TxnOutcome {
        if self.client.saw_outage() {
            tracing::warn!(pipeline = %self.name, error = %e, "transactional producer unusable after a broker outage");
            lock(&self.reset_cause).get_or_insert(e);
            return TxnOutcome::Reset;
        }
        let transactional_id = self.client.transactional_id();
        if self.client.is_fenced(&e) {
            if self.needs_reset() {
                return TxnOutcome::Reset; // the same fence, seen by another call before the reset
            }
            let fences = self.client.note_fence();
            if fences <= FENCES_TOLERATED {
                FencedRecovering { transactional_id, fences_in_window: fences, error: &e }.emit(&self.telemetry);
                lock(&self.reset_cause).get_or_insert(e);
                return TxnOutcome::Reset;
            }
            let conflict = Error::TransactionalIdConflict {
                transactional_id: transactional_id.to_owned(),
                fences,
                within: FENCE_WINDOW,
            };
            TransactionsStopped { error: &conflict, cause: &e }.emit(&self.telemetry);
            lock(&self.fatal).get_or_insert(conflict);
            return TxnOutcome::Fatal;
        }
        TransactionsStopped { error: &"fatal transaction error", cause: &e }.emit(&self.telemetry);
        lock(&self.fatal).get_or_insert(Error::Transaction(e));
        TxnOutcome::Fatal
    }

    /// Asks for a reset whatever the cause (the open transaction's fate is unknown).
    pub(super) fn uncertain(&self, e: KafkaError) -> TxnOutcome {
        tracing::warn!(pipeline = %self.name, error = %e, "the open transaction's outcome is unknown");
        lock(&self.reset_cause).get_or_insert(e);
        TxnOutcome::Reset
    }
}
