//! Creating a pipeline's topics before it runs: for examples, tests and a first deploy. Production
//! clusters usually create topics through their own tooling; the pipeline itself creates only what
//! it owns (DLQ, dedup changelog), sized like its inputs.

use crate::config::PipelineConfig;
use crate::error::Error;
use crate::kafka::config::admin_config;
use crate::kafka::topic;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use std::sync::Arc;

/// Creates each of `topics` that does not exist, with `partitions` partitions and the broker's
/// default replication, using `config`'s brokers and client settings (security included); then
/// waits until every partition answers, so the first produce does not race the creation.
///
/// A refusal by the ACLs is [`Error::NotAuthorized`]; any other failure (brokers away, an invalid
/// partition count) is [`Error::TopicCreation`], naming the topic and the brokers.
///
/// ```no_run
/// # async fn f() -> Result<(), millrace::Error> {
/// use millrace::PipelineConfig;
/// let config = PipelineConfig::new("127.0.0.1:9092", "billing", ["orders"]);
/// millrace::create_topics(&config, &["orders", "invoices"], 4).await?;
/// # Ok(()) }
/// ```
pub async fn create_topics(config: &PipelineConfig, topics: &[&str], partitions: i32) -> Result<(), Error> {
    let admin: AdminClient<DefaultClientContext> = admin_config(config).create()?;
    let admin = Arc::new(admin);
    for name in topics {
        let failed = |reason: String| Error::TopicCreation {
            topic: (*name).to_owned(),
            bootstrap: config.bootstrap_servers.clone(),
            reason,
        };
        topic::create(&admin, name, partitions, &[]).await.map_err(|e| match e.refusal("topic", name) {
            Ok(refused) => refused,
            Err(reason) => failed(reason),
        })?;
    }
    Ok(())
}
