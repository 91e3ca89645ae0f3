//! Key parking end to end, against the real broker, in both delivery modes: key K's record at offset
//! 10 fails for good, so K's records 11–20 are dead-lettered behind it as `parked` while the other
//! keys flow and the group commits to the end; the partition moves to another instance (an empty
//! disk) and K stays parked there (a new K record is parked too); after the fix `millrace dlq replay`
//! brings K's records back in their offset order, the replay of the blocking record releases K, and
//! every one of K's effects happens once, in order (dedup store on).

use millrace::dlq::{DlqErrorKind, DlqInfo, headers};
use millrace::{
    Context, DedupConfig, DlqConfig, ExactlyOnce, Pipeline, PipelineConfig, ProcessError, Processor, Record, Stats,
};
use millrace_integration_tests::{
    Isolation, ReadRecord, bootstrap, committed_to_end, create_topic, eventually, produce_raw, read_topic_as, unique,
};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Rejects records flagged `bad` until fixed; journals `(key, seq)` of every effect, in order.
struct Ledger {
    fixed: Arc<AtomicBool>,
    effects: Arc<Mutex<Vec<(String, i64)>>>,
}

impl Processor for Ledger {
    async fn process(&self, record: &Record, _: &Context) -> Result<(), ProcessError> {
        if record.headers.get("flag") == Some(b"bad") && !self.fixed.load(Relaxed) {
            return Err(ProcessError::permanent("rejected by v1"));
        }
        let key = String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()).into_owned();
        let seq = std::str::from_utf8(record.headers.get("seq").unwrap_or_default()).unwrap().parse().unwrap();
        self.effects.lock().unwrap().push((key, seq));
        Ok(())
    }
}

type Raw = (Option<Vec<u8>>, Option<Vec<u8>>, Vec<(String, Vec<u8>)>);

fn record(key: &str, seq: i64, bad: bool) -> Raw {
    let mut headers = vec![
        ("idempotency-key".to_owned(), format!("order-{seq}").into_bytes()),
        ("seq".to_owned(), seq.to_string().into_bytes()),
    ];
    if bad {
        headers.push(("flag".to_owned(), b"bad".to_vec()));
    }
    (Some(key.as_bytes().to_vec()), Some(format!("order {seq}").into_bytes()), headers)
}

/// Runs `millrace dlq <args>` and returns its last line of stdout.
fn millrace(args: &[&str]) -> String {
    stdout_of(args).lines().last().unwrap_or_default().to_owned()
}

struct Run {
    stats: Arc<Stats>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Result<millrace::RunSummary, millrace::Error>>,
}

fn start(config: PipelineConfig, ledger: Ledger) -> anyhow::Result<Run> {
    let pipeline = Pipeline::new(config, ledger)?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    Ok(Run { stats, stop, task: tokio::spawn(pipeline.run()) })
}

async fn until(stats: &Stats, what: &str, done: impl Fn(&millrace::StatsSnapshot) -> bool) -> anyhow::Result<()> {
    let waited = eventually(what, Duration::from_secs(60), || Ok(done(&stats.snapshot()).then_some(()))).await;
    waited.map_err(|e| e.context(format!("{:?}", stats.snapshot())))
}

fn dlq_info(r: &ReadRecord) -> DlqInfo {
    DlqInfo::from_headers(&r.headers).expect("millrace headers")
}

async fn park_move_and_replay(exactly_once: bool) -> anyhow::Result<()> {
    millrace_integration_tests::init_logs();
    let mode = if exactly_once { "eos" } else { "alos" };
    let topic = unique(&format!("parking-{mode}"));
    let (dlq, group) = (format!("{topic}.dlq"), unique(&format!("parking-{mode}-group")));
    let dirs = [std::env::temp_dir().join(unique("parking-a")), std::env::temp_dir().join(unique("parking-b"))];
    create_topic(&topic, 1).await?;
    // K at offsets 0-20 (10 is bad), then 20 records of 5 other keys.
    let ks = (0..=20).map(|i| record("K", i, i == 10));
    produce_raw(&topic, ks.chain((21..41).map(|i| record(&format!("other-{}", i % 5), i, false)))).await?;

    let fixed = Arc::new(AtomicBool::new(false));
    let effects = Arc::new(Mutex::new(Vec::new()));
    let ledger = || Ledger { fixed: fixed.clone(), effects: effects.clone() };
    let config = |dir: &std::path::Path| {
        let dlq = DlqConfig { park_keys: true, ..DlqConfig::default() };
        let c = PipelineConfig::new(bootstrap(), &group, [&topic]).dedup(DedupConfig::new(dir)).dlq(dlq);
        if exactly_once { c.exactly_once(ExactlyOnce::default().transactional_id(format!("{group}-tx"))) } else { c }
    };

    let a = start(config(&dirs[0]), ledger())?;
    until(&a.stats, "K parked behind offset 10, the others processed", |s| s.processed == 30 && s.dead_lettered == 11)
        .await?;
    let s = a.stats.snapshot();
    assert_eq!((s.parked, s.keys_parked, s.keys_released, s.failed), (10, 1, 0, 0), "{s:?}");
    committed_to_end(&group, &topic, 1, Duration::from_secs(60)).await?;
    let k_effects = |e: &[(String, i64)]| e.iter().filter(|(k, _)| k == "K").map(|(_, s)| *s).collect::<Vec<_>>();
    assert_eq!(k_effects(&effects.lock().unwrap()), (0..10).collect::<Vec<_>>(), "K stopped at its failure");
    let dead = read_topic_as(&dlq, Isolation::ReadCommitted)?;
    let kinds: Vec<(DlqErrorKind, i64)> =
        dead.iter().map(|r| (dlq_info(r).kind, dlq_info(r).original_offset)).collect();
    let mut want = vec![(DlqErrorKind::Permanent, 10)];
    want.extend((11..=20).map(|o| (DlqErrorKind::Parked, o)));
    assert_eq!(kinds, want, "the blocking record, then K's later records in offset order");
    let blocking = format!("{topic}/0/10");
    assert!(dead[1..].iter().all(|r| r.headers.get(headers::PARKED_BY) == Some(blocking.as_bytes())));
    a.stop.cancel();
    a.task.await??;

    // Another instance, another disk: K is still parked there.
    let b = start(config(&dirs[1]), ledger())?;
    produce_raw(&topic, [record("K", 41, false), record("other-1", 42, false)]).await?;
    until(&b.stats, "the new K record parked on the other instance", |s| s.parked == 1 && s.processed == 1).await?;
    assert_eq!(k_effects(&effects.lock().unwrap()).len(), 10, "nothing of K ran on the other instance");

    // Exactly-once, the parked record's DLQ copy is visible once its transaction commits.
    eventually("the new K record in the DLQ", Duration::from_secs(60), || {
        Ok((read_topic_as(&dlq, Isolation::ReadCommitted)?.len() == 12).then_some(()))
    })
    .await?;
    fixed.store(true, Relaxed); // the fix is deployed
    assert_eq!(millrace(&["replay", &dlq]), "replayed 12, exhausted 0, skipped-no-headers 0, filtered-out 0");
    until(&b.stats, "K's records replayed and K released", |s| s.processed == 13 && s.keys_released == 1).await?;
    produce_raw(&topic, [record("K", 43, false)]).await?;
    until(&b.stats, "a new K record runs after the release", |s| s.processed == 14).await?;
    b.stop.cancel();
    b.task.await??;

    let effects = effects.lock().unwrap();
    let mut want: Vec<i64> = (0..=20).collect();
    want.extend([41, 43]);
    assert_eq!(k_effects(&effects), want, "every effect of K once, in its offset order");
    assert_eq!(effects.len(), 23 + 21, "K's 23 and the other keys' 21, each once");
    for dir in dirs {
        std::fs::remove_dir_all(&dir).ok();
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_key_is_parked_across_a_move_and_released_by_replay_at_least_once() -> anyhow::Result<()> {
    park_move_and_replay(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_key_is_parked_across_a_move_and_released_by_replay_exactly_once() -> anyhow::Result<()> {
    park_move_and_replay(true).await
}

/// `millrace dlq stats` shows the parked key and its parked records; `millrace dlq release` releases
/// it (the pipeline applies the marker in order, never running it) and a new record of the key runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_show_a_parked_key_and_release_lets_it_run_again() -> anyhow::Result<()> {
    millrace_integration_tests::init_logs();
    let topic = unique("parking-release");
    let (dlq, group) = (format!("{topic}.dlq"), unique("parking-release-group"));
    create_topic(&topic, 1).await?;
    produce_raw(&topic, (0..6).map(|i| record("K", i, i == 2)).chain([record("J", 6, false)])).await?;
    let effects = Arc::new(Mutex::new(Vec::new()));
    let ledger = Ledger { fixed: Arc::new(AtomicBool::new(false)), effects: effects.clone() };
    let dlq_config = DlqConfig { park_keys: true, ..DlqConfig::default() };
    let run = start(PipelineConfig::new(bootstrap(), &group, [&topic]).dlq(dlq_config), ledger)?;
    until(&run.stats, "K parked behind offset 2", |s| s.processed == 3 && s.parked == 3).await?;

    let stats: serde_json::Value = serde_json::from_str(&stdout_of(&["stats", &dlq, "--format", "json"]))?;
    let want = serde_json::json!([{
        "group": group, "topic": topic, "partition": 0, "key": "K", "blocking_offset": 2, "parked_records": 3
    }]);
    assert_eq!(stats["parked_keys"], want, "{stats}");
    let release = ["release", "--group", &group, "--key", "K"];
    assert_eq!(millrace(&release), "wrote 1 release marker");
    until(&run.stats, "K released by the marker", |s| s.keys_released == 1).await?;
    produce_raw(&topic, [record("K", 8, false)]).await?;
    until(&run.stats, "a new K record runs", |s| s.processed == 4).await?;
    let effects: Vec<(String, i64)> = effects.lock().unwrap().clone();
    let k: Vec<i64> = effects.iter().filter(|(k, _)| k == "K").map(|(_, s)| *s).collect();
    assert_eq!(k, [0, 1, 8], "K's parked records stay in the DLQ; the marker never reached the processor");
    let stats: serde_json::Value = serde_json::from_str(&stdout_of(&["stats", &dlq, "--format", "json"]))?;
    assert_eq!(stats["parked_keys"], serde_json::json!([]), "{stats}");
    // Nothing parked any more: a second release says so and fails.
    let again = Command::new(env!("CARGO_BIN_EXE_millrace"))
        .arg("dlq")
        .args(release)
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
        .output()?;
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success() && said.contains("is not parked by group"), "{said}");
    run.stop.cancel();
    run.task.await??;
    Ok(())
}

/// All of stdout of `millrace dlq <args>`, which must succeed.
fn stdout_of(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_millrace"))
        .arg("dlq")
        .args(args)
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
        .env("RUST_LOG", "warn,librdkafka=off,rdkafka=off")
        .env("NO_COLOR", "1")
        .output()
        .expect("run millrace");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "millrace dlq {args:?} failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    stdout
}
