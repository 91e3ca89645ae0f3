//! A broker outage mid-run is retried, not crashed on: the local broker is stopped and started again
//! under a running pipeline, which then finishes the stream with nothing lost (at-least-once), or
//! with every input in the output exactly once (exactly-once, the outage outlasting the transaction
//! timeout so that the transactional producer has to be replaced).
//!
//! These tests need to own the broker: they run only against the broker `scripts/kafka` manages (the
//! one `scripts/test` and `.ci/run` start); against any other broker they say so and do nothing.
//! They take turns (one broker).

use anyhow::{Result, bail};
use millrace::{Bounds, Context, ExactlyOnce, OutputRecord, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use std::collections::{BTreeSet, HashMap};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// One outage at a time.
static BROKER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn kafka_script(arg: &str) -> Result<bool> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/kafka");
    Ok(Command::new("bash").arg(script).arg(arg).status()?.success())
}

/// This test's turn with the broker, or `None` (after saying so) when the broker is not the one
/// `scripts/kafka` runs here, which must not be stopped.
async fn take_the_broker() -> Result<Option<tokio::sync::MutexGuard<'static, ()>>> {
    let turn = BROKER.lock().await;
    let port = std::env::var("KAFKA_PORT").unwrap_or_else(|_| "9092".into());
    if bootstrap() == format!("127.0.0.1:{port}") && kafka_script("status")? {
        return Ok(Some(turn));
    }
    println!("SKIPPED: the broker at {} is not managed by scripts/kafka here", bootstrap());
    Ok(None)
}

struct Collect {
    seen: Arc<Mutex<BTreeSet<(i32, i64)>>>,
    count: watch::Sender<usize>,
}

impl Processor for Collect {
    async fn process(&self, record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let n = {
            let mut seen = self.seen.lock().unwrap();
            seen.insert((record.partition, record.offset));
            seen.len()
        };
        self.count.send_replace(n);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_restart_mid_stream_is_survived_without_loss() -> Result<()> {
    init_logs();
    let Some(_turn) = take_the_broker().await? else { return Ok(()) };
    const N: usize = 3_000;
    let topic = unique("outage");
    let group = unique("outage-group");
    create_topic(&topic, 2).await?;
    let written = produce(&topic, keyed_records(N, 100)).await?;

    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let (tx, mut count) = watch::channel(0);
    let config = PipelineConfig::new(bootstrap(), &group, [&topic])
        .commit_interval(Duration::from_millis(200))
        .consumer_property("session.timeout.ms", "10000");
    let pipeline = Pipeline::new(config, Collect { seen: seen.clone(), count: tx })?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let mut run = tokio::spawn(pipeline.run());
    tokio::time::timeout(Duration::from_secs(60), count.wait_for(|n| *n >= N / 5)).await??;

    let down_at = Instant::now();
    if !kafka_script("down")? {
        bail!("scripts/kafka down failed");
    }
    // The outage itself: the pipeline must neither exit nor lose anything while the broker is gone.
    let exited = tokio::time::timeout(Duration::from_secs(5), &mut run).await.is_ok();
    assert!(!exited, "the pipeline gave up during the outage");
    if !kafka_script("up")? {
        bail!("scripts/kafka up failed");
    }
    let back_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(120), count.wait_for(|n| *n >= N)).await??;
    let resumed_in = back_at.elapsed();
    let ends = end_offsets(&topic, 2)?;
    eventually_despite_errors("the group to commit everything", Duration::from_secs(60), || {
        Ok((committed_offsets(&group, &topic, 2)? == ends).then_some(()))
    })
    .await?;
    stop.cancel();
    run.await??;
    let expected: BTreeSet<(i32, i64)> = written.iter().map(|w| (w.partition, w.offset)).collect();
    assert_eq!(*seen.lock().unwrap(), expected, "every record processed despite the outage");
    println!(
        "broker down for {:?}; stream finished {resumed_in:?} after it came back; {:?}",
        back_at - down_at,
        stats.snapshot()
    );
    Ok(())
}

/// Copies each input to the output as `<partition> <offset> <value>`, slowly (10 ms, 4 at a time), so
/// that the stream outlasts the start of the outage and a transaction is open when the broker goes.
struct Copy {
    output: String,
    processed: watch::Sender<usize>,
}

impl Processor for Copy {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let value = format!("{} {} {}", record.partition, record.offset, record.value_str().unwrap_or_default());
        ctx.emit(OutputRecord::to(&self.output).key(record.key.clone().unwrap_or_default()).value(value)).await?;
        self.processed.send_modify(|n| *n += 1);
        Ok(())
    }
}

/// Exactly-once through an outage longer than `transaction_timeout`: the open transaction's
/// messages time out and the coordinator's epoch moves on, which leaves the transactional producer
/// fenced or its abort unconfirmable. The pipeline must not stop: it replaces the producer,
/// rewinds to the committed offsets, and finishes with every input in the output exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_rides_out_an_outage_longer_than_the_transaction_timeout() -> Result<()> {
    init_logs();
    let Some(_turn) = take_the_broker().await? else { return Ok(()) };
    const N: usize = 3_000;
    const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(2);
    let (input, output, group) = (unique("eos-outage-in"), unique("eos-outage-out"), unique("eos-outage-group"));
    create_topic(&input, 2).await?;
    create_topic(&output, 2).await?;
    let inputs: Vec<(String, Vec<u8>)> =
        (0..N).map(|i| (format!("k{}", i % 100), format!("id-{i}").into_bytes())).collect();
    produce(&input, inputs).await?;

    let (tx, mut processed) = watch::channel(0);
    let config = PipelineConfig::new(bootstrap(), &group, [&input])
        .exactly_once(
            ExactlyOnce::default().transactional_id(format!("{group}-tx")).transaction_timeout(TRANSACTION_TIMEOUT),
        )
        .commit_interval(Duration::from_millis(100))
        .bounds(Bounds { max_concurrency: 4, ..Bounds::default() })
        .consumer_property("session.timeout.ms", "10000");
    let pipeline = Pipeline::new(config, Copy { output: output.clone(), processed: tx })?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let mut run = tokio::spawn(pipeline.run());
    tokio::time::timeout(Duration::from_secs(60), processed.wait_for(|n| *n >= N / 5)).await??;
    eventually("a transaction to commit before the outage", Duration::from_secs(30), || {
        Ok((stats.snapshot().transactions_committed > 0).then_some(()))
    })
    .await?;

    let down_at = Instant::now();
    if !kafka_script("down")? {
        bail!("scripts/kafka down failed");
    }
    // Held down well past the transaction timeout (the outage is the stimulus here, not a wait for
    // an event); the pipeline must not exit meanwhile.
    let exited = tokio::time::timeout(TRANSACTION_TIMEOUT * 3, &mut run).await.is_ok();
    assert!(!exited, "the exactly-once pipeline gave up during the outage");
    if !kafka_script("up")? {
        bail!("scripts/kafka up failed");
    }
    let back_at = Instant::now();
    let ends = end_offsets(&input, 2)?;
    eventually_despite_errors("the group to commit every input", Duration::from_secs(120), || {
        Ok((committed_offsets(&group, &input, 2)? == ends).then_some(()))
    })
    .await?;
    let resumed_in = back_at.elapsed();
    stop.cancel();
    run.await??;
    let s = stats.snapshot();
    println!(
        "broker down for {:?}; everything committed {resumed_in:?} after it came back; {} producer replacements, {} rewinds, {} transactions committed, {} aborted",
        back_at - down_at,
        s.producer_resets,
        s.rewinds,
        s.transactions_committed,
        s.transactions_aborted
    );
    // The open transaction cannot commit through the outage: it is aborted (librdkafka aborts a
    // transaction locally when no partition of it reached the coordinator yet) or the producer is
    // replaced (the coordinator aborted it on its timeout, fencing the producer). Which of the two
    // depends on where the transaction stood when the broker went away.
    assert!(
        s.producer_resets + s.transactions_aborted >= 1,
        "an outage this long costs the open transaction: aborted or the producer replaced"
    );

    let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
    for r in read_topic_as(&output, Isolation::ReadCommitted)? {
        let value = r.value.unwrap_or_default();
        let id = value.splitn(3, |b| *b == b' ').nth(2).unwrap_or_default().to_vec();
        *seen.entry(id).or_default() += 1;
    }
    let duplicates: usize = seen.values().map(|n| n - 1).sum();
    assert_eq!(seen.len(), N, "every input in the output");
    assert_eq!(duplicates, 0, "no input twice in the output");
    let committed_view = Watermarks::new(Isolation::ReadCommitted)?;
    let uncommitted_view = Watermarks::new(Isolation::ReadUncommitted)?;
    assert_eq!(committed_view.ends(&output, 2)?, uncommitted_view.ends(&output, 2)?, "no hanging transaction");
    Ok(())
}
