//! Downstream protection (issue 15): the rate limit holds processor calls to its rate within 10%
//! over 20 s (retries included), and the circuit breaker pauses a pipeline whose processor fails
//! transiently (a downstream that is down) instead of churning retries, probes once per cool-down
//! and resumes when a probe succeeds, losing and dead-lettering nothing.

use anyhow::Result;
use millrace::{
    CircuitBreakerConfig, Context, Pipeline, PipelineConfig, ProcessError, Processor, RateLimit, Record, RetryPolicy,
};
use millrace_integration_tests::*;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Notes the time of every call; fails transiently while `down`, and every `fail_every`-th call.
#[derive(Clone, Default)]
struct Downstream {
    calls: Arc<Mutex<Vec<Instant>>>,
    down: Arc<AtomicBool>,
    fail_every: Option<usize>,
}

impl Downstream {
    fn calls(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}

impl Processor for Downstream {
    async fn process(&self, _record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        let n = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(Instant::now());
            calls.len()
        };
        if self.down.load(Relaxed) {
            return Err(ProcessError::transient("downstream answered 503"));
        }
        if self.fail_every.is_some_and(|k| n % k == 0) {
            return Err(ProcessError::transient("downstream answered 429"));
        }
        Ok(())
    }
}

/// Many attempts a few milliseconds apart: nothing is dead-lettered in these tests.
fn patient_retries() -> RetryPolicy {
    RetryPolicy { max_attempts: 10_000, base_delay: Duration::from_millis(10), max_delay: Duration::from_millis(50) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_within_ten_percent_over_twenty_seconds_retries_included() -> Result<()> {
    init_logs();
    const RATE: u32 = 50;
    let topic = unique("rate-limit");
    let group = unique("rate-limit-group");
    create_topic(&topic, 4).await?;
    // More than 24 s of work at the limit, all of it produced before the start.
    produce(&topic, keyed_records(1_500, 100)).await?;
    let downstream = Downstream { fail_every: Some(5), ..Downstream::default() };
    let config = PipelineConfig::new(bootstrap(), &group, [&topic])
        .retry(patient_retries())
        .rate_limit(RateLimit::per_second(RATE));
    let pipeline = Pipeline::new(config, downstream.clone())?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    // From the first call, 2 s for the burst to pass, then a 20 s window.
    let t0 =
        eventually("the first call", Duration::from_secs(30), || Ok(downstream.calls.lock().unwrap().first().copied()))
            .await?;
    let (from, to) = (t0 + Duration::from_secs(2), t0 + Duration::from_secs(22));
    eventually("a call after the 20 s window", Duration::from_secs(60), || {
        Ok(downstream.calls.lock().unwrap().last().is_some_and(|t| *t >= to).then_some(()))
    })
    .await?;
    stop.cancel();
    run.await??;
    let in_window = downstream.calls.lock().unwrap().iter().filter(|t| **t >= from && **t < to).count();
    let s = stats.snapshot();
    println!("{in_window} calls in 20 s at a limit of {RATE}/s; {} retries; {} waited", s.retries, s.rate_limited);
    let expected = (RATE * 20) as usize;
    assert!(
        in_window.abs_diff(expected) <= expected / 10,
        "{in_window} calls in the 20 s window, expected {expected} ± 10%"
    );
    assert!(s.retries >= (in_window / 5 - 10) as u64, "one call in five failed and was retried: {}", s.retries);
    assert!(s.rate_limited > 0);
    assert_eq!(s.dead_lettered, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_pauses_on_a_transient_storm_probes_once_per_cooldown_and_resumes() -> Result<()> {
    init_logs();
    let topic = unique("storm");
    let group = unique("storm-group");
    create_topic(&topic, 2).await?;
    produce(&topic, keyed_records(300, 30)).await?;
    let downstream = Downstream::default();
    downstream.down.store(true, Relaxed);
    let cooldown = Duration::from_secs(3);
    let breaker =
        CircuitBreakerConfig { transient_window: 50, max_transient_share: 0.8, cooldown, ..Default::default() };
    let config = PipelineConfig::new(bootstrap(), &group, [&topic]).retry(patient_retries()).circuit_breaker(breaker);
    let pipeline = Pipeline::new(config, downstream.clone())?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());

    let tripped = eventually("the breaker to trip and pause both partitions", Duration::from_secs(30), || {
        let s = stats.snapshot();
        Ok((s.breaker_open && s.assigned_partitions == 2 && s.paused_partitions == 2).then_some(Instant::now()))
    })
    .await?;
    let calls_at_trip = downstream.calls();
    // While the downstream stays down: each cool-down ends in one probe, which fails.
    eventually("the first probe to fail", Duration::from_secs(10), || {
        Ok((stats.snapshot().breaker_probes >= 1).then_some(()))
    })
    .await?;
    let after_first_probe = (downstream.calls(), Instant::now());
    eventually("the second probe to fail", Duration::from_secs(10), || {
        Ok((stats.snapshot().breaker_probes >= 2).then_some(()))
    })
    .await?;
    let after_second_probe = (downstream.calls(), Instant::now());
    // Half-open resumes fetching (a probe needs a record); the failed probe pauses everything again.
    eventually("both partitions paused again after the failed probe", Duration::from_secs(5), || {
        let s = stats.snapshot();
        Ok((s.breaker_open && s.paused_partitions == 2).then_some(()))
    })
    .await?;
    assert_eq!(after_second_probe.0 - after_first_probe.0, 1, "one call, the probe, in a cool-down");
    assert!(after_second_probe.1 - after_first_probe.1 >= cooldown - Duration::from_millis(100));
    assert!(tripped.elapsed() < Duration::from_secs(10));

    // The downstream comes back: the next probe succeeds, the breaker closes, everything commits.
    downstream.down.store(false, Relaxed);
    eventually("the breaker to close", Duration::from_secs(10), || Ok((!stats.snapshot().breaker_open).then_some(())))
        .await?;
    committed_to_end(&group, &topic, 2, Duration::from_secs(30)).await?;
    stop.cancel();
    run.await??;
    let s = stats.snapshot();
    println!("calls: {calls_at_trip} up to the trip, {} in all; {s:?}", downstream.calls());
    assert_eq!((s.breaker_trips, s.breaker_probes), (1, 3), "one trip, two failed probes and a good one");
    assert_eq!(s.dead_lettered, 0);
    assert_eq!(s.processed, 300);
    Ok(())
}
