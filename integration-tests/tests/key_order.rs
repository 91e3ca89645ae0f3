//! I3 under concurrency: 8 partitions, 1,000 keys, 50,000 records, random handler delays. Every key's
//! records reach the processor one at a time in strictly increasing offset order, and all of them arrive.

use anyhow::Result;
use millrace::{Context, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

const PARTITIONS: i32 = 8;
const KEYS: usize = 1_000;
const RECORDS: usize = 50_000;

#[derive(Default)]
struct Seen {
    order: Vec<JournalEntry>,
    running_keys: HashSet<(i32, String)>,
    overlaps: usize,
}

struct Recorder {
    seen: Arc<Mutex<Seen>>,
    count: watch::Sender<usize>,
}

impl Processor for Recorder {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let key = (record.partition, record.key_str().unwrap_or("-").to_owned());
        {
            let mut seen = self.seen.lock().unwrap();
            if !seen.running_keys.insert(key.clone()) {
                seen.overlaps += 1; // the same key is already inside the processor
            }
            seen.order.push(JournalEntry {
                partition: record.partition,
                offset: record.offset,
                key: key.1.clone(),
                epoch: ctx.assignment_epoch(),
                idempotency_key: String::new(),
            });
        }
        let delay = rand::random_range(0..=2000u64);
        tokio::time::sleep(Duration::from_micros(delay)).await;
        self.seen.lock().unwrap().running_keys.remove(&key);
        self.count.send_modify(|c| *c += 1);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_records_run_one_at_a_time_in_offset_order() -> Result<()> {
    init_logs();
    let topic = unique("key-order");
    create_topic(&topic, PARTITIONS).await?;
    let written = produce(&topic, keyed_records(RECORDS, KEYS)).await?;
    assert_eq!(written.len(), RECORDS);

    let (count, mut counted) = watch::channel(0);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let recorder = Recorder { seen: seen.clone(), count };
    let config = PipelineConfig::new(bootstrap(), unique("key-order-group"), [&topic]);
    let pipeline = Pipeline::new(config, recorder)?;
    let stop = pipeline.shutdown_token();
    let stats = pipeline.stats();
    let started = std::time::Instant::now();
    let run = tokio::spawn(pipeline.run());
    tokio::time::timeout(Duration::from_secs(120), counted.wait_for(|c| *c >= RECORDS)).await??;
    let elapsed = started.elapsed();
    stop.cancel();
    run.await??;
    let s = stats.snapshot();
    println!(
        "{RECORDS} records in {elapsed:?}; peak concurrent handlers {}, peak in flight {}",
        s.running_peak, s.in_flight_peak
    );
    assert!(s.running_peak > 1, "records must run concurrently across keys");
    assert_eq!(s.processed as usize, RECORDS);

    let seen = seen.lock().unwrap();
    assert_eq!(seen.overlaps, 0, "a key was inside the processor twice at once");
    assert_key_order(&seen.order, |e| (e.partition, e.key.clone()))?;
    let expected: std::collections::BTreeSet<(i32, i64)> = written.iter().map(|w| (w.partition, w.offset)).collect();
    assert_eq!(distinct(&seen.order), expected, "every record is handed to the processor");
    assert_eq!(seen.order.len(), RECORDS, "no record is handed over twice in a run without faults");
    Ok(())
}
