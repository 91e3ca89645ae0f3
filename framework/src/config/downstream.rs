//! The settings that protect the processor's downstream: the rate limit and the circuit breaker.

use super::{CircuitBreakerConfig, PipelineConfig};
use crate::error::ConfigError;

/// A limit on processor calls per second across the pipeline (a token bucket: GCRA from
/// `governor`), for a downstream API with a quota.
///
/// It counts *attempts*, not records: a retry calls the downstream too. Up to `burst` calls may go
/// at once after a quiet spell; beyond that they are spaced `1 / per_second` apart. A record waiting
/// for its turn holds no concurrency permit, and waits in order of arrival. Set it together with
/// [`Bounds::max_concurrency`](crate::Bounds::max_concurrency), the downstream's cap on concurrent
/// calls.
///
/// ```
/// use millrace::{PipelineConfig, RateLimit};
///
/// let config = PipelineConfig::new("127.0.0.1:9092", "billing", ["orders"]).rate_limit(RateLimit::per_second(50));
/// assert!(config.validate().is_ok());
/// let bad = RateLimit { burst: 100, ..RateLimit::per_second(50) };
/// let config = PipelineConfig::new("127.0.0.1:9092", "billing", ["orders"]).rate_limit(bad);
/// assert_eq!(config.validate().unwrap_err().field, "rate_limit.burst");
/// let config = PipelineConfig::new("127.0.0.1:9092", "billing", ["orders"]).rate_limit(RateLimit::per_second(0));
/// assert_eq!(config.validate().unwrap_err().field, "rate_limit.per_second");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(from = "RateLimitSettings")]
pub struct RateLimit {
    /// Calls per second, sustained (at least 1).
    pub per_second: u32,
    /// Calls that may go at once after a quiet spell (1 to `per_second`).
    pub burst: u32,
}

/// A [`RateLimit`] as a configuration file writes it: the burst defaults to `per_second`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitSettings {
    per_second: u32,
    burst: Option<u32>,
}

impl From<RateLimitSettings> for RateLimit {
    fn from(s: RateLimitSettings) -> Self {
        Self { per_second: s.per_second, burst: s.burst.unwrap_or(s.per_second) }
    }
}

impl RateLimit {
    /// `per_second` calls per second, with a burst of as many.
    pub fn per_second(per_second: u32) -> Self {
        Self { per_second, burst: per_second }
    }
}

impl PipelineConfig {
    /// Limits processor calls (attempts) per second across the pipeline; see [`RateLimit`].
    pub fn rate_limit(mut self, limit: RateLimit) -> Self {
        self.rate_limit = Some(limit);
        self
    }

    /// Checks the rate limit and the circuit breaker.
    pub(super) fn validate_downstream(&self) -> Result<(), ConfigError> {
        if let Some(limit) = self.rate_limit {
            if limit.per_second == 0 {
                return Err(ConfigError::new("rate_limit.per_second", "must be at least 1"));
            }
            if limit.burst == 0 || limit.burst > limit.per_second {
                return Err(ConfigError::new(
                    "rate_limit.burst",
                    format!("{} must be 1 to rate_limit.per_second ({})", limit.burst, limit.per_second),
                ));
            }
        }
        let cb: &CircuitBreakerConfig = &self.circuit_breaker;
        if !cb.enabled {
            return Ok(());
        }
        for (field, v) in
            [("circuit_breaker.window", cb.window), ("circuit_breaker.transient_window", cb.transient_window)]
        {
            if v == 0 {
                return Err(ConfigError::new(field, "must be at least 1"));
            }
        }
        if !(cb.max_dlq_share > 0.0 && cb.max_dlq_share <= 1.0) {
            return Err(ConfigError::new("circuit_breaker.max_dlq_share", "must be in (0, 1]"));
        }
        if !(0.0..=1.0).contains(&cb.max_transient_share) {
            return Err(ConfigError::new("circuit_breaker.max_transient_share", "must be in [0, 1] (0 turns it off)"));
        }
        if cb.max_consecutive == 0 {
            return Err(ConfigError::new("circuit_breaker.max_consecutive", "must be at least 1"));
        }
        Ok(())
    }
}
