//! Hung handlers (issue 15): a processor call that never returns holds only its own record (and, in
//! key order, its key's later records); with `attempt_timeout` it is cancelled, retried and
//! dead-lettered with error kind `timeout`, and in exactly-once mode the outputs it emitted before
//! hanging are never committed while every other record's outputs are. A revoke during a hang
//! cancels the old handler (`ctx.cancelled()`, reason `Revoked`) and the new owner processes the
//! record; exactly-once, none of the old handler's outputs is committed.

use anyhow::Result;
use millrace::dlq::{DlqErrorKind, DlqInfo};
use millrace::{
    CancelReason, Context, ExactlyOnce, OutputRecord, Pipeline, PipelineConfig, ProcessError, ProcessingOrder,
    Processor, Record, RetryPolicy,
};
use millrace_integration_tests::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const RECORDS: usize = 200;
const KEYS: usize = 20;
/// The input whose value is `hang`: key `k7`, the third record of that key.
const HUNG: usize = 47;

/// Keys `k0..k19` in turn; value `id-N`, and `hang` for input `HUNG`.
fn inputs() -> Vec<(String, Vec<u8>)> {
    (0..RECORDS)
        .map(|i| {
            let value = if i == HUNG { "hang".to_owned() } else { format!("id-{i}") };
            (format!("k{}", i % KEYS), value.into_bytes())
        })
        .collect()
}

/// Never returns for a `hang` record (after emitting `hung-output` when it has an output topic);
/// otherwise emits the value to the output topic, if any, and notes the record's offset.
struct Hangs {
    output: Option<String>,
    processed: watch::Sender<Vec<i64>>,
    hung_calls: Arc<AtomicU32>,
}

impl Processor for Hangs {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let value = record.value.clone().unwrap_or_default();
        if value == b"hang" {
            self.hung_calls.fetch_add(1, Relaxed);
            if let Some(topic) = &self.output {
                ctx.emit(OutputRecord::to(topic).value("hung-output")).await?;
            }
            std::future::pending::<()>().await;
        }
        if let Some(topic) = &self.output {
            let mut out = OutputRecord::to(topic).value(value);
            out.key = record.key.clone();
            ctx.emit(out).await?;
        }
        self.processed.send_modify(|v| v.push(record.offset));
        Ok(())
    }
}

fn hangs(output: Option<&str>) -> (Hangs, watch::Receiver<Vec<i64>>) {
    let (tx, rx) = watch::channel(Vec::new());
    (Hangs { output: output.map(str::to_owned), processed: tx, hung_calls: Arc::default() }, rx)
}

/// Three attempts, a few milliseconds apart.
fn quick_retries() -> RetryPolicy {
    RetryPolicy { max_attempts: 3, base_delay: Duration::from_millis(10), max_delay: Duration::from_millis(50) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_handler_without_a_timeout_holds_back_only_its_record_and_its_key() -> Result<()> {
    init_logs();
    let topic = unique("hung");
    let group = unique("hung-group");
    create_topic(&topic, 1).await?;
    produce(&topic, inputs()).await?;
    let (processor, mut processed) = hangs(None);
    let config = PipelineConfig::new(bootstrap(), &group, [&topic])
        .ordering(ProcessingOrder::Key)
        .commit_interval(Duration::from_millis(200))
        .drain_timeout(Duration::from_secs(1));
    let pipeline = Pipeline::new(config, processor)?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());

    // Every record but the hung one and its key's later ones (k7 at 67, 87, …, 187) is processed.
    let held: Vec<i64> = (HUNG + KEYS..RECORDS).step_by(KEYS).map(|o| o as i64).collect();
    let expected = RECORDS - 1 - held.len();
    tokio::time::timeout(Duration::from_secs(60), processed.wait_for(|v| v.len() >= expected)).await??;
    let at_hung = BTreeMap::from([(0, HUNG as i64)]);
    eventually("the commit to reach the hung record", Duration::from_secs(30), || {
        Ok((committed_offsets(&group, &topic, 1)? == at_hung).then_some(()))
    })
    .await?;
    let started = Instant::now();
    stop.cancel();
    run.await??;
    println!("shut down in {:?} with one call still hung", started.elapsed());
    let stats = stats.snapshot();
    assert_eq!(
        (stats.attempts_cancelled, stats.attempts_dropped),
        (1, 1),
        "cancelled at the drain deadline: {stats:?}"
    );

    let seen = processed.borrow().clone();
    assert_eq!(seen.len(), expected, "each other record processed once: {seen:?}");
    assert!(seen.iter().all(|o| *o != HUNG as i64 && !held.contains(o)), "k7 stayed behind its hung record");
    assert_eq!(committed_offsets(&group, &topic, 1)?, at_hung, "the shutdown commit stops at the hung record");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_handler_is_cancelled_at_the_attempt_timeout_and_dead_lettered_as_timeout() -> Result<()> {
    init_logs();
    let topic = unique("hung-timeout");
    let group = unique("hung-timeout-group");
    create_topic(&topic, 1).await?;
    let written = produce(&topic, inputs()).await?;
    let (processor, mut processed) = hangs(None);
    let hung_calls = Arc::clone(&processor.hung_calls);
    let limit = Duration::from_millis(300);
    let config = PipelineConfig::new(bootstrap(), &group, [&topic])
        .ordering(ProcessingOrder::Key)
        .attempt_timeout(limit)
        .retry(quick_retries());
    let pipeline = Pipeline::new(config, processor)?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());

    tokio::time::timeout(Duration::from_secs(60), processed.wait_for(|v| v.len() >= RECORDS - 1)).await??;
    committed_to_end(&group, &topic, 1, Duration::from_secs(30)).await?;
    stop.cancel();
    run.await??;

    let mut seen = processed.borrow().clone();
    seen.sort_unstable();
    let others: Vec<i64> = (0..RECORDS as i64).filter(|o| *o != HUNG as i64).collect();
    assert_eq!(seen, others, "every other record processed once, k7's later ones after the DLQ write");
    assert_eq!(hung_calls.load(Relaxed), 3, "the hung record was tried max_attempts times");
    let dlq = read_topic(&format!("{topic}.dlq"))?;
    assert_eq!(dlq.len(), 1, "the hung record, once");
    let info = DlqInfo::from_headers(&dlq[0].headers).expect("millrace headers");
    assert_eq!((info.kind, info.attempts), (DlqErrorKind::Timeout, 3), "{info:?}");
    assert_eq!(info.original_offset, written[HUNG].offset);
    assert!(info.message.contains("timed out after 300ms"), "{}", info.message);
    assert_eq!(dlq[0].value.as_deref(), Some(&b"hang"[..]), "bytes intact");
    assert_eq!(stats.snapshot().retries, 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_a_hung_handler_holds_back_no_other_output_and_its_own_is_never_committed() -> Result<()> {
    init_logs();
    let topic = unique("hung-eos");
    let output = format!("{topic}.out");
    let group = unique("hung-eos-group");
    create_topic(&topic, 2).await?;
    create_topic(&output, 2).await?;
    produce(&topic, inputs()).await?;
    let (processor, _processed) = hangs(Some(&output));
    let config = PipelineConfig::new(bootstrap(), &group, [&topic])
        .ordering(ProcessingOrder::Key)
        .exactly_once(ExactlyOnce::default())
        .attempt_timeout(Duration::from_secs(2))
        .retry(quick_retries());
    let pipeline = Pipeline::new(config, processor)?;
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());

    committed_to_end(&group, &topic, 2, Duration::from_secs(60)).await?;
    stop.cancel();
    run.await??;

    let committed = read_topic_as(&output, Isolation::ReadCommitted)?;
    let mut values: Vec<String> =
        committed.iter().map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into()).collect();
    values.sort_unstable();
    let mut expected: Vec<String> = (0..RECORDS).filter(|i| *i != HUNG).map(|i| format!("id-{i}")).collect();
    expected.sort_unstable();
    assert_eq!(values, expected, "every other record's output committed once, none from the hung calls");
    let dlq = read_topic_as(&format!("{topic}.dlq"), Isolation::ReadCommitted)?;
    assert_eq!(dlq.len(), 1, "the hung record, once");
    let info = DlqInfo::from_headers(&dlq[0].headers).expect("millrace headers");
    assert_eq!((info.kind, info.attempts), (DlqErrorKind::Timeout, 3), "{info:?}");
    Ok(())
}

/// The offset, in each partition, whose first call hangs on the revoke test's first member.
const HANG_AT: i64 = 3;

/// One member of the revoke test: on the first member the first call for offset `HANG_AT` of each
/// partition emits `early-P`, waits for `ctx.cancelled()`, notes why, emits `late-P` and returns
/// `Ok`; every other call emits the record's value and notes its coordinates.
struct Member {
    output: String,
    hangs: bool,
    hung: Mutex<BTreeSet<i32>>,
    hanging: watch::Sender<usize>,
    cancels: Mutex<Vec<(i32, CancelReason)>>,
    processed: Mutex<BTreeSet<(i32, i64)>>,
}

impl Member {
    fn new(output: &str, hangs: bool) -> (Arc<Self>, watch::Receiver<usize>) {
        let (hanging, rx) = watch::channel(0);
        let member = Member {
            output: output.to_owned(),
            hangs,
            hung: Mutex::default(),
            hanging,
            cancels: Mutex::default(),
            processed: Mutex::default(),
        };
        (Arc::new(member), rx)
    }
}

/// A member, shared with the test.
struct Of(Arc<Member>);

impl Processor for Of {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let (p, this) = (record.partition, &self.0);
        if this.hangs && record.offset == HANG_AT && this.hung.lock().unwrap().insert(p) {
            ctx.emit(OutputRecord::to(&this.output).value(format!("early-{p}"))).await?;
            this.hanging.send_modify(|n| *n += 1);
            ctx.cancelled().await;
            this.cancels.lock().unwrap().push((p, ctx.cancel_reason().expect("a reason once cancelled")));
            ctx.emit(OutputRecord::to(&this.output).value(format!("late-{p}"))).await?;
            return Ok(());
        }
        ctx.emit(OutputRecord::to(&this.output).value(record.value.clone().unwrap_or_default())).await?;
        this.processed.lock().unwrap().insert((p, record.offset));
        Ok(())
    }
}

/// A member joins while the first member's handlers hang on one record of each partition. For the
/// partition that moves, the old handler sees `cancelled()` (reason `Revoked`) once `drain_timeout`
/// ends, and the new owner processes the record; exactly-once, none of the old handler's outputs
/// (before or after the cancel) is ever committed, and every input's output is committed once.
async fn revoke_during_a_hang(exactly_once: bool) -> Result<()> {
    init_logs();
    let topic = unique("hung-revoke");
    let output = format!("{topic}.out");
    let group = unique("hung-revoke-group");
    create_topic(&topic, 2).await?;
    create_topic(&output, 1).await?;
    let written = produce(&topic, (0..40).map(|i| (format!("k{i}"), format!("id-{i}").into_bytes()))).await?;
    for p in 0..2 {
        assert!(written.iter().any(|w| (w.partition, w.offset) == (p, HANG_AT)), "partition {p} has offset {HANG_AT}");
    }
    let config = |member: &str| {
        let mut c = PipelineConfig::new(bootstrap(), &group, [&topic])
            .ordering(ProcessingOrder::Key)
            .commit_interval(Duration::from_millis(200))
            .drain_timeout(Duration::from_secs(2))
            .cancel_grace(Duration::from_secs(1))
            // The partition that stays is released by the timeout.
            .attempt_timeout(Duration::from_secs(6))
            .retry(quick_retries())
            .consumer_property("session.timeout.ms", "10000")
            .consumer_property("heartbeat.interval.ms", "500");
        if exactly_once {
            c = c.exactly_once(ExactlyOnce::default().transactional_id(format!("{group}-{member}")));
        }
        c
    };
    let (a, mut a_hanging) = Member::new(&output, true);
    let a_pipeline = Pipeline::new(config("a"), Of(a.clone()))?;
    let (a_stop, a_stats) = (a_pipeline.shutdown_token(), a_pipeline.stats());
    let a_run = tokio::spawn(a_pipeline.run());
    tokio::time::timeout(Duration::from_secs(60), a_hanging.wait_for(|n| *n == 2)).await??;

    let (b, _) = Member::new(&output, false);
    let b_pipeline = Pipeline::new(config("b"), Of(b.clone()))?;
    let b_stop = b_pipeline.shutdown_token();
    let b_run = tokio::spawn(b_pipeline.run());
    let joined = Instant::now();
    let revoked = eventually("the old handler to see a revoke", Duration::from_secs(60), || {
        let cancels = a.cancels.lock().unwrap();
        let revoked: BTreeSet<i32> =
            cancels.iter().filter(|(_, r)| *r == CancelReason::Revoked).map(|(p, _)| *p).collect();
        Ok((!revoked.is_empty()).then_some(revoked))
    })
    .await?;
    println!("revoked hung partitions {revoked:?} {:?} after the second member started", joined.elapsed());
    committed_to_end(&group, &topic, 2, Duration::from_secs(60)).await?;
    b_stop.cancel();
    b_run.await??;
    a_stop.cancel();
    a_run.await??;

    for p in &revoked {
        assert!(b.processed.lock().unwrap().contains(&(*p, HANG_AT)), "the new owner processed the revoked record");
    }
    let a_stats = a_stats.snapshot();
    assert!(a_stats.attempts_cancelled >= 1, "{a_stats:?}");
    assert_eq!(a_stats.attempts_dropped, 0, "the handler stopped within its grace: {a_stats:?}");
    let all: BTreeSet<(i32, i64)> = written.iter().map(|w| (w.partition, w.offset)).collect();
    let mut done: BTreeSet<(i32, i64)> = a.processed.lock().unwrap().clone();
    done.extend(b.processed.lock().unwrap().iter().copied());
    assert_eq!(done, all, "every record processed");
    if exactly_once {
        let committed = read_topic_as(&output, Isolation::ReadCommitted)?;
        let mut values: Vec<String> =
            committed.iter().map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into()).collect();
        values.sort_unstable();
        let mut expected: Vec<String> = (0..40).map(|i| format!("id-{i}")).collect();
        expected.sort_unstable();
        assert_eq!(values, expected, "each output committed once; no early- or late- output of a cancelled call");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_a_revoke_during_a_hang_cancels_the_old_handler_and_commits_none_of_its_outputs() -> Result<()> {
    revoke_during_a_hang(true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_during_a_hang_cancels_the_old_handler_and_the_new_owner_processes_the_record() -> Result<()> {
    revoke_during_a_hang(false).await
}

/// Blocks its thread (`std::thread::sleep`, no await) on the first call for offset `HANG_AT` of
/// partition 0, after noting that it started; every other call returns at once.
struct Blocks {
    block_for: Duration,
    started: watch::Sender<Option<Instant>>,
}

impl Processor for Blocks {
    async fn process(&self, record: &Record, _: &Context) -> Result<(), ProcessError> {
        if (record.partition, record.offset) == (0, HANG_AT) && self.started.borrow().is_none() {
            self.started.send_replace(Some(Instant::now()));
            std::thread::sleep(self.block_for);
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_blocking_its_thread_is_reported_while_the_other_partition_flows() -> Result<()> {
    init_logs();
    let topic = unique("hung-blocking");
    let group = unique("hung-blocking-group");
    create_topic(&topic, 2).await?;
    let written = produce(&topic, (0..40).map(|i| (format!("k{i}"), format!("id-{i}").into_bytes()))).await?;
    assert!(
        written.iter().any(|w| (w.partition, w.offset) == (0, HANG_AT)) && written.iter().any(|w| w.partition == 1)
    );
    let (started, mut started_rx) = watch::channel(None);
    let (threshold, block_for) = (Duration::from_millis(500), Duration::from_secs(5));
    let config = PipelineConfig::new(bootstrap(), &group, [&topic])
        .commit_interval(Duration::from_millis(200))
        .blocked_poll_threshold(threshold)
        .http("127.0.0.1:0".parse()?);
    let pipeline = Pipeline::new(config, Blocks { block_for, started })?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let base = format!("http://{}", pipeline.http_addr().expect("listening"));
    let run = tokio::spawn(pipeline.run());

    let began = tokio::time::timeout(Duration::from_secs(60), started_rx.wait_for(Option::is_some)).await??.unwrap();
    eventually("the blocking call to be reported", Duration::from_secs(3), || {
        Ok((stats.snapshot().blocked_calls == 1).then_some(()))
    })
    .await?;
    let detected = began.elapsed();
    println!("a call blocking its thread reported after {detected:?}");
    assert!(detected >= threshold, "not before the threshold: {detected:?}");
    let ready = reqwest::get(format!("{base}/health/ready")).await?;
    let status = ready.status().as_u16();
    let body = ready.text().await?;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("1 processor call(s) blocking their thread"), "{body}");
    // The other partition's records are processed and committed meanwhile.
    let end = end_offsets(&topic, 2)?[&1];
    eventually("partition 1 to be committed while partition 0 blocks", Duration::from_secs(3), || {
        Ok((committed_offsets(&group, &topic, 2)?.get(&1) == Some(&end)).then_some(()))
    })
    .await?;
    assert!(began.elapsed() < block_for, "all of this while the call still blocked");
    assert_eq!(stats.snapshot().blocked_calls, 1);

    eventually("the report to clear once the call returned", Duration::from_secs(10), || {
        Ok((stats.snapshot().blocked_calls == 0).then_some(()))
    })
    .await?;
    committed_to_end(&group, &topic, 2, Duration::from_secs(30)).await?;
    stop.cancel();
    run.await??;
    Ok(())
}
