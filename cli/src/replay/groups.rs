//! The replay groups of a DLQ topic and how far each got: what `millrace dlq stats` shows as replay
//! state. A replay group is one named by [`default_group`](super::default_group):
//! `millrace-replay.<dlq-topic>` or `millrace-replay.<dlq-topic>.<filter hash>` (a `--group` of
//! another name is not found).

use crate::read::{DlqRecord, REQUEST_TIMEOUT, client_config, unreachable_error};
use anyhow::{Context as _, Result};
use millrace::dlq::replay_count;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::Serialize;
use std::collections::BTreeMap;

/// One replay group's position on the DLQ and the records on either side of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReplayGroup {
    /// The consumer group.
    pub group: String,
    /// Records below its committed offsets: handled by it (replayed, exhausted, filtered out or
    /// skipped for want of headers).
    pub committed_past: u64,
    /// Records at or above them (or in partitions it never committed): a run of this group would
    /// read them.
    pub outstanding: u64,
    /// The outstanding records by replay count (`millrace.replay.count`; 0 when absent).
    pub outstanding_by_replay_count: BTreeMap<u32, u64>,
    /// Its committed offset per DLQ partition.
    #[serde(skip)]
    pub committed: BTreeMap<i32, i64>,
}

impl ReplayGroup {
    /// Counts one record of the DLQ.
    pub fn add(&mut self, record: &DlqRecord) {
        let at = self.committed.get(&record.record.partition).copied().unwrap_or(0);
        if record.record.offset < at {
            self.committed_past += 1;
        } else {
            self.outstanding += 1;
            *self.outstanding_by_replay_count.entry(replay_count(&record.record.headers)).or_default() += 1;
        }
    }
}

/// Whether `group` is a replay group of `dlq_topic`.
pub fn is_replay_group(group: &str, dlq_topic: &str) -> bool {
    let default = format!("millrace-replay.{dlq_topic}");
    group == default || group.strip_prefix(&default).and_then(|rest| rest.strip_prefix('.')).is_some_and(is_hash)
}

fn is_hash(s: &str) -> bool {
    s.len() == 8 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The replay groups of `dlq_topic` known to the cluster, with their committed offsets on it.
pub fn find(bootstrap: &str, dlq_topic: &str) -> Result<Vec<ReplayGroup>> {
    let consumer: BaseConsumer<crate::client::Hooks> =
        client_config(bootstrap).create_with_context(crate::client::Hooks).context("creating the Kafka consumer")?;
    let list = tokio::task::block_in_place(|| consumer.fetch_group_list(None, REQUEST_TIMEOUT)).map_err(|e| {
        let _ = consumer.poll(std::time::Duration::ZERO);
        unreachable_error(bootstrap, e)
    })?;
    let mut names: Vec<String> =
        list.groups().iter().map(|g| g.name().to_owned()).filter(|g| is_replay_group(g, dlq_topic)).collect();
    names.sort();
    let mut groups = Vec::new();
    for group in names {
        let lag = tokio::task::block_in_place(|| crate::status::group_lag(bootstrap, &group, &[dlq_topic.to_owned()]))?;
        let committed = lag.iter().map(|p| (p.partition, p.committed)).collect();
        groups.push(ReplayGroup { group, committed, ..ReplayGroup::default() });
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace::OutputRecord;
    use millrace::dlq::headers;

    #[test]
    fn replay_groups_are_the_default_names() {
        assert!(is_replay_group("millrace-replay.orders.dlq", "orders.dlq"));
        assert!(is_replay_group("millrace-replay.orders.dlq.0f8bfe25", "orders.dlq"));
        assert!(!is_replay_group("millrace-replay.orders.dlq.other", "orders.dlq"));
        assert!(!is_replay_group("millrace-replay.orders", "orders.dlq"));
        assert!(!is_replay_group("billing", "orders.dlq"));
    }

    #[test]
    fn records_below_the_committed_offset_are_handled() {
        let mut g = ReplayGroup { committed: BTreeMap::from([(0, 2)]), ..ReplayGroup::default() };
        for (partition, offset, count) in [(0, 0, None), (0, 1, None), (0, 2, Some("3")), (1, 0, None)] {
            let mut out = OutputRecord::to("orders.dlq");
            if let Some(n) = count {
                out = out.header(headers::REPLAY_COUNT, n);
            }
            g.add(&DlqRecord::written(out, partition, offset));
        }
        assert_eq!((g.committed_past, g.outstanding), (2, 2));
        assert_eq!(g.outstanding_by_replay_count, BTreeMap::from([(0, 1), (3, 1)]));
    }
}
