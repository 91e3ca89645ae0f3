//! The independent checkers. They share nothing with the pipeline under test: they read the output
//! and DLQ topics back with their own consumers (`read_committed`, after the run and concurrently
//! with it), and read the journals and ledgers the worker writes outside Kafka.

use crate::fleet::Slot;
use crate::outcome::Outcome;
use anyhow::Result;
use millrace_integration_tests::{
    Isolation, ReadRecord, Watermarks, bootstrap, committed_offsets, end_offsets, eventually, read_topic_as, unique,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// What a read of the copier's output found: each input value's count, and per key the input
/// offsets of its outputs in output order.
#[derive(Debug, Default)]
pub struct Tally {
    /// Times each input value was seen.
    pub seen: HashMap<Vec<u8>, u32>,
    /// Per key: the input (partition, offset) of each output, in output order.
    pub by_key: HashMap<Vec<u8>, Vec<(i32, i64)>>,
    /// Records not in the copier's `<partition> <offset> <value>` shape.
    pub malformed: usize,
}

impl Tally {
    /// Counts copier outputs.
    pub fn add(&mut self, records: &[ReadRecord]) {
        for r in records {
            let v = r.value.as_deref().unwrap_or_default();
            let mut parts = v.splitn(3, |b| *b == b' ');
            let parsed = (|| {
                let p = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
                let o = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
                Some((p, o, parts.next()?.to_vec()))
            })();
            let Some((p, o, value)) = parsed else {
                self.malformed += 1;
                continue;
            };
            *self.seen.entry(value).or_default() += 1;
            self.by_key.entry(r.key.clone().unwrap_or_default()).or_default().push((p, o));
        }
    }

    /// Counts raw values (the DLQ holds the input records as they were).
    pub fn add_raw(&mut self, records: &[ReadRecord]) {
        for r in records {
            *self.seen.entry(r.value.clone().unwrap_or_default()).or_default() += 1;
        }
    }

    /// Copies beyond the first.
    pub fn duplicates(&self) -> usize {
        self.seen.values().map(|&n| n as usize - 1).sum()
    }

    /// Outputs of one key that do not follow input order (same key → same input partition, so the
    /// input offsets must increase): E3.
    pub fn order_violations(&self) -> usize {
        self.by_key.values().map(|v| v.windows(2).filter(|w| !(w[0].0 == w[1].0 && w[0].1 < w[1].1)).count()).sum()
    }

    /// Inputs of `expected` never seen, and seen values not in `expected`.
    pub fn compare(&self, expected: &[Vec<u8>]) -> (usize, usize) {
        let lost = expected.iter().filter(|v| !self.seen.contains_key(*v)).count();
        let set: HashSet<&Vec<u8>> = expected.iter().collect();
        let unexpected = self.seen.keys().filter(|v| !set.contains(v)).count();
        (lost, unexpected)
    }
}

/// Reads a whole topic as `read_committed` after the run, as copier outputs.
pub fn final_tally(topic: &str) -> Result<Tally> {
    let mut t = Tally::default();
    t.add(&read_topic_as(topic, Isolation::ReadCommitted)?);
    Ok(t)
}

/// A `read_committed` reader running beside the pipeline from its start, counting what it sees. It
/// rides out broker outages (errors are counted, not fatal).
pub struct ConcurrentReader {
    stop: Arc<AtomicBool>,
    read: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<(Tally, usize)>,
}

impl ConcurrentReader {
    /// Starts reading every partition of `topic` (which must exist) from the beginning.
    pub fn start(topic: &str, partitions: i32) -> Result<Self> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("group.id", unique("chaos-reader"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let read = Arc::new(AtomicUsize::new(0));
        let read2 = read.clone();
        let thread = std::thread::spawn(move || {
            let mut tally = Tally::default();
            let mut errors = 0;
            while !stop2.load(Relaxed) {
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => {
                        tally.add(&[ReadRecord {
                            partition: m.partition(),
                            offset: m.offset(),
                            key: m.key().map(<[u8]>::to_vec),
                            value: m.payload().map(<[u8]>::to_vec),
                            headers: Default::default(),
                        }]);
                        read2.fetch_add(1, Relaxed);
                    }
                    Some(Err(_)) => errors += 1,
                    None => {}
                }
            }
            (tally, errors)
        });
        Ok(Self { stop, read, thread })
    }

    /// Lets the reader catch up to `goal` outputs (up to 30 s), stops it and returns its tally and
    /// the number of errors it rode out.
    pub async fn finish(self, goal: usize) -> (Tally, usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && !self.thread.is_finished() && self.read.load(Relaxed) < goal {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.stop.store(true, Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Waits until the read_committed and read_uncommitted end offsets of `topic` agree (E4: no
/// transaction left hanging), for up to `timeout`. Returns whether they did.
pub async fn no_hanging_transactions(topic: &str, partitions: i32, timeout: Duration) -> Result<bool> {
    let committed = Watermarks::new(Isolation::ReadCommitted)?;
    let uncommitted = Watermarks::new(Isolation::ReadUncommitted)?;
    let r = eventually("read_committed and read_uncommitted ends to agree", timeout, || {
        Ok((committed.ends(topic, partitions)? == uncommitted.ends(topic, partitions)?).then_some(()))
    })
    .await;
    Ok(r.is_ok())
}

/// Whether the output currently has a transaction open (written but not yet committed records).
pub fn transaction_open(committed: &Watermarks, uncommitted: &Watermarks, topic: &str, partitions: i32) -> bool {
    match (committed.ends(topic, partitions), uncommitted.ends(topic, partitions)) {
        (Ok(c), Ok(u)) => c != u,
        _ => false,
    }
}

/// The group's committed input offsets summed over partitions (`None` while the broker does not
/// answer).
pub fn committed_total(group: &str, topic: &str, partitions: i32) -> Option<i64> {
    committed_offsets(group, topic, partitions).ok().map(|c| c.values().sum())
}

/// A broker outage or an abort is retried, not crashed on: the worker in `slot` must never have
/// exited unless the harness killed or stopped it.
pub fn no_unexpected_exits(outcome: &mut Outcome, slot: &Slot) {
    outcome.check(
        slot.unexpected_exits.is_empty(),
        format!(
            "the copier exited by itself {} times (exit codes {:?})",
            slot.unexpected_exits.len(),
            slot.unexpected_exits
        ),
    );
}

/// Waits until the group has committed the whole input (`committed offsets = end offsets`), for up
/// to `timeout`; calls `tick` every poll (to restart exited workers). Returns whether it did.
pub async fn wait_all_committed(
    group: &str,
    topic: &str,
    partitions: i32,
    timeout: Duration,
    mut tick: impl FnMut() -> Result<()>,
) -> Result<bool> {
    let ends = end_offsets(topic, partitions)?;
    let deadline = Instant::now() + timeout;
    let mut last = None;
    while Instant::now() < deadline {
        tick()?;
        match committed_offsets(group, topic, partitions) {
            Ok(c) if c == ends => return Ok(true),
            Ok(c) => last = Some(c),
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // For the record of a stall: which partitions stayed behind.
    println!("  stall: group {group} committed {last:?}, end offsets {ends:?}");
    Ok(false)
}

/// The standard exactly-once checks of a copier run: set equality against `expected`, no duplicate
/// for the final and the concurrent `read_committed` readers, input order per key, no hanging
/// transaction, committed offsets at the input's end. Fills `lost` and `duplicated`.
pub async fn exactly_once_checks(
    outcome: &mut Outcome,
    expected: &[Vec<u8>],
    output: &str,
    output_partitions: i32,
    reader: ConcurrentReader,
    all_committed: bool,
) -> Result<Tally> {
    let final_tally = final_tally(output)?;
    let outputs = final_tally.seen.values().map(|&n| n as usize).sum::<usize>() + final_tally.malformed;
    let (concurrent, reader_errors) = reader.finish(outputs).await;
    let (lost, unexpected) = final_tally.compare(expected);
    outcome.lost = lost;
    outcome.duplicated = final_tally.duplicates().max(concurrent.duplicates());
    outcome.check(all_committed, "committed offsets never reached the input's end offsets (stall)");
    outcome.check(lost == 0, format!("{lost} inputs missing from the read_committed output"));
    outcome.check(unexpected == 0, format!("{unexpected} outputs that match no input"));
    outcome.check(final_tally.malformed == 0, format!("{} malformed outputs", final_tally.malformed));
    outcome.check(
        final_tally.duplicates() == 0,
        format!("{} duplicates for the final read_committed reader", final_tally.duplicates()),
    );
    outcome.check(
        concurrent.duplicates() == 0,
        format!("{} duplicates for the concurrent read_committed reader", concurrent.duplicates()),
    );
    let order = final_tally.order_violations();
    outcome.check(order == 0, format!("{order} outputs out of input order for their key (E3)"));
    let settled = no_hanging_transactions(output, output_partitions, Duration::from_secs(20)).await?;
    outcome.check(settled, "a transaction was left hanging: read_committed and read_uncommitted ends differ (E4)");
    outcome.note(format!(
        "final read_committed reader: {} distinct, {} duplicates; concurrent reader: {} distinct, {} duplicates ({} errors ridden out); committed offsets = end offsets: {all_committed}; no hanging transaction: {settled}",
        final_tally.seen.len(),
        final_tally.duplicates(),
        concurrent.seen.len(),
        concurrent.duplicates(),
        reader_errors
    ));
    Ok(final_tally)
}
