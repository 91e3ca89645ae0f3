//! Hung handlers (issue 15): a processor call that never returns holds only its own record (and, in
//! key order, its key's later records); with `attempt_timeout` it is cancelled, retried and
//! dead-lettered with error kind `timeout`, and in exactly-once mode the outputs it emitted before
//! hanging are never committed while every other record's outputs are.

use anyhow::Result;
use millrace::dlq::{DlqErrorKind, DlqInfo};
use millrace::{
    Context, ExactlyOnce, OutputRecord, Pipeline, PipelineConfig, ProcessError, ProcessingOrder, Processor, Record,
    RetryPolicy,
};
use millrace_integration_tests::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
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
    let stop = pipeline.shutdown_token();
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
