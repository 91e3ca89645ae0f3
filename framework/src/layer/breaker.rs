//! Layer 1, the circuit breaker: a record waits while the breaker is open, so that a flood of
//! failures stops at once rather than after the records already polled. The breaker's state and
//! its decisions are [`crate::breaker`]'s.

use crate::processor::Processor;
use crate::shared::Shared;
use tokio_util::sync::CancellationToken;

/// Returns once the breaker is no longer open (closed, or half-open: the retry layer's gate then
/// lets one attempt probe); `false` when `cancel` fired first.
pub(crate) async fn closed<P: Processor>(shared: &Shared<P>, cancel: &CancellationToken) -> bool {
    shared.breaker.admits(cancel).await
}
