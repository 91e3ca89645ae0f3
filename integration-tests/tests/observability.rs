//! Operating a pipeline: its HTTP listener serves Prometheus metrics whose figures match what the
//! test produced (records processed, dead-lettered by kind, lag per partition back to 0, attempt
//! durations), and health probes that say why a pipeline is not ready.

use anyhow::{Context as _, Result, bail};
use millrace::{Context, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use std::time::{Duration, Instant};

/// Fails records whose value is `poison` permanently; processes the rest.
struct PoisonAware;

impl Processor for PoisonAware {
    async fn process(&self, record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        match record.value_str() {
            Some("poison") => Err(ProcessError::permanent("poison value")),
            _ => Ok(()),
        }
    }
}

async fn get(url: &str) -> Result<(u16, String)> {
    let response = reqwest::get(url).await.with_context(|| format!("GET {url}"))?;
    Ok((response.status().as_u16(), response.text().await?))
}

/// The value of the sample of `name` whose labels include every one of `labels` (`k="v"`).
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Polls `url` until `check` accepts its body, or fails with the last body after `timeout`.
async fn until(url: &str, timeout: Duration, check: impl Fn(u16, &str) -> bool) -> Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let (status, body) = get(url).await?;
        if check(status, &body) {
            return Ok(body);
        }
        if Instant::now() > deadline {
            bail!("{url} did not reach the expected state within {timeout:?}; last ({status}):\n{body}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health_match_what_was_produced() -> Result<()> {
    init_logs();
    const N: usize = 300;
    const POISON: usize = 7;
    let topic = unique("observed");
    let group = unique("observed-group");
    create_topic(&topic, 2).await?;
    let mut records: Vec<(String, Vec<u8>)> = keyed_records(N, 20).collect();
    for (_, r) in records.iter_mut().enumerate().filter(|(i, _)| i % 40 == 3).take(POISON) {
        r.1 = b"poison".to_vec();
    }
    produce(&topic, records).await?;
    let config = PipelineConfig::new(bootstrap(), &group, [&topic])
        .commit_interval(Duration::from_millis(200))
        .stall_timeout(Duration::from_secs(2)) // statistics (lag) every 500 ms
        .http("127.0.0.1:0".parse()?);
    let pipeline = Pipeline::new(config, PoisonAware)?;
    let base = format!("http://{}", pipeline.http_addr().context("bound")?);
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());

    let (status, _) = get(&format!("{base}/health/live")).await?;
    assert_eq!(status, 200, "live while it starts");
    until(&format!("{base}/health/ready"), Duration::from_secs(60), |s, b| s == 200 && b.contains(r#""ready":true"#))
        .await?;

    let pipeline_label = format!(r#"pipeline="{group}""#);
    let topic_label = format!(r#"topic="{topic}""#);
    let metrics = until(&format!("{base}/metrics"), Duration::from_secs(60), |_, body| {
        let done = sample(body, "millrace_records_processed_total", &[&pipeline_label]) == Some((N - POISON) as f64);
        let lag_zero = (0..2).all(|p| {
            let partition = format!(r#"partition="{p}""#);
            sample(body, "millrace_consumer_committed_lag_records", &[&pipeline_label, &topic_label, &partition])
                == Some(0.0)
        });
        done && lag_zero
    })
    .await?;
    let dead = sample(&metrics, "millrace_dead_lettered_total", &[&pipeline_label, r#"kind="permanent""#]);
    assert_eq!(dead, Some(POISON as f64), "dead-lettered by kind");
    let attempts = sample(&metrics, "millrace_attempt_duration_seconds_count", &[&pipeline_label]);
    assert_eq!(attempts, Some(N as f64), "one attempt per record (permanent failures are not retried)");
    let all = sample(&metrics, "millrace_attempt_duration_seconds_bucket", &[&pipeline_label, r#"le="+Inf""#]);
    assert_eq!(all, Some(N as f64), "the +Inf bucket counts every attempt");
    let quick = sample(&metrics, "millrace_attempt_duration_seconds_bucket", &[&pipeline_label, r#"le="5""#]);
    assert_eq!(quick, Some(N as f64), "a no-op processor's attempts take under 5 s");
    let latencies = sample(&metrics, "millrace_record_latency_seconds_count", &[&pipeline_label]);
    assert_eq!(latencies, Some((N - POISON) as f64), "an end-to-end latency per processed record");
    assert!(sample(&metrics, "millrace_record_latency_seconds_sum", &[&pipeline_label]).is_some_and(|s| s > 0.0));
    assert_eq!(sample(&metrics, "millrace_cluster_reachable", &[&pipeline_label]), Some(1.0));
    assert_eq!(sample(&metrics, "millrace_assigned_partitions", &[&pipeline_label]), Some(2.0));
    assert!(metrics.contains("# HELP millrace_consumer_lag_records"), "metrics are described");
    let s = stats.snapshot();
    assert_eq!((s.processed, s.dead_lettered), ((N - POISON) as u64, POISON as u64));

    stop.cancel();
    run.await??;
    assert!(get(&format!("{base}/metrics")).await.is_err(), "the listener stops with the pipeline");
    Ok(())
}

/// Emits one output per record.
struct Echo(String);

impl Processor for Echo {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        ctx.emit(millrace::OutputRecord::to(&self.0).value(record.value.clone().unwrap_or_default())).await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_metrics_count_dedup_misses_and_transactions() -> Result<()> {
    init_logs();
    const UNIQUE: usize = 30;
    const REPEATED: usize = 10;
    let (topic, out, group) = (unique("observed-eos"), unique("observed-eos-out"), unique("observed-eos-group"));
    create_topic(&topic, 1).await?;
    create_topic(&out, 1).await?;
    // 30 events, then the first 10 again (redelivered by an upstream retry): 30 misses, 10 hits.
    let event = |i: usize| {
        let header = vec![("idempotency-key".to_owned(), format!("evt-{i}").into_bytes())];
        (Some(format!("k{i}").into_bytes()), Some(format!("v{i}").into_bytes()), header)
    };
    produce_raw(&topic, (0..UNIQUE).chain(0..REPEATED).map(event)).await?;
    let dir = std::env::temp_dir().join(unique("observed-eos-dedup"));
    let config = PipelineConfig::new(bootstrap(), &group, [&topic])
        .commit_interval(Duration::from_millis(200))
        .exactly_once(millrace::ExactlyOnce::default().transactional_id(unique("observed-eos-txn")))
        .dedup(millrace::DedupConfig::new(&dir))
        .http("127.0.0.1:0".parse()?);
    let pipeline = Pipeline::new(config, Echo(out.clone()))?;
    let base = format!("http://{}", pipeline.http_addr().context("bound")?);
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());

    let label = format!(r#"pipeline="{group}""#);
    let metrics = until(&format!("{base}/metrics"), Duration::from_secs(60), |_, body| {
        let committed = sample(body, "millrace_transactions_committed_total", &[&label]).unwrap_or(0.0);
        sample(body, "millrace_dedup_hits_total", &[&label]) == Some(REPEATED as f64)
            && sample(body, "millrace_consumer_committed_lag_records", &[&label]) == Some(0.0)
            && sample(body, "millrace_transaction_duration_seconds_count", &[&label]) == Some(committed)
    })
    .await?;
    assert_eq!(sample(&metrics, "millrace_dedup_misses_total", &[&label]), Some(UNIQUE as f64), "{metrics}");
    assert_eq!(sample(&metrics, "millrace_producer_queue_messages", &[&label]), Some(0.0), "all acknowledged");
    let s = stats.snapshot();
    assert!(s.transactions_committed >= 1, "{s:?}");
    assert_eq!((s.dedup_misses, s.dedup_hits, s.processed), (UNIQUE as u64, REPEATED as u64, UNIQUE as u64));
    assert_eq!(read_topic_as(&out, Isolation::ReadCommitted)?.len(), UNIQUE, "one output per event");

    stop.cancel();
    run.await??;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

#[tokio::test]
async fn readiness_says_why_when_the_cluster_cannot_be_reached() -> Result<()> {
    init_logs();
    let config = PipelineConfig::new("127.0.0.1:1", unique("unreachable"), ["t"]).http("127.0.0.1:0".parse()?);
    let pipeline = Pipeline::new(config, PoisonAware)?;
    let base = format!("http://{}", pipeline.http_addr().context("bound")?);
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());
    let body = until(&format!("{base}/health/ready"), Duration::from_secs(30), |s, b| {
        s == 503 && b.contains("no broker of the cluster can be reached")
    })
    .await?;
    assert!(body.contains("not joined to the consumer group yet"), "{body}");
    let (status, _) = get(&format!("{base}/health/live")).await?;
    assert_eq!(status, 200, "retrying to reach the cluster is live: a restart would not help");
    stop.cancel();
    assert!(run.await?.is_err(), "stopped before the cluster was reached");
    Ok(())
}

#[test]
fn a_taken_address_fails_at_start_up_naming_the_field() -> Result<()> {
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let config = PipelineConfig::new(bootstrap(), "g", ["t"]).http(taken.local_addr()?);
    match Pipeline::new(config, PoisonAware) {
        Err(millrace::Error::Config(e)) => assert_eq!(e.field, "http", "{e}"),
        Err(e) => bail!("wrong error: {e}"),
        Ok(_) => bail!("bound an address already taken"),
    }
    Ok(())
}

/// Waits until the Prometheus at `PROMETHEUS_URL` answers `query` with one sample accepted by `check`.
async fn prometheus_until(query: &str, timeout: Duration, check: impl Fn(f64) -> bool) -> Result<f64> {
    let base = std::env::var("PROMETHEUS_URL").unwrap_or_else(|_| "http://127.0.0.1:9090".into());
    let deadline = Instant::now() + timeout;
    let client = reqwest::Client::new();
    loop {
        let response = client.get(format!("{base}/api/v1/query")).query(&[("query", query)]).send().await;
        let response =
            response.with_context(|| format!("querying Prometheus at {base}: is it up? (scripts/observe up)"))?;
        let body: serde_json::Value = serde_json::from_str(&response.text().await?)?;
        let value = body["data"]["result"][0]["value"][1].as_str().and_then(|v| v.parse::<f64>().ok());
        if let Some(v) = value.filter(|v| check(*v)) {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("Prometheus: `{query}` did not reach the expected value within {timeout:?}; last answer: {body}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Holds every record until the gate opens.
struct Gated {
    gate: tokio::sync::watch::Receiver<bool>,
}

impl Processor for Gated {
    async fn process(&self, record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        let _ = self.gate.clone().wait_for(|open| *open).await;
        match record.value_str() {
            Some("poison") => Err(ProcessError::permanent("poison value")),
            _ => Ok(()),
        }
    }
}

/// A real Prometheus (scripts/observe, started by scripts/test) scrapes a pipeline: the lag it
/// stores is the backlog the test created, the head-of-line age grows while a record is held, and
/// the processed and dead-lettered counts are the test's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_lag_and_dlq_figures_that_match() -> Result<()> {
    init_logs();
    const FIRST: usize = 100;
    const BACKLOG: usize = 250;
    let topic = unique("scraped");
    let group = unique("scraped-group");
    create_topic(&topic, 3).await?;
    produce(&topic, keyed_records(FIRST, 30)).await?;
    let (open, gate) = tokio::sync::watch::channel(true);
    let config = PipelineConfig::new(bootstrap(), &group, [&topic])
        .commit_interval(Duration::from_millis(200))
        .stall_timeout(Duration::from_secs(2))
        .http("127.0.0.1:0".parse()?);
    let pipeline = Pipeline::new(config, Gated { gate })?;
    let addr = pipeline.http_addr().context("bound")?;
    let targets = std::env::var("PROMETHEUS_TARGETS_DIR").map(std::path::PathBuf::from).unwrap_or_else(|_| {
        std::path::PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/millrace/prometheus/targets")
    });
    std::fs::create_dir_all(&targets)?;
    let target_file = targets.join(format!("{group}.json"));
    std::fs::write(&target_file, serde_json::json!([{ "targets": [addr.to_string()] }]).to_string())?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    let by_group = |metric: &str, agg: &str| format!(r#"{agg}({metric}{{pipeline="{group}"}})"#);

    // The first records are done and committed: Prometheus sees lag 0.
    prometheus_until(&by_group("millrace_records_processed_total", "sum"), Duration::from_secs(90), |v| {
        v == FIRST as f64
    })
    .await?;
    prometheus_until(&by_group("millrace_consumer_committed_lag_records", "sum"), Duration::from_secs(60), |v| {
        v == 0.0
    })
    .await?;

    // A backlog the pipeline cannot work off (the gate is shut): every record of it is lag, and the
    // head-of-line record's age grows.
    open.send_replace(false);
    let mut backlog: Vec<(String, Vec<u8>)> = keyed_records(BACKLOG, 30).collect();
    for r in backlog.iter_mut().step_by(50) {
        r.1 = b"poison".to_vec();
    }
    let poison = backlog.iter().filter(|r| r.1 == b"poison").count();
    produce(&topic, backlog).await?;
    let lag =
        prometheus_until(&by_group("millrace_consumer_committed_lag_records", "sum"), Duration::from_secs(60), |v| {
            v == BACKLOG as f64
        })
        .await?;
    let held =
        prometheus_until(&by_group("millrace_oldest_unfinished_age_seconds", "max"), Duration::from_secs(60), |v| {
            v >= 2.0
        })
        .await?;

    // Open the gate: the backlog drains, the DLQ count is the poison the test wrote.
    open.send_replace(true);
    prometheus_until(&by_group("millrace_consumer_committed_lag_records", "sum"), Duration::from_secs(90), |v| {
        v == 0.0
    })
    .await?;
    let dead = prometheus_until(&by_group("millrace_dead_lettered_total", "sum"), Duration::from_secs(60), |v| {
        v == poison as f64
    })
    .await?;
    let processed =
        prometheus_until(&by_group("millrace_records_processed_total", "sum"), Duration::from_secs(60), |v| {
            v == (FIRST + BACKLOG - poison) as f64
        })
        .await?;
    println!(
        "Prometheus saw: lag {lag} with the gate shut, head-of-line held {held} s, {dead} dead-lettered, {processed} processed"
    );
    let s = stats.snapshot();
    assert_eq!((s.processed, s.dead_lettered), ((FIRST + BACKLOG - poison) as u64, poison as u64));
    stop.cancel();
    run.await??;
    std::fs::remove_file(&target_file)?;
    Ok(())
}

/// Runs headless Chromium (Debian's `chromium`; `CHROMIUM` names another) with `args` and `url`;
/// returns its stdout.
fn chromium(args: &[&str], url: &str) -> Result<String> {
    let exe = std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into());
    let profile = std::env::temp_dir().join(unique("chromium-profile"));
    let out = std::process::Command::new(&exe)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .with_context(|| format!("running {exe} (install it: apt-get install chromium; scripts/test does)"))?;
    let _ = std::fs::remove_dir_all(&profile);
    if !out.status.success() {
        bail!("{exe} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The status page, rendered by a real headless Chromium: the DOM it built holds a row per owned
/// partition with its lag, the readiness line, and the counters; a screenshot of it is a real
/// image of the page's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_in_a_browser_with_a_row_per_partition() -> Result<()> {
    init_logs();
    let topic = unique("paged");
    let group = unique("paged-group");
    create_topic(&topic, 3).await?;
    produce(&topic, keyed_records(90, 9)).await?;
    let config = PipelineConfig::new(bootstrap(), &group, [&topic])
        .commit_interval(Duration::from_millis(100))
        .stall_timeout(Duration::from_secs(2))
        .http("127.0.0.1:0".parse()?);
    let pipeline = Pipeline::new(config, PoisonAware)?;
    let base = format!("http://{}", pipeline.http_addr().context("bound")?);
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());
    // Every partition committed to its end, as the page's data says.
    until(&format!("{base}/status"), Duration::from_secs(60), |_, body| {
        let Ok(status) = serde_json::from_str::<serde_json::Value>(body) else { return false };
        let parts = status["partitions"].as_array().cloned().unwrap_or_default();
        status["ready"] == true && parts.len() == 3 && parts.iter().all(|p| p["end"] == p["committed"])
    })
    .await?;

    let dom = tokio::task::spawn_blocking({
        let base = base.clone();
        move || chromium(&["--dump-dom"], &format!("{base}/"))
    })
    .await??;
    for p in 0..3 {
        assert!(dom.contains(&format!(r#"data-partition="{topic}/{p}""#)), "row of partition {p} in:\n{dom}");
    }
    assert!(dom.contains(r#"<p id="readiness" class="ready">ready</p>"#), "{dom}");
    assert!(dom.contains(r#"<td class="lag">0</td>"#), "lag 0 shown: {dom}");
    assert!(dom.contains("<th>processed</th><td>90</td>"), "counters shown: {dom}");

    let shot = std::env::temp_dir().join(format!("{}.png", unique("status-page")));
    let screenshot = format!("--screenshot={}", shot.display());
    tokio::task::spawn_blocking({
        let base = base.clone();
        move || chromium(&[&screenshot, "--window-size=1000,700"], &format!("{base}/"))
    })
    .await??;
    let png = std::fs::read(&shot)?;
    std::fs::remove_file(&shot)?;
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    let (width, height) = (u32::from_be_bytes(png[16..20].try_into()?), u32::from_be_bytes(png[20..24].try_into()?));
    assert_eq!((width, height), (1000, 700), "the page's size");
    assert!(png.len() > 5_000, "a page with content, not a blank image ({} bytes)", png.len());
    stop.cancel();
    run.await??;
    Ok(())
}
