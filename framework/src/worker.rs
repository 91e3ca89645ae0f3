//! The lane worker: runs the records of one lane one after another, with the retry loop around the
//! processor, and reports each outcome to the partition.

use crate::context::Context;
use crate::error::ProcessError;
use crate::partition::{LaneId, PartitionHandle};
use crate::pipeline::Shared;
use crate::processor::Processor;
use crate::record::Record;
use crate::stats::Stats;
use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// Serves `lane` of `part`, starting with `record`, until the lane's queue is empty.
pub(crate) async fn run_lane<P: Processor>(
    shared: Arc<Shared<P>>,
    part: Arc<PartitionHandle>,
    lane: LaneId,
    mut record: Record,
) {
    loop {
        let permit = match shared.concurrency.acquire().await {
            Ok(p) => p,
            Err(_) => return, // semaphore closed: the pipeline is gone
        };
        if !part.start(&record, lane, &shared.stats) {
            return;
        }
        let outcome = attempt_until_done(&shared, &part, &record).await;
        drop(permit);
        let succeeded = match outcome {
            Ok(()) => {
                Stats::bump(&shared.stats.processed);
                true
            }
            Err(e) => {
                Stats::bump(&shared.stats.failed);
                tracing::error!(
                    pipeline = %shared.config.name, topic = %record.topic, partition = record.partition,
                    offset = record.offset, error = %e,
                    "record failed; its offset will not be committed past"
                );
                false
            }
        };
        let finished = part.finish(&record, lane, succeeded, &shared.stats);
        if finished.paused && finished.buffered <= shared.config.bounds.max_in_flight_per_partition / 2 {
            shared.resume_hint.store(true, Relaxed);
        }
        match finished.next {
            Some(next) => record = next,
            None => return,
        }
    }
}

/// Runs the processor on `record`, retrying transient failures under the retry policy. A panic is
/// a permanent failure. Returns the last error when the record cannot be completed.
async fn attempt_until_done<P: Processor>(
    shared: &Shared<P>,
    part: &PartitionHandle,
    record: &Record,
) -> Result<(), ProcessError> {
    let mut attempt = 1;
    loop {
        let ctx = Context::new(attempt, part.epoch, shared.producer.clone(), shared.shutdown.clone());
        let result = match AssertUnwindSafe(shared.processor.process(record, &ctx)).catch_unwind().await {
            Ok(Ok(())) => ctx.acknowledged().await.map_err(ProcessError::from),
            Ok(Err(e)) => Err(e),
            Err(panic) => {
                Stats::bump(&shared.stats.panics);
                Err(ProcessError::permanent(format!("processor panicked: {}", panic_message(&panic))))
            }
        };
        let error = match result {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let delay = match error.is_transient().then(|| shared.config.retry.delay_after(attempt)).flatten() {
            Some(d) => d,
            None => return Err(error),
        };
        Stats::bump(&shared.stats.retries);
        tracing::warn!(
            pipeline = %shared.config.name, topic = %record.topic, partition = record.partition,
            offset = record.offset, attempt, ?delay, error = %error, "transient failure; retrying"
        );
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shared.shutdown.cancelled() => return Err(error),
        }
        attempt += 1;
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}
