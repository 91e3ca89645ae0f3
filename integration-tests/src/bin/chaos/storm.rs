//! Scenario 3: a rebalance storm. Three instances of one group are started and stopped (SIGTERM
//! or SIGKILL, chosen at random) at random intervals of 0–500 ms; one of them is SIGSTOPped past
//! its session timeout and `max.poll.interval.ms` and then resumed: a zombie whose partitions moved,
//! which must be fenced. Exactly-once: the zombie also stays stopped past its transaction timeout
//! (plus the coordinator's abort check interval), so a transaction it had open is rolled back by the
//! coordinator and its producer fenced; resumed, it must carry on (not exit by itself). No loss and
//! no duplicate for `read_committed` readers. At-least-once: no loss (duplicates are expected and
//! only reported).

use crate::Env;
use crate::check::{self, ConcurrentReader};
use crate::copier::{CopyTopics, copy_topics};
use crate::fleet::{Ending, Slot, WorkerSpec};
use crate::outcome::Outcome;
use anyhow::Result;
use millrace_integration_tests::signal;
use rand::RngExt;
use std::time::{Duration, Instant};

const INPUT_PARTITIONS: i32 = 6;
const OUTPUT_PARTITIONS: i32 = 3;
const SLOTS: usize = 3;
/// How long the zombie stays stopped: past `session.timeout.ms` (6 s) and `max.poll.interval.ms` (7 s).
const FROZEN: Duration = Duration::from_secs(10);
/// Exactly-once workers' `transaction.timeout.ms`: above the revoke drain (3 s), so that only the
/// zombie's pause outlasts it.
const TRANSACTION_TIMEOUT_MS: u64 = 6_000;
/// Exactly-once: how long the zombie stays stopped: past the transaction timeout plus the broker's
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms` (10 s by default), so that the
/// coordinator has rolled back the transaction it had open and fenced its producer.
const FROZEN_EOS: Duration = Duration::from_millis(TRANSACTION_TIMEOUT_MS + 10_000 + 2_000);

/// Runs the storm in exactly-once (`eos`) or at-least-once mode.
pub async fn run(mut env: Env, eos: bool) -> Result<Outcome> {
    let name = if eos { "rebalance-storm-eos" } else { "rebalance-storm-alos" };
    let n = env.profile.storm_records;
    let mut outcome = Outcome::new(name);
    outcome.records = n;
    let CopyTopics { input, output, group, expected } =
        copy_topics("storm", n, (INPUT_PARTITIONS, OUTPUT_PARTITIONS), &mut outcome).await?;
    let mut slots: Vec<Slot> = (0..SLOTS)
        .map(|i| {
            let mut spec = WorkerSpec::new(&env.worker, &env.dir, &format!("slot{i}"), &input, &group)
                // Slow (2 at a time, 2–6 ms each) so that work is in flight throughout the storm.
                .args(["--output-topic", &output, "--delay-min-ms", "2", "--delay-max-ms", "6"])
                .args(["--concurrency", "2", "--drain-timeout-ms", "3000"])
                .consumer_prop("session.timeout.ms", "6000")
                .consumer_prop("heartbeat.interval.ms", "1000")
                .consumer_prop("max.poll.interval.ms", "7000");
            spec = if eos {
                // One transactional id per slot, stable across the slot's restarts.
                spec.args(["--exactly-once", "--transactional-id", &format!("{group}-slot{i}")])
                    .args(["--commit-interval-ms", "100"])
                    .args(["--transaction-timeout-ms".to_owned(), TRANSACTION_TIMEOUT_MS.to_string()])
            } else {
                spec.args(["--commit-interval-ms", "500"])
            };
            Slot::new(spec)
        })
        .collect();
    let reader = ConcurrentReader::start(&output, OUTPUT_PARTITIONS)?;
    for slot in &mut slots {
        slot.start()?;
    }
    let started = Instant::now();
    // The storm lasts its duration and until it made the profile's membership changes (at most
    // four times the duration).
    let min_changes = env.profile.storm_min_rebalances;
    let mut storm_end = started + env.profile.storm_duration;
    let storm_cap = started + env.profile.storm_duration * 4;
    let zombie_at = started + env.profile.storm_duration / 3;
    let mut stopping: [Option<Instant>; SLOTS] = [None; SLOTS];
    let mut frozen: Option<(usize, Instant)> = None;
    let frozen_for = if eos { FROZEN_EOS } else { FROZEN };
    // The zombie's slot and incarnation.
    let mut zombie: Option<(usize, usize)> = None;
    let mut zombie_done = false;
    let mut zombie_note = String::from("no zombie made");
    let mut changes = 0;
    let mut unexpected_exits = 0;
    loop {
        if Instant::now() >= storm_end {
            if changes < min_changes && Instant::now() < storm_cap {
                storm_end = Instant::now() + Duration::from_secs(1);
            } else if frozen.is_none() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(env.rng.random_range(0..=500))).await;
        // Reap the SIGTERMed; SIGKILL those that take too long to drain.
        for (i, slot) in slots.iter_mut().enumerate() {
            if let Some(since) = stopping[i] {
                if slot.incarnations.last_mut().is_none_or(|inc| inc.exited().unwrap_or(true)) {
                    stopping[i] = None;
                } else if since.elapsed() > Duration::from_secs(8) {
                    slot.kill().await?;
                    stopping[i] = None;
                }
            } else if frozen.is_none_or(|(f, _)| f != i)
                && let Some(inc) = slot.incarnations.last_mut()
                && inc.ended.is_none()
                && inc.exited()?
            {
                unexpected_exits += 1;
            }
        }
        // The zombie: stop one running instance past its session timeout, then resume it.
        if let Some((i, since)) = frozen {
            if since.elapsed() >= frozen_for {
                if let Some(inc) = slots[i].running() {
                    signal(&inc.child, libc::SIGCONT)?;
                }
                zombie_note = format!("slot{i} SIGSTOPped for {:?}, then SIGCONTed", since.elapsed());
                frozen = None;
                changes += 1;
            }
            if Instant::now() >= storm_end && frozen.is_some() {
                continue;
            }
        } else if !zombie_done && Instant::now() >= zombie_at {
            let candidates: Vec<usize> = (0..SLOTS)
                .filter(|&i| stopping[i].is_none())
                .filter(|&i| {
                    slots[i]
                        .incarnations
                        .last()
                        .is_some_and(|inc| inc.ended.is_none() && inc.stats().get("assigned").is_some_and(|&a| a > 0))
                })
                .collect();
            if !candidates.is_empty() {
                let i = candidates[env.rng.random_range(0..candidates.len())];
                let inc = slots[i].running().expect("running");
                signal(&inc.child, libc::SIGSTOP)?;
                frozen = Some((i, Instant::now()));
                zombie = Some((i, slots[i].incarnations.len() - 1));
                zombie_done = true;
                continue;
            }
        }
        if Instant::now() >= storm_end {
            continue;
        }
        // Toggle one instance (never the frozen one, never one still draining, and stop only members
        // that own partitions, so that every stop moves partitions).
        let i = env.rng.random_range(0..SLOTS);
        if frozen.is_some_and(|(f, _)| f == i) || stopping[i].is_some() {
            continue;
        }
        // A SIGKILLed member holds its partitions until its session times out; a SIGTERMed one
        // leaves at once. Both, with more of the second to keep the group moving.
        let kill = env.rng.random_bool(0.35);
        let slot = &mut slots[i];
        if slot.running().is_some_and(|inc| inc.stats().get("assigned").is_none_or(|&a| a == 0)) {
            continue;
        }
        match slot.running() {
            Some(_) if kill => {
                slot.kill().await?;
                changes += 1;
            }
            Some(inc) => {
                signal(&inc.child, libc::SIGTERM)?;
                stopping[i] = Some(Instant::now());
                changes += 1;
            }
            None => {
                slot.start()?;
                changes += 1;
            }
        }
    }
    // Calm: every slot runs (so every transactional id is initialised again) until the input is done.
    for (i, slot) in slots.iter_mut().enumerate() {
        if stopping[i].is_some()
            && let Some(inc) = slot.incarnations.last_mut()
            && !inc.reap(Duration::from_secs(8)).await?
        {
            slot.kill().await?;
        }
        if slot.running().is_none() {
            slot.start()?;
        }
    }
    let storm_took = started.elapsed();
    let finish = env.profile.finish_timeout;
    let all = check::wait_all_committed(&group, &input, INPUT_PARTITIONS, finish, || {
        for slot in &mut slots {
            slot.supervise()?;
        }
        Ok(())
    })
    .await?;
    let mut clean = 0;
    for slot in &mut slots {
        clean += usize::from(slot.terminate(Duration::from_secs(30)).await?);
    }
    let kills: usize = slots.iter().map(|s| s.kills).sum();
    let sum = |name: &str| slots.iter().map(|s| s.stat(name)).sum::<u64>();
    outcome.faults.kills = kills;
    outcome.faults.rebalances = changes;
    outcome.faults.aborts = sum("aborted") as usize;
    if eos {
        check::exactly_once_checks(&mut outcome, &expected, &output, OUTPUT_PARTITIONS, reader, all).await?;
    } else {
        let (concurrent, _) = reader.finish(0).await;
        let tally = check::final_tally(&output)?;
        let (lost, unexpected) = tally.compare(&expected);
        outcome.lost = lost;
        outcome.duplicated = tally.duplicates();
        outcome.check(all, "committed offsets never reached the input's end offsets (stall)");
        outcome.check(lost == 0, format!("{lost} inputs missing from the output"));
        outcome.check(unexpected == 0, format!("{unexpected} outputs that match no input"));
        outcome.note(format!(
            "at-least-once: {} duplicate outputs are redeliveries after kills and revocations (allowed); concurrent reader saw {} distinct",
            tally.duplicates(),
            concurrent.seen.len()
        ));
    }
    outcome.check(changes >= min_changes, format!("only {changes} membership changes, fewer than {min_changes}"));
    outcome.check(clean == SLOTS, format!("only {clean} of {SLOTS} instances drained and exited 0 at the end"));
    if let Some((i, n)) = zombie {
        // Stopped by the harness (SIGKILL, or SIGTERM and exit 0) or still running at the end: fine.
        // Exiting by itself after SIGCONT is not.
        let inc = &slots[i].incarnations[n];
        let code = match inc.ended {
            Some(Ending::Exited(Some(code))) => code,
            _ => 0,
        };
        outcome.check(code == 0, format!("the zombie (slot{i}) exited with status {code} after SIGCONT"));
        if eos {
            outcome.note(format!(
                "the zombie replaced its transactional producer {} time(s) after SIGCONT",
                inc.stats().get("producer_resets").copied().unwrap_or(0)
            ));
        }
    }
    let restarts: usize = slots.iter().map(|s| s.unexpected_exits.len()).sum();
    outcome.note(format!(
        "storm {:.0}s: {changes} membership changes ({kills} SIGKILLs, the rest SIGTERMs and starts) over {} incarnations; {zombie_note}; members saw {} assignments and {} revocations ({} commit failures, {} queued records dropped on revoke); {unexpected_exits} exits the harness did not cause during the storm, {restarts} after",
        storm_took.as_secs_f64(),
        slots.iter().map(|s| s.incarnations.len()).sum::<usize>(),
        sum("assignments"),
        sum("revocations"),
        sum("commit_failures"),
        sum("discarded_on_revoke"),
    ));
    if eos {
        outcome.note(format!(
            "transactions: {} committed, {} aborted; {} partition rewinds",
            sum("transactions"),
            sum("aborted"),
            sum("rewinds")
        ));
    }
    Ok(outcome)
}
