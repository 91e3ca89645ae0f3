//! The RocksDB dedup store against a real broker: a side effect keyed by an idempotency key runs at
//! most once across duplicates, crashes, restarts and partition moves (D1), and the context's key is
//! stable for a downstream to absorb the one window left (D2). Effects are journaled outside Kafka.

use anyhow::Result;
use millrace::{
    Context, DedupConfig, ExactlyOnce, OutputRecord, Pipeline, PipelineConfig, ProcessError, Processor, Record,
    RetryPolicy,
};
use millrace_integration_tests::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

fn temp_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(unique(name))
}

type Attempt = (u32, Option<String>);

/// Performs the "side effect": counts it per idempotency key, and notes the keys the context gave.
#[derive(Clone, Default)]
struct Effects {
    per_key: Arc<Mutex<HashMap<String, u32>>>,
    /// (attempt, idempotency key) per call.
    attempts: Arc<Mutex<Vec<Attempt>>>,
}

struct Charge {
    effects: Effects,
    done: watch::Sender<usize>,
    fail_first_attempt: bool,
}

impl Processor for Charge {
    async fn process(&self, _record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let key = ctx.idempotency_key().map(|k| String::from_utf8_lossy(k).into_owned());
        self.effects.attempts.lock().unwrap().push((ctx.attempt(), key.clone()));
        *self.effects.per_key.lock().unwrap().entry(key.unwrap_or_default()).or_default() += 1;
        if self.fail_first_attempt && ctx.attempt() == 1 {
            // The effect happened but the attempt fails: the window dedup cannot close (D2).
            return Err(ProcessError::transient("timeout after the effect"));
        }
        self.done.send_modify(|n| *n += 1);
        Ok(())
    }
}

fn events(ids: std::ops::Range<usize>, kafka_key: impl Fn(usize) -> String) -> Vec<RawRecord> {
    ids.map(|i| {
        (
            Some(kafka_key(i).into_bytes()),
            Some(format!("charge {i}").into_bytes()),
            vec![("idempotency-key".to_owned(), format!("evt-{i}").into_bytes())],
        )
    })
    .collect()
}

fn config(topic: &str, group: &str, dir: &Path) -> PipelineConfig {
    PipelineConfig::new(bootstrap(), group, [topic])
        .commit_interval(Duration::from_millis(200))
        .dedup(DedupConfig::new(dir))
}

async fn run_until(
    config: PipelineConfig,
    processor: impl Processor,
    mut done: watch::Receiver<usize>,
    wanted: impl Fn(&millrace::StatsSnapshot, usize) -> bool,
) -> Result<millrace::StatsSnapshot> {
    let pipeline = Pipeline::new(config, processor)?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if wanted(&stats.snapshot(), *done.borrow()) {
                return;
            }
            tokio::select! {
                _ = done.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(50)) => {} // stats are counters, not events
            }
        }
    })
    .await?;
    stop.cancel();
    run.await??;
    Ok(stats.snapshot())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_and_concurrent_same_key_records_run_the_effect_once() -> Result<()> {
    init_logs();
    let topic = unique("dedup-dup");
    let dir = temp_dir("dedup-dup");
    create_topic(&topic, 2).await?;
    // 200 events, then the same 200 again (new offsets: a producer retry or an upstream replay), and
    // 50 events whose Kafka keys differ but idempotency keys collide, so they may run concurrently
    // (different lanes). The store's scope is the input partition: each pair collides because both
    // land on one partition, checked below (another partition escapes it, see
    // the_same_key_on_another_partition_is_not_a_duplicate).
    let mut records = events(0..200, |i| format!("customer-{}", i % 20));
    records.extend(events(0..200, |i| format!("customer-{}", i % 20)));
    records.extend(events(200..250, |i| format!("a-{i}")));
    records.extend(events(200..250, |i| format!("b-{i}")));
    let written = produce_raw(&topic, records).await?;
    let split = (0..50).filter(|i| written[400 + i].0 != written[450 + i].0).count();
    assert_eq!(split, 0, "each colliding pair is on one partition (the test's premise)");

    let effects = Effects::default();
    let (tx, rx) = watch::channel(0);
    let charge = Charge { effects: effects.clone(), done: tx, fail_first_attempt: false };
    let s = run_until(config(&topic, &unique("dedup-dup-group"), &dir), charge, rx, |s, _| {
        s.processed + s.dedup_hits >= 500
    })
    .await?;
    println!("{s:?}");
    let per_key = effects.per_key.lock().unwrap();
    assert_eq!(per_key.len(), 250, "every event's effect ran");
    let repeated: Vec<_> = per_key.iter().filter(|(_, n)| **n != 1).collect();
    assert!(repeated.is_empty(), "effects repeated: {repeated:?}");
    assert_eq!((s.processed, s.dedup_hits), (250, 250));
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_is_stable_across_attempts_and_falls_back_to_coordinates() -> Result<()> {
    init_logs();
    let topic = unique("dedup-key");
    let dir = temp_dir("dedup-key");
    create_topic(&topic, 1).await?;
    let mut records = events(0..3, |i| format!("k{i}"));
    records.push((Some(b"no-header".to_vec()), Some(b"x".to_vec()), vec![]));
    let written = produce_raw(&topic, records).await?;
    let effects = Effects::default();
    let (tx, rx) = watch::channel(0);
    let charge = Charge { effects: effects.clone(), done: tx, fail_first_attempt: true };
    let fast =
        RetryPolicy { max_attempts: 3, base_delay: Duration::from_millis(10), max_delay: Duration::from_millis(20) };
    run_until(config(&topic, &unique("dedup-key-group"), &dir).retry(fast), charge, rx, |_, done| done >= 4).await?;
    let attempts = effects.attempts.lock().unwrap();
    let mut keys_by_record: HashMap<String, Vec<u32>> = HashMap::new();
    for (attempt, key) in attempts.iter() {
        keys_by_record.entry(key.clone().expect("a key is always given")).or_default().push(*attempt);
    }
    // The same key on the failed attempt (after its effect) and on the retry: a downstream keyed by it
    // absorbs the repeat.
    for i in 0..3 {
        assert_eq!(keys_by_record[&format!("evt-{i}")], vec![1, 2]);
    }
    let (p, o) = written[3];
    assert_eq!(keys_by_record[&format!("{topic}/{p}/{o}")], vec![1, 2], "coordinates when no header");
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_moving_to_an_empty_disk_still_rejects_duplicates() -> Result<()> {
    init_logs();
    let topic = unique("dedup-move");
    let group = unique("dedup-move-group");
    let (dir_a, dir_b) = (temp_dir("dedup-move-a"), temp_dir("dedup-move-b"));
    create_topic(&topic, 2).await?;
    produce_raw(&topic, events(0..300, |i| format!("c{}", i % 30))).await?;

    let effects = Effects::default();
    let (tx, rx) = watch::channel(0);
    let a = Charge { effects: effects.clone(), done: tx, fail_first_attempt: false };
    run_until(config(&topic, &group, &dir_a), a, rx, |s, _| s.processed >= 300).await?;

    // Instance B, empty disk; the same 300 events arrive again, plus 100 new ones.
    let mut again = events(0..300, |i| format!("c{}", i % 30));
    again.extend(events(300..400, |i| format!("c{}", i % 30)));
    produce_raw(&topic, again).await?;
    let (tx, rx) = watch::channel(0);
    let b = Charge { effects: effects.clone(), done: tx, fail_first_attempt: false };
    let s = run_until(config(&topic, &group, &dir_b), b, rx, |s, _| s.processed + s.dedup_hits >= 400).await?;
    println!("instance B: {s:?}");
    assert!(s.dedup_restored >= 300, "B restored A's keys from the changelog ({})", s.dedup_restored);
    assert_eq!((s.processed, s.dedup_hits), (100, 300));
    assert!(effects.per_key.lock().unwrap().values().all(|n| *n == 1), "no effect ran twice");
    for d in [dir_a, dir_b] {
        std::fs::remove_dir_all(&d).ok();
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_key_is_processed_again() -> Result<()> {
    init_logs();
    let topic = unique("dedup-ttl");
    let group = unique("dedup-ttl-group");
    let dir = temp_dir("dedup-ttl");
    create_topic(&topic, 1).await?;
    produce_raw(&topic, events(0..1, |_| "k".into())).await?;
    let effects = Effects::default();
    // Long enough to cover a pipeline restart under CPU contention (the second run must still see
    // the key; with 1.5 s it expired first in 2 of 7 runs of a contention soak).
    let ttl = Duration::from_secs(10);
    let config = || {
        let mut d = DedupConfig::new(&dir);
        d.ttl = ttl;
        PipelineConfig::new(bootstrap(), &group, [&topic])
            .retry(RetryPolicy { max_attempts: 1, ..RetryPolicy::default() })
            .dedup(d)
    };
    let (tx, rx) = watch::channel(0);
    run_until(config(), Charge { effects: effects.clone(), done: tx, fail_first_attempt: false }, rx, |s, _| {
        s.processed >= 1
    })
    .await?;
    // A duplicate within the TTL is rejected; the TTL is the subject here, so time has to pass.
    produce_raw(&topic, events(0..1, |_| "k".into())).await?;
    let (tx, rx) = watch::channel(0);
    let s =
        run_until(config(), Charge { effects: effects.clone(), done: tx, fail_first_attempt: false }, rx, |s, _| {
            s.dedup_hits >= 1
        })
        .await?;
    assert_eq!(s.processed, 0);
    tokio::time::sleep(ttl + Duration::from_millis(500)).await;
    produce_raw(&topic, events(0..1, |_| "k".into())).await?;
    let (tx, rx) = watch::channel(0);
    let s =
        run_until(config(), Charge { effects: effects.clone(), done: tx, fail_first_attempt: false }, rx, |s, _| {
            s.processed >= 1
        })
        .await?;
    assert_eq!(s.dedup_hits, 0, "the expired key is not a duplicate any more");
    assert_eq!(effects.per_key.lock().unwrap()["evt-0"], 2);
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

/// SIGKILL after the effects and their dedup writes, before any offset commit: the restarted worker
/// (same RocksDB directory) gets every record again and runs none of the effects a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_dedup_write_before_commit_repeats_no_effect() -> Result<()> {
    init_logs();
    const N: usize = 500;
    let topic = unique("dedup-crash");
    let group = unique("dedup-crash-group");
    let dir = temp_dir("dedup-crash");
    let journal = journal_path("dedup-crash");
    create_topic(&topic, 2).await?;
    produce_raw(&topic, events(0..N, |i| format!("c{}", i % 50))).await?;
    let worker = |commit_ms: &str| {
        worker_command(env!("CARGO_BIN_EXE_millrace-it-worker"), &topic, &group, &journal)
            .arg("--dedup-dir")
            .arg(&dir)
            .args(["--commit-interval-ms", commit_ms, "--consumer-prop", "session.timeout.ms=6000"])
            .spawn()
    };
    // No periodic commit in the first run: everything is processed and recorded, nothing committed.
    let mut child = worker("3600000")?;
    eventually("every record journaled", Duration::from_secs(60), || {
        Ok((read_journal(&journal)?.len() >= N).then_some(()))
    })
    .await?;
    // The journal line is the effect; its dedup write (changelog, then RocksDB) follows it. Kill only
    // once every key is in the changelog, so that no record is in the documented D2 window (a crash
    // between the effect and its dedup write): a restart restores keys from the changelog.
    let changelog = millrace::dedup::changelog_topic(&group);
    eventually("every dedup key in the changelog", Duration::from_secs(30), || {
        Ok((read_changelog(&changelog)?.len() >= N).then_some(()))
    })
    .await?;
    signal(&child, libc::SIGKILL)?;
    wait_exit(&mut child, Duration::from_secs(10)).await?;
    assert!(committed_offsets(&group, &topic, 2)?.values().all(|o| *o == 0), "nothing was committed");

    let mut child = worker("200")?;
    let ends = end_offsets(&topic, 2)?;
    eventually("the group to commit everything", Duration::from_secs(60), || {
        Ok((committed_offsets(&group, &topic, 2)? == ends).then_some(()))
    })
    .await?;
    signal(&child, libc::SIGTERM)?;
    assert!(wait_exit(&mut child, Duration::from_secs(30)).await?.success());
    let out = worker_summary(&mut child)?;
    let entries = read_journal(&journal)?;
    println!("{} effects for {N} records; restarted worker: {}", entries.len(), out.trim());
    assert_eq!(entries.len(), N, "no effect ran twice after the crash");
    assert!(out.contains(&format!("dedup_hits={N}")), "every redelivered record was a dedup hit: {out}");
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_file(&journal).ok();
    Ok(())
}

/// The exactly-once form of [`Charge`]: its effect is an output record (`charge <i>`), committed with
/// the input offset, so the output topic is the effect log.
struct Forward {
    output: String,
    done: watch::Sender<usize>,
}

impl Processor for Forward {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        ctx.emit(OutputRecord::to(&self.output).value(record.value.clone().unwrap_or_default())).await?;
        self.done.send_modify(|n| *n += 1);
        Ok(())
    }
}

/// The dedup store in exactly-once mode: keys go to the changelog inside the transaction and to
/// RocksDB (in one write per transaction) after it commits; until then a duplicate is recognised as
/// pending. Duplicates in the same stream are skipped, and a second instance on an empty disk
/// restores the keys from the changelog and skips them too; the committed output holds each event
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_with_dedup_skips_duplicates_across_a_move() -> Result<()> {
    init_logs();
    let (topic, output, group) = (unique("dedup-eos-in"), unique("dedup-eos-out"), unique("dedup-eos-group"));
    let (dir_a, dir_b) = (temp_dir("dedup-eos-a"), temp_dir("dedup-eos-b"));
    create_topic(&topic, 2).await?;
    create_topic(&output, 2).await?;
    // 300 events, each followed soon after by a copy (a producer retry): some copies arrive while the
    // original's transaction is open, others after it committed.
    let mut records = Vec::new();
    for chunk in (0..300).collect::<Vec<_>>().chunks(30) {
        let ids = chunk[0]..chunk[chunk.len() - 1] + 1;
        records.extend(events(ids.clone(), |i| format!("c{}", i % 30)));
        records.extend(events(ids, |i| format!("c{}", i % 30)));
    }
    produce_raw(&topic, records).await?;
    let config = |dir: &Path| {
        config(&topic, &group, dir)
            .exactly_once(ExactlyOnce::default().transactional_id(format!("{group}-{}", dir.display())))
            .commit_interval(Duration::from_millis(50))
    };
    let (tx, rx) = watch::channel(0);
    let a = Forward { output: output.clone(), done: tx };
    let s = run_until(config(&dir_a), a, rx, |s, _| s.processed + s.dedup_hits >= 600).await?;
    println!("instance A: {s:?}");
    assert_eq!((s.processed, s.dedup_hits), (300, 300), "every copy skipped");

    // Instance B, empty disk: the same 300 events arrive again, plus 100 new ones.
    let mut again = events(0..300, |i| format!("c{}", i % 30));
    again.extend(events(300..400, |i| format!("c{}", i % 30)));
    produce_raw(&topic, again).await?;
    let (tx, rx) = watch::channel(0);
    let b = Forward { output: output.clone(), done: tx };
    let s = run_until(config(&dir_b), b, rx, |s, _| s.processed + s.dedup_hits >= 400).await?;
    println!("instance B: {s:?}");
    assert!(s.dedup_restored >= 300, "B restored A's committed keys from the changelog ({})", s.dedup_restored);
    assert_eq!((s.processed, s.dedup_hits), (100, 300));

    let mut per_event: HashMap<Vec<u8>, u32> = HashMap::new();
    for r in read_topic_as(&output, Isolation::ReadCommitted)? {
        *per_event.entry(r.value.unwrap_or_default()).or_default() += 1;
    }
    assert_eq!(per_event.len(), 400, "every event in the output");
    assert!(per_event.values().all(|n| *n == 1), "no event twice in the committed output");
    for d in [dir_a, dir_b] {
        std::fs::remove_dir_all(&d).ok();
    }
    Ok(())
}

/// Produces `(partition, idempotency key)` records to explicit partitions.
async fn produce_to_partitions(topic: &str, records: &[(i32, &str)]) -> Result<()> {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new().set("bootstrap.servers", bootstrap()).create()?;
    for (partition, key) in records {
        let headers = OwnedHeaders::new().insert(Header { key: "idempotency-key", value: Some(key.as_bytes()) });
        let record =
            FutureRecord::<str, str>::to(topic).partition(*partition).key(key).payload("charge").headers(headers);
        producer.send(record, Duration::from_secs(10)).await.map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// The documented scope (docs/guarantees.md, "Dedup scope"): a duplicate is the same idempotency key
/// within the same input partition and TTL. The same key on another partition runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_on_another_partition_is_not_a_duplicate() -> Result<()> {
    init_logs();
    let topic = unique("dedup-scope");
    let dir = temp_dir("dedup-scope");
    create_topic(&topic, 2).await?;
    // evt-1 twice on partition 0 and once on partition 1; evt-2 twice on partition 1.
    produce_to_partitions(&topic, &[(0, "evt-1"), (0, "evt-1"), (1, "evt-1"), (1, "evt-2"), (1, "evt-2")]).await?;
    let effects = Effects::default();
    let (tx, rx) = watch::channel(0);
    let charge = Charge { effects: effects.clone(), done: tx, fail_first_attempt: false };
    let s = run_until(config(&topic, &unique("dedup-scope-group"), &dir), charge, rx, |s, _| {
        s.processed + s.dedup_hits >= 5
    })
    .await?;
    let per_key = effects.per_key.lock().unwrap().clone();
    assert_eq!(per_key, HashMap::from([("evt-1".to_owned(), 2), ("evt-2".to_owned(), 1)]), "once per partition");
    assert_eq!((s.processed, s.dedup_hits), (3, 2));
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

/// With the store off the context still gives a key, by the store's default rules: the
/// `idempotency-key` header, else `topic/partition/offset`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_without_the_store_is_the_header_or_the_coordinates() -> Result<()> {
    init_logs();
    let topic = unique("nodedup-key");
    create_topic(&topic, 1).await?;
    let records = vec![
        (Some(b"k".to_vec()), Some(b"x".to_vec()), vec![("idempotency-key".to_owned(), b"evt-7".to_vec())]),
        (Some(b"k".to_vec()), Some(b"y".to_vec()), vec![]),
    ];
    let written = produce_raw(&topic, records).await?;
    let effects = Effects::default();
    let (tx, rx) = watch::channel(0);
    let charge = Charge { effects: effects.clone(), done: tx, fail_first_attempt: false };
    let config = PipelineConfig::new(bootstrap(), unique("nodedup-key-group"), [topic.as_str()]);
    run_until(config, charge, rx, |_, done| done >= 2).await?;
    let keys: Vec<_> = effects.attempts.lock().unwrap().iter().map(|(_, key)| key.clone()).collect();
    let (p, o) = written[1];
    assert_eq!(keys, vec![Some("evt-7".to_owned()), Some(format!("{topic}/{p}/{o}"))]);
    Ok(())
}
