//! The retry *policy* (exponential backoff with full jitter, bounded attempts) for a record's
//! processing, and `Backoff` (internal), the same full jitter without an attempt limit for every internal
//! retry loop (a DLQ or changelog write, a transaction call, a metadata request). The loops live
//! with their callers; this module only decides how long to wait.

use crate::error::ConfigError;
use std::time::Duration;

/// Exponential backoff with full jitter: before attempt `n + 1` wait a uniformly random delay in
/// `[0, min(max_delay, base_delay * 2^(n-1))]`, for at most `max_attempts` attempts in all.
///
/// ```
/// use millrace::RetryPolicy;
/// use std::time::Duration;
///
/// let p = RetryPolicy { max_attempts: 5, base_delay: Duration::from_millis(100), max_delay: Duration::from_secs(1) };
/// assert_eq!(p.ceiling(1), Duration::from_millis(100));
/// assert_eq!(p.ceiling(3), Duration::from_millis(400));
/// assert_eq!(p.ceiling(9), Duration::from_secs(1)); // capped
/// assert!(p.delay_after(3).unwrap() <= Duration::from_millis(400));
/// assert!(p.delay_after(5).is_none()); // attempts exhausted
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = no retry).
    pub max_attempts: u32,
    /// Ceiling of the first backoff.
    #[serde(with = "humantime_serde")]
    pub base_delay: Duration,
    /// Largest ceiling.
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { max_attempts: 5, base_delay: Duration::from_millis(100), max_delay: Duration::from_secs(30) }
    }
}

impl RetryPolicy {
    /// The upper bound of the delay after failed attempt `attempt` (1-based).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.saturating_sub(1)).unwrap_or(u32::MAX);
        self.base_delay.saturating_mul(factor).min(self.max_delay)
    }

    /// The delay before the next attempt after failed attempt `attempt`, or `None` when the attempts
    /// are used up.
    pub fn delay_after(&self, attempt: u32) -> Option<Duration> {
        if attempt >= self.max_attempts {
            return None;
        }
        let ceiling = self.ceiling(attempt).as_nanos().min(u64::MAX as u128) as u64;
        Some(Duration::from_nanos(rand::random_range(0..=ceiling)))
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_attempts == 0 {
            return Err(ConfigError::new("retry.max_attempts", "must be at least 1"));
        }
        if self.base_delay > self.max_delay {
            return Err(ConfigError::new("retry.base_delay", "must not exceed retry.max_delay"));
        }
        Ok(())
    }
}

/// The waits of an internal retry loop: full jitter like [`RetryPolicy`] (each wait uniformly
/// random in `[0, min(max, base * 2^(n-1))]` after failure `n`), with no attempt limit: such a loop
/// goes on until it succeeds, its deadline passes or it is cancelled.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    ceiling: RetryPolicy,
    failures: u32,
}

impl Backoff {
    /// Waits with ceilings from `base` doubling up to `max`.
    pub(crate) fn new(base: Duration, max: Duration) -> Self {
        Self {
            ceiling: RetryPolicy { max_attempts: u32::MAX, base_delay: base, max_delay: max.max(base) },
            failures: 0,
        }
    }

    /// The ceilings of the user's retry policy, at least `floor` (a retry of infrastructure, such as
    /// a DLQ write, never spins even when the policy's base delay is zero).
    pub(crate) fn from_policy(policy: &RetryPolicy, floor: Duration) -> Self {
        Self::new(policy.base_delay.max(floor), policy.max_delay.max(floor))
    }

    /// Failures so far.
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }

    /// Counts a failure; returns the wait before the next try.
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let ceiling = self.ceiling.ceiling(self.failures).as_nanos().min(u64::MAX as u128) as u64;
        Duration::from_nanos(rand::random_range(0..=ceiling))
    }

    /// Counts a failure and waits; `false` when `cancel` fired first.
    pub(crate) async fn wait(&mut self, cancel: &tokio_util::sync::CancellationToken) -> bool {
        let delay = self.next_delay();
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            _ = cancel.cancelled() => false,
        }
    }

    /// Counts a failure and blocks the thread for the wait (the poll thread's loops).
    pub(crate) fn sleep(&mut self) {
        std::thread::sleep(self.next_delay());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_within_full_jitter_bounds() {
        let p = RetryPolicy {
            max_attempts: 8,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(200),
        };
        for attempt in 1..8 {
            let ceiling = p.ceiling(attempt);
            let samples: Vec<Duration> = (0..500).map(|_| p.delay_after(attempt).unwrap()).collect();
            assert!(samples.iter().all(|d| *d <= ceiling));
            // full jitter spreads over the whole range, not only near the ceiling
            assert!(samples.iter().any(|d| *d < ceiling / 4), "attempt {attempt}: no low sample");
            assert!(samples.iter().any(|d| *d > ceiling * 3 / 4), "attempt {attempt}: no high sample");
        }
        assert_eq!(p.delay_after(8), None);
    }

    #[test]
    fn backoff_ceilings_double_up_to_the_cap_and_never_end() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(80));
        let mut highest = Duration::ZERO;
        for n in 1..=1_000u32 {
            let d = b.next_delay();
            let ceiling = Duration::from_millis(10 * (1u64 << (n - 1).min(3)));
            assert!(d <= ceiling, "failure {n}: {d:?} over {ceiling:?}");
            highest = highest.max(d);
        }
        assert_eq!(b.failures(), 1_000);
        assert!(highest > Duration::from_millis(60), "full jitter reaches near the cap: {highest:?}");
        let floored = Backoff::from_policy(
            &RetryPolicy { base_delay: Duration::ZERO, ..RetryPolicy::default() },
            Duration::from_millis(100),
        );
        assert_eq!(floored.ceiling.base_delay, Duration::from_millis(100), "a zero base delay is floored");
    }

    #[test]
    fn huge_attempt_numbers_saturate() {
        let p = RetryPolicy { max_attempts: u32::MAX, ..RetryPolicy::default() };
        assert_eq!(p.ceiling(200), p.max_delay);
    }
}
