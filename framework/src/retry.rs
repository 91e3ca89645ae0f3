//! The retry *policy*: exponential backoff with full jitter, bounded attempts. The retry *loop* lives
//! with the lane worker; this module only decides whether and how long to wait.

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = no retry).
    pub max_attempts: u32,
    /// Ceiling of the first backoff.
    pub base_delay: Duration,
    /// Largest ceiling.
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
    fn huge_attempt_numbers_saturate() {
        let p = RetryPolicy { max_attempts: u32::MAX, ..RetryPolicy::default() };
        assert_eq!(p.ceiling(200), p.max_delay);
    }
}
