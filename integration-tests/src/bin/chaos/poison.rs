//! Scenario 5: poison. About 1% of the inputs are not UTF-8 (the worker decodes with `Typed<_, Utf8>`,
//! so they fail as `decode`), about 0.1% make the processor panic (`panic`), and one makes it emit an
//! output above the producer's `message.max.bytes` (`permanent`: the framework fails such an emit
//! at once). The copier runs exactly-once and is SIGKILLed a few times. Each bad record must be in
//! the DLQ exactly once with its error kind, every good one in the output exactly once, and the
//! group must commit to the end (no stall).

use crate::Env;
use crate::check::{self, ConcurrentReader, Tally};
use crate::copier::{Input, KEYS, kill_loop};
use crate::fleet::{Slot, WorkerSpec};
use crate::outcome::Outcome;
use anyhow::Result;
use millrace_integration_tests::{Isolation, create_topic, produce, read_topic_as, unique};
use rand::RngExt;
use std::collections::HashMap;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;

/// Runs the scenario.
pub async fn run(mut env: Env) -> Result<Outcome> {
    let n = env.profile.poison_records;
    let mut outcome = Outcome::new("poison");
    outcome.records = n;
    let (input, output, group) = (unique("chaos-poison-in"), unique("chaos-poison-out"), unique("chaos-poison"));
    outcome.note(format!("input {input}, output {output}, group {group}"));
    create_topic(&input, PARTITIONS).await?;
    create_topic(&output, 3).await?;
    create_topic(&format!("{input}.dlq"), PARTITIONS).await?;
    let inflate = env.rng.random_range(n / 4..n * 3 / 4);
    let mut good = Vec::new();
    let mut bad: HashMap<Vec<u8>, &str> = HashMap::new();
    let inputs: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| {
            let r = env.rng.random_range(0..1_000);
            let value = if i == inflate {
                bad.insert(format!("inflate-{i}").into_bytes(), "permanent");
                format!("inflate-{i}").into_bytes()
            } else if r < 10 {
                let mut v = vec![0xff, 0xfe];
                v.extend_from_slice(format!("undecodable-{i}").as_bytes());
                bad.insert(v.clone(), "decode");
                v
            } else if r == 10 {
                bad.insert(format!("panic-{i}").into_bytes(), "panic");
                format!("panic-{i}").into_bytes()
            } else {
                good.push(format!("id-{i}").into_bytes());
                format!("id-{i}").into_bytes()
            };
            (format!("k{}", i % KEYS), value)
        })
        .collect();
    produce(&input, inputs).await?;
    let spec = WorkerSpec::new(&env.worker, &env.dir, "copier", &input, &group)
        .args(["--output-topic", &output, "--exactly-once", "--transactional-id", &format!("{group}-tx")])
        .args(["--decode-utf8", "--commit-interval-ms", "100", "--delay-max-ms", "1", "--concurrency", "64"])
        .consumer_prop("group.instance.id", &format!("{group}-1"))
        .consumer_prop("session.timeout.ms", "10000");
    let mut slot = Slot::new(spec);
    let reader = ConcurrentReader::start(&output, 3)?;
    let started = Instant::now();
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
    let drained_in = started.elapsed();
    let clean = slot.terminate(Duration::from_secs(30)).await?;
    outcome.faults.kills = slot.kills;
    outcome.faults.aborts = slot.stat("aborted") as usize;
    check::exactly_once_checks(&mut outcome, &good, &output, 3, reader, all).await?;
    let (out_lost, out_dups) = (outcome.lost, outcome.duplicated);

    // The DLQ, read as read_committed: every bad record once, with its error kind.
    let dlq = read_topic_as(&format!("{input}.dlq"), Isolation::ReadCommitted)?;
    let mut tally = Tally::default();
    tally.add_raw(&dlq);
    let mut wrong_kind = Vec::new();
    for r in &dlq {
        let value = r.value.clone().unwrap_or_default();
        let kind = r.headers.get("millrace.error.kind").map(|k| String::from_utf8_lossy(k).into_owned());
        if bad.get(&value).is_some_and(|want| kind.as_deref() != Some(*want)) {
            wrong_kind.push(format!("{} as {kind:?}", String::from_utf8_lossy(&value)));
        }
    }
    let expected_bad: Vec<Vec<u8>> = bad.keys().cloned().collect();
    let (dlq_lost, dlq_unexpected) = tally.compare(&expected_bad);
    outcome.lost = out_lost + dlq_lost;
    outcome.duplicated = out_dups + tally.duplicates();
    outcome.check(dlq_lost == 0, format!("{dlq_lost} bad records missing from the DLQ"));
    outcome.check(tally.duplicates() == 0, format!("{} duplicate DLQ records", tally.duplicates()));
    outcome.check(dlq_unexpected == 0, format!("{dlq_unexpected} good records in the DLQ"));
    outcome.check(wrong_kind.is_empty(), format!("wrong error kinds: {:?}", &wrong_kind[..wrong_kind.len().min(5)]));
    outcome.check(clean, "the last copier did not drain and exit 0 on SIGTERM");
    let count = |k: &str| bad.values().filter(|v| **v == k).count();
    outcome.note(format!(
        "{} good, {} undecodable, {} panics, 1 oversized output; DLQ: {} distinct, {} duplicates; all committed {:.0}s after start (no stall: {all}); {} panics caught, {} dead-lettered by the workers",
        good.len(),
        count("decode"),
        count("panic"),
        tally.seen.len(),
        tally.duplicates(),
        drained_in.as_secs_f64(),
        slot.stat("panics"),
        slot.stat("dead_lettered"),
    ));
    Ok(outcome)
}
