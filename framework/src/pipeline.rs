//! The pipeline: builds the Kafka clients and runs the poll thread.
//!
//! The path of one record: the poll thread polls it and batches it to its partition's task
//! (`partition`); the task tracks its offset and routes it to its key lane; the
//! lane runs the processor (`attempt`, retrying transient failures); once the
//! outputs are acknowledged the task completes the offset and publishes the new committable offset;
//! the poll thread commits the contiguous completed prefix every `commit_interval`, at revoke and at
//! shutdown.
//!
//! The poll thread is a dedicated OS thread that never runs user code, so the member keeps polling
//! (and stays in the group) however slow the processors are (I4). Backpressure: when the total of
//! in-flight records or bytes reaches its bound the poll thread stops taking records (it still polls at
//! least every 100 ms, so rebalances and the poll interval are served, admitting at most one record per
//! such poll); when one partition reaches its own bound that partition is paused until it drains to
//! half.

use crate::breaker::Breaker;
use crate::cluster::{self, TopicWatch};
use crate::config::PipelineConfig;
use crate::context::RuntimeHandles;
use crate::dedup_changelog::Dedup;
use crate::error::Error;
use crate::kafka::config::{
    admin_config, client_creation, consumer_config, max_message_bytes, producer_config, transactional_producer_config,
};
use crate::kafka::log::{KafkaLog, Producer, ProducerHooks, is_fatal};
use crate::kafka::txn_producer::TxnClient;
use crate::partition::PartitionHandle;
use crate::processor::Processor;
use crate::rebalance::{Assignments, Hooks, Starter, commit_now};
use crate::record::Record;
use crate::rejected::Rejections;
use crate::stats::Stats;
use crate::transaction::{Transactions, TxnOutcome};
use crate::watchdog::Watchdog;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// At-least-once: how often the completed prefixes are committed again although they did not move.
pub(crate) const RECOMMIT_EVERY: Duration = Duration::from_secs(5);

/// Records handed to a partition task in one message, at most.
const BATCH: usize = 512;
/// Longest the poll thread blocks in one poll or one backpressure wait.
const POLL_WAIT: Duration = Duration::from_millis(100);

/// What the poll thread and the partition tasks share.
pub(crate) struct Shared<P> {
    pub(crate) processor: P,
    pub(crate) config: PipelineConfig,
    pub(crate) handles: Arc<RuntimeHandles>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) concurrency: Semaphore,
    /// Set by partition tasks when a paused partition has drained enough to resume.
    pub(crate) resume_hint: AtomicBool,
    poller: PollerWake,
    /// For creating DLQ topics.
    pub(crate) admin: Arc<AdminClient<DefaultClientContext>>,
    /// DLQ topics known to exist in this run.
    pub(crate) dlq_topics: Mutex<HashSet<String>>,
    pub(crate) breaker: Breaker,
    pub(crate) log: Arc<KafkaLog>,
    /// The dedup store, when on.
    pub(crate) dedup: Option<Arc<Dedup>>,
    /// Exactly-once: outputs rejected for their record.
    pub(crate) rejections: Option<Arc<Rejections>>,
}

/// Lets partition tasks wake the poll thread while it waits for in-flight room.
#[derive(Default)]
struct PollerWake {
    waiting: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl<P> Shared<P> {
    /// Wakes the poll thread if it waits for room (cheap when it does not).
    pub(crate) fn wake_poller(&self) {
        // SeqCst pairs with the swap in `wait_for_room` (the in-flight count was just decremented by
        // an atomic read-modify-write), so a waiting poll thread is never missed.
        if self.poller.waiting.load(SeqCst) && !self.over_low_water() {
            let _guard = self.poller.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.poller.cv.notify_one();
        }
    }

    /// Whether in-flight work, plus `pending` records of `pending_bytes` not handed over yet, reached
    /// the total bounds.
    fn over_total(&self, pending: usize, pending_bytes: usize) -> bool {
        let b = &self.config.bounds;
        self.stats.in_flight.load(Relaxed) + pending as u64 >= b.max_in_flight_total as u64
            || self.stats.buffered_bytes.load(Relaxed) + pending_bytes as u64 >= b.max_buffered_bytes as u64
    }

    /// Whether in-flight work is above three quarters of the total bounds: the poll thread, once
    /// throttled, resumes below that, so that it refills in large batches rather than one by one.
    fn over_low_water(&self) -> bool {
        let b = &self.config.bounds;
        self.stats.in_flight.load(Relaxed) > (b.max_in_flight_total as u64 * 3 / 4)
            || self.stats.buffered_bytes.load(Relaxed) > (b.max_buffered_bytes as u64 * 3 / 4)
    }

    /// Blocks the poll thread until in-flight work drops under the low-water mark, or `POLL_WAIT` passed.
    fn wait_for_room(&self) {
        let guard = self.poller.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.poller.waiting.swap(true, SeqCst);
        let _ = self.poller.cv.wait_timeout_while(guard, POLL_WAIT, |_| self.over_low_water());
        self.poller.waiting.store(false, SeqCst);
    }
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
    pub(crate) shared: Arc<Shared<P>>,
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
        let producer: Producer = producer_config(&config)
            .create_with_context(ProducerHooks(log.clone()))
            .map_err(client_creation("producer"))?;
        let dedup = config.dedup.clone().map(|d| Dedup::open(d, &config.group_id)).transpose()?.map(Arc::new);
        let rejections = config.exactly_once_settings().map(|_| Arc::new(Rejections::default()));
        let transactions = match (config.exactly_once_settings(), &rejections) {
            (Some(eo), Some(rejections)) => {
                let producer_config = transactional_producer_config(&config, eo);
                let client = TxnClient::new(producer_config, log.clone(), eo.transaction_timeout, rejections.clone())
                    .map_err(client_creation("transactional producer"))?;
                Some(Arc::new(Transactions::new(client, stats.clone(), dedup.clone(), eo.clone(), config.name.clone())))
            }
            _ => None,
        };
        let hooks = Hooks {
            transactions,
            assignments: Arc::new(Mutex::new(Assignments::default())),
            starter: OnceLock::new(),
            stats: stats.clone(),
            drain_timeout: config.drain_timeout,
            name: config.name.clone(),
            recommit: AtomicBool::new(false),
            version: AtomicU64::new(0),
            log: log.clone(),
            watchdog: Watchdog::new(
                config.name.clone(),
                config.bootstrap_servers.clone(),
                config.stall_timeout,
                config.exactly_once_settings().is_some(),
            ),
        };
        let consumer: BaseConsumer<Hooks> =
            consumer_config(&config).create_with_context(hooks).map_err(client_creation("consumer"))?;
        let admin: AdminClient<DefaultClientContext> =
            admin_config(&config).create().map_err(client_creation("admin"))?;
        let handles = RuntimeHandles {
            producer,
            shutdown: CancellationToken::new(),
            transactional: config.exactly_once_settings().is_some(),
            max_output_bytes: max_message_bytes(&config)?,
            output_topics: Default::default(),
        };
        let shared = Shared {
            dedup,
            rejections,
            admin: Arc::new(admin),
            dlq_topics: Mutex::default(),
            breaker: Breaker::new(config.circuit_breaker),
            log,
            processor,
            concurrency: Semaphore::new(config.bounds.max_concurrency),
            config,
            handles: Arc::new(handles),
            stats,
            resume_hint: AtomicBool::new(false),
            poller: PollerWake::default(),
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
        let runtime = tokio::runtime::Handle::current();
        let starter: Starter = {
            let (shared, runtime) = (shared.clone(), runtime.clone());
            Box::new(move |topic, partition, epoch| PartitionHandle::start(&shared, &runtime, topic, partition, epoch))
        };
        if consumer.context().starter.set(starter).is_err() {
            return Err(Error::Runtime("pipeline started twice".into()));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("millrace-poll".into())
            .spawn(move || {
                let mut topics = TopicWatch::new(&shared.config);
                let result = cluster::reach(&consumer, &shared.config, &stop, &shared.stats, &mut topics);
                let result = result.and_then(|()| match &consumer.context().transactions {
                    // Fences earlier incarnations of this transactional id before consuming.
                    Some(txn) => txn.init(&stop).map_err(Error::Transaction),
                    None => Ok(()),
                });
                let result = result.and_then(|()| PollLoop { shared, consumer: &consumer, stop, topics }.run());
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

/// The last partition handle looked up, valid while the assignment has not changed: records arrive in
/// runs from one partition, so this saves a locked map lookup per record.
#[derive(Default)]
struct HandleCache {
    version: u64,
    last: Option<Arc<PartitionHandle>>,
}

impl HandleCache {
    fn get(&mut self, hooks: &Hooks, topic: &str, partition: i32) -> Option<Arc<PartitionHandle>> {
        let version = hooks.version.load(Relaxed);
        if let Some(h) = &self.last
            && self.version == version
            && h.partition == partition
            && &*h.topic == topic
        {
            return Some(h.clone());
        }
        let found = hooks.lock().get(topic, partition).cloned();
        self.version = version;
        self.last = found.clone();
        found
    }
}

struct PollLoop<'c, P> {
    shared: Arc<Shared<P>>,
    consumer: &'c BaseConsumer<Hooks>,
    stop: CancellationToken,
    /// Input topics that went missing.
    topics: TopicWatch,
}

/// Records polled but not yet handed to their partition tasks.
#[derive(Default)]
struct Batches {
    /// By assignment epoch.
    by_epoch: HashMap<u64, (Arc<PartitionHandle>, Vec<Record>)>,
    records: usize,
    bytes: usize,
}

impl<P: Processor> PollLoop<'_, P> {
    fn hooks(&self) -> &Hooks {
        self.consumer.context()
    }

    fn run(mut self) -> Result<RunSummary, Error> {
        let topics: Vec<&str> = self.shared.config.topics.iter().map(String::as_str).collect();
        self.consumer.subscribe(&topics)?;
        tracing::info!(pipeline = %self.shared.config.name, ?topics, "subscribed");
        let interval = self.shared.config.commit_interval;
        let mut next_commit = Instant::now() + interval;
        let mut next_refresh = Instant::now() + RECOMMIT_EVERY;
        let every = self.shared.config.commit_every_records;
        // Exactly-once: completed work moves into the open transaction this often.
        let pump_interval = (interval / 10).clamp(Duration::from_millis(1), Duration::from_millis(10));
        let mut next_pump = Instant::now() + pump_interval;
        let mut completed_at_commit = 0;
        let mut batches = Batches::default();
        let mut cache = HandleCache::default();
        let mut result = Ok(());
        let mut breaker_paused = false;
        let mut producer_ready = true;
        while !self.stop.is_cancelled() {
            // The DLQ circuit breaker pauses every partition while open (newly assigned ones too).
            let breaker_flag = self.shared.stats.breaker_open.load(Relaxed) != 0;
            if breaker_flag && self.shared.breaker.is_open(&self.shared.stats, &self.shared.config.name) {
                self.flush(&mut batches);
                let all: Vec<_> = self.hooks().lock().handles().cloned().collect();
                self.pause(&all);
                breaker_paused = true;
            } else if breaker_paused {
                breaker_paused = false;
                self.resume_drained();
            }
            if self.shared.over_total(batches.records, batches.bytes) {
                self.flush(&mut batches);
                self.shared.wait_for_room();
            }
            let paused = self.shared.stats.paused_partitions.load(Relaxed) > 0;
            let wait = if batches.records > 0 {
                Duration::ZERO
            } else if paused {
                Duration::from_millis(5)
            } else {
                POLL_WAIT
            };
            let mut check_clock = true;
            match self.consumer.poll(wait) {
                None => self.flush(&mut batches),
                Some(Ok(msg)) => {
                    self.batch(&msg, &mut batches, &mut cache);
                    // Reading the clock per record is measurable; do it once per batch.
                    check_clock = batches.records == 0;
                    if batches.records >= BATCH {
                        self.flush(&mut batches);
                        check_clock = true;
                    }
                }
                Some(Err(e)) if is_fatal(&e) => {
                    result = Err(Error::Kafka(e));
                    break;
                }
                Some(Err(e)) => {
                    self.topics.consumer_error(&e);
                    self.hooks().log.warn("consumer error", &e.to_string());
                }
            }
            if let Some(e) = self.hooks().log.take_fatal() {
                result = Err(Error::Kafka(e));
                break;
            }
            if let Err(e) = self.topics.check(self.consumer, &self.shared.stats) {
                result = Err(e);
                break;
            }
            if let Some(e) = self.hooks().transactions.as_ref().and_then(|t| t.take_fatal()) {
                result = Err(e);
                break;
            }
            if let Some(e) = self.shared.rejections.as_ref().and_then(|r| r.take_fatal()) {
                tracing::error!(pipeline = %self.shared.config.name, error = %e, "stopping");
                result = Err(Error::Runtime(e));
                break;
            }
            if self.hooks().transactions.as_ref().is_some_and(|t| t.needs_reset()) {
                match self.reset_transactions() {
                    Ok(true) => {}
                    Ok(false) => {
                        producer_ready = false; // stopped meanwhile: no producer to commit with
                        break;
                    }
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            if paused && self.shared.resume_hint.swap(false, Relaxed) {
                self.resume_drained();
            }
            // Once per batch, not per record (`check_clock`).
            if let Some(txn) = self.hooks().transactions.as_ref().filter(|_| check_clock) {
                if let Err(e) = self.rewind_deferred() {
                    result = Err(e);
                    break;
                }
                if Instant::now() >= next_pump {
                    self.flush(&mut batches);
                    let handles: Vec<_> = self.hooks().lock().handles().cloned().collect();
                    if let Err(outcome) = txn.pump(&handles)
                        && let Err(e) = self.after_transaction(outcome)
                    {
                        result = Err(e);
                        break;
                    }
                    next_pump = Instant::now() + pump_interval;
                }
            }
            let records_due = every.is_some_and(|n| self.completed().saturating_sub(completed_at_commit) >= n);
            if records_due || (check_clock && Instant::now() >= next_commit) {
                completed_at_commit = self.completed();
                self.flush(&mut batches);
                let now = Instant::now();
                let refresh = now >= next_refresh;
                if refresh {
                    next_refresh = now + RECOMMIT_EVERY;
                }
                if let Err(e) = self.commit_progress(refresh) {
                    result = Err(e);
                    break;
                }
                if paused {
                    self.resume_drained();
                }
                next_commit = Instant::now() + interval;
            }
        }
        // Records batched but never handed over were not tracked: they are simply not committed.
        drop(batches);
        let drained = self.shutdown(result.is_ok() && producer_ready);
        let s = self.shared.stats.snapshot();
        result.map(|()| RunSummary { processed: s.processed, failed: s.failed, drained })
    }

    /// Records finished so far (processed, dead-lettered or skipped as duplicates).
    fn completed(&self) -> u64 {
        let s = &self.shared.stats;
        s.processed.load(Relaxed) + s.dead_lettered.load(Relaxed) + s.dedup_hits.load(Relaxed)
    }

    /// Copies a polled message into its partition's batch, unless the partition is not owned
    /// (prefetched before a revoke: never tracked, so never committed).
    fn batch(&self, msg: &rdkafka::message::BorrowedMessage<'_>, batches: &mut Batches, cache: &mut HandleCache) {
        let Some(handle) = cache.get(self.hooks(), msg.topic(), msg.partition()) else {
            return;
        };
        let record = Record::from_message(msg, handle.topic.clone());
        batches.records += 1;
        batches.bytes += record.byte_len();
        let (handle, batch) = batches.by_epoch.entry(handle.epoch).or_insert_with(|| (handle, Vec::with_capacity(64)));
        batch.push(record);
        if handle.buffered() + batch.len() >= self.shared.config.bounds.max_in_flight_per_partition {
            self.flush(batches); // hands the batch over now, and pauses the partition if need be
        }
    }

    /// Hands every batch to its partition task, pausing partitions that reached their bound.
    fn flush(&self, batches: &mut Batches) {
        if batches.records == 0 {
            return;
        }
        self.shared.stats.polled.fetch_add(batches.records as u64, Relaxed);
        batches.records = 0;
        batches.bytes = 0;
        let bounds = &self.shared.config.bounds;
        // The per-partition bound pauses a partition (librdkafka then drops what it prefetched for
        // it); when it is not below the total bound, throttling the poll is enough and cheaper.
        let per_partition = bounds.max_in_flight_per_partition < bounds.max_in_flight_total;
        let mut full = Vec::new();
        for (_, (handle, records)) in batches.by_epoch.drain() {
            if handle.send(records, &self.shared.stats) >= bounds.max_in_flight_per_partition && per_partition {
                full.push(handle);
            }
        }
        if !full.is_empty() {
            self.pause(&full);
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

    /// Resumes paused partitions that drained to half their bound.
    fn resume_drained(&self) {
        if self.shared.stats.breaker_open.load(Relaxed) != 0 {
            return; // the circuit breaker holds everything paused
        }
        let half = self.shared.config.bounds.max_in_flight_per_partition / 2;
        let mut tpl = TopicPartitionList::new();
        for h in self.hooks().lock().handles() {
            if h.is_paused() && h.buffered() <= half {
                tpl.add_partition(&h.topic, h.partition);
                h.set_paused(false);
                self.shared.stats.paused_partitions.fetch_sub(1, Relaxed);
            }
        }
        if tpl.count() > 0
            && let Err(e) = self.consumer.resume(&tpl)
        {
            tracing::warn!(error = %e, "resuming partitions failed");
        }
    }

    /// Commits every owned partition whose completed prefix moved: asynchronously, or in a
    /// transaction (exactly-once). With `refresh` (at-least-once, every [`RECOMMIT_EVERY`]) every
    /// owned partition's completed prefix is committed again even if it did not move, as the Java
    /// consumer's auto-commit does: a commit the group lost or that a late commit replaced is healed
    /// within that time instead of lingering as lag until the next rebalance. An error stops the
    /// pipeline.
    fn commit_progress(&self, refresh: bool) -> Result<(), Error> {
        if let Some(txn) = &self.hooks().transactions {
            self.rewind_deferred()?;
            let handles: Vec<_> = self.hooks().lock().handles().cloned().collect();
            self.advance_idle(&handles);
            return self.after_transaction(txn.commit(self.consumer, &handles));
        }
        let force = self.hooks().recommit.swap(false, Relaxed) | refresh;
        let handles: Vec<_> = self.hooks().lock().handles().cloned().collect();
        self.advance_idle(&handles);
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
                h.set_committed(offset);
            }
        } else {
            self.hooks().recommit.store(true, Relaxed);
        }
        Ok(())
    }

    /// Moves the committable offset of every caught-up partition to the consumer's position, past
    /// transaction markers and aborted records (see [`PartitionHandle::advance_idle`]), so that a
    /// group that finished its work shows lag 0 on transactional input too. Every polled record
    /// must have been handed over (flushed) before.
    fn advance_idle(&self, handles: &[Arc<PartitionHandle>]) {
        let idle: Vec<_> = handles.iter().filter(|h| h.caught_up()).collect();
        if idle.is_empty() {
            return;
        }
        let positions = match self.consumer.position() {
            Ok(p) => p,
            Err(e) => return self.hooks().log.warn("reading the consumer's position failed", &e.to_string()),
        };
        for h in idle {
            if let Some(Offset::Offset(p)) = positions.find_partition(&h.topic, h.partition).map(|e| e.offset()) {
                h.advance_idle(p);
            }
        }
    }

    /// Exactly-once: rewinds the partitions an abort inside a rebalance callback left for after the
    /// poll. Runs before anything else moves their work into a transaction (their aborted entries
    /// are gone, so nothing of theirs may commit before the rewind).
    fn rewind_deferred(&self) -> Result<(), Error> {
        let Some(txn) = &self.hooks().transactions else { return Ok(()) };
        let deferred = txn.take_deferred_rewinds();
        if deferred.is_empty() {
            return Ok(());
        }
        self.hooks().rewind(self.consumer, &deferred).map_err(Error::Transaction)
    }

    /// Acts on how a transaction step ended: rewinds after an abort, stops after a fatal error.
    fn after_transaction(&self, outcome: TxnOutcome) -> Result<(), Error> {
        match outcome {
            TxnOutcome::Idle | TxnOutcome::Committed => Ok(()),
            TxnOutcome::Aborted(rewind) => self.hooks().rewind(self.consumer, &rewind).map_err(Error::Transaction),
            // The poll loop resets before its next poll (it checks `needs_reset`).
            TxnOutcome::Reset => Ok(()),
            TxnOutcome::Fatal => Err(self
                .hooks()
                .transactions
                .as_ref()
                .and_then(|t| t.take_fatal())
                .unwrap_or_else(|| Error::Runtime("transactions stopped on a fatal error".into()))),
        }
    }

    /// Exactly-once, after [`TxnOutcome::Reset`]: replaces the transactional producer, then rewinds
    /// every owned partition to the offsets the group coordinator holds (read once the new
    /// producer's `init_transactions` settled the old transaction, so they are the truth whether it
    /// committed or not). `Ok(false)` when the pipeline was stopped meanwhile.
    fn reset_transactions(&self) -> Result<bool, Error> {
        let Some(txn) = &self.hooks().transactions else { return Ok(true) };
        if !txn.reset(&self.stop).map_err(Error::Transaction)? {
            return Ok(false);
        }
        let handles: Vec<_> = self.hooks().lock().handles().cloned().collect();
        self.hooks().rewind_to_group_offsets(self.consumer, &handles, &self.stop).map_err(Error::Transaction)?;
        Ok(!self.stop.is_cancelled())
    }

    /// Stop: every partition task finishes its running and queued records until the drain deadline;
    /// the completed prefixes are committed synchronously (unless stopping on a fatal error); then the
    /// partitions are given up. Returns whether everything finished in time.
    fn shutdown(&self, commit: bool) -> bool {
        let name = &self.shared.config.name;
        let in_flight = self.shared.stats.in_flight.load(Relaxed);
        tracing::info!(pipeline = %name, in_flight, "shutting down: draining");
        // Processors can see the shutdown (and retries waiting on a backoff give up at once).
        self.shared.handles.shutdown.cancel();
        let released = self.hooks().lock().drain_all();
        self.hooks().version.fetch_add(1, Relaxed);
        let deadline = Instant::now() + self.shared.config.drain_timeout;
        let stops: Vec<_> = released.iter().map(|h| h.stop(true, deadline)).collect();
        // Wait for every task (no short-circuit): each must reach idle or the deadline.
        let idle: Vec<bool> = stops.into_iter().map(|s| s.wait()).collect();
        let drained = idle.iter().all(|&i| i);
        if !drained {
            tracing::warn!(pipeline = %name, "drain deadline passed; committing only the completed prefix");
        }
        if commit {
            let mut tpl = TopicPartitionList::new();
            for h in &released {
                if let Some(offset) = h.committable() {
                    let _ = tpl.add_partition_offset(&h.topic, h.partition, Offset::Offset(offset));
                }
            }
            self.hooks().commit_released(self.consumer, &released, &tpl);
        } else if self.hooks().transactions.is_some() {
            for h in &released {
                h.pending.discard(&self.shared.stats);
            }
        }
        let s = &self.shared.stats;
        s.revocations.fetch_add(released.len() as u64, Relaxed);
        s.assigned_partitions.store(0, Relaxed);
        s.paused_partitions.store(0, Relaxed);
        tracing::info!(pipeline = %name, drained, "stopped");
        drained
    }
}
