//! Layer 5, DLQ: a record that failed for good goes to its DLQ topic, until the broker acknowledges
//! it (or, with the DLQ off, stays failed and uncommitted).
//!
//! The record stays unfinished (its offset is not committable) until the DLQ produce is acknowledged;
//! a failed produce is retried with the pipeline's backoff, forever, until it succeeds or the
//! partition is revoked or the pipeline stops (then the record is redelivered later). A missing DLQ
//! topic is created on first use when `dlq.create_topics` is on, with the source topic's partition
//! count. In exactly-once mode the DLQ record is not produced here but returned, to be produced in
//! the transaction that commits the record's offset.

use crate::dlq::{self, Coordinates, Failure};
use crate::kafka::produce::produce;
use crate::kafka::topic;
use crate::layer::Outcome;
use crate::processor::Processor;
use crate::record::Record;
use crate::retry::Backoff;
use crate::shared::Shared;
use crate::telemetry::events::{DlqProduceFailed, RecordDeadLettered};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A record that failed for good: dead-lettered when the DLQ is on, else left uncommitted.
pub(crate) async fn failed<P: Processor>(
    shared: &Arc<Shared<P>>,
    record: &Record,
    failure: Failure,
    cancel: &CancellationToken,
) -> Outcome {
    failed_behind(shared, record, failure, None, cancel).await
}

/// [`failed`], for a record parked behind `parked_by` (named in its DLQ headers) when given.
pub(crate) async fn failed_behind<P: Processor>(
    shared: &Arc<Shared<P>>,
    record: &Record,
    failure: Failure,
    parked_by: Option<&Coordinates>,
    cancel: &CancellationToken,
) -> Outcome {
    match shared.config.dlq.enabled {
        true => dead_letter(shared, record, &failure, parked_by, cancel).await,
        false => Outcome::Failed(failure),
    }
}

/// Dead-letters `record`. Returns [`Outcome::DeadLettered`] once acknowledged, or
/// [`Outcome::Abandoned`] if `cancel` fired first.
async fn dead_letter<P: Processor>(
    shared: &Arc<Shared<P>>,
    record: &Record,
    failure: &Failure,
    parked_by: Option<&Coordinates>,
    cancel: &CancellationToken,
) -> Outcome {
    let topic = shared.config.dlq_topic(&record.topic);
    let mut out = dlq::dead_letter(record, &topic, &shared.config.group_id, shared.processor.name(), failure);
    if let Some(by) = parked_by {
        out.headers.push(dlq::headers::PARKED_BY, by.to_string());
    }
    let transactional = shared.handles.transactional;
    let mut backoff = Backoff::from_policy(&shared.config.retry, Duration::from_millis(100));
    loop {
        let result = match ensure_topic(shared, &record.topic, &topic).await {
            // Exactly-once: the DLQ record is produced in the transaction that commits its offset.
            Ok(()) if transactional => Ok(()),
            Ok(()) => {
                let produced = produce(&shared.handles.producer, &out).await;
                // Not allowed to write the DLQ: stop rather than retry for ever; the record stays
                // unfinished.
                if let Err(e) = &produced
                    && shared.log.stop_if_refused("DLQ topic", &topic, e)
                {
                    return Outcome::Abandoned;
                }
                produced.map_err(|e| e.to_string())
            }
            Err(e) => match e.refusal("DLQ topic", &topic) {
                // Not allowed to see or create the DLQ topic: stop, the record stays unfinished.
                Ok(error) => {
                    shared.log.stop_with(error);
                    return Outcome::Abandoned;
                }
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(()) => {
                RecordDeadLettered { record, dlq: &topic, failure }.emit(&shared.telemetry);
                return Outcome::DeadLettered(if transactional { vec![out] } else { Vec::new() });
            }
            Err(e) => {
                DlqProduceFailed { dlq: &topic, error: &e }.emit(&shared.telemetry, &shared.log);
            }
        }
        if !backoff.wait(cancel).await {
            return Outcome::Abandoned;
        }
    }
}

/// Creates the DLQ topic once per run if allowed and missing, with the source topic's partitions.
async fn ensure_topic<P: Processor>(
    shared: &Arc<Shared<P>>,
    source: &str,
    dlq_topic: &str,
) -> Result<(), topic::EnsureError> {
    if !shared.config.dlq.create_topics
        || shared.dlq_topics.lock().unwrap_or_else(|p| p.into_inner()).contains(dlq_topic)
    {
        return Ok(());
    }
    topic::ensure(&shared.admin, dlq_topic, &[source.to_owned()], &[]).await?;
    shared.dlq_topics.lock().unwrap_or_else(|p| p.into_inner()).insert(dlq_topic.to_owned());
    Ok(())
}
