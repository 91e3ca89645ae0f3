//! Liveness under slow handlers: a handler longer than `max.poll.interval.ms` does not get the member
//! evicted, and a large backlog behind a slow handler keeps memory bounded (I4).

use anyhow::Result;
use millrace::{Context, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use std::time::{Duration, Instant};
use tokio::sync::watch;

struct SlowKey {
    processed: watch::Sender<usize>,
}

impl Processor for SlowKey {
    async fn process(&self, record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        if record.key_str() == Some("slow") {
            tokio::time::sleep(Duration::from_secs(15)).await;
        }
        self.processed.send_modify(|n| *n += 1);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_longer_than_max_poll_interval_keeps_the_member_in_the_group() -> Result<()> {
    init_logs();
    let topic = unique("max-poll");
    let group = unique("max-poll-group");
    create_topic(&topic, 1).await?;
    let records = std::iter::once(("slow".to_owned(), b"takes 15 s".to_vec()))
        .chain((1..20).map(|i| (format!("fast-{i}"), b"quick".to_vec())));
    produce(&topic, records).await?;

    let (tx, mut processed) = watch::channel(0);
    let config = PipelineConfig::new(bootstrap(), &group, [&topic])
        .drain_timeout(Duration::from_secs(5))
        .consumer_property("max.poll.interval.ms", "10000")
        .consumer_property("session.timeout.ms", "6000")
        .consumer_property("heartbeat.interval.ms", "1000");
    let pipeline = Pipeline::new(config, SlowKey { processed: tx })?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let started = Instant::now();
    let run = tokio::spawn(pipeline.run());

    // Other keys are not held up by the slow one.
    tokio::time::timeout(Duration::from_secs(10), processed.wait_for(|n| *n >= 19)).await??;
    let fast = started.elapsed();
    tokio::time::timeout(Duration::from_secs(40), processed.wait_for(|n| *n >= 20)).await??;
    let slow = started.elapsed();
    eventually("the commit to cover the slow record", Duration::from_secs(10), || {
        Ok((committed_offsets(&group, &topic, 1)?.get(&0) == Some(&20)).then_some(()))
    })
    .await?;
    let s = stats.snapshot();
    stop.cancel();
    run.await??;
    println!("19 fast records done after {fast:?}; the 15 s record after {slow:?}; {s:?}");
    assert!(slow >= Duration::from_secs(15));
    assert_eq!(s.assignments, 1, "the member was never evicted and re-assigned");
    assert_eq!(s.revocations, 0, "no partition was revoked or lost while the handler ran");
    Ok(())
}

/// A 200,000-record backlog (1 KiB values, ~200 MiB) behind a slow handler: the worker's in-flight
/// count stays under its bounds and its resident memory stays far below the backlog's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_behind_slow_handler_keeps_memory_bounded() -> Result<()> {
    init_logs();
    const RECORDS: usize = 200_000;
    const TOTAL_BOUND: u64 = 1_000;
    let topic = unique("backpressure");
    let group = unique("backpressure-group");
    let journal = journal_path("backpressure");
    create_topic(&topic, 4).await?;
    let value = vec![b'x'; 1024];
    produce(&topic, (0..RECORDS).map(|i| (format!("key-{}", i % 5_000), value.clone()))).await?;

    let mut child = worker_command(env!("CARGO_BIN_EXE_millrace-it-worker"), &topic, &group, &journal)
        .args(["--delay-min-ms", "1", "--delay-max-ms", "3", "--concurrency", "16"])
        .args(["--per-partition", "500", "--total", &TOTAL_BOUND.to_string()])
        .spawn()?;
    // Sample while the worker chews through the backlog: it cannot finish 200,000 records in this time.
    eventually("the worker to start processing", Duration::from_secs(30), || {
        Ok((!read_journal(&journal)?.is_empty()).then_some(()))
    })
    .await?;
    let mut peak_rss = 0;
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if let Some((rss, _)) = rss_kib(child.id()) {
            peak_rss = peak_rss.max(rss);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hwm = rss_kib(child.id()).map_or(0, |(_, hwm)| hwm);
    let processed = distinct(&read_journal(&journal)?).len();
    signal(&child, libc::SIGTERM)?;
    assert!(wait_exit(&mut child, Duration::from_secs(30)).await?.success());
    let out = worker_summary(&mut child)?;
    let peak_in_flight: u64 = out
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("in_flight_peak="))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no summary from the worker: {out:?}"))?;
    println!(
        "backlog {RECORDS} x 1 KiB; processed {processed} while sampling; peak in flight {peak_in_flight} \
         (bound {TOTAL_BOUND}); RSS peak sampled {} MiB, VmHWM {} MiB",
        peak_rss / 1024,
        hwm / 1024
    );
    assert!(processed < RECORDS, "the backlog must still be there while memory is sampled");
    assert!(peak_in_flight <= TOTAL_BOUND + 16, "in-flight {peak_in_flight} exceeded the bound {TOTAL_BOUND}");
    assert!(hwm < 160 * 1024, "peak RSS {} MiB is not bounded well below the ~200 MiB backlog", hwm / 1024);
    std::fs::remove_file(&journal).ok();
    Ok(())
}
