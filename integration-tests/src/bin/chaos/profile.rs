//! Sizes of each scenario per profile: `ci` fits the whole suite in a few minutes on two cores,
//! `long` runs the sizes the issue asks for (100,000 records, ≥ 50 rebalances, more kills).

use anyhow::{Result, bail};
use std::time::Duration;

/// Every figure a scenario takes from its profile.
#[derive(Debug, Clone)]
pub struct Profile {
    /// Copier under SIGKILL: records and kills.
    pub copier_records: usize,
    /// Copier under SIGKILL: SIGKILLs.
    pub copier_kills: usize,
    /// Side effects with the dedup store: records (10% more are produced again later).
    pub effects_records: usize,
    /// Side effects: SIGKILLs.
    pub effects_kills: usize,
    /// Rebalance storm: records.
    pub storm_records: usize,
    /// Rebalance storm: how long instances are toggled.
    pub storm_duration: Duration,
    /// Rebalance storm: the fewest membership changes the storm must reach.
    pub storm_min_rebalances: usize,
    /// Broker restarts: records.
    pub broker_records: usize,
    /// Broker restarts: SIGKILL restarts (a clean restart follows them).
    pub broker_kills: usize,
    /// Broker restarts: how long the broker stays down (longer than the session timeout).
    pub broker_downtime: Duration,
    /// Poison: records.
    pub poison_records: usize,
    /// Poison: SIGKILLs while poison flows.
    pub poison_kills: usize,
    /// Negative control: records.
    pub control_records: usize,
    /// Negative control: SIGKILLs.
    pub control_kills: usize,
    /// How long a scenario may take to finish its input after the faults stop.
    pub finish_timeout: Duration,
}

impl Profile {
    /// `ci` or `long`.
    pub fn named(name: &str) -> Result<Self> {
        Ok(match name {
            "ci" => Self {
                copier_records: 40_000,
                copier_kills: 10,
                effects_records: 20_000,
                effects_kills: 6,
                storm_records: 20_000,
                storm_duration: Duration::from_secs(20),
                storm_min_rebalances: 20,
                broker_records: 8_000,
                broker_kills: 1,
                broker_downtime: Duration::from_secs(8),
                poison_records: 20_000,
                poison_kills: 2,
                control_records: 20_000,
                control_kills: 3,
                finish_timeout: Duration::from_secs(180),
            },
            "long" => Self {
                copier_records: 100_000,
                copier_kills: 20,
                effects_records: 100_000,
                effects_kills: 12,
                storm_records: 60_000,
                storm_duration: Duration::from_secs(90),
                storm_min_rebalances: 50,
                broker_records: 30_000,
                broker_kills: 2,
                broker_downtime: Duration::from_secs(10),
                poison_records: 100_000,
                poison_kills: 5,
                control_records: 50_000,
                control_kills: 5,
                finish_timeout: Duration::from_secs(300),
            },
            other => bail!("unknown profile {other:?} (ci or long)"),
        })
    }
}
