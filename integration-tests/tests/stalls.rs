//! Silent stalls made loud (issue 12, item 2): zstd-compressed input is decoded; a partition that
//! cannot make progress is reported (`stall_timeout`, `stalled_partitions`); a cluster that cannot
//! be reached at start-up is reported and, with `startup_timeout`, fails `run()`; an input topic
//! that is missing or deleted is reported (`missing_topics`) and, with `fail_on_missing_topic`,
//! fails `run()`.

use anyhow::{Result, bail};
use millrace::{Context, Error, ExactlyOnce, Pipeline, PipelineConfig, ProcessError, Processor, Record, Stats};
use millrace_integration_tests::*;
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

struct Count(watch::Sender<usize>);

impl Processor for Count {
    async fn process(&self, _record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        self.0.send_modify(|n| *n += 1);
        Ok(())
    }
}

/// A producer of `topic` with extra properties (`compression.type`, `transactional.id`, …).
fn producer(extra: &[(&str, &str)]) -> Result<FutureProducer> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap()).set("linger.ms", "20");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    Ok(c.create()?)
}

async fn send(producer: &FutureProducer, topic: &str, range: std::ops::Range<usize>) -> Result<()> {
    for i in range {
        let (key, value) = (format!("key-{i}"), format!("value-{i} {}", "x".repeat(200)));
        producer
            .send(FutureRecord::to(topic).key(&key).payload(&value), Duration::from_secs(10))
            .await
            .map_err(|(e, _)| anyhow::anyhow!("delivery failed: {e}"))?;
    }
    Ok(())
}

/// Waits until `stats` satisfies `check` (the gauges are read, not pushed: polled every 50 ms).
async fn stat(
    stats: &Arc<Stats>,
    what: &str,
    timeout: Duration,
    check: impl Fn(&millrace::StatsSnapshot) -> bool,
) -> Result<()> {
    eventually(what, timeout, || Ok(check(&stats.snapshot()).then_some(()))).await
}

async fn delete_topic(topic: &str) -> Result<()> {
    Admin::from_env()?.delete_topics(&[topic]).await
}

/// A transactional producer with a transaction begun (and a timeout long enough to stay open for
/// the whole test unless ended).
fn open_transaction(prefix: &str) -> Result<FutureProducer> {
    let txn = producer(&[("transactional.id", &unique(prefix)), ("transaction.timeout.ms", "120000")])?;
    txn.init_transactions(Duration::from_secs(30))?;
    txn.begin_transaction()?;
    Ok(txn)
}

/// A transaction left open that commits `offset` for `topic`/`partition` in the group of
/// `metadata`: until it ends, the group's committed offset of that partition is pending, and a
/// `read_committed` offset fetch (`require_stable`) waits for it.
fn hold_offsets(
    metadata: &rdkafka::consumer::ConsumerGroupMetadata,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<FutureProducer> {
    let txn = open_transaction("pending-offsets-tx")?;
    let mut offsets = rdkafka::TopicPartitionList::new();
    offsets.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset))?;
    txn.send_offsets_to_transaction(&offsets, metadata, Duration::from_secs(30))?;
    Ok(txn)
}

/// An exactly-once (`read_committed`) pipeline of `group` on `input` with a 2 s `stall_timeout`;
/// counts processed records into `tx`.
fn exactly_once(group: &str, input: &str, tx: watch::Sender<usize>) -> Result<Pipeline<Count>> {
    let config = PipelineConfig::new(bootstrap(), group, [input])
        .exactly_once(ExactlyOnce::default().transactional_id(format!("{group}-tx")))
        .stall_timeout(Duration::from_secs(2));
    Ok(Pipeline::new(config, Count(tx))?)
}

/// zstd batches used to stall the partition for good (librdkafka was built without zstd: one
/// "Decompression (codec 0x4) … Not implemented" warning, then nothing). Now every record is
/// processed and committed to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_compressed_input_is_processed_and_committed_to_the_end() -> Result<()> {
    init_logs();
    const N: usize = 500;
    let (topic, group) = (unique("zstd-in"), unique("zstd-group"));
    create_topic(&topic, 2).await?;
    let zstd = producer(&[("compression.type", "zstd")])?;
    send(&zstd, &topic, 0..N).await?;

    let (tx, mut processed) = watch::channel(0);
    let config = PipelineConfig::new(bootstrap(), &group, [&topic]).commit_interval(Duration::from_millis(200));
    let pipeline = Pipeline::new(config, Count(tx))?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    tokio::time::timeout(Duration::from_secs(60), processed.wait_for(|n| *n >= N)).await??;
    let ends = end_offsets(&topic, 2)?;
    eventually("the group to commit to the end", Duration::from_secs(30), || {
        Ok((committed_offsets(&group, &topic, 2)? == ends).then_some(()))
    })
    .await?;
    let s = stats.snapshot();
    stop.cancel();
    run.await??;
    assert_eq!(s.stalled_partitions, 0, "a healthy pipeline reports no stall");
    assert!(!s.cluster_unreachable, "nor an unreachable cluster");
    assert_eq!(s.missing_topics, 0, "nor a missing topic");
    Ok(())
}

/// The stall watchdog on a real stall: a transaction left open on the input (a hanging
/// transaction) holds a `read_committed` pipeline at the last stable offset while records lie
/// beyond it. After `stall_timeout` the partition is counted in `stalled_partitions`; once the
/// transaction ends, it moves, the gauge clears and the records behind it are processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_left_open_on_the_input_is_reported_as_a_stall() -> Result<()> {
    init_logs();
    let (input, group) = (unique("hanging-in"), unique("hanging-group"));
    create_topic(&input, 1).await?;
    let plain = producer(&[])?;
    send(&plain, &input, 0..10).await?;
    let txn = open_transaction("hanging-tx")?;
    send(&txn, &input, 10..15).await?; // left open
    send(&plain, &input, 15..20).await?; // readable only once the transaction ends

    let (tx, mut processed) = watch::channel(0);
    let pipeline = exactly_once(&group, &input, tx)?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    tokio::time::timeout(Duration::from_secs(60), processed.wait_for(|n| *n >= 10)).await??;
    let held_at = Instant::now();
    stat(&stats, "the stall to be reported", Duration::from_secs(30), |s| s.stalled_partitions == 1).await?;
    let reported_after = held_at.elapsed();
    assert_eq!(*processed.borrow(), 10, "nothing behind the open transaction is readable");

    txn.commit_transaction(Duration::from_secs(30))?;
    tokio::time::timeout(Duration::from_secs(30), processed.wait_for(|n| *n >= 20)).await??;
    stat(&stats, "the stall to clear", Duration::from_secs(30), |s| s.stalled_partitions == 0).await?;
    stop.cancel();
    run.await??;
    println!("stall reported {reported_after:?} after the pipeline reached the open transaction");
    assert!(reported_after >= Duration::from_secs(1), "reported only after stall_timeout");
    Ok(())
}

/// A transaction left open holding offsets of the pipeline's group (seen in the chaos
/// `broker-restart` scenario after two broker restarts: a hanging transaction on
/// `__consumer_offsets`): a `read_committed` consumer fetches the group's committed offsets with
/// `require_stable`, which librdkafka retries for as long as the transaction is open, so the
/// assigned partition never gets a position and nothing is fetched. Before, that was silent; now
/// after `stall_timeout` it is reported as a stall, and it clears once the transaction ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_offsets_held_by_an_open_transaction_are_reported_as_a_stall() -> Result<()> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    init_logs();
    let (input, group) = (unique("pending-offsets-in"), unique("pending-offsets-group"));
    create_topic(&input, 1).await?;
    send(&producer(&[])?, &input, 0..10).await?;
    // Offsets for the group in a transaction that is left open (the group metadata of a consumer
    // that never joined: generation -1, which the coordinator accepts without a generation check).
    let member: BaseConsumer =
        ClientConfig::new().set("bootstrap.servers", bootstrap()).set("group.id", &group).create()?;
    let metadata = member.group_metadata().ok_or_else(|| anyhow::anyhow!("no group metadata"))?;
    let txn = hold_offsets(&metadata, &input, 0, 5)?;

    let (tx, mut processed) = watch::channel(0);
    let pipeline = exactly_once(&group, &input, tx)?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    stat(&stats, "the partition to be assigned", Duration::from_secs(60), |s| s.assigned_partitions == 1).await?;
    let assigned_at = Instant::now();
    stat(&stats, "the stall to be reported", Duration::from_secs(30), |s| s.stalled_partitions == 1).await?;
    let reported_after = assigned_at.elapsed();
    assert_eq!(*processed.borrow(), 0, "no position, nothing fetched");

    txn.abort_transaction(Duration::from_secs(30))?; // the offsets never count
    tokio::time::timeout(Duration::from_secs(60), processed.wait_for(|n| *n >= 10)).await??;
    stat(&stats, "the stall to clear", Duration::from_secs(30), |s| s.stalled_partitions == 0).await?;
    stop.cancel();
    run.await??;
    println!("stall reported {reported_after:?} after the assignment");
    assert!(reported_after >= Duration::from_secs(1), "reported only after stall_timeout");
    Ok(())
}

/// The same on a partition assigned again (as in the chaos `broker-restart` scenario, where the
/// member got its partitions back after a lost session): a second member takes partition 0, a
/// transaction left open commits offsets for it with that member's group metadata, and the member
/// leaves. The pipeline owns the partition again but librdkafka never resumes fetching it (its
/// statistics say fetch state `stopped`, and still count one outdated op in its fetch queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reassigned_partition_whose_offsets_an_open_transaction_holds_is_reported_as_a_stall() -> Result<()> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    init_logs();
    let (input, group) = (unique("pending-reassign-in"), unique("pending-reassign-group"));
    create_topic(&input, 2).await?;
    send(&producer(&[])?, &input, 0..10).await?;
    let (tx, mut processed) = watch::channel(0);
    let pipeline = exactly_once(&group, &input, tx)?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    tokio::time::timeout(Duration::from_secs(60), processed.wait_for(|n| *n >= 10)).await??;

    let member: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .create()?;
    member.subscribe(&[&input])?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let taken = loop {
        let _ = member.poll(Duration::from_millis(100));
        if let Some(e) = member.assignment()?.elements().first() {
            break e.partition();
        }
        if Instant::now() > deadline {
            bail!("the second member was never assigned a partition");
        }
    };
    let metadata = member.group_metadata().ok_or_else(|| anyhow::anyhow!("no group metadata"))?;
    let txn = hold_offsets(&metadata, &input, taken, 1)?;
    drop(member); // leaves the group: the pipeline is assigned the partition again
    stat(&stats, "the partition to be assigned again", Duration::from_secs(60), |s| s.assigned_partitions == 2).await?;
    let assigned_at = Instant::now();
    stat(&stats, "the stall to be reported", Duration::from_secs(30), |s| s.stalled_partitions == 1).await?;
    let reported_after = assigned_at.elapsed();

    txn.abort_transaction(Duration::from_secs(30))?;
    stat(&stats, "the stall to clear", Duration::from_secs(30), |s| s.stalled_partitions == 0).await?;
    stop.cancel();
    run.await??;
    println!("stall of partition {taken} reported {reported_after:?} after it was assigned again");
    assert!(reported_after >= Duration::from_secs(1), "reported only after stall_timeout");
    Ok(())
}

/// Nothing listens on port 1: with a start-up timeout, `run()` fails with the typed error naming
/// the bootstrap list, instead of logging `AllBrokersDown (retrying)` forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_fails_run_after_the_startup_timeout() -> Result<()> {
    init_logs();
    let (tx, _) = watch::channel(0);
    let config = PipelineConfig::new("127.0.0.1:1", unique("unreachable-group"), ["never-read"])
        .startup_timeout(Duration::from_secs(3));
    let pipeline = Pipeline::new(config, Count(tx))?;
    let stats = pipeline.stats();
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(20), pipeline.run()).await?;
    let took = started.elapsed();
    match result {
        Err(Error::Unreachable { bootstrap, waited }) => {
            assert_eq!(bootstrap, "127.0.0.1:1");
            assert!(waited >= Duration::from_secs(3), "{waited:?}");
        }
        other => bail!("expected Error::Unreachable, got {other:?}"),
    }
    assert!((Duration::from_secs(3)..Duration::from_secs(8)).contains(&took), "returned after {took:?}");
    assert!(stats.snapshot().cluster_unreachable);
    Ok(())
}

/// Without a start-up timeout the pipeline keeps trying (the health signal says why nothing
/// happens); stopping it before it ever reached the cluster returns the error, not `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_pipeline_that_never_reached_the_cluster_returns_the_error() -> Result<()> {
    init_logs();
    let (tx, _) = watch::channel(0);
    let config = PipelineConfig::new("127.0.0.1:1", unique("unreachable-group"), ["never-read"]);
    let pipeline = Pipeline::new(config, Count(tx))?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let mut run = tokio::spawn(pipeline.run());
    stat(&stats, "the cluster to be reported unreachable", Duration::from_secs(10), |s| s.cluster_unreachable).await?;
    assert!(tokio::time::timeout(Duration::from_secs(2), &mut run).await.is_err(), "keeps retrying");
    stop.cancel();
    let result = tokio::time::timeout(Duration::from_secs(10), run).await??;
    assert!(matches!(&result, Err(Error::Unreachable { bootstrap, .. }) if bootstrap == "127.0.0.1:1"), "{result:?}");
    Ok(())
}

/// An input topic deleted under a running pipeline is reported (gauge, error log) and the pipeline
/// goes on; a topic missing at start-up likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_input_topic_is_reported() -> Result<()> {
    init_logs();
    let (topic, absent, group) = (unique("deleted-in"), unique("absent-in"), unique("deleted-group"));
    create_topic(&topic, 2).await?;
    produce(&topic, keyed_records(20, 5)).await?;

    let (tx, mut processed) = watch::channel(0);
    let config = PipelineConfig::new(bootstrap(), &group, [&topic, &absent]);
    let pipeline = Pipeline::new(config, Count(tx))?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let mut run = tokio::spawn(pipeline.run());
    tokio::time::timeout(Duration::from_secs(60), processed.wait_for(|n| *n >= 20)).await??;
    assert_eq!(stats.snapshot().missing_topics, 1, "the topic that was never created is reported at start-up");

    delete_topic(&topic).await?;
    stat(&stats, "the deleted topic to be reported", Duration::from_secs(60), |s| s.missing_topics == 2).await?;
    assert!(tokio::time::timeout(Duration::from_millis(500), &mut run).await.is_err(), "the pipeline goes on");
    stop.cancel();
    run.await??;
    Ok(())
}

/// With `fail_on_missing_topic`, deleting the input topic stops `run()` with an error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_input_topic_fails_run_when_asked() -> Result<()> {
    init_logs();
    let (topic, group) = (unique("deleted-fail-in"), unique("deleted-fail-group"));
    create_topic(&topic, 1).await?;
    produce(&topic, keyed_records(10, 5)).await?;

    let (tx, mut processed) = watch::channel(0);
    let config = PipelineConfig::new(bootstrap(), &group, [&topic]).fail_on_missing_topic(true);
    let pipeline = Pipeline::new(config, Count(tx))?;
    let run = tokio::spawn(pipeline.run());
    tokio::time::timeout(Duration::from_secs(60), processed.wait_for(|n| *n >= 10)).await??;
    delete_topic(&topic).await?;
    let result = tokio::time::timeout(Duration::from_secs(60), run).await??;
    assert!(matches!(&result, Err(Error::MissingTopic { topic: t }) if *t == topic), "{result:?}");
    assert!(result.unwrap_err().to_string().contains(&topic));

    // Missing at start-up: the same error, at once.
    let (tx, _) = watch::channel(0);
    let config = PipelineConfig::new(bootstrap(), unique("absent-group"), [&topic]).fail_on_missing_topic(true);
    let result = tokio::time::timeout(Duration::from_secs(30), Pipeline::new(config, Count(tx))?.run()).await?;
    assert!(matches!(&result, Err(Error::MissingTopic { topic: t }) if *t == topic), "{result:?}");
    Ok(())
}
