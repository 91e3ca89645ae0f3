//! Creating a topic the pipeline writes to on its own (a DLQ topic, the dedup changelog), and
//! waiting until the broker can take writes to it.
//!
//! A topic is not writable when `CreateTopics` returns: the broker learns the new partitions from
//! the metadata log and creates their logs a little later, and meanwhile answers produce requests
//! with `NOT_LEADER_OR_FOLLOWER`. Another member (or another partition task of this one) that gets
//! `TOPIC_ALREADY_EXISTS` may be even earlier. Writing in that window made librdkafka's idempotent
//! producer report a refused record as delivered (issue 12, item 3; see
//! [`crate::kafka::produce::confirmed`]), so [`ensure`] returns only once every partition answers a
//! `ListOffsets` request, which the broker serves from the partition's log.

use crate::retry::Backoff;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long to wait for a created topic's partitions to take writes.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Creates `name` unless it exists, with as many partitions as the largest of `sized_like`
/// (replication: the broker's default) and `configs`; then waits until each partition answers. The
/// error says what failed, for a log line; callers retry.
pub(crate) async fn ensure(
    admin: &Arc<AdminClient<DefaultClientContext>>,
    name: &str,
    sized_like: &[String],
    configs: &[(&str, &str)],
) -> Result<(), String> {
    let partitions = blocking(admin, {
        let sized_like = sized_like.to_vec();
        move |admin| partition_count(admin, &sized_like)
    })
    .await?;
    let mut new = NewTopic::new(name, partitions, TopicReplication::Fixed(-1));
    for (k, v) in configs {
        new = new.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics([&new], &opts).await.map_err(|e| e.to_string())? {
        match result {
            Ok(_) => tracing::info!(topic = name, partitions, "created topic"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => return Err(format!("creating topic {t}: {e}")),
        }
    }
    let topic = name.to_owned();
    blocking(admin, move |admin| wait_writable(admin, &topic)).await
}

/// The largest partition count among `topics` (at least 1).
fn partition_count(admin: &AdminClient<DefaultClientContext>, topics: &[String]) -> Result<i32, String> {
    let mut most = 1;
    for t in topics {
        let md = admin.inner().fetch_metadata(Some(t), Duration::from_secs(10)).map_err(|e| e.to_string())?;
        most = most.max(md.topics().first().map_or(1, |t| t.partitions().len()));
    }
    Ok(most as i32)
}

/// Waits until every partition of `topic` answers `ListOffsets`, within [`READY_TIMEOUT`].
fn wait_writable(admin: &AdminClient<DefaultClientContext>, topic: &str) -> Result<(), String> {
    let client = admin.inner();
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));
    let partitions = loop {
        let md = client.fetch_metadata(Some(topic), Duration::from_secs(10)).map_err(|e| e.to_string())?;
        match md.topics().first() {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => break t.partitions().len() as i32,
            _ if Instant::now() > deadline => return Err(format!("topic {topic} not in the metadata")),
            _ => backoff.sleep(),
        }
    };
    for p in 0..partitions {
        loop {
            match client.fetch_watermarks(topic, p, Duration::from_secs(5)) {
                Ok(_) => break,
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("topic {topic} partition {p} not ready after {READY_TIMEOUT:?}: {e}"));
                }
                Err(_) => backoff.sleep(),
            }
        }
    }
    Ok(())
}

/// Runs a blocking admin call off the runtime's worker threads.
async fn blocking<T: Send + 'static>(
    admin: &Arc<AdminClient<DefaultClientContext>>,
    call: impl FnOnce(&AdminClient<DefaultClientContext>) -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let admin = admin.clone();
    tokio::task::spawn_blocking(move || call(&admin)).await.map_err(|e| e.to_string())?
}
