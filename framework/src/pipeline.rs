//! The pipeline: builds the Kafka clients, runs the poll thread, and dispatches records to lanes.
//!
//! The path of one record: the poll thread polls it, the [`PartitionHandle`] tracks its offset and
//! routes it to its key lane, a lane worker runs the processor (retrying transient failures), the
//! outputs' acknowledgements are awaited, the handle completes the offset, and the poll thread
//! commits the contiguous completed prefix every `commit_interval`, at revoke and at shutdown.
//!
//! The poll thread is a dedicated OS thread that never runs user code, so the member keeps polling
//! (and stays in the group) however slow the processors are; backpressure pauses partitions instead
//! of stopping the poll (I4).

use crate::config::PipelineConfig;
use crate::error::{ConfigError, Error};
use crate::kafka_log::{KafkaLog, Producer, ProducerHooks, is_fatal};
use crate::partition::{Admit, LaneId, PartitionHandle};
use crate::processor::Processor;
use crate::rebalance::{Assignments, Hooks, commit_now};
use crate::record::Record;
use crate::stats::Stats;
use crate::worker::run_lane;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// What the poll thread and the lane workers share.
pub(crate) struct Shared<P> {
    pub(crate) processor: P,
    pub(crate) config: PipelineConfig,
    pub(crate) producer: Producer,
    pub(crate) stats: Arc<Stats>,
    pub(crate) concurrency: Semaphore,
    /// Cancelled when shutdown starts; processors see it through their context.
    pub(crate) shutdown: CancellationToken,
    /// Set by workers when a paused partition has drained enough to resume.
    pub(crate) resume_hint: AtomicBool,
}

/// A consumer group member running a [`Processor`].
///
/// ```no_run
/// use millrace::{Context, Pipeline, PipelineConfig, ProcessError, Processor, Record};
///
/// struct Print;
/// impl Processor for Print {
///     async fn process(&self, record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
///         println!("{}@{}: {:?}", record.partition, record.offset, record.value_str());
///         Ok(())
///     }
/// }
///
/// # async fn run() -> Result<(), millrace::Error> {
/// let config = PipelineConfig::new(PipelineConfig::bootstrap_from_env(), "printer", ["events"]);
/// let pipeline = Pipeline::new(config, Print)?;
/// let stop = pipeline.shutdown_token(); // cancel it to stop gracefully
/// let summary = pipeline.run().await?;
/// println!("processed {}", summary.processed);
/// # Ok(()) }
/// ```
pub struct Pipeline<P: Processor> {
    shared: Arc<Shared<P>>,
    consumer: BaseConsumer<Hooks>,
    stop: CancellationToken,
}

impl<P: Processor> Pipeline<P> {
    /// Validates `config` and creates the Kafka clients. Fails with the offending field or property
    /// named; does not need the brokers to be up.
    pub fn new(config: PipelineConfig, processor: P) -> Result<Self, Error> {
        config.validate()?;
        let stats = Arc::new(Stats::default());
        let log = Arc::new(KafkaLog::new(config.name.clone()));
        let hooks = Hooks {
            assignments: Arc::new(Mutex::new(Assignments::default())),
            stats: stats.clone(),
            drain_timeout: config.drain_timeout,
            name: config.name.clone(),
            recommit: AtomicBool::new(false),
            log: log.clone(),
        };
        let consumer: BaseConsumer<Hooks> =
            consumer_config(&config).create_with_context(hooks).map_err(client_creation("consumer"))?;
        let producer: Producer =
            producer_config(&config).create_with_context(ProducerHooks(log)).map_err(client_creation("producer"))?;
        let concurrency = Semaphore::new(config.bounds.max_concurrency);
        let shared = Shared {
            processor,
            config,
            producer,
            stats,
            concurrency,
            shutdown: CancellationToken::new(),
            resume_hint: AtomicBool::new(false),
        };
        Ok(Self { shared: Arc::new(shared), consumer, stop: CancellationToken::new() })
    }

    /// Live counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.shared.stats.clone()
    }

    /// A token that stops the pipeline gracefully when cancelled: stop fetching, drain running and
    /// buffered records until `drain_timeout`, commit, leave the group.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Runs until SIGINT or SIGTERM (graceful), see [`crate::shutdown::on_signals`]; a second signal
    /// exits the process at once without committing past unfinished work.
    pub async fn run_until_signal(self) -> Result<RunSummary, Error> {
        crate::shutdown::on_signals(self.stop.clone());
        self.run().await
    }

    /// Runs until the [`shutdown_token`](Self::shutdown_token) is cancelled or a fatal error occurs.
    pub async fn run(self) -> Result<RunSummary, Error> {
        let Pipeline { shared, consumer, stop } = self;
        let handle = tokio::runtime::Handle::current();
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("millrace-poll".into())
            .spawn(move || {
                let result = PollLoop { shared, consumer: &consumer, runtime: handle, stop }.run();
                drop(consumer); // leaves the group (runs the final revoke) before reporting
                let _ = tx.send(result);
            })
            .map_err(|e| Error::Runtime(format!("cannot start the poll thread: {e}")))?;
        rx.await.map_err(|_| Error::Runtime("the poll thread panicked".into()))?
    }
}

/// What a finished run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSummary {
    /// Records processed successfully.
    pub processed: u64,
    /// Records that failed (left uncommitted).
    pub failed: u64,
    /// Whether every in-flight record finished before the drain deadline.
    pub drained: bool,
}

/// Maps librdkafka's rejection of a property to a [`ConfigError`] naming that property.
fn client_creation(which: &'static str) -> impl Fn(KafkaError) -> Error {
    move |e| match e {
        KafkaError::ClientConfig(_, desc, key, value) => {
            Error::Config(ConfigError::new(key, format!("{desc} (value {value:?}, {which} client)")))
        }
        KafkaError::ClientCreation(msg) => Error::Config(ConfigError::new(which, msg)),
        other => Error::Kafka(other),
    }
}

fn consumer_config(config: &PipelineConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("partition.assignment.strategy", "cooperative-sticky")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false");
    for (k, v) in config.kafka.iter().chain(&config.consumer) {
        c.set(k, v);
    }
    c.set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", &config.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    c
}

fn producer_config(config: &PipelineConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("enable.idempotence", "true").set("acks", "all").set("linger.ms", "5");
    for (k, v) in config.kafka.iter().chain(&config.producer) {
        c.set(k, v);
    }
    c.set("bootstrap.servers", &config.bootstrap_servers);
    c
}

struct PollLoop<'c, P> {
    shared: Arc<Shared<P>>,
    consumer: &'c BaseConsumer<Hooks>,
    runtime: tokio::runtime::Handle,
    stop: CancellationToken,
}

impl<P: Processor> PollLoop<'_, P> {
    fn hooks(&self) -> &Hooks {
        self.consumer.context()
    }

    fn run(self) -> Result<RunSummary, Error> {
        let topics: Vec<&str> = self.shared.config.topics.iter().map(String::as_str).collect();
        self.consumer.subscribe(&topics)?;
        tracing::info!(pipeline = %self.shared.config.name, ?topics, "subscribed");
        let interval = self.shared.config.commit_interval;
        let mut next_commit = Instant::now() + interval;
        let mut result = Ok(());
        while !self.stop.is_cancelled() {
            let paused = self.shared.stats.paused_partitions.load(Relaxed) > 0;
            let timeout = if paused { Duration::from_millis(5) } else { Duration::from_millis(100) };
            match self.consumer.poll(timeout) {
                None => {}
                Some(Ok(msg)) => self.dispatch(&msg),
                Some(Err(e)) if is_fatal(&e) => {
                    result = Err(Error::Kafka(e));
                    break;
                }
                Some(Err(e)) => {
                    tracing::warn!(pipeline = %self.shared.config.name, error = %e, "consumer error (retrying)")
                }
            }
            if let Some(e) = self.hooks().log.take_fatal() {
                result = Err(Error::Kafka(e));
                break;
            }
            if paused && self.shared.resume_hint.swap(false, Relaxed) {
                self.resume_drained();
            }
            if Instant::now() >= next_commit {
                self.commit_progress();
                if paused {
                    self.resume_drained();
                }
                next_commit = Instant::now() + interval;
            }
        }
        let drained = self.shutdown(result.is_ok());
        let s = self.shared.stats.snapshot();
        result.map(|()| RunSummary { processed: s.processed, failed: s.failed, drained })
    }

    fn dispatch(&self, msg: &rdkafka::message::BorrowedMessage<'_>) {
        let bounds = self.shared.config.bounds;
        let handle = match self.hooks().lock().get(msg.topic(), msg.partition()) {
            Some(h) => h.clone(),
            None => return, // prefetched for a partition no longer owned: never tracked, never committed
        };
        let record = Record::from_message(msg, handle.topic.clone());
        let lane = LaneId::of(self.shared.config.ordering, &record);
        Stats::bump(&self.shared.stats.polled);
        let (admit, buffered) = handle.admit(record, lane, &self.shared.stats);
        if let Admit::Spawn(record) = admit {
            self.runtime.spawn(run_lane(self.shared.clone(), handle.clone(), lane, record));
        }
        let s = &self.shared.stats;
        if buffered >= bounds.max_in_flight_per_partition {
            self.pause(&[handle]);
        } else if s.in_flight.load(Relaxed) >= bounds.max_in_flight_total as u64
            || s.buffered_bytes.load(Relaxed) >= bounds.max_buffered_bytes as u64
        {
            let all: Vec<_> = self.hooks().lock().handles().cloned().collect();
            self.pause(&all);
        }
    }

    /// Pauses fetching for the given partitions (those not paused yet).
    fn pause(&self, handles: &[Arc<PartitionHandle>]) {
        let mut tpl = TopicPartitionList::new();
        for h in handles.iter().filter(|h| !h.is_paused()) {
            tpl.add_partition(&h.topic, h.partition);
            h.set_paused(true);
            Stats::bump(&self.shared.stats.paused_partitions);
        }
        if tpl.count() > 0
            && let Err(e) = self.consumer.pause(&tpl)
        {
            tracing::warn!(error = %e, "pausing partitions failed");
        }
    }

    /// Resumes paused partitions that drained below half their bound, while the totals allow it.
    fn resume_drained(&self) {
        let b = self.shared.config.bounds;
        let s = &self.shared.stats;
        if s.in_flight.load(Relaxed) > b.max_in_flight_total as u64 / 2
            || s.buffered_bytes.load(Relaxed) > b.max_buffered_bytes as u64 / 2
        {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for h in self.hooks().lock().handles() {
            if h.is_paused() && h.buffered() <= b.max_in_flight_per_partition / 2 {
                tpl.add_partition(&h.topic, h.partition);
                h.set_paused(false);
                s.paused_partitions.fetch_sub(1, Relaxed);
            }
        }
        if tpl.count() > 0
            && let Err(e) = self.consumer.resume(&tpl)
        {
            tracing::warn!(error = %e, "resuming partitions failed");
        }
    }

    /// Commits every owned partition whose completed prefix moved (asynchronously).
    fn commit_progress(&self) {
        let force = self.hooks().recommit.swap(false, Relaxed);
        let handles: Vec<_> = self.hooks().lock().handles().cloned().collect();
        let mut tpl = TopicPartitionList::new();
        let mut moved = Vec::new();
        for h in &handles {
            let candidate = if force { h.committable() } else { h.commit_candidate() };
            if let Some(offset) = candidate {
                let _ = tpl.add_partition_offset(&h.topic, h.partition, Offset::Offset(offset));
                moved.push((h, offset));
            }
        }
        if commit_now(self.consumer, &tpl, CommitMode::Async, &self.shared.stats) {
            for (h, offset) in moved {
                h.set_committed(Some(offset));
            }
        } else {
            self.hooks().recommit.store(true, Relaxed);
        }
    }

    /// Graceful stop: pause everything, let buffered records finish until the drain deadline, commit
    /// synchronously, then stop the remaining workers. Returns whether everything finished.
    fn shutdown(&self, graceful: bool) -> bool {
        let name = &self.shared.config.name;
        self.shared.shutdown.cancel();
        let handles: Vec<_> = self.hooks().lock().handles().cloned().collect();
        self.pause(&handles);
        let deadline = Instant::now() + self.shared.config.drain_timeout;
        let mut drained = true;
        if graceful {
            tracing::info!(pipeline = %name, in_flight = self.shared.stats.in_flight.load(Relaxed), "shutting down: draining");
            // Keep serving the consumer (rebalance callbacks, heartbeats) while workers finish.
            while self.shared.stats.in_flight.load(Relaxed) > 0 {
                if Instant::now() >= deadline {
                    drained = false;
                    tracing::warn!(pipeline = %name, "drain deadline passed; committing only the completed prefix");
                    break;
                }
                if let Some(Ok(msg)) = self.consumer.poll(Duration::from_millis(10)) {
                    drop(msg); // fetched before the pause took effect: not tracked, so never committed
                }
            }
            let mut tpl = TopicPartitionList::new();
            for h in self.hooks().lock().handles() {
                if let Some(offset) = h.committable() {
                    let _ = tpl.add_partition_offset(&h.topic, h.partition, Offset::Offset(offset));
                }
            }
            commit_now(self.consumer, &tpl, CommitMode::Sync, &self.shared.stats);
        }
        // Give every partition up: later completions go to handles nobody commits through (I5).
        let released = self.hooks().lock().drain_all();
        for h in &released {
            h.revoke(&self.shared.stats);
        }
        self.shared.stats.revocations.fetch_add(released.len() as u64, Relaxed);
        self.shared.stats.assigned_partitions.store(0, Relaxed);
        self.shared.stats.paused_partitions.store(0, Relaxed);
        tracing::info!(pipeline = %name, drained, "stopped");
        drained
    }
}
