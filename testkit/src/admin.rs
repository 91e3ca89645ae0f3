//! Creating and deleting topics and consumer groups.

use crate::{bootstrap, plain_consumer};
use anyhow::{Context as _, Result, bail};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::Consumer;
use std::time::{Duration, Instant};

/// How long an admin request, and a new topic's metadata to appear, may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// An admin client of one cluster: creates topics (and waits until they are visible), deletes topics
/// and consumer groups.
pub struct Admin {
    client: AdminClient<DefaultClientContext>,
    bootstrap: String,
}

impl Admin {
    /// An admin client of the brokers `bootstrap`.
    pub fn new(bootstrap: &str) -> Result<Self> {
        let client =
            ClientConfig::new().set("bootstrap.servers", bootstrap).create().context("creating the admin client")?;
        Ok(Self { client, bootstrap: bootstrap.to_owned() })
    }

    /// An admin client of the brokers of [`bootstrap()`] (the environment's).
    pub fn from_env() -> Result<Self> {
        Self::new(&bootstrap())
    }

    /// Creates `name` with `partitions` partitions (replication factor 1: a single local broker) and
    /// the topic configs `configs`, and waits until its metadata shows every partition.
    pub async fn create_topic(&self, name: &str, partitions: i32, configs: &[(&str, &str)]) -> Result<()> {
        let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        for (k, v) in configs {
            topic = topic.set(k, v);
        }
        for result in self.client.create_topics([&topic], &options()).await.context("creating the topic")? {
            result.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
        }
        let consumer = plain_consumer(&self.bootstrap, None)?;
        let deadline = Instant::now() + ADMIN_TIMEOUT;
        loop {
            let md = consumer.fetch_metadata(Some(name), Duration::from_secs(5))?;
            if md.topics().first().is_some_and(|t| t.error().is_none() && t.partitions().len() == partitions as usize) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("topic {name} not visible after creation");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Deletes `topics`; fails if any of them could not be deleted.
    pub async fn delete_topics(&self, topics: &[&str]) -> Result<()> {
        for result in self.client.delete_topics(topics, &options()).await? {
            result.map_err(|(t, e)| anyhow::anyhow!("deleting topic {t}: {e}"))?;
        }
        Ok(())
    }

    /// Deletes `topics` and the consumer groups `groups`. Best effort: failures are only reported on
    /// stderr, so that a failed clean-up never hides a run's result.
    pub async fn clean_up(&self, topics: &[String], groups: &[String]) {
        if !topics.is_empty() {
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            match self.client.delete_topics(&names, &options()).await {
                Ok(results) => {
                    for (name, code) in results.into_iter().filter_map(Result::err) {
                        eprintln!("warning: deleting topic {name}: {code}");
                    }
                }
                Err(e) => eprintln!("warning: deleting topics {}: {e}", names.join(", ")),
            }
        }
        if groups.is_empty() {
            return;
        }
        let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
        match self.client.delete_groups(&groups, &options()).await {
            Ok(results) => {
                for (name, code) in results.into_iter().filter_map(Result::err) {
                    eprintln!("warning: deleting group {name}: {code}");
                }
            }
            Err(e) => eprintln!("warning: deleting groups: {e}"),
        }
    }
}

fn options() -> AdminOptions {
    AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)).request_timeout(Some(ADMIN_TIMEOUT))
}

/// Creates a topic with `partitions` partitions (replication 1) on the environment's brokers and
/// waits until its metadata is visible.
pub async fn create_topic(name: &str, partitions: i32) -> Result<()> {
    create_topic_with(name, partitions, &[]).await
}

/// Like [`create_topic`], with extra topic configs.
pub async fn create_topic_with(name: &str, partitions: i32, configs: &[(&str, &str)]) -> Result<()> {
    Admin::from_env()?.create_topic(name, partitions, configs).await
}
