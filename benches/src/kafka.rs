//! Benchmark fixtures on the broker: the records pre-loaded into a benchmark's topics, and the options
//! that say which. Fresh names, creating topics and the clean-up are [`millrace_testkit`]'s.

use anyhow::{Context as _, bail};
use rand::RngExt;
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// How long the final producer flush may take.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(300);

/// What to pre-load into the topic.
#[derive(Debug, Clone, Copy)]
pub struct LoadSpec {
    /// Number of records.
    pub records: u64,
    /// Bytes per value.
    pub value_size: usize,
    /// Keys are drawn uniformly from this many distinct keys.
    pub keys: u64,
}

/// Counts failed deliveries of the loader.
#[derive(Default)]
struct LoadContext {
    failed: AtomicU64,
}

impl ClientContext for LoadContext {}

impl ProducerContext for LoadContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if result.is_err() {
            self.failed.fetch_add(1, Relaxed);
        }
    }
}

/// One record as the loader should produce it.
#[derive(Debug, Clone, Default)]
pub struct Planned {
    /// Index of its key, in `0..spec.keys` (the key is `key-<index>`).
    pub key: u64,
    /// A header to attach, as (name, value).
    pub header: Option<(String, Vec<u8>)>,
}

/// Produces `spec.records` records to `topic` as fast as the broker takes them, and waits until every
/// one is acknowledged. Blocking: call it off the async runtime. Returns how long it took.
pub fn load(bootstrap: &str, topic: &str, spec: LoadSpec) -> anyhow::Result<Duration> {
    let mut rng = rand::rng();
    let keys = spec.keys.max(1);
    load_planned(bootstrap, topic, spec, |_| Planned { key: rng.random_range(0..keys), header: None })
}

/// Like [`load`], but `plan(i)` says the key (and an optional header) of the `i`-th record, in the
/// order produced. Blocking. Returns how long it took.
pub fn load_planned(
    bootstrap: &str,
    topic: &str,
    spec: LoadSpec,
    mut plan: impl FnMut(u64) -> Planned,
) -> anyhow::Result<Duration> {
    let producer: ThreadedProducer<LoadContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "1")
        .set("enable.idempotence", "false")
        .set("compression.type", "none")
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("batch.num.messages", "100000")
        .set("queue.buffering.max.messages", "1000000")
        .create_with_context(LoadContext::default())
        .context("creating the loading producer")?;
    let keys: Vec<String> = (0..spec.keys.max(1)).map(|k| format!("key-{k}")).collect();
    let mut rng = rand::rng();
    let value: Vec<u8> = (0..spec.value_size).map(|_| rng.random_range(b'a'..=b'z')).collect();
    let started = Instant::now();
    for i in 0..spec.records {
        let planned = plan(i);
        let key = keys.get(planned.key as usize).context("a planned key index is out of range")?;
        let mut record = BaseRecord::to(topic).key(key.as_str()).payload(value.as_slice());
        if let Some((name, header)) = &planned.header {
            record = record.headers(OwnedHeaders::new().insert(Header { key: name, value: Some(header) }));
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back; // the producer's thread is delivering: give it a moment
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => return Err(e).context("producing a record"),
            }
        }
    }
    producer.flush(FLUSH_TIMEOUT).context("flushing the loading producer")?;
    let failed = producer.context().failed.load(Relaxed);
    if failed > 0 {
        bail!("{failed} of {} records were not acknowledged", spec.records);
    }
    Ok(started.elapsed())
}

/// The pre-loaded topic a benchmark drains: options shared by `core`, `dedup` and `memory`.
#[derive(Debug, clap::Args)]
pub struct TopicArgs {
    /// Records pre-loaded and consumed by every run [default: the benchmark's; fewer with --quick].
    #[arg(long)]
    pub records: Option<u64>,
    /// Bytes per record value.
    #[arg(long, default_value_t = 100)]
    pub value_size: usize,
    /// Number of distinct keys, drawn uniformly.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    /// Partitions of the benchmark topic.
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// A smoke run: fewer records and a single pair, unless --records or --pairs say otherwise.
    #[arg(long)]
    pub quick: bool,
    /// Brokers; defaults to KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092.
    #[arg(long)]
    pub bootstrap: Option<String>,
}

impl TopicArgs {
    /// The brokers to use.
    pub fn bootstrap(&self) -> String {
        self.bootstrap.clone().unwrap_or_else(millrace::PipelineConfig::bootstrap_from_env)
    }

    /// What to load: `--records`, else `full` (or `quick` with `--quick`).
    pub fn load(&self, full: u64, quick: u64) -> LoadSpec {
        LoadSpec {
            records: self.records.unwrap_or(if self.quick { quick } else { full }),
            value_size: self.value_size,
            keys: self.keys,
        }
    }
}
