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
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long to wait for a created topic's partitions to take writes.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why [`ensure`] failed.
#[derive(Debug)]
pub(crate) enum EnsureError {
    /// The ACLs refuse `operation` on the topic (or on the cluster, to create it): retrying cannot
    /// help, the caller stops the pipeline.
    Refused { operation: &'static str, source: KafkaError },
    /// Anything else, said for a log line; callers retry.
    Failed(String),
}

impl From<String> for EnsureError {
    fn from(s: String) -> Self {
        EnsureError::Failed(s)
    }
}

impl std::fmt::Display for EnsureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnsureError::Refused { operation, source } => write!(f, "{operation} refused: {source}"),
            EnsureError::Failed(s) => f.write_str(s),
        }
    }
}

impl EnsureError {
    /// The pipeline's error for a refusal on the topic `topic` (`what`: "DLQ topic", ...), or the
    /// text of any other failure.
    pub(crate) fn refusal(self, what: &str, topic: &str) -> Result<crate::Error, String> {
        match self {
            EnsureError::Refused { operation, source } => Ok(crate::Error::NotAuthorized {
                resource: format!("{what} {topic}"),
                operation,
                acl_target: format!("--topic {topic}"),
                source: Box::new(source),
            }),
            EnsureError::Failed(s) => Err(s),
        }
    }
}

/// Creates `name` unless it exists, with as many partitions as the largest of `sized_like`
/// (replication: the broker's default) and `configs`; then waits until each partition answers. A
/// refusal by the ACLs is [`EnsureError::Refused`]; any other error says what failed, for a log
/// line; callers retry.
pub(crate) async fn ensure(
    admin: &Arc<AdminClient<DefaultClientContext>>,
    name: &str,
    sized_like: &[String],
    configs: &[(&str, &str)],
) -> Result<(), EnsureError> {
    let partitions = blocking(admin, {
        let sized_like = sized_like.to_vec();
        move |admin| partition_count(admin, &sized_like)
    })
    .await?;
    create(admin, name, partitions, configs).await
}

/// Creates `name` unless it exists, with `partitions` partitions (replication: the broker's
/// default) and `configs`; then waits until each partition answers. Errors as [`ensure`]'s.
pub(crate) async fn create(
    admin: &Arc<AdminClient<DefaultClientContext>>,
    name: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) -> Result<(), EnsureError> {
    let mut new = NewTopic::new(name, partitions, TopicReplication::Fixed(-1));
    for (k, v) in configs {
        new = new.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics([&new], &opts).await.map_err(|e| e.to_string())? {
        match result {
            Ok(_) => tracing::info!(topic = name, partitions, "created topic"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((
                _,
                code @ (RDKafkaErrorCode::TopicAuthorizationFailed | RDKafkaErrorCode::ClusterAuthorizationFailed),
            )) => {
                return Err(EnsureError::Refused { operation: "CREATE", source: KafkaError::AdminOp(code) });
            }
            Err((t, e)) => return Err(format!("creating topic {t}: {e}").into()),
        }
    }
    let topic = name.to_owned();
    let admin = admin.clone();
    tokio::task::spawn_blocking(move || wait_writable(&admin, &topic)).await.map_err(|e| e.to_string())?
}

/// The settings of the topic `name` (every entry the broker describes, defaults included).
pub(crate) async fn configs_of(
    admin: &AdminClient<DefaultClientContext>,
    name: &str,
) -> Result<HashMap<String, String>, String> {
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let results = admin.describe_configs([&ResourceSpecifier::Topic(name)], &opts).await.map_err(|e| e.to_string())?;
    let resource = results.into_iter().next().ok_or("no answer")?.map_err(|e| e.to_string())?;
    Ok(resource.entries.into_iter().filter_map(|e| Some((e.name, e.value?))).collect())
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
fn wait_writable(admin: &AdminClient<DefaultClientContext>, topic: &str) -> Result<(), EnsureError> {
    let client = admin.inner();
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));
    let partitions = loop {
        let md = client.fetch_metadata(Some(topic), Duration::from_secs(10)).map_err(|e| e.to_string())?;
        match md.topics().first() {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => break t.partitions().len() as i32,
            Some(t) if t.error().map(RDKafkaErrorCode::from) == Some(RDKafkaErrorCode::TopicAuthorizationFailed) => {
                let source = KafkaError::MetadataFetch(RDKafkaErrorCode::TopicAuthorizationFailed);
                // WRITE implies DESCRIBE, and writing is what the pipeline needs.
                return Err(EnsureError::Refused { operation: "WRITE", source });
            }
            _ if Instant::now() > deadline => return Err(format!("topic {topic} not in the metadata").into()),
            _ => backoff.sleep(),
        }
    };
    for p in 0..partitions {
        loop {
            match client.fetch_watermarks(topic, p, Duration::from_secs(5)) {
                Ok(_) => break,
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("topic {topic} partition {p} not ready after {READY_TIMEOUT:?}: {e}").into());
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
