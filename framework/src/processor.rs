//! The user's code: one record in, effects and output records out.

use crate::context::Context;
use crate::error::ProcessError;
use crate::record::Record;
use std::future::Future;

/// Processes one record at a time per key (in [`ProcessingOrder::Key`](crate::ProcessingOrder::Key) mode).
///
/// Return `Ok(())` once the record's effects are done; the record then completes when every output it
/// emitted is acknowledged, and only then can its offset be committed. Return
/// [`ProcessError::transient`] to have it retried with backoff, [`ProcessError::permanent`] when
/// retrying cannot help. A panic is caught and counts as a permanent failure of that record.
///
/// ```no_run
/// use millrace::{Context, OutputRecord, Pipeline, PipelineConfig, ProcessError, Processor, Record};
///
/// struct Uppercase;
///
/// impl Processor for Uppercase {
///     async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
///         let text = record.value_str().ok_or_else(|| ProcessError::permanent("not UTF-8"))?;
///         let mut out = OutputRecord::to("shouted").value(text.to_uppercase());
///         if let Some(key) = &record.key {
///             out = out.key(key.clone());
///         }
///         ctx.emit(out).await?;
///         Ok(())
///     }
/// }
///
/// # async fn run() -> Result<(), millrace::Error> {
/// let config = PipelineConfig::new(PipelineConfig::bootstrap_from_env(), "shouter", ["words"]);
/// Pipeline::new(config, Uppercase)?.run_until_signal().await?;
/// # Ok(()) }
/// ```
pub trait Processor: Send + Sync + 'static {
    /// Handles one record. Called again (with [`Context::attempt`] incremented) after a transient failure.
    fn process(&self, record: &Record, ctx: &Context) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// The name written into DLQ records ([`crate::dlq::headers::PROCESSOR`]) and logs. Defaults to the
    /// type's name without its module path.
    fn name(&self) -> &str {
        let full = std::any::type_name::<Self>();
        full.rsplit("::").next().unwrap_or(full)
    }
}
