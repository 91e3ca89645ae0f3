//! The copier under SIGKILL (exactly-once, with injected aborts) and its negative control (the same
//! copier at-least-once, whose checker must see duplicates), plus the kill loop other scenarios
//! share.

use crate::Env;
use crate::check::{self, ConcurrentReader, committed_total, transaction_open};
use crate::fleet::{Slot, WorkerSpec};
use crate::outcome::Outcome;
use anyhow::{Result, bail};
use millrace_integration_tests::{Isolation, Watermarks, create_topic, eventually, produce, unique};
use rand::RngExt;
use std::time::{Duration, Instant};

/// Keys of the inputs: 1,000 of them, so per-key order is checkable and keys run concurrently.
pub const KEYS: usize = 1_000;

/// `n` inputs with unique values `id-N`.
pub fn id_inputs(n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n).map(|i| (format!("k{}", i % KEYS), format!("id-{i}").into_bytes())).collect()
}

/// The topics and group of a copy scenario, with the input loaded.
pub struct CopyTopics {
    pub input: String,
    pub output: String,
    pub group: String,
    /// The input values, each of which must appear in the output.
    pub expected: Vec<Vec<u8>>,
}

/// Creates fresh `chaos-<name>-in` (`partitions.0` partitions) and `chaos-<name>-out`
/// (`partitions.1`) topics and a group name, loads `n` [`id_inputs`], and notes the names.
pub async fn copy_topics(name: &str, n: usize, partitions: (i32, i32), outcome: &mut Outcome) -> Result<CopyTopics> {
    let (input, output, group) =
        (unique(&format!("chaos-{name}-in")), unique(&format!("chaos-{name}-out")), unique(&format!("chaos-{name}")));
    outcome.note(format!("input {input}, output {output}, group {group}"));
    create_topic(&input, partitions.0).await?;
    create_topic(&output, partitions.1).await?;
    let inputs = id_inputs(n);
    let expected = inputs.iter().map(|(_, v)| v.clone()).collect();
    produce(&input, inputs).await?;
    Ok(CopyTopics { input, output, group, expected })
}

/// Waits until the group committed at least `target` input records in total, restarting the
/// worker if it exited by itself.
pub async fn wait_progress(
    slot: &mut Slot,
    input: &str,
    partitions: i32,
    target: i64,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        slot.supervise()?;
        if committed_total(&slot.spec.group, input, partitions).is_some_and(|c| c >= target) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("no progress to {target} committed records in {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the running incarnation's stats file shows `settle`.
async fn wait_stat(slot: &mut Slot, settle: Settle, timeout: Duration) -> Result<()> {
    let Settle { stat, at_least } = settle;
    let what = format!("the incarnation after the restart to reach {stat} >= {at_least}");
    eventually(&what, timeout, || {
        slot.supervise()?;
        let value = slot.incarnations.last().map_or(0, |i| i.stats().get(stat).copied().unwrap_or(0));
        Ok((value >= at_least).then_some(()))
    })
    .await
}

/// The input a kill loop measures progress on.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// Topic.
    pub topic: &'a str,
    /// Its partitions.
    pub partitions: i32,
    /// Records in it.
    pub records: usize,
}

/// How a kill loop went.
#[derive(Debug, Default)]
pub struct KillLoop {
    /// Kills made while a transaction was visibly open on the output.
    pub in_open_transaction: usize,
}

/// A counter the next incarnation must reach (in its `--stats-file`) before it may be killed.
#[derive(Debug, Clone, Copy)]
pub struct Settle {
    /// The counter's name.
    pub stat: &'static str,
    /// The value it must reach.
    pub at_least: u64,
}

/// SIGKILLs `slot` `kills` times, each after the group committed a random further 2–8% of the `n`
/// inputs and a random 0–400 ms more, and restarts it; `before_restart(k)` runs while the worker
/// is down after kill `k`, and may return a [`Settle`] that the next incarnation must reach (up to
/// 60 s) before kill `k + 1` (so a check on that incarnation's counters does not race the kill). With
/// `open_transaction`, the second kill waits (up to 10 s) until the output has a transaction open.
pub async fn kill_loop(
    env: &mut Env,
    slot: &mut Slot,
    input: Input<'_>,
    kills: usize,
    open_transaction: Option<(&str, i32)>,
    mut before_restart: impl AsyncFnMut(usize) -> Result<Option<Settle>>,
) -> Result<KillLoop> {
    let Input { topic: input, partitions, records } = input;
    let n = records as i64;
    let mut result = KillLoop::default();
    let views = match open_transaction {
        Some(_) => Some((Watermarks::new(Isolation::ReadCommitted)?, Watermarks::new(Isolation::ReadUncommitted)?)),
        None => None,
    };
    let mut settle = None;
    for k in 0..kills {
        let now = committed_total(&slot.spec.group, input, partitions).unwrap_or(0);
        let step = n * env.rng.random_range(2..=8) / 100;
        let target = if now + step < n * 97 / 100 { now + step } else { now };
        wait_progress(slot, input, partitions, target, Duration::from_secs(120)).await?;
        tokio::time::sleep(Duration::from_millis(env.rng.random_range(0..=400))).await;
        if k == 1
            && let (Some((output, out_partitions)), Some((rc, ru))) = (open_transaction, &views)
        {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !transaction_open(rc, ru, output, out_partitions) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if transaction_open(rc, ru, output, out_partitions) {
                result.in_open_transaction += 1;
            }
        }
        if let Some(s) = settle.take() {
            wait_stat(slot, s, Duration::from_secs(60)).await?;
        }
        slot.kill().await?;
        settle = before_restart(k).await?;
        slot.start()?;
    }
    Ok(result)
}

/// Scenario 1: 2 → 3 partitions, exactly-once, commit (transaction) interval 100 ms, a third of
/// the transactions aborted on purpose, SIGKILLed at random points; a concurrent and a final
/// `read_committed` reader must each see every input exactly once.
pub async fn copier_sigkill(mut env: Env) -> Result<Outcome> {
    let n = env.profile.copier_records;
    let mut outcome = Outcome::new("copier-sigkill");
    outcome.records = n;
    let CopyTopics { input, output, group, expected } = copy_topics("copier", n, (2, 3), &mut outcome).await?;
    let spec = WorkerSpec::new(&env.worker, &env.dir, "copier", &input, &group)
        .args(["--output-topic", &output, "--exactly-once", "--transactional-id", &format!("{group}-tx")])
        .args(["--abort-ratio", "0.33", "--commit-interval-ms", "100", "--commit-every-records", "750"])
        .args(["--delay-min-ms", "1", "--delay-max-ms", "3", "--concurrency", "16"])
        // Static membership: a restarted copier takes its partitions back at once.
        .consumer_prop("group.instance.id", &format!("{group}-1"))
        .consumer_prop("session.timeout.ms", "10000");
    let mut slot = Slot::new(spec);
    let reader = ConcurrentReader::start(&output, 3)?;
    slot.start()?;
    let kills = env.profile.copier_kills;
    let run = kill_loop(
        &mut env,
        &mut slot,
        Input { topic: &input, partitions: 2, records: n },
        kills,
        Some((&output, 3)),
        async |_| Ok(None),
    )
    .await?;
    let finish = env.profile.finish_timeout;
    let all = check::wait_all_committed(&group, &input, 2, finish, || slot.supervise()).await?;
    let clean = slot.terminate(Duration::from_secs(30)).await?;
    outcome.faults.kills = slot.kills;
    outcome.faults.aborts = slot.stat("aborted") as usize;
    check::exactly_once_checks(&mut outcome, &expected, &output, 3, reader, all).await?;
    outcome.check(slot.kills >= kills, format!("only {} of {kills} kills made", slot.kills));
    outcome.check(clean, "the last copier did not drain and exit 0 on SIGTERM");
    check::no_unexpected_exits(&mut outcome, &slot);
    outcome.note(format!(
        "{} incarnations; {} kills ({} with a transaction open); transactions: {} committed, {} aborted ({} injected); {} partition rewinds; {} records processed for {n} inputs",
        slot.incarnations.len(),
        slot.kills,
        run.in_open_transaction,
        slot.stat("transactions"),
        slot.stat("aborted"),
        slot.stat("injected_aborts"),
        slot.stat("rewinds"),
        slot.stat("processed"),
    ));
    outcome.note("commit trigger: every 750 finished records or every 100 ms, whichever comes first");
    Ok(outcome)
}

/// Scenario 6: the same copier at-least-once, without dedup, killed a few times. Its checker must
/// see duplicates (and no loss); if it sees none, the suite's checkers prove nothing and it fails.
pub async fn negative_control(mut env: Env) -> Result<Outcome> {
    let n = env.profile.control_records;
    let mut outcome = Outcome::new("negative-control");
    outcome.records = n;
    let CopyTopics { input, output, group, expected } = copy_topics("control", n, (2, 3), &mut outcome).await?;
    let spec = WorkerSpec::new(&env.worker, &env.dir, "control", &input, &group)
        .args(["--output-topic", &output, "--commit-interval-ms", "1000", "--delay-max-ms", "2", "--concurrency", "64"])
        .consumer_prop("group.instance.id", &format!("{group}-1"))
        .consumer_prop("session.timeout.ms", "10000");
    let mut slot = Slot::new(spec);
    slot.start()?;
    let kills = env.profile.control_kills;
    kill_loop(&mut env, &mut slot, Input { topic: &input, partitions: 2, records: n }, kills, None, async |_| Ok(None))
        .await?;
    let finish = env.profile.finish_timeout;
    let all = check::wait_all_committed(&group, &input, 2, finish, || slot.supervise()).await?;
    slot.terminate(Duration::from_secs(30)).await?;
    outcome.faults.kills = slot.kills;
    let tally = check::final_tally(&output)?;
    let (lost, unexpected) = tally.compare(&expected);
    outcome.lost = lost;
    outcome.duplicated = tally.duplicates();
    outcome.check(all, "committed offsets never reached the input's end offsets");
    outcome.check(lost == 0 && unexpected == 0, format!("{lost} lost, {unexpected} unexpected outputs"));
    outcome.check(
        tally.duplicates() > 0,
        "the checker saw no duplicate from an at-least-once copier under SIGKILL: it cannot detect duplicates",
    );
    outcome.note(format!(
        "expected: duplicates > 0 (at-least-once redelivers what was emitted but not committed); saw {} duplicate outputs of {} distinct inputs",
        tally.duplicates(),
        tally.seen.len()
    ));
    Ok(outcome)
}
