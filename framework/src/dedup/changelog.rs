//! The dedup store's changelog: every recorded key is also produced to the topic
//! `<group>.dedup-changelog` (same partition number as the input record, source topic in a header,
//! keys in batch records: [`crate::dedup::entries`]),
//! and a partition's keys are restored from it when the partition is assigned, so that a partition
//! moving to an instance with an empty disk still rejects duplicates. The topic is compacted and
//! deleted by age ([`topic_configs`]), so keys past the TTL leave it and a restore reads live keys.

use crate::dedup::entries::for_each_entry;
use crate::dedup::runtime::{Dedup, SOURCE_TOPIC_HEADER};
use crate::kafka::config::restore_consumer_config;
use crate::kafka::produce::{acknowledged, enqueue};
use crate::kafka::topic;
use crate::processor::Processor;
use crate::record::Record;
use crate::retry::Backoff;
use crate::shared::Shared;
use crate::stats::Stats;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers as _, Message};
use rdkafka::{Offset, TopicPartitionList};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Records `key` as processed: in the changelog (acknowledged), then locally, in its partition's
/// next batch ([`crate::dedup::group_commit`]), retrying until it is done or `cancel` fires.
/// Returns whether it was recorded.
pub(crate) async fn record<P: Processor>(
    shared: &Arc<Shared<P>>,
    dedup: &Dedup,
    record: &Record,
    key: &[u8],
    cancel: &CancellationToken,
) -> bool {
    let now = crate::clock::now_ms();
    let mut backoff = Backoff::from_policy(&shared.config.retry, Duration::from_millis(100));
    loop {
        let written = dedup.group_commit.add(shared, &record.topic, record.partition, key, now);
        let written = tokio::select! {
            written = written => written.unwrap_or_else(|_| Err("the dedup writer stopped".to_owned())),
            _ = cancel.cancelled() => return false,
        };
        match written {
            Ok(()) => return true,
            Err(e) => shared.log.warn("dedup write failed; the record stays uncommitted", &e),
        }
        if !backoff.wait(cancel).await {
            return false;
        }
    }
}

/// Writes one batch of `topic`/`partition`'s keys: to the changelog, acknowledged, then to the
/// local store in one write.
pub(crate) async fn write_batch<P: Processor>(
    shared: &Arc<Shared<P>>,
    topic: &str,
    partition: i32,
    entries: &[(Vec<u8>, i64)],
) -> Result<(), String> {
    let dedup = shared.dedup.as_ref().ok_or("the dedup store is off")?;
    let local = || {
        let part = dedup.store.partition(topic, partition)?;
        let mut batch = dedup.store.batch();
        for (key, at) in entries {
            batch.record(&part, key, *at);
        }
        batch.write()
    };
    if !dedup.config.changelog {
        return local().map_err(|e| e.to_string());
    }
    // The changelog first, the local store after: a crash in between leaves the key only in the
    // changelog (the record runs again here: the documented window), never only on this disk, from
    // where a redelivery would be skipped and committed while another instance, restored from the
    // changelog, would not know the key (found by the chaos suite, seeds 3 and 7).
    ensure_changelog(shared, dedup).await?;
    let mut deliveries = Vec::new();
    for out in dedup.changelog_batches(topic, partition, entries.iter().map(|(k, at)| (&k[..], *at))) {
        deliveries.push(enqueue(&shared.handles.producer, &out).await.map_err(|e| e.to_string())?);
    }
    let mut next = 0;
    for delivery in deliveries {
        // The delivery report says where the batch landed: the local store is current up to there.
        next = next.max(acknowledged(&dedup.changelog, delivery).await.map_err(|e| e.to_string())? + 1);
    }
    local().map_err(|e| e.to_string())?;
    dedup.note_position(topic, partition, next)
}

/// The changelog topic's settings for a store with `ttl`: compacted (one entry per key) and deleted
/// by age (`retention.ms` = the TTL), in segments of a tenth of the TTL (1 s to 1 day), so an expired
/// key leaves the changelog with its segment: a key lives there at most the TTL plus a segment plus
/// the broker's `log.retention.check.interval.ms`. An entry is produced after its key's first-seen
/// time, so no segment holding a live key is older than the TTL.
pub(crate) fn topic_configs(ttl: Duration) -> [(&'static str, String); 3] {
    let ttl_ms = ttl.as_millis().min(i64::MAX as u128) as i64;
    let segment_ms = (ttl_ms / 10).clamp(1_000, 24 * 3600 * 1000);
    [
        ("cleanup.policy", "compact,delete".to_owned()),
        ("retention.ms", ttl_ms.to_string()),
        ("segment.ms", segment_ms.to_string()),
    ]
}

/// Creates the changelog topic once per run (partitions = the largest input topic's; settings:
/// [`topic_configs`]), and warns when an existing one keeps expired keys.
async fn ensure_changelog<P: Processor>(shared: &Arc<Shared<P>>, dedup: &Dedup) -> Result<(), String> {
    if dedup.changelog_ready.load(Relaxed) {
        return Ok(());
    }
    let configs = topic_configs(dedup.config.ttl);
    let configs: Vec<(&str, &str)> = configs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let ensured = topic::ensure(&shared.admin, &dedup.changelog, &shared.config.topics, &configs);
    match ensured.await.map_err(|e| e.refusal("dedup changelog topic", &dedup.changelog)) {
        Ok(()) => {}
        // Not allowed to see or create the changelog: stop rather than retry for ever.
        Err(Ok(error)) => {
            let said = error.to_string();
            shared.log.stop_with(error);
            return Err(said);
        }
        Err(Err(e)) => return Err(e),
    }
    check_retention(shared, &dedup.changelog, &configs).await;
    dedup.changelog_ready.store(true, Relaxed);
    Ok(())
}

/// Warns (once per run) when the changelog topic's cleanup policy or retention differ from
/// [`topic_configs`] (a topic created by an earlier version is compact-only and grows with every
/// key ever seen), naming the command that fixes it. Settings are not altered: the non-incremental
/// `AlterConfigs` would reset the topic's other settings.
async fn check_retention<P: Processor>(shared: &Arc<Shared<P>>, changelog: &str, wanted: &[(&str, &str)]) {
    let found = match topic::configs_of(&shared.admin, changelog).await {
        Ok(found) => found,
        Err(e) => {
            tracing::debug!(topic = changelog, error = %e, "could not read the dedup changelog's settings");
            return;
        }
    };
    let differ: Vec<String> = wanted
        .iter()
        .filter(|(k, v)| found.get(*k).map(String::as_str) != Some(*v))
        // kafka-configs.sh takes a list value in brackets.
        .map(|(k, v)| if v.contains(',') { format!("{k}=[{v}]") } else { format!("{k}={v}") })
        .collect();
    if !differ.is_empty() {
        let command = format!(
            "kafka-configs.sh --bootstrap-server <brokers> --alter --entity-type topics --entity-name {changelog} --add-config '{}'",
            differ.join(",")
        );
        tracing::warn!(
            topic = changelog,
            found = ?wanted.iter().map(|(k, _)| format!("{k}={}", found.get(*k).map_or("?", String::as_str))).collect::<Vec<_>>(),
            fix = %command,
            "the dedup changelog keeps expired keys (its settings differ from the TTL's): it grows with every key and a restore reads them all"
        );
    }
}

/// Applies the changelog of `topic`/`partition` to the local store, from where the store left off to
/// the changelog's end, within `restore_timeout`. Returns the entries applied.
pub(crate) async fn restore<P: Processor>(shared: &Arc<Shared<P>>, topic: &str, partition: i32) -> usize {
    let Some(dedup) = &shared.dedup else { return 0 };
    if !dedup.config.changelog {
        return 0;
    }
    if let Err(e) = ensure_changelog(shared, dedup).await {
        tracing::warn!(topic, partition, error = %e, "dedup changelog unavailable; not restored");
        return 0;
    }
    let started = Instant::now();
    let deadline = started + dedup.config.restore_timeout;
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        let (shared2, topic2) = (shared.clone(), topic.to_owned());
        let result = tokio::task::spawn_blocking(move || apply(&shared2, &topic2, partition, deadline))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        match result {
            Ok((applied, complete)) => {
                let secs = started.elapsed().as_secs_f64();
                shared.telemetry.stats.dedup_restored.fetch_add(applied as u64, Relaxed);
                if complete {
                    Stats::bump(&shared.telemetry.stats.dedup_restores);
                }
                if applied > 0 || !complete {
                    tracing::info!(
                        topic,
                        partition,
                        applied,
                        complete,
                        seconds = secs,
                        rate = applied as f64 / secs.max(1e-9),
                        "dedup store restored from the changelog"
                    );
                }
                if !complete {
                    tracing::warn!(topic, partition, "dedup restore timed out; duplicates of unrestored keys may run");
                }
                return applied;
            }
            // A new changelog partition may have no leader yet, a leader may be moving: retry.
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(topic, partition, failures = backoff.failures() + 1, error = %e, "dedup restore failed; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(e) => {
                tracing::warn!(topic, partition, error = %e, "dedup restore failed until its deadline; continuing without it");
                return 0;
            }
        }
    }
}

fn apply<P: Processor>(
    shared: &Shared<P>,
    topic: &str,
    partition: i32,
    deadline: Instant,
) -> Result<(usize, bool), String> {
    let dedup = shared.dedup.as_ref().expect("checked by restore");
    let part = dedup.store.partition(topic, partition).map_err(|e| e.to_string())?;
    let from = part.changelog_position().map_err(|e| e.to_string())?;
    let c = restore_consumer_config(&shared.config);
    let consumer: BaseConsumer = c.create().map_err(|e| e.to_string())?;
    let (low, high) =
        consumer.fetch_watermarks(&dedup.changelog, partition, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    let start = from.max(low);
    if start >= high {
        return Ok((0, true));
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&dedup.changelog, partition, Offset::Offset(start)).map_err(|e| e.to_string())?;
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    let mut applied = 0;
    let mut next = start;
    while next < high {
        if Instant::now() > deadline {
            part.set_changelog_position(next).map_err(|e| e.to_string())?;
            return Ok((applied, false));
        }
        let msg = match consumer.poll(Duration::from_millis(200)) {
            None => continue,
            // Nothing committed beyond here (the rest is markers, or a transaction still open).
            Some(Err(KafkaError::PartitionEOF(_))) => break,
            Some(other) => other.map_err(|e| e.to_string())?,
        };
        next = msg.offset() + 1;
        let source = msg.headers().and_then(|h| h.iter().find(|x| x.key == SOURCE_TOPIC_HEADER).and_then(|x| x.value));
        if source.is_some_and(|s| s != topic.as_bytes()) {
            continue; // another input topic's key in the same changelog partition
        }
        let mut batch = dedup.store.batch();
        applied += for_each_entry(msg.key(), msg.payload(), |key, at| batch.record(&part, key, at));
        batch.write().map_err(|e| e.to_string())?;
    }
    part.set_changelog_position(next).map_err(|e| e.to_string())?;
    Ok((applied, true))
}

#[cfg(test)]
mod tests {
    use super::topic_configs;
    use std::time::Duration;

    #[test]
    fn the_changelog_is_deleted_by_the_ttl_in_tenths_of_it() {
        let week = topic_configs(Duration::from_secs(7 * 24 * 3600));
        assert_eq!(week[0], ("cleanup.policy", "compact,delete".to_owned()));
        assert_eq!(week[1], ("retention.ms", "604800000".to_owned()));
        assert_eq!(week[2], ("segment.ms", "60480000".to_owned()));
        // A tenth of a second-scale TTL is raised to 1 s; of a year, capped at a day.
        assert_eq!(topic_configs(Duration::from_secs(3))[2].1, "1000");
        assert_eq!(topic_configs(Duration::from_secs(365 * 24 * 3600))[2].1, "86400000");
    }
}
