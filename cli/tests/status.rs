//! `millrace status` against a real broker and a running pipeline: lag per partition from the
//! group's committed offsets, the pipeline's readiness from its HTTP listener, and the record that
//! holds a partition back (its head-of-line blocker).

use millrace::{Context, Pipeline, PipelineConfig, ProcessError, Processor, Record, RetryPolicy};
use millrace_integration_tests::{
    bootstrap, committed_offsets, create_topic, end_offsets, eventually, keyed_records, produce, unique,
};
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

struct Noop;

impl Processor for Noop {
    async fn process(&self, _: &Record, _: &Context) -> Result<(), ProcessError> {
        Ok(())
    }
}

/// Fails the record whose value is `stuck` transiently, every time (a downstream that stays down).
struct StuckOne;

impl Processor for StuckOne {
    async fn process(&self, record: &Record, _: &Context) -> Result<(), ProcessError> {
        match record.value_str() {
            Some("stuck") => Err(ProcessError::transient("payments-api: connection refused")),
            _ => Ok(()),
        }
    }
}

fn table(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_millrace"))
        .arg("status")
        .args(args)
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
        .output()
        .expect("run millrace");
    assert!(out.status.success(), "millrace status {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8")
}

fn status(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_millrace"))
        .arg("status")
        .args(args)
        .args(["--format", "json"])
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
        .output()
        .expect("run millrace");
    assert!(out.status.success(), "millrace status {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[tokio::test(flavor = "multi_thread")]
async fn status_reports_lag_per_partition_and_the_pipelines_readiness() -> anyhow::Result<()> {
    let topic = unique("status");
    let group = unique("status-group");
    create_topic(&topic, 2).await?;
    produce(&topic, keyed_records(30, 6)).await?;
    let config = PipelineConfig::new(bootstrap(), &group, [&topic])
        .commit_interval(Duration::from_millis(100))
        .http("127.0.0.1:0".parse()?);
    let pipeline = Pipeline::new(config, Noop)?;
    let url = format!("http://{}", pipeline.http_addr().expect("bound"));
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());
    let ends = end_offsets(&topic, 2)?;
    eventually("everything committed", Duration::from_secs(60), || {
        Ok((committed_offsets(&group, &topic, 2)? == ends).then_some(()))
    })
    .await?;
    let running = eventually("the pipeline ready", Duration::from_secs(30), || {
        let s = status(&["--group", &group, "--url", &url]);
        Ok((s["health"]["ready"] == Value::Bool(true)).then_some(s))
    })
    .await?;
    assert_eq!(running["total_lag"], 0, "{running}");
    assert_eq!(running["partitions"].as_array().map(Vec::len), Some(2), "{running}");

    // Stopped, with 12 more records behind it: that is the lag, partition by partition.
    stop.cancel();
    run.await??;
    produce(&topic, keyed_records(12, 6)).await?;
    let ends = end_offsets(&topic, 2)?;
    let stopped = status(&["--group", &group, "--topic", &topic]);
    assert_eq!(stopped["total_lag"], 12, "{stopped}");
    for p in stopped["partitions"].as_array().expect("partitions") {
        let partition = p["partition"].as_i64().expect("partition") as i32;
        assert_eq!(p["end"].as_i64(), Some(ends[&partition]), "{p}");
        assert_eq!(p["lag"].as_i64(), Some(ends[&partition] - p["committed"].as_i64().expect("committed")));
    }
    assert_eq!(stopped["health"], Value::Null, "no --url, no health");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn status_names_the_record_that_holds_a_partition_back() -> anyhow::Result<()> {
    let topic = unique("status-blocked");
    let group = unique("status-blocked-group");
    create_topic(&topic, 1).await?;
    let mut records: Vec<(String, Vec<u8>)> = (0..10).map(|i| (format!("k{i}"), b"fine".to_vec())).collect();
    records[4] = ("card-4711".into(), b"stuck".to_vec());
    produce(&topic, records).await?;
    let retry =
        RetryPolicy { max_attempts: 1000, base_delay: Duration::from_millis(20), max_delay: Duration::from_millis(50) };
    let config = PipelineConfig::new(bootstrap(), &group, [&topic])
        .commit_interval(Duration::from_millis(100))
        .stall_timeout(Duration::from_secs(2)) // statistics (the status's source) every 500 ms
        .retry(retry)
        .http("127.0.0.1:0".parse()?);
    let pipeline = Pipeline::new(config, StuckOne)?;
    let url = format!("http://{}", pipeline.http_addr().expect("bound"));
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());

    let blocked = eventually("the blocker named", Duration::from_secs(60), || {
        let s = status(&["--group", &group, "--url", &url]);
        let p = &s["pipeline"]["partitions"][0];
        Ok((p["blocker"]["failed_attempts"].as_u64().unwrap_or(0) >= 3).then(|| p.clone()))
    })
    .await?;
    assert_eq!(blocked["completed"], 4, "the prefix stands at the stuck record: {blocked}");
    assert_eq!(blocked["in_flight"], 1, "everything after it is done: {blocked}");
    let b = &blocked["blocker"];
    assert_eq!((b["offset"].as_i64(), b["key"].as_str()), (Some(4), Some("card-4711")), "{b}");
    assert!(b["last_error"].as_str().is_some_and(|e| e.contains("connection refused")), "{b}");
    let text = table(&["--group", &group, "--url", &url]);
    let line =
        text.lines().find(|l| l.starts_with("head of line")).unwrap_or_else(|| panic!("no blocker line:\n{text}"));
    assert!(
        line.contains("offset 4") && line.contains("key card-4711") && line.contains("connection refused"),
        "{line}"
    );

    stop.cancel();
    run.await??;
    Ok(())
}
