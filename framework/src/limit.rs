//! The rate limit on processor calls ([`RateLimit`]): a GCRA token bucket from `governor`, with
//! the waiting attempts queued in order of arrival so that one of them at a time polls the bucket.

use crate::config::RateLimit;
use governor::clock::Clock;
use governor::{DefaultDirectRateLimiter, Quota};
use tokio_util::sync::CancellationToken;

pub(crate) struct RateLimiter {
    bucket: DefaultDirectRateLimiter,
    /// The attempts waiting for a cell, first come first served (a fair mutex).
    turn: tokio::sync::Mutex<()>,
}

impl RateLimiter {
    pub(crate) fn new(limit: RateLimit) -> Self {
        // Both are at least 1: `PipelineConfig::validate` refuses a pipeline otherwise.
        let nonzero = |n| std::num::NonZeroU32::new(n).unwrap_or(std::num::NonZeroU32::MIN);
        let quota = Quota::per_second(nonzero(limit.per_second)).allow_burst(nonzero(limit.burst));
        Self { bucket: DefaultDirectRateLimiter::direct(quota), turn: tokio::sync::Mutex::new(()) }
    }

    /// Waits for a call's turn: `Some(waited)`, or `None` when `cancel` fired first.
    pub(crate) async fn ready(&self, cancel: &CancellationToken) -> Option<bool> {
        let _turn = match self.turn.try_lock() {
            Ok(turn) => turn,
            Err(_) => tokio::select! {
                turn = self.turn.lock() => turn,
                _ = cancel.cancelled() => return None,
            },
        };
        let mut waited = false;
        loop {
            let Err(not_until) = self.bucket.check() else { return Some(waited) };
            waited = true;
            let wait = not_until.wait_time_from(self.bucket.clock().now());
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = cancel.cancelled() => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[tokio::test]
    async fn spaces_calls_after_the_burst_and_gives_up_when_cancelled() {
        let limit = RateLimiter::new(RateLimit { burst: 2, ..RateLimit::per_second(20) });
        let cancel = CancellationToken::new();
        let start = Instant::now();
        assert_eq!(limit.ready(&cancel).await, Some(false));
        assert_eq!(limit.ready(&cancel).await, Some(false), "the burst");
        for _ in 0..4 {
            assert_eq!(limit.ready(&cancel).await, Some(true));
        }
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(190) && took < Duration::from_millis(400), "4 calls at 20/s: {took:?}");
        cancel.cancel();
        assert_eq!(limit.ready(&cancel).await, None);
    }
}
