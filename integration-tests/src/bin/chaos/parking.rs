//! Scenario: parked keys under SIGKILL, at-least-once with key parking (`--park-keys`). About 5% of
//! the keys get one poison record each, at a random place among the key's records; the worker is
//! SIGKILLed a few times while they flow. Checked from the journals and the DLQ, not the worker's
//! word: per incarnation, every key's effects in offset order; no effect of a poison key after its
//! poison record (its later records are parked, in whichever incarnation they arrive); every other
//! record handled (no loss); the DLQ holds exactly each poison record (kind `permanent`) and its
//! key's later records (kind `parked`, naming it), first written in offset order, and nothing else;
//! and the group commits to the end (a parked key never stalls its partition).

use crate::Env;
use crate::check;
use crate::copier::{Input, KEYS, kill_loop};
use crate::fleet::{Slot, WorkerSpec};
use crate::outcome::Outcome;
use anyhow::Result;
use millrace::dlq::{DlqErrorKind, DlqInfo, headers};
use millrace_integration_tests::{JournalEntry, assert_key_order, create_topic, produce_raw, read_topic, unique};
use rand::RngExt;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

const PARTITIONS: i32 = 4;

/// Runs the scenario.
pub async fn run(mut env: Env) -> Result<Outcome> {
    let n = env.profile.poison_records;
    let mut outcome = Outcome::new("parked-keys");
    outcome.records = n;
    let (input, group) = (unique("chaos-parking-in"), unique("chaos-parking"));
    outcome.note(format!("input {input}, group {group} (parked keys in {group}.parked-keys)"));
    create_topic(&input, PARTITIONS).await?;
    // Poison keys, each with the index (among the inputs) of its poison record.
    let mut poison_at: HashMap<usize, usize> = HashMap::new();
    let per_key = n / KEYS;
    for key in 0..KEYS {
        if env.rng.random_range(0..100) < 5 && per_key > 0 {
            poison_at.insert(key, key + KEYS * env.rng.random_range(0..per_key));
        }
    }
    let poison: BTreeSet<usize> = poison_at.values().copied().collect();
    let inputs = (0..n).map(|i| {
        let value = if poison.contains(&i) { format!("poison-{i}") } else { format!("id-{i}") };
        (Some(format!("k{}", i % KEYS).into_bytes()), Some(value.into_bytes()), Vec::new())
    });
    let placed = produce_raw(&input, inputs).await?;
    let spec = WorkerSpec::new(&env.worker, &env.dir, "parking", &input, &group)
        .args(["--park-keys", "--commit-interval-ms", "200", "--delay-max-ms", "1", "--concurrency", "64"])
        .consumer_prop("group.instance.id", &format!("{group}-1"))
        .consumer_prop("session.timeout.ms", "10000");
    let mut slot = Slot::new(spec);
    slot.start()?;
    let kills = env.profile.poison_kills;
    kill_loop(
        &mut env,
        &mut slot,
        Input { topic: &input, partitions: PARTITIONS, records: n },
        kills,
        None,
        async |_| Ok(None),
    )
    .await?;
    let finish = env.profile.finish_timeout;
    let all = check::wait_all_committed(&group, &input, PARTITIONS, finish, || slot.supervise()).await?;
    let clean = slot.terminate(Duration::from_secs(30)).await?;
    outcome.faults.kills = slot.kills;

    // Per key: where its poison record is (partition, offset), if it has one.
    let key_of = |i: usize| format!("k{}", i % KEYS);
    let blocking: HashMap<String, (i32, i64)> = poison_at.iter().map(|(k, i)| (format!("k{k}"), placed[*i])).collect();
    let held = |key: &str, (p, o): (i32, i64)| blocking.get(key).is_some_and(|&(bp, bo)| bp == p && o > bo);
    let journals = slot.journals()?;
    // One ordered stream per key and incarnation: a restart redelivers from the committed offset.
    let streams: Vec<JournalEntry> = journals
        .iter()
        .map(|(i, e)| JournalEntry { key: format!("{} in incarnation {i}", e.key), ..e.clone() })
        .collect();
    let order = assert_key_order(&streams, |e| e.key.clone());
    let ran_behind: Vec<String> = journals
        .iter()
        .filter(|(_, e)| held(&e.key, (e.partition, e.offset)))
        .map(|(i, e)| format!("{} at {}/{} in incarnation {i}", e.key, e.partition, e.offset))
        .collect();
    let handled: BTreeSet<(i32, i64)> = journals.iter().map(|(_, e)| (e.partition, e.offset)).collect();
    let should_run: Vec<(i32, i64)> = (0..n).filter(|&i| !held(&key_of(i), placed[i])).map(|i| placed[i]).collect();
    let lost = should_run.iter().filter(|at| !handled.contains(at)).count();

    // The DLQ: per source coordinates, the kinds it was written with, in first-written order per key.
    let dlq = read_topic(&format!("{input}.dlq"))?;
    let mut first_seen: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut copies: HashMap<(i32, i64), usize> = HashMap::new();
    let mut wrong = Vec::new();
    for r in &dlq {
        let Some(info) = DlqInfo::from_headers(&r.headers) else {
            wrong.push("a DLQ record without Millrace headers".to_owned());
            continue;
        };
        let key = String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned();
        let at = (info.original_partition, info.original_offset);
        let expected = match blocking.get(&key) {
            Some(&b) if b == at => info.kind == DlqErrorKind::Permanent,
            Some(&(bp, bo)) => {
                let by = r.headers.get(headers::PARKED_BY).map(|v| String::from_utf8_lossy(v).into_owned());
                info.kind == DlqErrorKind::Parked && held(&key, at) && by == Some(format!("{input}/{bp}/{bo}"))
            }
            None => false,
        };
        if !expected {
            wrong.push(format!("{key} at {}/{} as {}", at.0, at.1, info.kind));
        }
        let n = copies.entry(at).or_default();
        if *n == 0 {
            first_seen.entry(key).or_default().push(at.1);
        }
        *n += 1;
    }
    let want_dlq: BTreeSet<(i32, i64)> =
        (0..n).filter(|&i| poison.contains(&i) || held(&key_of(i), placed[i])).map(|i| placed[i]).collect();
    let missing = want_dlq.iter().filter(|at| !copies.contains_key(at)).count();
    let out_of_order: Vec<&String> =
        first_seen.iter().filter(|(_, o)| o.windows(2).any(|w| w[0] >= w[1])).map(|(k, _)| k).collect();
    let repeated: usize = copies.values().map(|c| c - 1).sum();
    outcome.lost = lost + missing;

    outcome.check(all, "committed offsets never reached the input's end offsets (a parked key stalled its partition?)");
    outcome.check(clean, "the last worker did not drain and exit 0 on SIGTERM");
    outcome.check(order.is_ok(), format!("per-key order broken: {:?}", order.err()));
    outcome.check(
        ran_behind.is_empty(),
        format!("{} effects behind a poison record: {:?}", ran_behind.len(), &ran_behind[..ran_behind.len().min(5)]),
    );
    outcome.check(lost == 0, format!("{lost} records that should have run were never handled"));
    outcome.check(missing == 0, format!("{missing} poison or parked records missing from the DLQ"));
    outcome
        .check(wrong.is_empty(), format!("{} unexpected DLQ records: {:?}", wrong.len(), &wrong[..wrong.len().min(5)]));
    outcome.check(
        out_of_order.is_empty(),
        format!("DLQ records of keys {out_of_order:?} first written out of offset order"),
    );
    outcome.note(format!(
        "{} poison keys, {} records parked behind them, {} run; DLQ: {} distinct, {repeated} written again after a kill (at-least-once); all committed: {all}",
        blocking.len(),
        want_dlq.len() - blocking.len(),
        should_run.len(),
        copies.len(),
    ));
    Ok(outcome)
}
