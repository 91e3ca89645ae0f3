//! Layer 0 and 6, key parking ([`crate::park`]): before the other layers, a record of a parked key
//! is dead-lettered as `parked` without running and a Millrace control record is skipped; after
//! them, the change the record makes to its key's parking is made durable before its offset may
//! complete (at-least-once: written and acknowledged here; exactly-once: returned, to go in the
//! record's transaction).

use crate::dlq::{Coordinates, DlqErrorKind, Failure};
use crate::layer::{Outcome, dlq};
use crate::park::{Change, Decision, store};
use crate::processor::Processor;
use crate::record::{OutputRecord, Record};
use crate::shared::Shared;
use crate::stats::Stats;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Dead-letters `record`, whose key is parked behind the record at `blocking`, with kind `parked`
/// and the blocking record in [`PARKED_BY`](crate::dlq::headers::PARKED_BY).
pub(crate) async fn parked<P: Processor>(
    shared: &Arc<Shared<P>>,
    record: &Record,
    blocking: i64,
    cancel: &CancellationToken,
) -> Outcome {
    let by = Coordinates { topic: record.topic.to_string(), partition: record.partition, offset: blocking };
    let now = crate::clock::now_ms();
    let failure = Failure {
        kind: DlqErrorKind::Parked,
        message: format!("not run: its key is parked behind {by}, which failed"),
        attempts: 0,
        first_failure_ms: now,
        last_failure_ms: now,
    };
    dlq::failed_behind(shared, record, failure, Some(&by), cancel).await
}

/// A finished record's change to its key's parking, made durable: the outcome (abandoned when the
/// at-least-once write was interrupted), the change, and in exactly-once mode the parked-keys
/// record for the transaction.
pub(crate) struct Settled {
    pub(crate) outcome: Outcome,
    pub(crate) change: Option<Change>,
    pub(crate) record: Option<OutputRecord>,
}

/// Works out and writes the change `record`'s `outcome` makes to its key's parking.
pub(crate) async fn settle<P: Processor>(
    shared: &Arc<Shared<P>>,
    record: &Record,
    decision: Decision,
    outcome: Outcome,
    cancel: &CancellationToken,
) -> Settled {
    let change = match (decision, &outcome) {
        (Decision::Run { room: true } | Decision::RunBlocking, Outcome::DeadLettered(_)) => {
            Some(Change::Park(record.offset))
        }
        (Decision::Run { room: false }, Outcome::DeadLettered(_)) => {
            Stats::bump(&shared.telemetry.stats.park_overflows);
            let bound = shared.config.dlq.max_parked_keys;
            // One text per partition, so that the log's repeat suppression applies.
            let what = format!("{}/{}", record.topic, record.partition);
            shared.log.warn(
                &format!("a failed key not parked: {what} holds dlq.max_parked_keys ({bound}) parked keys"),
                "its later records run (per-key order across the failure is not kept; see park_overflows)",
            );
            None
        }
        (Decision::RunBlocking, Outcome::Done(_) | Outcome::Duplicate) => Some(Change::Release),
        (Decision::Control { releases: true }, Outcome::Skipped) => Some(Change::Release),
        _ => None,
    };
    let (Some(change), Some(key)) = (change, record.key.as_deref()) else {
        return Settled { outcome, change: None, record: None };
    };
    let out = store::entry(&shared.config.group_id, &record.topic, record.partition, key, change);
    if shared.handles.transactional {
        return Settled { outcome, change: Some(change), record: Some(out) };
    }
    match store::write(shared, &out, cancel).await {
        true => Settled { outcome, change: Some(change), record: None },
        false => Settled { outcome: Outcome::Abandoned, change: None, record: None },
    }
}
