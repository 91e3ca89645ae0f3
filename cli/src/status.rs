//! `millrace status --group G`: a consumer group's lag per partition, from the broker (committed
//! offsets against end offsets), and, with `--url`, what the pipeline itself says: its readiness
//! (`/health/ready`) and its head-of-line blockers (`/status`: per owned partition, the record
//! holding the committable prefix back, how long, and, when it has retried, its key, failed
//! attempts and last error).

use crate::args::{Format, StatusArgs};
use crate::read::{REQUEST_TIMEOUT, client_config, unreachable_error};
use anyhow::{Context as _, Result, bail};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;

/// One partition the group committed to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartitionLag {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The group's committed offset (the next record it will process).
    pub committed: i64,
    /// The partition's end (high watermark).
    pub end: i64,
    /// `end - committed`.
    pub lag: i64,
}

/// Runs `millrace status`.
pub async fn run(bootstrap: &str, a: &StatusArgs) -> Result<()> {
    let lags = tokio::task::block_in_place(|| group_lag(bootstrap, &a.group, &a.topics))?;
    let (ready, pipeline) = match &a.url {
        Some(url) => (Some(get_json(url, "health/ready").await?), Some(get_json(url, "status").await?)),
        None => (None, None),
    };
    let total: i64 = lags.iter().map(|l| l.lag).sum();
    match a.format {
        Format::Json => {
            let out = json!({
                "group": a.group, "total_lag": total, "partitions": lags, "health": ready, "pipeline": pipeline,
            });
            println!("{out}");
        }
        Format::Table => {
            println!("group {}: total lag {total} over {} partition(s)", a.group, lags.len());
            println!("{:<40} {:>9} {:>12} {:>12} {:>10}", "topic", "partition", "committed", "end", "lag");
            for l in &lags {
                println!("{:<40} {:>9} {:>12} {:>12} {:>10}", l.topic, l.partition, l.committed, l.end, l.lag);
            }
            if let Some(ready) = ready {
                println!("pipeline health: {ready}");
            }
            for line in pipeline.iter().flat_map(blockers) {
                println!("{line}");
            }
        }
    }
    Ok(())
}

/// Committed offset, end and lag of every partition `group` committed to, in `topics` (all topics
/// but Kafka's internal ones when empty).
pub fn group_lag(bootstrap: &str, group: &str, topics: &[String]) -> Result<Vec<PartitionLag>> {
    let consumer: BaseConsumer<crate::client::Hooks> = client_config(bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create_with_context(crate::client::Hooks)
        .context("creating the Kafka consumer")?;
    let metadata = consumer.fetch_metadata(None, REQUEST_TIMEOUT).map_err(|e| {
        // librdkafka queues its log lines for the consumer's poll: serve them, so that the error
        // can say why a broker refused the connection.
        let _ = consumer.poll(std::time::Duration::ZERO);
        unreachable_error(bootstrap, e)
    })?;
    let mut tpl = TopicPartitionList::new();
    for t in metadata.topics() {
        let wanted = if topics.is_empty() { !t.name().starts_with("__") } else { topics.iter().any(|n| n == t.name()) };
        if wanted {
            for p in t.partitions() {
                tpl.add_partition(t.name(), p.id());
            }
        }
    }
    if let Some(missing) = topics.iter().find(|n| !metadata.topics().iter().any(|t| t.name() == n.as_str())) {
        bail!("topic {missing} does not exist");
    }
    if tpl.count() == 0 {
        return Ok(Vec::new());
    }
    let committed = consumer
        .committed_offsets(tpl, REQUEST_TIMEOUT)
        .with_context(|| format!("reading the committed offsets of group {group}"))?;
    let mut out = Vec::new();
    for e in committed.elements() {
        let Offset::Offset(at) = e.offset() else { continue }; // nothing committed there
        let (_, end) = consumer
            .fetch_watermarks(e.topic(), e.partition(), REQUEST_TIMEOUT)
            .with_context(|| format!("reading the end of {} [{}]", e.topic(), e.partition()))?;
        out.push(PartitionLag {
            topic: e.topic().to_owned(),
            partition: e.partition(),
            committed: at,
            end,
            lag: (end - at).max(0),
        });
    }
    out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    Ok(out)
}

/// The head-of-line records of the partitions the pipeline's `/status` shows with records in
/// flight, one line each.
fn blockers(status: &serde_json::Value) -> Vec<String> {
    let partitions = status["partitions"].as_array().into_iter().flatten();
    let held = partitions.filter(|p| p["in_flight"].as_u64().unwrap_or(0) > 0);
    held.map(|p| {
        let mut line = format!(
            "head of line {} [{}]: offset {}, held {:.1} s",
            p["topic"].as_str().unwrap_or_default(),
            p["partition"],
            p["completed"],
            p["head_of_line_age_s"].as_f64().unwrap_or(0.0)
        );
        let b = &p["blocker"];
        if !b.is_null() {
            line += &format!(
                ", key {}, {} failed attempt(s), last error: {}",
                b["key"].as_str().unwrap_or("(none)"),
                b["failed_attempts"],
                b["last_error"].as_str().unwrap_or_default()
            );
        }
        line
    })
    .collect()
}

/// The pipeline's answer at `path` (JSON), from its HTTP listener at `url`.
async fn get_json(url: &str, path: &str) -> Result<serde_json::Value> {
    let url = format!("{}/{path}", url.trim_end_matches('/'));
    let response = reqwest::get(&url).await.with_context(|| format!("GET {url}"))?;
    let body = response.text().await.with_context(|| format!("reading {url}"))?;
    serde_json::from_str(&body).with_context(|| format!("{url} did not answer JSON: {body}"))
}
