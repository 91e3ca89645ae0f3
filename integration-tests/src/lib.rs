//! Shared helpers for Millrace's integration tests, which run against a real Kafka broker
//! (`scripts/kafka up`; address from `KAFKA_BOOTSTRAP_SERVERS`, default `127.0.0.1:9092`).
//!
//! Every test uses its own topics and groups ([`unique`]), so tests never see each other's data.
//! The `millrace-it-worker` binary beside this library is the pipeline the crash tests kill.

use anyhow::{Context as _, Result, bail};
use millrace::PipelineConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

/// The broker address for tests.
pub fn bootstrap() -> String {
    PipelineConfig::bootstrap_from_env()
}

/// A name no other test run uses: `prefix-<pid>-<random>`.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{:08x}", std::process::id(), rand::random::<u32>())
}

/// Installs a log subscriber once (RUST_LOG controls it; warnings by default).
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn,librdkafka=error".into()),
        )
        .with_test_writer()
        .try_init();
}

fn admin() -> Result<AdminClient<DefaultClientContext>> {
    Ok(ClientConfig::new().set("bootstrap.servers", bootstrap()).create()?)
}

/// Creates a topic with `partitions` partitions (replication 1) and waits until its metadata is visible.
pub async fn create_topic(name: &str, partitions: i32) -> Result<()> {
    create_topic_with(name, partitions, &[]).await
}

/// Creates a topic with extra topic configs.
pub async fn create_topic_with(name: &str, partitions: i32, configs: &[(&str, &str)]) -> Result<()> {
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        topic = topic.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin()?.create_topics([&topic], &opts).await? {
        result.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
    }
    let consumer = plain_consumer(None)?;
    let deadline = Instant::now() + Duration::from_secs(30);
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

fn plain_consumer(group: Option<&str>) -> Result<BaseConsumer> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap()).set("enable.auto.commit", "false");
    if let Some(g) = group {
        c.set("group.id", g);
    }
    Ok(c.create()?)
}

/// One record a test wrote.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Written {
    /// Partition it landed in.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its key.
    pub key: String,
}

/// Produces `(key, value)` pairs to `topic` (partitioned by key) and returns where each landed.
pub async fn produce(topic: &str, records: impl IntoIterator<Item = (String, Vec<u8>)>) -> Result<Vec<Written>> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("linger.ms", "10")
        .set("enable.idempotence", "true")
        // One request in flight: librdkafka's idempotent producer can report a record refused by a
        // partition the broker is still creating as delivered when the next request succeeds
        // (issue 12, item 3). Tests need every record where they say it is.
        .set("max.in.flight.requests.per.connection", "1")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let mut pending = Vec::new();
    for (key, value) in records {
        let delivery = producer
            .send_result(FutureRecord::to(topic).key(key.as_bytes()).payload(&value))
            .map_err(|(e, _)| anyhow::anyhow!("enqueue failed: {e}"))?;
        pending.push((key, delivery));
    }
    let mut written = Vec::with_capacity(pending.len());
    for (key, delivery) in pending {
        let (partition, offset) = match delivery.await? {
            Ok(d) if d.offset < 0 => bail!("delivery to {topic} [{}] reported without an offset", d.partition),
            Ok(d) => (d.partition, d.offset),
            Err((e, _)) => bail!("delivery failed: {e}"),
        };
        written.push(Written { partition, offset, key });
    }
    Ok(written)
}

/// `n` records with keys `key-0 … key-(keys-1)` round-robin and values `value-i`.
pub fn keyed_records(n: usize, keys: usize) -> impl Iterator<Item = (String, Vec<u8>)> {
    (0..n).map(move |i| (format!("key-{}", i % keys), format!("value-{i}").into_bytes()))
}

/// The group's committed offset per partition of `topic` (partitions without a commit are absent).
/// A group coordinator that is still loading or moving (a fresh broker, or one just restarted) is
/// asked again for up to 30 s.
pub fn committed_offsets(group: &str, topic: &str, partitions: i32) -> Result<BTreeMap<i32, i64>> {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode::*};
    let consumer = plain_consumer(Some(group))?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let committed = loop {
        match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
            Err(KafkaError::MetadataFetch(NotCoordinator | CoordinatorLoadInProgress | CoordinatorNotAvailable))
                if Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => break other?,
        }
    };
    Ok(committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect())
}

/// The high watermark (end offset) per partition.
/// A partition whose leader is moving or not loaded yet (right after a broker restart, or a topic's
/// creation) is asked again, for up to 30 s.
pub fn end_offsets(topic: &str, partitions: i32) -> Result<BTreeMap<i32, i64>> {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode::*};
    let consumer = plain_consumer(None)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ends = BTreeMap::new();
    for p in 0..partitions {
        let end = loop {
            match consumer.fetch_watermarks(topic, p, Duration::from_secs(10)) {
                Err(KafkaError::MetadataFetch(
                    NotLeaderForPartition | LeaderNotAvailable | UnknownTopicOrPartition | NotCoordinator,
                )) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                other => break other?.1,
            }
        };
        ends.insert(p, end);
    }
    Ok(ends)
}

/// Polls `check` every 50 ms until it returns `Some`, or fails after `timeout` with `what` (used only
/// for state outside this process, such as a child's journal or the group's committed offsets).
pub async fn eventually<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check()? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One line of a worker's journal: a record the processor handled (its effect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key.
    pub key: String,
    /// Assignment epoch the record was processed under.
    pub epoch: u64,
    /// The idempotency key the processor saw (`-` when dedup was off).
    pub idempotency_key: String,
}

/// Reads a journal file written by `millrace-it-worker` (missing file = empty). A torn last line
/// (the writer was killed mid-write) is ignored.
pub fn read_journal(path: &Path) -> Result<Vec<JournalEntry>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut f = line.split(' ');
            Some(JournalEntry {
                partition: f.next()?.parse().ok()?,
                offset: f.next()?.parse().ok()?,
                key: f.next()?.to_owned(),
                epoch: f.next()?.parse().ok()?,
                idempotency_key: f.next().unwrap_or("-").to_owned(),
            })
        })
        .collect())
}

/// Distinct `(partition, offset)` pairs of a journal.
pub fn distinct(entries: &[JournalEntry]) -> BTreeSet<(i32, i64)> {
    entries.iter().map(|e| (e.partition, e.offset)).collect()
}

/// For each partition, the first offset (from 0) that is not in `seen`: the end of the processed prefix.
pub fn processed_prefix(seen: &BTreeSet<(i32, i64)>, partitions: i32) -> BTreeMap<i32, i64> {
    (0..partitions)
        .map(|p| {
            let mut next = 0;
            while seen.contains(&(p, next)) {
                next += 1;
            }
            (p, next)
        })
        .collect()
}

/// Checks I2 on a snapshot: no committed offset passes a record that was not processed. Returns how many
/// records the commits cover.
pub fn assert_commits_cover_only_processed(
    committed: &BTreeMap<i32, i64>,
    seen: &BTreeSet<(i32, i64)>,
    partitions: i32,
) -> Result<i64> {
    let prefix = processed_prefix(seen, partitions);
    let mut covered = 0;
    for (p, c) in committed {
        if *c > prefix[p] {
            bail!("partition {p}: committed offset {c} passes unprocessed offset {}", prefix[p]);
        }
        covered += c;
    }
    Ok(covered)
}

/// Per key, the offsets in the order the processor saw them must strictly increase (I3). `group_by`
/// picks what one ordered stream is (e.g. per key, or per key and owner epoch).
pub fn assert_key_order<G: std::hash::Hash + Eq + std::fmt::Debug>(
    entries: &[JournalEntry],
    group_by: impl Fn(&JournalEntry) -> G,
) -> Result<()> {
    let mut last: HashMap<G, i64> = HashMap::new();
    for e in entries {
        let g = group_by(e);
        if let Some(prev) = last.get(&g)
            && *prev >= e.offset
        {
            bail!("order broken for {g:?}: offset {} handled after {prev}", e.offset);
        }
        last.insert(g, e.offset);
    }
    Ok(())
}

/// Resident and peak resident memory of a process, in KiB, from `/proc/<pid>/status`.
pub fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field =
        |name: &str| status.lines().find(|l| l.starts_with(name))?.split_whitespace().nth(1)?.parse::<u64>().ok();
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Sends `signal` to a child process.
pub fn signal(child: &std::process::Child, signal: i32) -> Result<()> {
    let rc = kill(child.id() as i32, signal);
    if rc != 0 {
        bail!("kill({}, {signal}) failed: {}", child.id(), std::io::Error::last_os_error());
    }
    Ok(())
}

#[allow(unsafe_code)]
fn kill(pid: i32, sig: i32) -> i32 {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid, sig) }
}

/// Waits for a child to exit, up to `timeout`; returns its status.
pub async fn wait_exit(child: &mut std::process::Child, timeout: Duration) -> Result<std::process::ExitStatus> {
    eventually("the child to exit", timeout, || Ok(child.try_wait()?)).await
}

/// A record read back from a topic.
#[derive(Debug, Clone)]
pub struct ReadRecord {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Headers.
    pub headers: millrace::record::Headers,
}

/// Which records a reader of a transactional topic sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Everything written, including aborted and still-open transactions' records.
    ReadUncommitted,
    /// Only committed transactions' records (what downstream consumers of an exactly-once pipeline use).
    ReadCommitted,
}

impl Isolation {
    fn property(self) -> &'static str {
        match self {
            Isolation::ReadUncommitted => "read_uncommitted",
            Isolation::ReadCommitted => "read_committed",
        }
    }
}

/// End offsets as a reader with `isolation` sees them: the high watermark, or for `ReadCommitted`
/// the last stable offset (held back by any transaction still open). Keep one to query repeatedly.
pub struct Watermarks {
    consumer: BaseConsumer,
}

impl Watermarks {
    /// A client reading with `isolation`.
    pub fn new(isolation: Isolation) -> Result<Self> {
        let consumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("isolation.level", isolation.property())
            .create()?;
        Ok(Self { consumer })
    }

    /// The end offset of each partition of `topic`.
    pub fn ends(&self, topic: &str, partitions: i32) -> Result<BTreeMap<i32, i64>> {
        (0..partitions).map(|p| Ok((p, self.consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?.1))).collect()
    }
}

/// A reader of every partition of a topic from the beginning, in the given isolation; poll it
/// repeatedly (it keeps up with a topic being written) or read to the end with [`read_topic_as`].
pub struct TopicReader {
    consumer: BaseConsumer,
    partitions: usize,
}

impl TopicReader {
    /// Assigns every partition of `topic` (which must exist) from its first offset.
    pub fn new(topic: &str, isolation: Isolation) -> Result<Self> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            // librdkafka's assign() needs a group id even though nothing is committed.
            .set("group.id", unique("reader"))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", isolation.property())
            .create()?;
        let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let t = md.topics().first().filter(|t| t.error().is_none()).context("topic metadata")?;
        let mut tpl = TopicPartitionList::new();
        for p in t.partitions() {
            tpl.add_partition_offset(topic, p.id(), Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        Ok(Self { consumer, partitions: t.partitions().len() })
    }

    /// Polls for up to `wait`; returns the records read and the partitions that reached their end.
    pub fn poll(&self, wait: Duration) -> Result<(Vec<ReadRecord>, Vec<i32>)> {
        use rdkafka::Message;
        let mut records = Vec::new();
        let mut at_end = Vec::new();
        let deadline = Instant::now() + wait;
        while let Some(msg) = self.consumer.poll(deadline.saturating_duration_since(Instant::now())) {
            match msg {
                Ok(msg) => records.push(ReadRecord {
                    partition: msg.partition(),
                    offset: msg.offset(),
                    key: msg.key().map(<[u8]>::to_vec),
                    value: msg.payload().map(<[u8]>::to_vec),
                    headers: millrace::record::Headers::of_message(&msg),
                }),
                Err(rdkafka::error::KafkaError::PartitionEOF(p)) => at_end.push(p),
                Err(e) => return Err(e.into()),
            }
            if records.len() >= 10_000 || Instant::now() >= deadline {
                break;
            }
        }
        Ok((records, at_end))
    }
}

/// Reads `topic` from the beginning until every partition reports its end (for `ReadCommitted`,
/// the last stable offset), within 60 s.
pub fn read_topic_as(topic: &str, isolation: Isolation) -> Result<Vec<ReadRecord>> {
    let reader = TopicReader::new(topic, isolation)?;
    let mut out = Vec::new();
    let mut ended = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while ended.len() < reader.partitions {
        if Instant::now() > deadline {
            bail!(
                "reading {topic}: only {} of {} partitions reached their end in 60 s",
                ended.len(),
                reader.partitions
            );
        }
        let (records, at_end) = reader.poll(Duration::from_millis(200))?;
        out.extend(records);
        ended.extend(at_end);
    }
    Ok(out)
}

/// Reads every record of `topic` from the beginning to the end offsets at the time of the call.
/// A missing topic reads as empty.
pub fn read_topic(topic: &str) -> Result<Vec<ReadRecord>> {
    use rdkafka::Message;
    // librdkafka's assign() needs a group id even though nothing is committed.
    let consumer = plain_consumer(Some(&unique("reader")))?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let Some(t) = md.topics().first().filter(|t| t.error().is_none()) else { return Ok(Vec::new()) };
    let mut tpl = TopicPartitionList::new();
    let mut remaining = 0;
    let mut ends = HashMap::new();
    for p in t.partitions() {
        let (low, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
        tpl.add_partition_offset(topic, p.id(), Offset::Offset(low))?;
        ends.insert(p.id(), high);
        remaining += (high - low).max(0);
    }
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while remaining > 0 {
        if Instant::now() > deadline {
            bail!("reading {topic}: {remaining} records missing after 30 s");
        }
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else { continue };
        let msg = msg?;
        if msg.offset() >= ends[&msg.partition()] {
            continue;
        }
        remaining -= 1;
        let headers = millrace::record::Headers::of_message(&msg);
        out.push(ReadRecord {
            partition: msg.partition(),
            offset: msg.offset(),
            key: msg.key().map(<[u8]>::to_vec),
            value: msg.payload().map(<[u8]>::to_vec),
            headers,
        });
    }
    Ok(out)
}

/// A record to produce: key, value (either may be null) and headers.
pub type RawRecord = (Option<Vec<u8>>, Option<Vec<u8>>, Vec<(String, Vec<u8>)>);

/// Produces records with full control over key, value (possibly null) and headers; returns where
/// each landed.
pub async fn produce_raw(topic: &str, records: impl IntoIterator<Item = RawRecord>) -> Result<Vec<(i32, i64)>> {
    use rdkafka::message::{Header, OwnedHeaders};
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        // One request in flight: librdkafka's idempotent producer can report a record refused by a
        // partition the broker is still creating as delivered when the next request succeeds
        // (issue 12, item 3). Tests need every record where they say it is.
        .set("max.in.flight.requests.per.connection", "1")
        .set("message.max.bytes", "2000000")
        .create()?;
    let mut pending = Vec::new();
    for (key, value, headers) in records {
        let mut h = OwnedHeaders::new();
        for (k, v) in &headers {
            h = h.insert(Header { key: k, value: Some(v) });
        }
        let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(h);
        if let Some(k) = key.as_deref() {
            rec = rec.key(k);
        }
        if let Some(v) = value.as_deref() {
            rec = rec.payload(v);
        }
        pending.push(producer.send_result(rec).map_err(|(e, _)| anyhow::anyhow!("enqueue failed: {e}"))?);
    }
    let mut out = Vec::new();
    for d in pending {
        match d.await? {
            Ok(d) if d.offset < 0 => bail!("delivery to {topic} [{}] reported without an offset", d.partition),
            Ok(d) => out.push((d.partition, d.offset)),
            Err((e, _)) => bail!("delivery failed: {e}"),
        }
    }
    Ok(out)
}

/// A fresh journal file for a `millrace-it-worker` (in the temp directory; not created yet).
pub fn journal_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{}.journal", unique(name)))
}

/// The command that runs the killable worker on `topic` in `group`, journaling to `journal`, with its
/// stdout piped (its SUMMARY line is read by [`worker_summary`]). `exe` is the calling test's
/// `env!("CARGO_BIN_EXE_millrace-it-worker")`; add worker options with `.args(…)`.
pub fn worker_command(exe: &str, topic: &str, group: &str, journal: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(exe);
    c.args(["--topic", topic, "--group", group, "--journal"])
        .arg(journal)
        .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .stdout(std::process::Stdio::piped());
    c
}

/// A child process that is killed (SIGKILL) and reaped when dropped, so that a test failing early
/// (an `eventually` timing out between kills) leaves no worker running against the broker.
#[derive(Debug)]
pub struct Reaped(pub std::process::Child);

impl std::ops::Deref for Reaped {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Everything an exited worker printed on stdout (its SUMMARY line).
pub fn worker_summary(child: &mut std::process::Child) -> Result<String> {
    let mut out = String::new();
    if let Some(stdout) = child.stdout.as_mut() {
        std::io::Read::read_to_string(stdout, &mut out)?;
    }
    Ok(out)
}
