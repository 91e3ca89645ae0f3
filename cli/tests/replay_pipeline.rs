//! DLQ replay end to end with a real pipeline: a processor rejects records flagged bad, they land in
//! the DLQ; the processor is "fixed"; `millrace dlq replay` sends them back with their idempotency keys
//! and they are processed once; a second replay with the same group sends nothing; `--dry-run` produces
//! nothing; a record that keeps failing is exhausted by `--max-replays` instead of looping, and
//! `--min-replays` brings it back.

use millrace::{Context, DedupConfig, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::{bootstrap, create_topic, end_offsets, eventually, produce_raw, read_topic, unique};
use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Rejects records flagged `bad` until fixed; records flagged `hopeless` always fail. Counts effects
/// per idempotency key.
struct Orders {
    fixed: Arc<AtomicBool>,
    effects: Arc<Mutex<HashMap<String, u32>>>,
}

impl Processor for Orders {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        match record.headers.get("flag") {
            Some(b"hopeless") => return Err(ProcessError::permanent("cannot be processed, ever")),
            Some(b"bad") if !self.fixed.load(Relaxed) => return Err(ProcessError::permanent("rejected by v1")),
            _ => {}
        }
        let key = String::from_utf8_lossy(ctx.idempotency_key().unwrap_or_default()).into_owned();
        *self.effects.lock().unwrap().entry(key).or_default() += 1;
        Ok(())
    }
}

/// Runs `millrace` and returns its summary line (the last line of stdout).
fn replay(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_millrace"))
        .args(["dlq", "replay"])
        .args(args)
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
        // The scan's bounds and end-of-partition events, for the failure message.
        .env("RUST_LOG", "warn,millrace::read=debug,librdkafka=off,rdkafka=off")
        .env("NO_COLOR", "1")
        .output()
        .expect("run millrace");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    // Shown by the test harness when the test fails: what the tool said it would read.
    eprintln!("millrace dlq replay {args:?}:\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "millrace dlq replay {args:?} failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.lines().last().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fix_and_replay_processes_rejected_records_once() -> anyhow::Result<()> {
    millrace_integration_tests::init_logs();
    let topic = unique("replay-e2e");
    let dlq = format!("{topic}.dlq");
    let dir = std::env::temp_dir().join(unique("replay-e2e-dedup"));
    create_topic(&topic, 2).await?;
    let record = |i: usize, flag: &str| {
        let mut headers = vec![("idempotency-key".to_owned(), format!("order-{i}").into_bytes())];
        if !flag.is_empty() {
            headers.push(("flag".to_owned(), flag.as_bytes().to_vec()));
        }
        (Some(format!("customer-{}", i % 4).into_bytes()), Some(format!("order {i}").into_bytes()), headers)
    };
    let flags = |i: usize| match i {
        19 => "hopeless",
        i if i % 4 == 0 => "bad",
        _ => "",
    };
    produce_raw(&topic, (0..20).map(|i| record(i, flags(i)))).await?;

    let fixed = Arc::new(AtomicBool::new(false));
    let effects = Arc::new(Mutex::new(HashMap::new()));
    let config = PipelineConfig::new(bootstrap(), unique("replay-e2e-group"), [&topic]).dedup(DedupConfig::new(&dir));
    let pipeline = Pipeline::new(config, Orders { fixed: fixed.clone(), effects: effects.clone() })?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    // 5 flagged bad (0, 4, 8, 12, 16) and 1 hopeless go to the DLQ; 14 are processed.
    eventually("the first pass", Duration::from_secs(60), || {
        let s = stats.snapshot();
        Ok((s.processed == 14 && s.dead_lettered == 6).then_some(()))
    })
    .await?;

    // Every DLQ write was acknowledged with its offset (acks=all) before `dead_lettered` counted it,
    // so the end offsets already show all six. (They once showed five: the first write to the new
    // DLQ topic was refused by a partition the broker was still creating, and librdkafka reported it
    // delivered because the next write succeeded; issue 12, item 3.)
    assert_eq!(end_offsets(&dlq, 2)?.values().sum::<i64>(), 6, "every dead-lettered record is in the DLQ");
    let before = end_offsets(&topic, 2)?;
    let line = replay(&[&dlq, "--dry-run"]);
    assert_eq!(line, "would replay 6, exhausted 0, skipped-no-headers 0, filtered-out 0", "dry run reports");
    assert_eq!(end_offsets(&topic, 2)?, before, "--dry-run produces nothing");

    fixed.store(true, Relaxed); // the fix is deployed
    assert_eq!(replay(&[&dlq]), "replayed 6, exhausted 0, skipped-no-headers 0, filtered-out 0");
    // The 5 fixed records are processed; the hopeless one fails again and returns to the DLQ.
    eventually("the replayed records", Duration::from_secs(60), || {
        let s = stats.snapshot();
        Ok((s.processed == 19 && s.dead_lettered == 7).then_some(()))
    })
    .await?;
    // The hopeless record's second DLQ entry carries replay count 1: exhausted rather than looped.
    assert_eq!(replay(&[&dlq, "--max-replays", "1"]), "replayed 0, exhausted 1, skipped-no-headers 0, filtered-out 0");
    // The same group again: everything was handled, nothing is sent twice.
    assert_eq!(replay(&[&dlq]), "replayed 0, exhausted 0, skipped-no-headers 0, filtered-out 0", "nothing twice");
    // The way back for an exhausted record (after a further fix): replayed at least as often as the
    // earlier limit, under a higher one. Its own group rescans the DLQ but produces only that record,
    // not the six earlier copies (replay count 0) that the first replay already sent.
    let back = replay(&[&dlq, "--min-replays", "1", "--max-replays", "4"]);
    assert_eq!(back, "replayed 1, exhausted 0, skipped-no-headers 0, filtered-out 6", "only the exhausted copy");
    eventually("the exhausted record's replay", Duration::from_secs(60), || {
        let s = stats.snapshot();
        Ok((s.dead_lettered == 8).then_some(()))
    })
    .await?;
    assert_eq!(stats.snapshot().processed, 19, "still hopeless: back to the DLQ, nothing else ran");

    stop.cancel();
    run.await??;
    let effects = effects.lock().unwrap();
    assert_eq!(effects.len(), 19, "every order but the hopeless one took effect");
    assert!(effects.values().all(|n| *n == 1), "no effect twice: {effects:?}");
    let back = read_topic(&topic)?;
    let replayed: Vec<_> = back.iter().filter(|r| r.headers.get("millrace.replay.count") == Some(b"1")).collect();
    assert_eq!(replayed.len(), 6, "replayed records carry replay count 1 and their original headers");
    assert!(replayed.iter().all(|r| r.headers.get("idempotency-key").is_some()));
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
