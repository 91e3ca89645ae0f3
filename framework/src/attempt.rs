//! The retry *loop* around one record: run the processor, await its outputs' acknowledgements, catch
//! a panic as a permanent failure, and retry transient failures under the [`RetryPolicy`]
//! (crate::RetryPolicy) until it says stop.

use crate::context::Context;
use crate::error::ProcessError;
use crate::pipeline::Shared;
use crate::processor::Processor;
use crate::record::Record;
use crate::stats::Stats;
use futures::FutureExt;
use std::panic::AssertUnwindSafe;

/// How a record's processing ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Processed; every output acknowledged.
    Done,
    /// Failed permanently or ran out of attempts.
    Failed(ProcessError),
    /// Shutdown began while the record waited for a retry: left unfinished, to be redelivered.
    Abandoned,
}

/// Runs `record` through the processor until it succeeds, fails for good, or shutdown interrupts a
/// backoff.
pub(crate) async fn attempt_until_done<P: Processor>(shared: &Shared<P>, epoch: u64, record: &Record) -> Outcome {
    let mut attempt = 1;
    loop {
        let ctx = Context::new(attempt, epoch, shared.handles.clone());
        let result = match AssertUnwindSafe(shared.processor.process(record, &ctx)).catch_unwind().await {
            Ok(Ok(())) => ctx.acknowledged().await.map_err(ProcessError::from),
            Ok(Err(e)) => Err(e),
            Err(panic) => {
                Stats::bump(&shared.stats.panics);
                Err(ProcessError::permanent(format!("processor panicked: {}", panic_message(&*panic))))
            }
        };
        let error = match result {
            Ok(()) => return Outcome::Done,
            Err(e) => e,
        };
        let Some(delay) = error.is_transient().then(|| shared.config.retry.delay_after(attempt)).flatten() else {
            return Outcome::Failed(error);
        };
        Stats::bump(&shared.stats.retries);
        tracing::warn!(
            pipeline = %shared.config.name, topic = %record.topic, partition = record.partition,
            offset = record.offset, attempt, ?delay, error = %error, "transient failure; retrying"
        );
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shared.handles.shutdown.cancelled() => return Outcome::Abandoned,
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
