//! The `slow` benchmark's runs: the configurations round-robin, each a pipeline over its topic whose
//! processor logs every sleep.

use super::analysis::analyse;
use super::{CHECK_EVERY, Mode, Plan, Run, SETTLE, Sleeper, ceil_ms, delay_of, ms};
use crate::kafka::{self, LoadSpec, Planned};
use anyhow::{Context as _, bail};
use millrace::{Bounds, Pipeline, PipelineConfig};
use millrace_testkit::unique;
use rand::{RngExt, SeedableRng};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Loads the topics, then runs the configurations round-robin, printing each run as it ends.
pub(super) async fn measure_all(plan: &Plan, groups: &mut Vec<String>) -> anyhow::Result<Vec<Run>> {
    for (keys, topic) in &plan.topics {
        let spec = LoadSpec { records: plan.records, value_size: plan.value_size, keys: *keys };
        let (bootstrap, topic2, seed, keys) = (plan.bootstrap.clone(), topic.clone(), plan.seed, *keys);
        let took = tokio::task::spawn_blocking(move || {
            // Keys drawn with the seed too, so that --seed repeats the whole workload.
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ keys);
            kafka::load_planned(&bootstrap, &topic2, spec, |_| Planned { key: rng.random_range(0..keys), header: None })
        })
        .await??;
        println!("loaded {} records with {keys} keys into {topic} in {:.2} s", plan.records, took.as_secs_f64());
    }
    let delays: Vec<Duration> = (0..plan.records as i64).map(|o| delay_of(plan.seed, o, plan.max_delay)).collect();
    let requested: Duration = delays.iter().sum();
    let whole_ms: Duration = delays.iter().copied().map(ceil_ms).sum();
    println!(
        "delays: mean {:.3} ms requested, {:.3} ms rounded up to whole ms; ideal elapsed {:.3} s ({:.0} records/s), \
         {:.3} s ({:.0} records/s) with whole ms",
        ms(requested) / plan.records as f64,
        ms(whole_ms) / plan.records as f64,
        requested.as_secs_f64() / plan.concurrency as f64,
        plan.records as f64 * plan.concurrency as f64 / requested.as_secs_f64(),
        whole_ms.as_secs_f64() / plan.concurrency as f64,
        plan.records as f64 * plan.concurrency as f64 / whole_ms.as_secs_f64(),
    );

    println!();
    println!(
        "{:>5}  {:<10}  {:>10}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {:>11}  {:>11}  {:>7}  {:>9}",
        "round",
        "mode",
        "records/s",
        "elapsed s",
        "start s",
        "ideal s",
        "ideal ms",
        "ideal act",
        "bound req s",
        "bound act s",
        "conc.",
        "+sleep ms"
    );
    let mut runs = Vec::new();
    for round in 1..=plan.pairs {
        for (mode, topic) in &plan.modes {
            tokio::time::sleep(SETTLE).await;
            let group = unique(&format!("millrace-bench-slow-{}", mode.name()));
            groups.push(group.clone());
            let run = run_one(plan, *mode, topic, &group).await?;
            println!(
                "{round:>5}  {:<10}  {:>10.0}  {:>9.3}  {:>9.3}  {:>9.3}  {:>9.3}  {:>9.3}  {:>11.3}  {:>11.3}  \
                 {:>7.1}  {:>9.3}",
                mode.name(),
                run.rps(plan.records),
                run.elapsed.as_secs_f64(),
                run.from_start.as_secs_f64(),
                run.ideal.requested.as_secs_f64(),
                run.ideal.whole_ms.as_secs_f64(),
                run.ideal.actual.as_secs_f64(),
                run.bound.requested.as_secs_f64(),
                run.bound.actual.as_secs_f64(),
                run.concurrency(plan),
                ms(run.overshoot),
            );
            if run.sleeps as u64 != plan.records {
                println!("{:>5}  note: {} sleeps for {} records (redelivered records)", "", run.sleeps, plan.records);
            }
            runs.push(run);
        }
    }
    Ok(runs)
}

/// One run: a pipeline in `mode` over `topic` until every record was processed.
async fn run_one(plan: &Plan, mode: Mode, topic: &str, group: &str) -> anyhow::Result<Run> {
    let records = plan.records;
    let log = Arc::new(Mutex::new(Vec::with_capacity(records as usize)));
    let processor = Sleeper { seed: plan.seed, max_delay: plan.max_delay, log: log.clone() };
    let config = PipelineConfig::new(&plan.bootstrap, group, [topic])
        .ordering(mode.ordering())
        .bounds(Bounds { max_concurrency: plan.concurrency, ..Bounds::default() });
    let pipeline = Pipeline::new(config, processor)?;
    let stats = pipeline.stats();
    let stop = pipeline.shutdown_token();
    let started = Instant::now();
    let mut running = tokio::spawn(pipeline.run());
    let from_start = loop {
        let s = stats.snapshot();
        if s.processed >= records {
            break started.elapsed();
        }
        if running.is_finished() {
            let outcome = (&mut running).await?;
            bail!("{}: the pipeline stopped after {} of {records} records: {outcome:?}", mode.name(), s.processed);
        }
        if started.elapsed() > plan.run_timeout {
            stop.cancel();
            let _ = running.await;
            bail!("{}: only {} of {records} records after {:?}", mode.name(), s.processed, plan.run_timeout);
        }
        tokio::time::sleep(CHECK_EVERY).await;
    };
    stop.cancel();
    let summary = running.await?.with_context(|| format!("{} pipeline", mode.name()))?;
    if summary.failed > 0 {
        bail!("{}: {} records failed", mode.name(), summary.failed);
    }
    let end = stats.snapshot();
    let log = std::mem::take(&mut *log.lock().unwrap_or_else(|p| p.into_inner()));
    analyse(plan, mode, &log, from_start, end.running_peak)
}
