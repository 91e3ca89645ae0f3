//! The poll thread's loop: polls records and hands them in batches to their partitions' tasks,
//! throttles at the in-flight bounds, pauses and resumes partitions, commits the completed prefixes
//! (at-least-once) or the transaction (exactly-once) every `commit_interval`, and shuts down.
//! It never runs user code (I4).

use crate::cluster::TopicWatch;
use crate::error::Error;
use crate::kafka::errors::is_fatal;
use crate::partition::PartitionHandle;
use crate::processor::Processor;
use crate::rebalance::Hooks;
use crate::record::Record;
use crate::shared::{POLL_WAIT, Shared};
use crate::stats::Stats;
use crate::transaction::TxnOutcome;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::Producer as _;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// At-least-once: how often the completed prefixes are committed again although they did not move.
pub(crate) const RECOMMIT_EVERY: Duration = Duration::from_secs(5);

/// How often the poll thread reports itself live and publishes the metrics.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// Records handed to a partition task in one message, at most.
const BATCH: usize = 512;

/// Exactly-once, after a producer reset: how long one poll turn may wait for the group's committed
/// offsets (asked again on the next turns until they come).
const GROUP_OFFSETS_TRY: Duration = Duration::from_secs(1);

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

pub(crate) struct PollLoop<'c, P> {
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

impl<'c, P: Processor> PollLoop<'c, P> {
    pub(crate) fn new(
        shared: Arc<Shared<P>>,
        consumer: &'c BaseConsumer<Hooks>,
        stop: CancellationToken,
        topics: TopicWatch,
    ) -> Self {
        Self { shared, consumer, stop, topics }
    }

    fn hooks(&self) -> &Hooks {
        self.consumer.context()
    }

    pub(crate) fn run(mut self) -> Result<RunSummary, Error> {
        let topics: Vec<&str> = self.shared.config.topics.iter().map(String::as_str).collect();
        self.consumer.subscribe(&topics)?;
        tracing::info!(pipeline = %self.shared.config.name, ?topics, "subscribed");
        let interval = self.shared.config.commit_interval;
        let mut next_commit = Instant::now() + interval;
        let mut next_publish = Instant::now();
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
            // The circuit breaker pauses every partition while open (newly assigned ones too).
            if self.shared.breaker.tripped() && self.shared.breaker.is_open(&self.shared.telemetry) {
                self.flush(&mut batches);
                let all: Vec<_> = self.hooks().lock().handles().cloned().collect();
                self.pause(&all);
                breaker_paused = true;
            } else if breaker_paused {
                breaker_paused = false;
                self.resume_drained();
            }
            if self.shared.backpressure.over_total(batches.records, batches.bytes) {
                self.flush(&mut batches);
                self.shared.backpressure.wait_for_room(POLL_WAIT);
            }
            let paused = self.shared.telemetry.stats.paused_partitions.load(Relaxed) > 0;
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
                result = Err(e);
                break;
            }
            if let Err(e) = self.topics.check(self.consumer, &self.shared.telemetry.stats) {
                result = Err(e);
                break;
            }
            if let Some(e) = self.hooks().committer.transactions().and_then(|t| t.take_fatal()) {
                result = Err(e);
                break;
            }
            if let Some(e) = self.shared.rejections.as_ref().and_then(|r| r.take_fatal()) {
                tracing::error!(pipeline = %self.shared.config.name, error = %e, "stopping");
                result = Err(e);
                break;
            }
            if self.hooks().committer.transactions().is_some_and(|t| t.needs_reset()) {
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
            if paused && self.shared.backpressure.take_resume_hint() {
                self.resume_drained();
            }
            // Once per batch, not per record (`check_clock`).
            if let Some(txn) = self.hooks().committer.transactions().filter(|_| check_clock) {
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
            // Liveness and the metrics: once a second, whatever the commit interval or
            // `commit_every_records` (which can commit hundreds of times a second).
            if check_clock && Instant::now() >= next_publish {
                self.shared.telemetry.stats.beat();
                let queued = self.shared.handles.producer.in_flight_count()
                    + self.hooks().committer.transactions().map_or(0, |t| t.queued());
                self.shared.telemetry.stats.producer_queue.store(queued.max(0) as u64, Relaxed);
                self.shared.telemetry.publish();
                next_publish = Instant::now() + PUBLISH_EVERY;
            }
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
        let s = self.shared.telemetry.stats.snapshot();
        result.map(|()| RunSummary { processed: s.processed, failed: s.failed, drained })
    }

    /// Records finished so far (processed, dead-lettered or skipped as duplicates).
    fn completed(&self) -> u64 {
        let s = &self.shared.telemetry.stats;
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
        self.shared.telemetry.stats.polled.fetch_add(batches.records as u64, Relaxed);
        batches.records = 0;
        batches.bytes = 0;
        let bounds = &self.shared.config.bounds;
        // The per-partition bound pauses a partition (librdkafka then drops what it prefetched for
        // it); when it is not below the total bound, throttling the poll is enough and cheaper.
        let per_partition = bounds.max_in_flight_per_partition < bounds.max_in_flight_total;
        let mut full = Vec::new();
        for (_, (handle, records)) in batches.by_epoch.drain() {
            if handle.send(records) >= bounds.max_in_flight_per_partition && per_partition {
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
            Stats::bump(&self.shared.telemetry.stats.paused_partitions);
        }
        if tpl.count() > 0
            && let Err(e) = self.consumer.pause(&tpl)
        {
            tracing::warn!(error = %e, "pausing partitions failed");
        }
    }

    /// Resumes paused partitions that drained to half their bound.
    fn resume_drained(&self) {
        if self.shared.breaker.pausing() {
            return; // the circuit breaker holds everything paused
        }
        let half = self.shared.config.bounds.max_in_flight_per_partition / 2;
        let mut tpl = TopicPartitionList::new();
        for h in self.hooks().lock().handles() {
            if h.is_paused() && h.buffered() <= half {
                tpl.add_partition(&h.topic, h.partition);
                h.set_paused(false);
                self.shared.telemetry.stats.paused_partitions.fetch_sub(1, Relaxed);
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
        self.rewind_deferred()?;
        let handles: Vec<_> = self.hooks().lock().handles().cloned().collect();
        self.advance_idle(&handles);
        let outcome = self.hooks().committer.progress(self.consumer, &handles, refresh, &self.shared.telemetry);
        self.after_transaction(outcome)
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
    /// poll, and tries once more to rewind those a producer reset left to the group's offsets. Runs
    /// before anything else moves their work into a transaction (their aborted entries are gone,
    /// or their last transaction's outcome is unknown, so nothing of theirs may commit before the
    /// rewind).
    fn rewind_deferred(&self) -> Result<(), Error> {
        let Some(txn) = self.hooks().committer.transactions() else { return Ok(()) };
        let deferred = txn.take_deferred_rewinds();
        if !deferred.is_empty() {
            self.hooks().rewind(self.consumer, &deferred).map_err(Error::Transaction)?;
        }
        let to_group = txn.awaiting_group_rewind();
        if to_group.is_empty() {
            return Ok(());
        }
        match self.hooks().rewind_to_group_offsets(self.consumer, &to_group, GROUP_OFFSETS_TRY) {
            Ok(()) => txn.group_rewound(),
            // Not yet (the coordinator away, or still settling the old transaction): polled on,
            // so that rebalances are served, and asked again on the next turn.
            Err(e) => txn.group_rewind_failed(&e),
        }
        Ok(())
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
                .committer
                .transactions()
                .and_then(|t| t.take_fatal())
                .unwrap_or_else(|| Error::Runtime("transactions stopped on a fatal error".into()))),
        }
    }

    /// Exactly-once, after [`TxnOutcome::Reset`]: replaces the transactional producer, then leaves
    /// every owned partition to be rewound to the offsets the group coordinator holds (read once
    /// the new producer's `init_transactions` settled the old transaction, so they are the truth
    /// whether it committed or not) by [`rewind_deferred`](Self::rewind_deferred), which asks
    /// between polls: the coordinator may not answer for a while (it went away with the brokers),
    /// and the poll thread must keep polling meanwhile to hand a lost session to the rebalance
    /// callback and rejoin. Until then those partitions commit nothing. `Ok(false)` when the
    /// pipeline was stopped meanwhile.
    fn reset_transactions(&self) -> Result<bool, Error> {
        let Some(txn) = self.hooks().committer.transactions() else { return Ok(true) };
        if !txn.reset(&self.stop).map_err(Error::Transaction)? {
            return Ok(false);
        }
        let handles: Vec<_> = self.hooks().lock().handles().cloned().collect();
        txn.defer_group_rewind(handles);
        self.rewind_deferred()?;
        Ok(!self.stop.is_cancelled())
    }

    /// Stop: every partition task finishes its running and queued records until the drain deadline;
    /// the completed prefixes are committed synchronously (unless stopping on a fatal error); then the
    /// partitions are given up. Returns whether everything finished in time.
    fn shutdown(&self, commit: bool) -> bool {
        let name = &self.shared.config.name;
        let in_flight = self.shared.backpressure.load().records();
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
            self.hooks().committer.released(self.consumer, &released, &self.shared.telemetry);
        } else {
            self.hooks().committer.abandon(&released);
        }
        let s = &self.shared.telemetry.stats;
        s.revocations.fetch_add(released.len() as u64, Relaxed);
        s.assigned_partitions.store(0, Relaxed);
        s.paused_partitions.store(0, Relaxed);
        tracing::info!(pipeline = %name, drained, "stopped");
        drained
    }
}
