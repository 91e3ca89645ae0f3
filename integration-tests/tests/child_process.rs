//! Tests that run the pipeline as a child process (`millrace-it-worker`) so it can be killed.
//! Effects are journaled by the child to a file outside Kafka; the checks compare that journal with
//! the group's committed offsets read back from the broker.

use anyhow::Result;
use millrace_integration_tests::*;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const WORKER: &str = env!("CARGO_BIN_EXE_millrace-it-worker");

fn spawn_worker(topic: &str, group: &str, journal: &Path, extra: &[&str]) -> Result<Reaped> {
    Ok(Reaped(worker_command(WORKER, topic, group, journal).args(extra).spawn()?))
}

async fn journal_reaches(journal: &Path, distinct_records: usize, timeout: Duration) -> Result<()> {
    eventually(&format!("{distinct_records} distinct records in the journal"), timeout, || {
        Ok((distinct(&read_journal(journal)?).len() >= distinct_records).then_some(()))
    })
    .await
}

/// I1 + I2 across a crash: SIGKILL mid-stream, check that no committed offset passes an unprocessed
/// record, restart, and check that every record was processed at least once and the group caught up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_nothing_and_never_commits_past_unprocessed() -> Result<()> {
    init_logs();
    const PARTITIONS: i32 = 4;
    const RECORDS: usize = 20_000;
    let topic = unique("crash");
    let group = unique("crash-group");
    let journal = journal_path("crash");
    create_topic(&topic, PARTITIONS).await?;
    produce(&topic, keyed_records(RECORDS, 500)).await?;
    // A short session timeout: the restarted member waits for the killed one to be expired.
    let args = [
        "--delay-max-ms",
        "4",
        "--concurrency",
        "64",
        "--commit-interval-ms",
        "200",
        "--consumer-prop",
        "session.timeout.ms=6000",
        "--consumer-prop",
        "heartbeat.interval.ms=1000",
    ];

    let mut child = spawn_worker(&topic, &group, &journal, &args)?;
    journal_reaches(&journal, RECORDS / 4, Duration::from_secs(60)).await?;
    // Let at least one commit land after the journal grew, so the check below is not vacuous.
    eventually("a first commit", Duration::from_secs(30), || {
        Ok((committed_offsets(&group, &topic, PARTITIONS)?.values().sum::<i64>() > 0).then_some(()))
    })
    .await?;
    signal(&child, libc::SIGKILL)?;
    let status = wait_exit(&mut child, Duration::from_secs(10)).await?;
    assert!(!status.success(), "SIGKILL must kill the worker");

    let seen = distinct(&read_journal(&journal)?);
    let committed = committed_offsets(&group, &topic, PARTITIONS)?;
    let covered = assert_commits_cover_only_processed(&committed, &seen, PARTITIONS)?;
    println!("killed after {} distinct records; commits covered {covered}", seen.len());
    assert!(covered > 0 && (covered as usize) < RECORDS, "the kill must land mid-stream ({covered} committed)");

    let mut child = spawn_worker(&topic, &group, &journal, &args)?;
    journal_reaches(&journal, RECORDS, Duration::from_secs(120)).await?;
    let ends = end_offsets(&topic, PARTITIONS)?;
    eventually("committed offsets to reach the end offsets", Duration::from_secs(30), || {
        Ok((committed_offsets(&group, &topic, PARTITIONS)? == ends).then_some(()))
    })
    .await?;
    signal(&child, libc::SIGTERM)?;
    assert!(wait_exit(&mut child, Duration::from_secs(30)).await?.success());

    let entries = read_journal(&journal)?;
    let seen = distinct(&entries);
    assert_eq!(seen.len(), RECORDS, "every record processed at least once");
    println!(
        "after restart: {} effects for {RECORDS} records ({} redelivered)",
        entries.len(),
        entries.len() - RECORDS
    );
    std::fs::remove_file(&journal).ok();
    Ok(())
}

/// Graceful shutdown: SIGTERM mid-stream exits 0 within the drain deadline, and the committed offsets
/// are exactly the processed prefix of each partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_commits_the_completed_prefix_and_exits_zero() -> Result<()> {
    init_logs();
    const PARTITIONS: i32 = 4;
    const RECORDS: usize = 10_000;
    let topic = unique("sigterm");
    let group = unique("sigterm-group");
    let journal = journal_path("sigterm");
    create_topic(&topic, PARTITIONS).await?;
    produce(&topic, keyed_records(RECORDS, 200)).await?;
    let drain = Duration::from_secs(10);
    let mut child = spawn_worker(
        &topic,
        &group,
        &journal,
        &["--delay-max-ms", "20", "--concurrency", "32", "--drain-timeout-ms", &drain.as_millis().to_string()],
    )?;
    journal_reaches(&journal, 1_000, Duration::from_secs(60)).await?;
    let asked = Instant::now();
    signal(&child, libc::SIGTERM)?;
    let status = wait_exit(&mut child, drain + Duration::from_secs(10)).await?;
    let took = asked.elapsed();
    assert!(status.success(), "graceful shutdown exits 0, got {status}");
    assert!(took < drain + Duration::from_secs(5), "shutdown took {took:?}");
    let out = worker_summary(&mut child)?;
    assert!(out.contains("drained=true"), "all in-flight records finish within the deadline: {out}");

    let seen = distinct(&read_journal(&journal)?);
    let committed = committed_offsets(&group, &topic, PARTITIONS)?;
    let prefix = processed_prefix(&seen, PARTITIONS);
    println!("SIGTERM after {} records; exited in {took:?}; committed {committed:?}", seen.len());
    assert!(seen.len() < RECORDS, "the signal must land mid-stream");
    for p in 0..PARTITIONS {
        assert_eq!(committed.get(&p).copied().unwrap_or(0), prefix[&p], "partition {p}: commit = processed prefix");
    }
    std::fs::remove_file(&journal).ok();
    Ok(())
}

/// A second signal during the drain exits at once with status 130, committing nothing past the
/// records that were finished before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_signal_exits_at_once_without_committing_unfinished_work() -> Result<()> {
    init_logs();
    let topic = unique("second-signal");
    let group = unique("second-signal-group");
    let journal = journal_path("second-signal");
    create_topic(&topic, 1).await?;
    produce(&topic, keyed_records(50, 50)).await?;
    // Slow records (2-3 s each): the drain after the first signal would take seconds.
    let mut child = worker_command(WORKER, &topic, &group, &journal)
        .args(["--delay-min-ms", "2000", "--delay-max-ms", "3000", "--drain-timeout-ms", "30000"])
        .env("RUST_LOG", "info,librdkafka=warn")
        .stderr(Stdio::piped())
        .spawn()?;
    // The worker's log lines, as they come.
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    tokio::time::timeout(Duration::from_secs(60), wait_for_line(&mut lines, "partitions assigned")).await??;
    journal_reaches(&journal, 1, Duration::from_secs(60)).await?;
    signal(&child, libc::SIGTERM)?;
    tokio::time::timeout(Duration::from_secs(10), wait_for_line(&mut lines, "shutting down: draining")).await??;
    let asked = Instant::now();
    signal(&child, libc::SIGTERM)?;
    let status = wait_exit(&mut child, Duration::from_secs(10)).await?;
    assert_eq!(status.code(), Some(millrace::shutdown::FORCED_EXIT_CODE), "{status}");
    assert!(asked.elapsed() < Duration::from_secs(2), "the second signal must not wait for the drain");
    let seen = distinct(&read_journal(&journal)?);
    let committed = committed_offsets(&group, &topic, 1)?;
    assert_commits_cover_only_processed(&committed, &seen, 1)?;
    std::fs::remove_file(&journal).ok();
    Ok(())
}

async fn wait_for_line(lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>, needle: &str) -> Result<()> {
    while let Some(line) = lines.recv().await {
        if line.contains(needle) {
            return Ok(());
        }
    }
    anyhow::bail!("the worker exited without logging {needle:?}")
}
