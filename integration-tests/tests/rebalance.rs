//! A second member joins and then leaves mid-stream (cooperative-sticky rebalancing): nothing is lost,
//! per-key order holds within each owner's assignment, and the group ends fully committed.

use anyhow::Result;
use millrace::{Bounds, Context, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

const PARTITIONS: i32 = 8;
const RECORDS: usize = 40_000;

/// Journals (member, record) and counts distinct records seen by any member.
struct Member {
    id: usize,
    journal: Arc<Mutex<Vec<(usize, JournalEntry)>>>,
    seen: Arc<Mutex<BTreeSet<(i32, i64)>>>,
    distinct: watch::Sender<usize>,
    mine: watch::Sender<usize>,
}

impl Processor for Member {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        tokio::time::sleep(Duration::from_micros(rand::random_range(500..=2_500))).await;
        self.journal.lock().unwrap().push((
            self.id,
            JournalEntry {
                partition: record.partition,
                offset: record.offset,
                key: record.key_str().unwrap_or("-").to_owned(),
                epoch: ctx.assignment_epoch(),
                idempotency_key: String::new(),
            },
        ));
        let n = {
            let mut seen = self.seen.lock().unwrap();
            seen.insert((record.partition, record.offset));
            seen.len()
        };
        self.distinct.send_replace(n);
        self.mine.send_modify(|c| *c += 1);
        Ok(())
    }
}

fn config(topic: &str, group: &str) -> PipelineConfig {
    PipelineConfig::new(bootstrap(), group, [topic])
        .bounds(Bounds { max_concurrency: 8, ..Bounds::default() })
        .commit_interval(Duration::from_millis(200))
        .consumer_property("session.timeout.ms", "10000")
        .consumer_property("heartbeat.interval.ms", "500")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_joins_and_leaves_mid_stream_without_loss_or_reordering() -> Result<()> {
    init_logs();
    let topic = unique("rebalance");
    let group = unique("rebalance-group");
    create_topic(&topic, PARTITIONS).await?;
    let written = produce(&topic, keyed_records(RECORDS, 1_000)).await?;

    let journal = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let (distinct_tx, mut distinct_rx) = watch::channel(0);
    let member = |id| {
        let (mine, mine_rx) = watch::channel(0);
        (Member { id, journal: journal.clone(), seen: seen.clone(), distinct: distinct_tx.clone(), mine }, mine_rx)
    };

    let (a, mut a_count) = member(0);
    let a = Pipeline::new(config(&topic, &group), a)?;
    let (a_stop, a_stats) = (a.shutdown_token(), a.stats());
    let a_run = tokio::spawn(a.run());
    a_count.wait_for(|c| *c >= 4_000).await?;

    let (b, mut b_count) = member(1);
    let b = Pipeline::new(config(&topic, &group), b)?;
    let (b_stop, b_stats) = (b.shutdown_token(), b.stats());
    let b_run = tokio::spawn(b.run());
    tokio::time::timeout(Duration::from_secs(60), b_count.wait_for(|c| *c >= 3_000)).await??;
    let a_before_leave = *a_count.borrow();
    b_stop.cancel();
    b_run.await??;

    tokio::time::timeout(Duration::from_secs(120), distinct_rx.wait_for(|n| *n >= RECORDS)).await??;
    let ends = end_offsets(&topic, PARTITIONS)?;
    eventually("the group to commit everything", Duration::from_secs(30), || {
        Ok((committed_offsets(&group, &topic, PARTITIONS)? == ends).then_some(()))
    })
    .await?;
    a_stop.cancel();
    a_run.await??;

    let (a, b) = (a_stats.snapshot(), b_stats.snapshot());
    println!("member A: {a:?}\nmember B: {b:?}");
    assert!(b.processed >= 3_000 && b.revocations >= 1, "B owned partitions, then gave them back");
    assert!(a.revocations >= 1, "A gave partitions to B when it joined");
    assert!(a.assignments > PARTITIONS as u64, "A took B's partitions back when B left");
    assert!(*a_count.borrow() > a_before_leave, "A kept processing after B left");

    let journal = journal.lock().unwrap();
    let entries: Vec<JournalEntry> = journal.iter().map(|(_, e)| e.clone()).collect();
    let expected: BTreeSet<(i32, i64)> = written.iter().map(|w| (w.partition, w.offset)).collect();
    assert_eq!(distinct(&entries), expected, "no record lost across the two rebalances");
    // Within one owner's assignment of a partition (member + epoch), a key's offsets strictly increase.
    let owned: Vec<(usize, JournalEntry)> = journal.clone();
    let mut ordered = Vec::new();
    for (member, e) in owned {
        ordered.push(JournalEntry { key: format!("{member}/{}/{}", e.epoch, e.key), ..e });
    }
    assert_key_order(&ordered, |e| (e.partition, e.key.clone()))?;
    println!(
        "{} effects for {RECORDS} records ({} redelivered at the handovers)",
        entries.len(),
        entries.len() - RECORDS
    );
    Ok(())
}

/// Liveness of the committed offsets: another member of the group replaces the pipeline's final
/// commit with a lower offset (the broker accepts a commit for any partition from any member of the
/// current generation, as a late commit of a former owner would be). With no new record to move the
/// completed prefix, only the pipeline's periodic re-commit brings the group back to its end offset;
/// without it the lag would stay until the next rebalance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_commit_is_restored_without_new_records() -> Result<()> {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};
    init_logs();
    let topic = unique("recommit");
    let group = unique("recommit-group");
    create_topic(&topic, 1).await?;
    produce(&topic, keyed_records(200, 10)).await?;
    let ends = end_offsets(&topic, 1)?;

    let (distinct, _) = watch::channel(0);
    let (mine, _) = watch::channel(0);
    let member = Member { id: 0, journal: Default::default(), seen: Default::default(), distinct, mine };
    let pipeline = Pipeline::new(config(&topic, &group), member)?;
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());
    eventually("the pipeline to commit the end", Duration::from_secs(60), || {
        Ok((committed_offsets(&group, &topic, 1)? == ends).then_some(()))
    })
    .await?;

    // A second member (same protocol and assignor; sticky, so the pipeline keeps the partition)
    // commits offset 0 for the pipeline's partition.
    let other: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .create()?;
    other.subscribe(&[&topic])?;
    let mut rewind = TopicPartitionList::new();
    rewind.add_partition_offset(&topic, 0, Offset::Offset(0))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let _ = other.poll(Duration::from_millis(100));
        // Refused until this member has joined the group's current generation.
        if tokio::task::block_in_place(|| other.commit(&rewind, CommitMode::Sync)).is_ok() {
            break;
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "the second member never got its commit in");
    }
    let replaced = std::time::Instant::now();
    eventually("the pipeline to restore its commit", Duration::from_secs(30), || {
        let _ = other.poll(Duration::ZERO);
        Ok((committed_offsets(&group, &topic, 1)? == ends).then_some(()))
    })
    .await?;
    println!("committed offset restored {:?} after it was replaced", replaced.elapsed());
    drop(other);
    stop.cancel();
    run.await??;
    Ok(())
}
