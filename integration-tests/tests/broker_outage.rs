//! A broker outage mid-run is retried, not crashed on: the local broker is stopped and started again
//! under a running pipeline, which then finishes the stream with nothing lost.
//!
//! This test needs to own the broker: it runs only against the broker `scripts/kafka` manages (the
//! one `scripts/test` and `.ci/run` start); against any other broker it says so and does nothing.

use anyhow::{Result, bail};
use millrace::{Context, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use std::collections::BTreeSet;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

fn kafka_script(arg: &str) -> Result<bool> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/kafka");
    Ok(Command::new("bash").arg(script).arg(arg).status()?.success())
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
    let ours = bootstrap() == format!("127.0.0.1:{}", std::env::var("KAFKA_PORT").unwrap_or_else(|_| "9092".into()))
        && kafka_script("status")?;
    if !ours {
        println!("SKIPPED: the broker at {} is not managed by scripts/kafka here", bootstrap());
        return Ok(());
    }
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
    eventually("the group to commit everything", Duration::from_secs(60), || {
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
