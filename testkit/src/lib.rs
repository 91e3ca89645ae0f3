//! Kafka helpers shared by Millrace's integration tests, the chaos harness and the benchmarks, which
//! all run against a real broker (address from `KAFKA_BOOTSTRAP_SERVERS`, default `127.0.0.1:9092`,
//! unless a caller names one).
//!
//! - names and waits: [`unique`], [`eventually`];
//! - topics and groups: [`Admin`], [`create_topic`], [`create_topic_with`];
//! - offsets: [`end_offsets`], [`watermarks`], [`record_count`], [`committed_offsets`], [`Watermarks`];
//! - producing: [`produce`], [`keyed_records`], [`produce_raw`];
//! - reading back: [`read_topic`], [`read_topic_as`], [`TopicReader`];
//! - the secured listeners: [`secure`];
//! - Kafka's own tools: [`kafka_tool`], [`console_produce`], [`stored_codecs`];
//! - child processes: [`Reaped`], [`signal`], [`wait_exit`], [`proc_status_kib`], [`rss_kib`].
//!
//! Errors are `anyhow` errors: these are test and benchmark fixtures, whose callers only report them.

mod admin;
mod offsets;
mod process;
mod produce;
mod read;
pub mod secure;
mod tool;

pub use admin::{Admin, create_topic, create_topic_with};
pub use offsets::{Isolation, Watermarks, committed_offsets, end_offsets, record_count, watermarks};
pub use process::{Reaped, proc_status_kib, rss_kib, signal, wait_exit};
pub use produce::{RawRecord, Written, keyed_records, produce, produce_raw};
pub use read::{ReadRecord, TopicReader, read_topic, read_topic_as};
pub use tool::{console_produce, data_dir, kafka_tool, stored_codecs};

use anyhow::{Result, bail};
use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use std::time::{Duration, Instant};

/// The broker address from the environment (`KAFKA_BOOTSTRAP_SERVERS`, default `127.0.0.1:9092`).
pub fn bootstrap() -> String {
    millrace::PipelineConfig::bootstrap_from_env()
}

/// A name no other test or benchmark run uses: `prefix-<pid>-<random>`.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{:08x}", std::process::id(), rand::random::<u32>())
}

/// Polls `check` every 50 ms until it returns `Some`, or fails after `timeout` with `what` (used only
/// for state outside this process, such as a child's journal or the group's committed offsets).
pub async fn eventually<T>(what: &str, timeout: Duration, check: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    poll_until(what, timeout, false, check).await
}

/// Like [`eventually`], but a failed check counts as "not yet" (the last error is reported if the
/// timeout runs out): for reads that race a broker just restarted, whose group coordinator may
/// not answer for a while (e.g. committed offsets, which wait for pending transactional offsets to
/// settle), where the read failing says nothing about what is being waited for.
pub async fn eventually_despite_errors<T>(
    what: &str,
    timeout: Duration,
    check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    poll_until(what, timeout, true, check).await
}

/// Waits until `group` has committed every record of `topic`: its committed offsets equal the
/// partitions' end offsets as read now (polled like [`eventually`]).
pub async fn committed_to_end(group: &str, topic: &str, partitions: i32, timeout: Duration) -> Result<()> {
    let ends = end_offsets(topic, partitions)?;
    eventually(&format!("group {group} to commit to the end of {topic}"), timeout, || {
        Ok((committed_offsets(group, topic, partitions)? == ends).then_some(()))
    })
    .await
}

/// Polls `check` every 50 ms until it returns `Some` or `timeout` passes; an error ends the wait
/// unless `tolerate_errors`, when it counts as "not yet" and the last one is reported at the end.
async fn poll_until<T>(
    what: &str,
    timeout: Duration,
    tolerate_errors: bool,
    mut check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    let mut last_error = None;
    loop {
        match check() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) if tolerate_errors => last_error = Some(e),
            Err(e) => return Err(e),
        }
        if Instant::now() > deadline {
            match last_error {
                Some(e) => bail!("timed out after {timeout:?} waiting for {what}; the last check failed: {e:#}"),
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A consumer of `bootstrap` without auto-commit, in `group` if given (for metadata, watermarks,
/// committed offsets, or an assigned reader).
fn plain_consumer(bootstrap: &str, group: Option<&str>) -> Result<BaseConsumer> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap).set("enable.auto.commit", "false");
    if let Some(g) = group {
        c.set("group.id", g);
    }
    Ok(c.create()?)
}
