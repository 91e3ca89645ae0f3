//! Scenario 2b: the exactly-once copier with the dedup store, under SIGKILL. The copier's outputs,
//! its dedup changelog entries and its input offsets commit in one transaction; a committed key
//! reaches RocksDB after the commit. Midway, while the copier is down, its RocksDB directory is
//! deleted (the next incarnation restores the keys from the transactional changelog) and 10% of the
//! inputs are produced again with the same idempotency key (a producer retry upstream).
//!
//! The checker is the copier's: a final and a concurrent `read_committed` reader must see every
//! input id exactly once, so a re-produced duplicate that got past the store shows as a duplicate
//! output; plus the restore must have brought keys back. Sized like `side-effects-sigkill`.

use crate::Env;
use crate::check::{self, ConcurrentReader};
use crate::copier::{Input, Settle, kill_loop};
use crate::fleet::{Slot, WorkerSpec};
use crate::outcome::Outcome;
use crate::side_effects::{record, reproduced_ids, wipe_store_and_reproduce};
use anyhow::Result;
use millrace_integration_tests::{create_topic, produce_raw, unique};
use std::time::Duration;

const PARTITIONS: i32 = 2;
const OUTPUT_PARTITIONS: i32 = 3;

/// Runs the scenario.
pub async fn run(mut env: Env) -> Result<Outcome> {
    let n = env.profile.effects_records;
    let kills = env.profile.effects_kills;
    let mut outcome = Outcome::new("dedup-eos-sigkill");
    let (input, output, group) =
        (unique("chaos-dedup-eos-in"), unique("chaos-dedup-eos-out"), unique("chaos-dedup-eos"));
    outcome.note(format!("input {input}, output {output}, group {group} (changelog {group}.dedup-changelog)"));
    create_topic(&input, PARTITIONS).await?;
    create_topic(&output, OUTPUT_PARTITIONS).await?;
    produce_raw(&input, (0..n).map(record)).await?;
    let expected: Vec<Vec<u8>> = (0..n).map(|i| format!("id-{i}").into_bytes()).collect();
    let ids = reproduced_ids(&mut env.rng, n);
    let dedup_dir = env.dir.join("dedup");
    let spec = WorkerSpec::new(&env.worker, &env.dir, "copier", &input, &group)
        .args(["--output-topic", &output, "--exactly-once", "--transactional-id", &format!("{group}-tx")])
        .args(["--dedup-dir".to_owned(), dedup_dir.display().to_string()])
        .args(["--commit-interval-ms", "100", "--delay-min-ms", "1", "--delay-max-ms", "3", "--concurrency", "16"])
        .consumer_prop("group.instance.id", &format!("{group}-1"))
        .consumer_prop("session.timeout.ms", "10000");
    let mut slot = Slot::new(spec);
    let reader = ConcurrentReader::start(&output, OUTPUT_PARTITIONS)?;
    slot.start()?;
    let midway = kills / 2;
    let mut reproduced = 0;
    kill_loop(
        &mut env,
        &mut slot,
        Input { topic: &input, partitions: PARTITIONS, records: n },
        kills,
        Some((&output, OUTPUT_PARTITIONS)),
        async |k| {
            if k == midway {
                reproduced = wipe_store_and_reproduce(&dedup_dir, &input, &ids).await?.len();
                // The next incarnation restores both partitions before it is killed.
                return Ok(Some(Settle { stat: "dedup_restores", at_least: PARTITIONS as u64 }));
            }
            Ok(None)
        },
    )
    .await?;
    let finish = env.profile.finish_timeout;
    let all = check::wait_all_committed(&group, &input, PARTITIONS, finish, || slot.supervise()).await?;
    let clean = slot.terminate(Duration::from_secs(30)).await?;
    outcome.records = n + reproduced;
    outcome.faults.kills = slot.kills;
    check::exactly_once_checks(&mut outcome, &expected, &output, OUTPUT_PARTITIONS, reader, all).await?;
    let after_deletion = slot.incarnations.get(midway + 1).map(|inc| inc.stats()).unwrap_or_default();
    let restored = after_deletion.get("dedup_restored").copied().unwrap_or(0);
    // Complete restores (to the changelog's end, past its commit markers) of both partitions.
    let complete = after_deletion.get("dedup_restores").copied().unwrap_or(0);
    let hits = slot.stat("dedup_hits");
    outcome.check(clean, "the last copier did not drain and exit 0 on SIGTERM");
    check::no_unexpected_exits(&mut outcome, &slot);
    outcome.check(restored > 0, "no dedup key restored from the changelog after the RocksDB deletion");
    outcome.check(
        complete >= PARTITIONS as u64,
        format!("{complete} of {PARTITIONS} partition restores after the deletion reached the changelog's end"),
    );
    // That every duplicate was absorbed is proven by the outputs (exactly_once_checks: no id twice).
    // The hit counter cannot prove it: an incarnation's stats file is rewritten every 250 ms, so a
    // SIGKILL loses the hits since its last write (seen: 1594 of 2000 after two kills amid the
    // duplicates). It shows that the store, not luck, did the absorbing.
    outcome.check(
        reproduced == 0 || hits > 0,
        format!("no dedup hit for {reproduced} re-produced duplicates: the store recognised none"),
    );
    outcome.note(format!(
        "{} kills; {reproduced} re-produced duplicates, {hits} dedup hits; RocksDB deleted after kill {} and {restored} keys restored from the transactional changelog; transactions: {} committed, {} aborted",
        slot.kills,
        midway + 1,
        slot.stat("transactions"),
        slot.stat("aborted"),
    ));
    Ok(outcome)
}
