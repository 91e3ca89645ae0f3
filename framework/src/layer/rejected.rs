//! Layer 2, exactly-once mode only: a record whose output the broker rejected before (noted in
//! [`crate::rejected`]) runs again with its outputs produced alone, after a backoff; rejected alone,
//! it goes to the DLQ without running again.

use crate::dlq::Failure;
use crate::processor::Processor;
use crate::record::Record;
use crate::rejected::Verdict;
use crate::shared::Shared;
use tokio_util::sync::CancellationToken;

/// What to do with a record before it runs.
#[derive(Debug)]
pub(crate) enum Gate {
    /// Run it; `alone`: with its outputs produced alone.
    Run { alone: bool },
    /// Do not run it again: dead-letter it with this failure.
    DeadLetter(Failure),
    /// `cancel` fired during the backoff.
    Abandoned,
}

/// The verdict for `record`, after its backoff when it runs alone.
pub(crate) async fn gate<P: Processor>(shared: &Shared<P>, record: &Record, cancel: &CancellationToken) -> Gate {
    match shared.rejections.as_ref().map(|r| r.verdict(record, &shared.config.retry)) {
        None | Some(Verdict::Clean) => Gate::Run { alone: false },
        Some(Verdict::Alone { delay }) => {
            if !delay.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = cancel.cancelled() => return Gate::Abandoned,
                }
            }
            Gate::Run { alone: true }
        }
        Some(Verdict::DeadLetter(failure)) => {
            tracing::warn!(
                pipeline = %shared.config.name, topic = %record.topic, partition = record.partition,
                offset = record.offset, error = %failure.message,
                "an output of the record can never be produced; it is not run again"
            );
            Gate::DeadLetter(failure)
        }
    }
}
