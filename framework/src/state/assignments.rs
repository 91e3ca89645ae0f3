//! The partitions this member owns now: one [`PartitionHandle`] per assigned partition, each with
//! the epoch of its assignment. Written by the rebalance callbacks, read by the poll thread and the
//! stall watchdog.

use crate::partition::PartitionHandle;
use std::collections::HashMap;
use std::sync::Arc;

/// Starts the task of a newly assigned partition: `(topic, partition, epoch)`.
pub(crate) type Starter = Box<dyn Fn(Arc<str>, i32, u64) -> Arc<PartitionHandle> + Send + Sync>;

/// The partitions this member owns now, by topic and partition.
#[derive(Debug, Default)]
pub(crate) struct Assignments {
    by_topic: HashMap<Arc<str>, HashMap<i32, Arc<PartitionHandle>>>,
    next_epoch: u64,
}

impl Assignments {
    pub(crate) fn get(&self, topic: &str, partition: i32) -> Option<&Arc<PartitionHandle>> {
        self.by_topic.get(topic)?.get(&partition)
    }

    pub(crate) fn handles(&self) -> impl Iterator<Item = &Arc<PartitionHandle>> {
        self.by_topic.values().flat_map(HashMap::values)
    }

    pub(crate) fn insert(&mut self, topic: &str, partition: i32, start: &Starter) {
        self.next_epoch += 1;
        let topic: Arc<str> = self.by_topic.get_key_value(topic).map_or_else(|| topic.into(), |(k, _)| k.clone());
        let handle = start(topic.clone(), partition, self.next_epoch);
        self.by_topic.entry(topic).or_default().insert(partition, handle);
    }

    pub(crate) fn remove(&mut self, topic: &str, partition: i32) -> Option<Arc<PartitionHandle>> {
        let parts = self.by_topic.get_mut(topic)?;
        let handle = parts.remove(&partition);
        if parts.is_empty() {
            self.by_topic.remove(topic);
        }
        handle
    }

    pub(crate) fn drain_all(&mut self) -> Vec<Arc<PartitionHandle>> {
        self.by_topic.drain().flat_map(|(_, parts)| parts.into_values()).collect()
    }
}
