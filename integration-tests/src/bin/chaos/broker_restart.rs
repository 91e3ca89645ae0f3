//! Scenario 4: broker restarts under an exactly-once copier. The single broker is SIGKILLed (and,
//! last, stopped cleanly) mid-stream and kept down longer than the session timeout; the pipeline
//! must ride every outage out in the same process (no exit), commit progress again within 60 s of
//! the broker's return, and the usual exactly-once checks hold at the end. Runs only against the
//! broker `scripts/kafka` manages here (see [`broker`]).
//!
//! [`broker`]: crate::broker

use crate::Env;
use crate::broker;
use crate::check::{self, ConcurrentReader, committed_total};
use crate::copier::{CopyTopics, copy_topics, wait_progress};
use crate::fleet::{Slot, WorkerSpec};
use crate::outcome::Outcome;
use anyhow::Result;
use std::time::{Duration, Instant};

/// The longest the pipeline may take to commit again once the broker is back.
const RESUME_WITHIN: Duration = Duration::from_secs(60);

/// Runs the scenario.
pub async fn run(env: Env) -> Result<Outcome> {
    let mut outcome = Outcome::new("broker-restart");
    if !env.own_broker {
        outcome.skipped = Some("the broker may be shared: pass --own-broker to let this scenario restart it".into());
        return Ok(outcome);
    }
    if let Some(why) = broker::not_ours()? {
        // --own-broker asked for this scenario: not being able to run it is a failure, not a skip.
        outcome.check(false, format!("--own-broker was given, but {why}"));
        return Ok(outcome);
    }
    let n = env.profile.broker_records;
    outcome.records = n;
    let CopyTopics { input, output, group, expected } = copy_topics("broker", n, (2, 3), &mut outcome).await?;
    // Slow enough (4 at a time, 5–15 ms each) that the stream outlasts the restarts.
    let spec = WorkerSpec::new(&env.worker, &env.dir, "copier", &input, &group)
        .args(["--output-topic", &output, "--exactly-once", "--transactional-id", &format!("{group}-tx")])
        .args(["--commit-interval-ms", "100", "--delay-min-ms", "5", "--delay-max-ms", "15", "--concurrency", "4"])
        .consumer_prop("session.timeout.ms", "6000")
        .consumer_prop("heartbeat.interval.ms", "1000");
    let mut slot = Slot::new(spec);
    let reader = ConcurrentReader::start(&output, 3)?;
    slot.start()?;
    // SIGKILL restarts, then one clean restart, spread over the first 80% of the input.
    let plan: Vec<bool> = std::iter::repeat_n(true, env.profile.broker_kills).chain([false]).collect();
    let downtime = env.profile.broker_downtime;
    let mut resumed = Vec::new();
    let mut all_resumed = true;
    for (j, &hard) in plan.iter().enumerate() {
        let target = (n * 8 * (j + 1) / (10 * (plan.len() + 1))) as i64;
        wait_progress(&mut slot, &input, 2, target, Duration::from_secs(120)).await?;
        let before = committed_total(&group, &input, 2).unwrap_or(0);
        let t_down = Instant::now();
        tokio::task::spawn_blocking(move || if hard { broker::kill() } else { broker::down() }).await??;
        while t_down.elapsed() < downtime {
            slot.supervise()?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::task::spawn_blocking(broker::up).await??;
        let back = Instant::now();
        let mut resumed_in = None;
        while back.elapsed() < RESUME_WITHIN {
            slot.supervise()?;
            if committed_total(&group, &input, 2).is_some_and(|c| c > before) {
                resumed_in = Some(back.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let kind = if hard { "SIGKILL" } else { "clean stop" };
        match resumed_in {
            Some(t) => resumed.push(format!(
                "{kind}: down {:.1}s (incl. start-up), commits resumed {:.1}s after the broker was back",
                (back - t_down).as_secs_f64(),
                t.as_secs_f64()
            )),
            None => {
                all_resumed = false;
                resumed.push(format!("{kind}: no commit within {RESUME_WITHIN:?} of the broker's return"));
            }
        }
    }
    let finish = env.profile.finish_timeout;
    let all = check::wait_all_committed(&group, &input, 2, finish, || slot.supervise()).await?;
    if !all {
        println!("  {}", slot.dump_stacks());
    }
    let clean = slot.terminate(Duration::from_secs(30)).await?;
    outcome.faults.broker_restarts = plan.len();
    outcome.faults.kills = slot.kills;
    outcome.faults.aborts = slot.stat("aborted") as usize;
    check::exactly_once_checks(&mut outcome, &expected, &output, 3, reader, all).await?;
    outcome.check(all_resumed, format!("the pipeline did not resume within {RESUME_WITHIN:?} of the broker's return"));
    outcome.check(clean, "the last copier did not drain and exit 0 on SIGTERM");
    check::no_unexpected_exits(&mut outcome, &slot);
    for r in resumed {
        outcome.note(r);
    }
    outcome.note(format!(
        "the copier ran through every outage in one process; {} transactions committed, {} aborted, {} transactional producer replacements, {} partition rewinds",
        slot.stat("transactions"),
        slot.stat("aborted"),
        slot.stat("producer_resets"),
        slot.stat("rewinds"),
    ));
    Ok(outcome)
}
