//! Input written by a transactional producer (issue 12, item 4): transaction markers and aborted
//! records take offsets but are never delivered, so a committed offset of the last processed
//! record plus one stays below the end for good. Once a partition is caught up the pipeline commits the
//! consumer's position instead, and the group's lag reaches 0, in both delivery modes.

use anyhow::Result;
use millrace::{Context, ExactlyOnce, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

const PARTITIONS: i32 = 2;

/// Writes `batches` transactions of (records per partition, commit?) to every partition.
fn write_transactions(topic: &str, batches: &[(usize, bool)]) -> Result<usize> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("transactional.id", unique("txn-writer"))
        .create()?;
    producer.init_transactions(Duration::from_secs(30))?;
    let mut committed = 0;
    for (i, &(n, commit)) in batches.iter().enumerate() {
        producer.begin_transaction()?;
        for p in 0..PARTITIONS {
            for j in 0..n {
                let value = format!("batch-{i}-{p}-{j}");
                producer.send(BaseRecord::<(), str>::to(topic).payload(&value).partition(p)).map_err(|(e, _)| e)?;
            }
        }
        if commit {
            producer.commit_transaction(Duration::from_secs(30))?;
            committed += n * PARTITIONS as usize;
        } else {
            producer.flush(Duration::from_secs(30))?;
            producer.abort_transaction(Duration::from_secs(30))?;
        }
    }
    Ok(committed)
}

struct Count(Arc<AtomicU64>);

impl Processor for Count {
    async fn process(&self, record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        let value = record.value_str().unwrap_or_default();
        assert!(value.starts_with("batch-"), "unexpected {value}");
        self.0.fetch_add(1, Relaxed);
        Ok(())
    }
}

async fn lag_reaches_zero(exactly_once: bool) -> Result<()> {
    init_logs();
    let topic = unique("txn-input");
    let group = unique("txn-input-group");
    create_topic(&topic, PARTITIONS).await?;
    // Committed, aborted, committed, then aborted transactions at every partition's tail.
    let expected = write_transactions(&topic, &[(30, true), (10, false), (20, true), (5, false)])?;
    let ends = end_offsets(&topic, PARTITIONS)?;
    let mut config = PipelineConfig::new(bootstrap(), &group, [&topic]).commit_interval(Duration::from_millis(100));
    if exactly_once {
        config = config.exactly_once(ExactlyOnce::default().transactional_id(format!("{group}-tx")));
    }
    let seen = Arc::new(AtomicU64::new(0));
    let pipeline = Pipeline::new(config, Count(seen.clone()))?;
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());
    eventually("every committed record processed", Duration::from_secs(60), || {
        Ok((seen.load(Relaxed) as usize >= expected).then_some(()))
    })
    .await?;
    // Before the fix the committed offsets stayed at the last processed record + 1.
    let reached = eventually("committed offsets to reach the end offsets (lag 0)", Duration::from_secs(30), || {
        Ok((committed_offsets(&group, &topic, PARTITIONS)? == ends).then_some(()))
    })
    .await;
    let committed = committed_offsets(&group, &topic, PARTITIONS)?;
    println!("exactly_once={exactly_once}: ends {ends:?}, committed {committed:?}");
    stop.cancel();
    run.await??;
    reached?;
    assert_eq!(seen.load(Relaxed) as usize, expected, "aborted records are never processed");
    assert_eq!(committed_offsets(&group, &topic, PARTITIONS)?, ends, "still at the end after shutdown");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_lag_reaches_zero_past_markers_and_aborted_tails() -> Result<()> {
    lag_reaches_zero(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_lag_reaches_zero_past_markers_and_aborted_tails() -> Result<()> {
    lag_reaches_zero(true).await
}
