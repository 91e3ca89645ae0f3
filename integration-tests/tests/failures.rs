//! Failures: poison records go to the DLQ with their bytes intact and the partition keeps flowing;
//! transient failures are retried with exponential backoff and full jitter; a failing DLQ produce
//! never lets the commit pass the record; the circuit breaker stops a DLQ flood.

use anyhow::Result;
use millrace::dlq::{DlqErrorKind, DlqInfo};
use millrace::{
    CircuitBreakerConfig, Context, DlqConfig, Pipeline, PipelineConfig, ProcessError, ProcessingOrder, Processor,
    Record, RetryPolicy,
};
use millrace_integration_tests::*;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Payment {
    id: u64,
    amount: u64,
}

/// Decodes JSON payments; rejects zero amounts; panics on id 666. Counts what it processed.
struct Payments {
    processed: watch::Sender<Vec<(u64, Instant)>>,
}

impl Processor for Payments {
    async fn process(&self, record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        let bytes = record.value.as_deref().ok_or_else(|| ProcessError::decode("null value"))?;
        let text = std::str::from_utf8(bytes).map_err(ProcessError::decode)?;
        let p: Payment = serde_json::from_str(text).map_err(ProcessError::decode)?;
        if p.amount == 0 {
            return Err(ProcessError::permanent("amount must be positive"));
        }
        if p.id == 666 {
            panic!("the processor has a bug for id 666");
        }
        self.processed.send_modify(|v| v.push((p.id, Instant::now())));
        Ok(())
    }
}

fn nested(depth: usize) -> Vec<u8> {
    let mut v = "[".repeat(depth).into_bytes();
    v.extend(std::iter::repeat_n(b']', depth));
    v
}

/// The poison corpus: (case name, value, expected DLQ error kind).
fn corpus() -> Vec<(&'static str, Option<Vec<u8>>, DlqErrorKind)> {
    use DlqErrorKind::*;
    vec![
        ("invalid-utf8", Some(vec![0xff, 0xfe, 0x7b, 0x00, 0xc3]), Decode),
        ("truncated-json", Some(br#"{"id": 5, "amou"#.to_vec()), Decode),
        ("empty-value", Some(Vec::new()), Decode),
        ("null-value", None, Decode),
        ("huge-value", Some(vec![b'x'; 900 * 1024]), Decode),
        ("wrong-type", Some(br#"{"id": "seven", "amount": 5}"#.to_vec()), Decode),
        ("deeply-nested", Some(nested(10_000)), Decode),
        ("negative-amount", Some(br#"{"id": 9, "amount": -3}"#.to_vec()), Decode),
        ("unknown-field", Some(br#"{"id": 9, "amount": 3, "extra": true}"#.to_vec()), Decode),
        ("trailing-garbage", Some(br#"{"id": 9, "amount": 3} xyz"#.to_vec()), Decode),
        ("nul-bytes", Some(vec![0, 0, 0, 0]), Decode),
        ("zero-amount", Some(br#"{"id": 9, "amount": 0}"#.to_vec()), Permanent),
        ("processor-panic", Some(br#"{"id": 666, "amount": 1}"#.to_vec()), Panic),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_corpus_lands_in_the_dlq_byte_identical_and_the_partition_keeps_flowing() -> Result<()> {
    init_logs();
    let topic = unique("poison");
    let group = unique("poison-group");
    create_topic_with(&topic, 1, &[("max.message.bytes", "1048576")]).await?;
    // Good records interleaved with every poison case, in one partition processed one at a time: the
    // good record right behind a poison one must not be held up by it.
    let cases = corpus();
    let mut records = Vec::new();
    let mut good = 0u64;
    for (i, (case, value, _)) in cases.iter().enumerate() {
        for _ in 0..5 {
            good += 1;
            let v = format!(r#"{{"id": {good}, "amount": {}}}"#, 10 + good).into_bytes();
            records.push((Some(format!("good-{good}").into_bytes()), Some(v), vec![]));
        }
        records.push((
            Some(format!("poison-{i}").into_bytes()),
            value.clone(),
            vec![("case".to_owned(), case.as_bytes().to_vec()), ("trace".to_owned(), vec![1, 2, 3])],
        ));
    }
    let written = produce_raw(&topic, records.clone()).await?;

    let (tx, mut processed) = watch::channel(Vec::new());
    let config = PipelineConfig::new(bootstrap(), &group, [&topic])
        .ordering(ProcessingOrder::Partition)
        .producer_property("message.max.bytes", "2000000");
    let pipeline = Pipeline::new(config, Payments { processed: tx })?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let started = Instant::now();
    let run = tokio::spawn(pipeline.run());
    tokio::time::timeout(Duration::from_secs(60), processed.wait_for(|v| v.len() as u64 >= good)).await??;
    committed_to_end(&group, &topic, 1, Duration::from_secs(30)).await?;
    stop.cancel();
    run.await??;
    let s = stats.snapshot();
    println!("{} records ({} poison) in {:?}; {s:?}", records.len(), cases.len(), started.elapsed());

    // Every good record processed exactly once, with no long stall anywhere.
    let seen = processed.borrow().clone();
    let ids: Vec<u64> = seen.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, (1..=good).collect::<Vec<_>>(), "good records processed once each, in order");
    let worst_gap = seen.windows(2).map(|w| w[1].1 - w[0].1).max().unwrap();
    println!("longest gap between consecutive good records: {worst_gap:?}");
    assert!(worst_gap < Duration::from_secs(3), "a poison record stalled the partition for {worst_gap:?}");

    // Every poison record in the DLQ exactly once, with its bytes and headers intact.
    let dlq = read_topic(&format!("{topic}.dlq"))?;
    assert_eq!(dlq.len(), cases.len(), "one DLQ record per poison record");
    assert_eq!(s.dead_lettered as usize, cases.len());
    let by_case: HashMap<String, _> =
        dlq.iter().map(|r| (String::from_utf8(r.headers.get("case").unwrap().to_vec()).unwrap(), r)).collect();
    for (i, (case, value, kind)) in cases.iter().enumerate() {
        let r = by_case.get(*case).unwrap_or_else(|| panic!("{case} missing from the DLQ"));
        let source_index = (i + 1) * 6 - 1;
        let (partition, offset) = written[source_index];
        assert_eq!(&r.value, value, "{case}: value bytes must be identical");
        assert_eq!(r.key.as_deref(), Some(format!("poison-{i}").as_bytes()), "{case}: key");
        assert_eq!(r.headers.get("trace"), Some(&[1u8, 2, 3][..]), "{case}: user headers kept");
        let info = DlqInfo::from_headers(&r.headers).unwrap_or_else(|| panic!("{case}: millrace headers"));
        assert_eq!(info.kind, *kind, "{case}: error kind");
        assert_eq!(
            (info.original_topic.as_str(), info.original_partition, info.original_offset),
            (topic.as_str(), partition, offset)
        );
        assert_eq!(info.group, group);
        assert_eq!(info.processor, "Payments");
        assert_eq!(info.attempts, 1, "{case}: permanent failures are not retried");
        assert_eq!(info.replay_count, 0);
        assert!(!info.message.is_empty() && info.first_failure_ms <= info.last_failure_ms);
    }
    Ok(())
}

/// Fails transiently for keys starting with `flaky`, succeeding from attempt `succeed_at` on (never
/// when 0); records every attempt's time per key.
struct Flaky {
    succeed_at: u32,
    attempts: Arc<Mutex<BTreeMap<String, Vec<Instant>>>>,
    done: watch::Sender<usize>,
}

impl Processor for Flaky {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let key = record.key_str().unwrap_or("-").to_owned();
        if key.starts_with("flaky") {
            self.attempts.lock().unwrap().entry(key).or_default().push(Instant::now());
            if self.succeed_at == 0 || ctx.attempt() < self.succeed_at {
                return Err(ProcessError::transient("upstream answered 503"));
            }
        }
        self.done.send_modify(|n| *n += 1);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_retries_follow_full_jitter_bounds_then_dead_letter() -> Result<()> {
    init_logs();
    const FLAKY: usize = 20;
    const OTHERS: usize = 200;
    let topic = unique("retry");
    create_topic(&topic, 2).await?;
    let records = (0..FLAKY)
        .map(|i| (format!("flaky-{i}"), b"x".to_vec()))
        .chain((0..OTHERS).map(|i| (format!("other-{i}"), b"y".to_vec())));
    produce(&topic, records).await?;

    let policy =
        RetryPolicy { max_attempts: 4, base_delay: Duration::from_millis(100), max_delay: Duration::from_millis(300) };
    let attempts = Arc::new(Mutex::new(BTreeMap::new()));
    let (done_tx, mut done) = watch::channel(0);
    let config = PipelineConfig::new(bootstrap(), unique("retry-group"), [&topic]).retry(policy);
    let pipeline = Pipeline::new(config, Flaky { succeed_at: 0, attempts: attempts.clone(), done: done_tx })?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());

    // The other keys are not held up by the retrying ones (checked below against the attempt times).
    tokio::time::timeout(Duration::from_secs(30), done.wait_for(|n| *n >= OTHERS)).await??;
    let others_done = Instant::now();
    eventually("every flaky record dead-lettered", Duration::from_secs(30), || {
        Ok((stats.snapshot().dead_lettered as usize >= FLAKY).then_some(()))
    })
    .await?;
    stop.cancel();
    run.await??;

    let attempts = attempts.lock().unwrap();
    let mut delays: Vec<Vec<Duration>> = vec![Vec::new(); 3];
    for (key, times) in attempts.iter() {
        assert_eq!(times.len(), 4, "{key}: called exactly max_attempts times");
        for (i, w) in times.windows(2).enumerate() {
            delays[i].push(w[1] - w[0]);
        }
    }
    let last_flaky_attempt = attempts.values().map(|t| *t.last().unwrap()).max().unwrap();
    assert!(others_done < last_flaky_attempt, "other keys finished while the flaky ones were still retrying");
    for (i, d) in delays.iter_mut().enumerate() {
        d.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "delay before attempt {}: ceiling {:.0} ms; min {:.1} / median {:.1} / max {:.1} ms over {} records",
            i + 2,
            ms(policy.ceiling(i as u32 + 1)),
            ms(d[0]),
            ms(d[d.len() / 2]),
            ms(d[d.len() - 1]),
            d.len()
        );
        // What is measured here is the chosen delay plus the time the woken task waited for a CPU,
        // which has no bound on a busy machine (150 ms seen with a build beside the suite); that every
        // chosen delay stays under its ceiling is the unit test in retry.rs. Full jitter puts the
        // median at half the ceiling: a delay that ignores the ceiling or sits at it fails this.
        let ceiling = policy.ceiling(i as u32 + 1);
        assert!(d[d.len() / 2] <= ceiling, "median delay before attempt {} above its ceiling {ceiling:?}", i + 2);
    }
    // Full jitter spreads delays over the range: they are not all near the ceiling.
    let all: Vec<Duration> = delays.concat();
    assert!(all.iter().any(|d| *d < Duration::from_millis(50)), "no short delay at all: not full jitter");

    let dlq_topic = format!("{topic}.dlq");
    let dlq = read_topic(&dlq_topic)?;
    if dlq.len() != FLAKY {
        // Issue 12 item 3 (seen once, not reproduced since): say whether the records were late or
        // missing. `read_topic_as` reads to every partition's end rather than to a watermark snapshot.
        let keys = |rs: &[ReadRecord]| {
            rs.iter()
                .map(|r| String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned())
                .collect::<std::collections::BTreeSet<_>>()
        };
        let to_eof = read_topic_as(&dlq_topic, Isolation::ReadUncommitted)?;
        panic!(
            "{} DLQ records of {FLAKY} (dead_lettered {}): keys {:?}; end offsets {:?}; read to EOF: {} records, keys {:?}",
            dlq.len(),
            stats.snapshot().dead_lettered,
            keys(&dlq),
            end_offsets(&dlq_topic, 2)?,
            to_eof.len(),
            keys(&to_eof)
        );
    }
    for r in &dlq {
        let info = DlqInfo::from_headers(&r.headers).unwrap();
        assert_eq!((info.kind, info.attempts), (DlqErrorKind::TransientExhausted, 4));
        assert!(info.message.contains("503"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failure_recovering_on_attempt_three_is_processed_once_and_never_dead_lettered() -> Result<()> {
    init_logs();
    let topic = unique("recover");
    create_topic(&topic, 1).await?;
    produce(&topic, [("flaky-1".to_owned(), b"x".to_vec()), ("other".to_owned(), b"y".to_vec())]).await?;
    let attempts = Arc::new(Mutex::new(BTreeMap::new()));
    let (done_tx, mut done) = watch::channel(0);
    let policy =
        RetryPolicy { max_attempts: 5, base_delay: Duration::from_millis(20), max_delay: Duration::from_millis(50) };
    let config = PipelineConfig::new(bootstrap(), unique("recover-group"), [&topic]).retry(policy);
    let pipeline = Pipeline::new(config, Flaky { succeed_at: 3, attempts: attempts.clone(), done: done_tx })?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    tokio::time::timeout(Duration::from_secs(30), done.wait_for(|n| *n >= 2)).await??;
    stop.cancel();
    run.await??;
    let s = stats.snapshot();
    assert_eq!(attempts.lock().unwrap()["flaky-1"].len(), 3, "called until it succeeded on attempt 3");
    assert_eq!((s.processed, s.retries, s.dead_lettered), (2, 2, 0));
    assert!(read_topic(&format!("{topic}.dlq"))?.is_empty(), "nothing dead-lettered");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_dlq_produce_holds_the_commit_until_the_dlq_topic_exists() -> Result<()> {
    init_logs();
    let topic = unique("no-dlq");
    let group = unique("no-dlq-group");
    let dlq_topic = format!("{topic}.dlq");
    create_topic(&topic, 1).await?;
    let records =
        std::iter::once((Some(b"poison".to_vec()), Some(b"not json".to_vec()), vec![])).chain((1..=20).map(|i| {
            (Some(format!("good-{i}").into_bytes()), Some(format!(r#"{{"id":{i},"amount":1}}"#).into_bytes()), vec![])
        }));
    produce_raw(&topic, records).await?;

    let (tx, mut processed) = watch::channel(Vec::new());
    let config = PipelineConfig::new(bootstrap(), &group, [&topic])
        .commit_interval(Duration::from_millis(200))
        .dlq(DlqConfig { create_topics: false, ..DlqConfig::default() })
        .producer_property("message.timeout.ms", "1500");
    let pipeline = Pipeline::new(config, Payments { processed: tx })?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());

    // The good records (other keys) are processed; the poison one cannot reach its DLQ.
    tokio::time::timeout(Duration::from_secs(30), processed.wait_for(|v| v.len() >= 20)).await??;
    eventually("two failed DLQ produces", Duration::from_secs(30), || {
        Ok((stats.snapshot().dlq_produce_failures >= 2).then_some(()))
    })
    .await?;
    // Two failed produces take over 3 s (1.5 s message timeout each): many 200 ms commit rounds ran
    // after the good records finished.
    let committed = committed_offsets(&group, &topic, 1)?;
    assert!(
        committed.get(&0).copied().unwrap_or(0) == 0,
        "nothing may be committed past the poison record: {committed:?}"
    );
    assert_eq!(stats.snapshot().dead_lettered, 0);

    create_topic(&dlq_topic, 1).await?;
    eventually("the record dead-lettered once its DLQ exists", Duration::from_secs(60), || {
        Ok((stats.snapshot().dead_lettered == 1).then_some(()))
    })
    .await?;
    let ends = end_offsets(&topic, 1)?;
    eventually("the commit to reach the end", Duration::from_secs(10), || {
        Ok((committed_offsets(&group, &topic, 1)? == ends).then_some(()))
    })
    .await?;
    stop.cancel();
    run.await??;
    let dlq = read_topic(&dlq_topic)?;
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].value.as_deref(), Some(&b"not json"[..]));
    println!("DLQ produce failures before the topic existed: {}", stats.snapshot().dlq_produce_failures);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn circuit_breaker_trips_on_a_burst_of_poison_and_reports_unhealthy() -> Result<()> {
    init_logs();
    let topic = unique("breaker");
    create_topic(&topic, 1).await?;
    // 10 good, then 40 poison, then 50 good that must wait while the breaker is open.
    let good =
        |i: u64| (Some(format!("k{i}").into_bytes()), Some(format!(r#"{{"id":{i},"amount":1}}"#).into_bytes()), vec![]);
    let records: Vec<_> = (1..=10)
        .map(good)
        .chain((0..40).map(|i| (Some(format!("p{i}").into_bytes()), Some(b"{oops".to_vec()), vec![])))
        .chain((11..=60).map(good))
        .collect();
    produce_raw(&topic, records).await?;

    let (tx, processed) = watch::channel(Vec::new());
    let breaker = CircuitBreakerConfig {
        enabled: true,
        window: 1_000,
        max_dlq_share: 1.0,
        max_consecutive: 10,
        cooldown: Duration::from_secs(600),
        ..CircuitBreakerConfig::default()
    };
    let config = PipelineConfig::new(bootstrap(), unique("breaker-group"), [&topic])
        .ordering(ProcessingOrder::Partition)
        .circuit_breaker(breaker);
    let pipeline = Pipeline::new(config, Payments { processed: tx })?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    eventually("the breaker to open", Duration::from_secs(30), || Ok(stats.snapshot().breaker_open.then_some(())))
        .await?;
    let at_trip = stats.snapshot();
    // While open, consumption is paused. "Nothing happens" can only be observed over a window: watch
    // for 2 s (an observation window for a negative check, not a synchronisation).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = stats.snapshot();
    stop.cancel();
    run.await??;
    println!("at trip: {at_trip:?}\nlater: {later:?}");
    assert_eq!(later.breaker_trips, 1);
    assert!(later.breaker_open, "still open (unhealthy) during its cool-down");
    assert!(later.dead_lettered <= 12, "the breaker stopped the flood at about 10 in a row: {}", later.dead_lettered);
    assert!(processed.borrow().len() <= 10, "no record after the burst was processed while open");
    Ok(())
}
