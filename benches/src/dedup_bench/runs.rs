//! The `dedup` benchmark's runs: loading the workloads, the interleaved timed pairs and the restores.

use super::{CHECK_EVERY, DUPLICATE_EVERY, Plan, Restore, Results, Run, SETTLE, Side, Workload};
use crate::core_bench::{Noop, Samples};
use crate::kafka::{self, LoadSpec, Planned};
use crate::measure::{Measurement, Stopwatch, machine_cpu, other_process_cpu};
use anyhow::{Context as _, bail};
use millrace::dedup::changelog_topic;
use millrace::{DedupConfig, Pipeline, StatsSnapshot};
use millrace_testkit::unique;
use rand::RngExt;
use std::path::Path;
use std::time::Duration;

/// Loads the topics, then runs the interleaved pairs (and the restores), printing each as it ends.
pub(super) async fn measure_all(
    plan: &Plan,
    groups: &mut Vec<String>,
    topics: &mut Vec<String>,
) -> anyhow::Result<Results> {
    let header = DedupConfig::new(&plan.base_dir).header;
    for (workload, topic) in &plan.topics {
        let (bootstrap, topic2, spec, workload, header) =
            (plan.bootstrap.clone(), topic.clone(), plan.load, *workload, header.clone());
        let took =
            tokio::task::spawn_blocking(move || load_workload(&bootstrap, &topic2, spec, workload, &header)).await??;
        println!(
            "loaded {} records ({} repeating an earlier idempotency key) into {} in {:.2} s: {:.0} records/s",
            plan.records(),
            workload.duplicates(plan.records()),
            topic,
            took.as_secs_f64(),
            plan.records() as f64 / took.as_secs_f64(),
        );
    }

    println!();
    println!(
        "{:>4}  {:<8}  {:<8}  {:>11}  {:>12}  {:>9}  {:>10}  {:>7}  {:>7}  {:>7}",
        "pair", "workload", "side", "records/s", "steady rec/s", "elapsed s", "1st done s", "cpu s", "cpu s/M", "hits"
    );
    let mut results = Results::default();
    let mut run_number = 0;
    for pair in 1..=plan.pairs {
        for (workload, topic) in &plan.topics {
            for &side in &plan.sides {
                tokio::time::sleep(SETTLE).await;
                run_number += 1;
                let group = unique(&format!("millrace-bench-dedup-{}", side.name()));
                groups.push(group.clone());
                let dir = (side == Side::Dedup).then(|| plan.base_dir.join(format!("run-{run_number}")));
                if dir.is_some() && plan.changelog {
                    // Created by the pipeline on its first key (or first restore): delete it afterwards.
                    topics.push(changelog_topic(&group));
                }
                let (run, note) = timed_run(plan, *workload, topic, side, &group, dir.as_deref()).await?;
                println!(
                    "{pair:>4}  {:<8}  {:<8}  {:>11.0}  {:>12.0}  {:>9.3}  {:>10.3}  {:>7.2}  {:>7.2}  {:>7}",
                    workload.name(),
                    side.name(),
                    run.m.rps(),
                    run.steady_rps(),
                    run.m.elapsed.as_secs_f64(),
                    run.first_done.as_secs_f64(),
                    run.m.cpu.as_secs_f64(),
                    run.m.cpu_s_per_m(),
                    run.end.dedup_hits,
                );
                println!("{:>4}  {:<8}  {:<8}  {note}", "", "", "");
                let expected_hits = if side == Side::Dedup { workload.duplicates(plan.records()) } else { 0 };
                if run.end.dedup_hits != expected_hits {
                    let problem = format!(
                        "pair {pair} {} {}: {} dedup hits, expected {expected_hits}",
                        workload.name(),
                        side.name(),
                        run.end.dedup_hits
                    );
                    println!("{:>4}  CHECK FAILED: {problem}", "");
                    results.problems.push(problem);
                }
                if side == Side::Dedup && *workload == Workload::Unique && plan.restore {
                    tokio::time::sleep(SETTLE).await;
                    let dir = plan.base_dir.join(format!("run-{run_number}-restore"));
                    let restore = measure_restore(plan, topic, &group, &dir).await?;
                    println!(
                        "{:>4}  {:<8}  {:<8}  {} entries in {:.3} s: {:.0} entries/s ({:.0}/s after all {} partitions \
                         were assigned at {:.3} s), cpu {:.2} s, {} records polled",
                        "",
                        "",
                        "restore",
                        restore.entries,
                        restore.elapsed.as_secs_f64(),
                        restore.rate(),
                        restore.rate_after_assignment(),
                        plan.partitions,
                        restore.assigned.as_secs_f64(),
                        restore.cpu.as_secs_f64(),
                        restore.end.polled,
                    );
                    if restore.entries != plan.records() || restore.end.polled != 0 {
                        let problem = format!(
                            "pair {pair} restore: {} entries restored (expected {}), {} records polled (expected 0)",
                            restore.entries,
                            plan.records(),
                            restore.end.polled
                        );
                        println!("{:>4}  CHECK FAILED: {problem}", "");
                        results.problems.push(problem);
                    }
                    results.restores.push(restore);
                }
                results.runs.push(run);
            }
        }
    }
    Ok(results)
}

/// Loads one workload's topic: unique idempotency keys, or one record in [`DUPLICATE_EVERY`] repeating
/// the Kafka key and idempotency key of an earlier non-duplicate record. Blocking.
pub(crate) fn load_workload(
    bootstrap: &str,
    topic: &str,
    spec: LoadSpec,
    workload: Workload,
    header: &str,
) -> anyhow::Result<Duration> {
    let mut rng = rand::rng();
    let keys = spec.keys.max(1);
    // The Kafka key of each non-duplicate record, by its idempotency key's number.
    let mut originals: Vec<u64> = Vec::with_capacity(spec.records as usize);
    kafka::load_planned(bootstrap, topic, spec, |i| {
        let repeat = workload == Workload::Duplicates && i % DUPLICATE_EVERY == DUPLICATE_EVERY - 1;
        let (key, n) = if repeat {
            let n = rng.random_range(0..originals.len());
            (originals[n], n)
        } else {
            originals.push(rng.random_range(0..keys));
            (originals[originals.len() - 1], originals.len() - 1)
        };
        Planned { key, header: Some((header.to_owned(), format!("ik-{n}").into_bytes())) }
    })
}

/// One timed run: a pipeline over `topic` (with dedup when `dedup_dir` is given), until every record
/// is processed or skipped as a duplicate. Also returns a line on what its counters showed during the
/// run (sampled every 2 ms), as `core` prints under its Millrace runs.
async fn timed_run(
    plan: &Plan,
    workload: Workload,
    topic: &str,
    side: Side,
    group: &str,
    dedup_dir: Option<&Path>,
) -> anyhow::Result<(Run, String)> {
    let records = plan.records();
    let pipeline = Pipeline::new(plan.config(topic, group, dedup_dir), Noop)?;
    let mut first_done = None;
    let mut samples = Samples::default();
    let what = format!("{} {}", workload.name(), side.name());
    let driven = drive(pipeline, plan, &what, |s, at| {
        let done = s.processed + s.dedup_hits;
        if first_done.is_none() && done > 0 {
            first_done = Some((at, done));
        }
        samples.add(s);
        done >= records
    })
    .await?;
    let (first_done, done_at_first) = first_done.unwrap_or_default();
    let Driven { elapsed, cpu, at_done: end, machine_busy, broker_cpu, .. } = driven;
    let m = Measurement { records, elapsed, first_record: first_done, cpu, warm: None };
    let run = Run { workload, side, m, first_done, done_at_first, end, machine_busy, broker_cpu };
    let mut note = format!(
        "paused {:.0}% of the time ({} episodes), in flight mean {:.0} (peak {}), running peak {}, {} commits; \
         machine busy {}",
        samples.paused_fraction() * 100.0,
        samples.pause_episodes,
        samples.mean_in_flight(),
        end.in_flight_peak,
        end.running_peak,
        end.commits,
        machine_busy.map_or_else(|| "?".to_owned(), |b| format!("{:.0}%", b * 100.0)),
    );
    if let (Some(cpu), Some(per_m)) = (broker_cpu, run.broker_cpu_s_per_m()) {
        note.push_str(&format!(", broker cpu {:.2} s ({per_m:.2} s/M)", cpu.as_secs_f64()));
    }
    Ok((run, note))
}

/// A dedup pipeline in `group` (whose offsets are committed at the end of `topic`) with an empty
/// store in `dir`, timed until every partition restored its keys from the changelog.
async fn measure_restore(plan: &Plan, topic: &str, group: &str, dir: &Path) -> anyhow::Result<Restore> {
    let pipeline = Pipeline::new(plan.config(topic, group, Some(dir)), Noop)?;
    let partitions = plan.partitions as u64;
    let mut assigned = None;
    let driven = drive(pipeline, plan, "restore", |s, at| {
        if assigned.is_none() && s.assigned_partitions >= partitions {
            assigned = Some(at);
        }
        // `dedup_restores` counts complete restores only (an empty changelog partition is one), so
        // this waits until every partition has read its changelog to the end.
        s.dedup_restores >= partitions
    })
    .await?;
    // The entries are read after the pipeline stopped, the one snapshot that is sure to hold every
    // partition's count (each restore adds its entries to `dedup_restored` just before it counts itself).
    let Driven { elapsed, cpu, after_stop: end, .. } = driven;
    Ok(Restore { entries: end.dedup_restored, elapsed, assigned: assigned.unwrap_or(elapsed), cpu, end })
}

/// What [`drive`] measured.
struct Driven {
    /// Wall-clock time to `done`.
    elapsed: Duration,
    /// This process's CPU time over `elapsed`.
    cpu: Duration,
    /// The counters when `done` said so.
    at_done: StatsSnapshot,
    /// The counters after the pipeline stopped.
    after_stop: StatsSnapshot,
    /// Share of the machine's CPU time that was busy over `elapsed` (every process), if known.
    machine_busy: Option<f64>,
    /// The broker's CPU time over `elapsed`, if its process id was given.
    broker_cpu: Option<Duration>,
}

/// Spawns `pipeline.run()` and checks its counters every [`CHECK_EVERY`] until `done(snapshot, time
/// since start)` says so; then stops it gracefully (not timed) and checks that nothing failed.
async fn drive(
    pipeline: Pipeline<Noop>,
    plan: &Plan,
    what: &str,
    mut done: impl FnMut(&StatsSnapshot, Duration) -> bool,
) -> anyhow::Result<Driven> {
    let stats = pipeline.stats();
    let stop = pipeline.shutdown_token();
    let (machine_before, broker_before) = (machine_cpu(), plan.broker_pid.and_then(other_process_cpu));
    let clock = Stopwatch::start();
    let mut running = tokio::spawn(pipeline.run());
    let (elapsed, cpu, at_done) = loop {
        let s = stats.snapshot();
        if done(&s, clock.elapsed()) {
            let (elapsed, cpu) = clock.stop();
            break (elapsed, cpu, s);
        }
        if running.is_finished() {
            let outcome = (&mut running).await?;
            bail!("{what}: the pipeline stopped before it was done ({s:?}): {outcome:?}");
        }
        if clock.elapsed() > plan.run_timeout {
            stop.cancel();
            let _ = running.await;
            bail!("{what}: not done after {:?}; counters {s:?}", plan.run_timeout);
        }
        tokio::time::sleep(CHECK_EVERY).await;
    };
    let machine_busy = machine_before.zip(machine_cpu()).and_then(|((busy0, total0), (busy1, total1))| {
        let total = total1.saturating_sub(total0).as_secs_f64();
        (total > 0.0).then(|| busy1.saturating_sub(busy0).as_secs_f64() / total)
    });
    let broker_after = plan.broker_pid.and_then(other_process_cpu);
    let broker_cpu = broker_before.zip(broker_after).map(|(before, after)| after.saturating_sub(before));
    stop.cancel();
    let summary = running.await?.with_context(|| format!("{what} pipeline"))?;
    if summary.failed > 0 {
        bail!("{what}: {} records failed", summary.failed);
    }
    Ok(Driven { elapsed, cpu, at_done, after_stop: stats.snapshot(), machine_busy, broker_cpu })
}
