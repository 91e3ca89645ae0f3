//! The partition task: owns the partition's [`OffsetTracker`] and key lanes for one epoch, runs
//! records through the layers, and publishes the committable offset in its handle.

use super::{Command, LaneId, PartitionHandle};
use crate::config::ProcessingOrder;
use crate::context::CancelReason;
use crate::dedup::changelog;
use crate::layer::{self, CallScope, Outcome, Processed};
use crate::park::{Change, Decision, ParkedKeys};
use crate::processor::Processor;
use crate::record::Record;
use crate::shared::Shared;
use crate::state::offsets::OffsetTracker;
use crate::state::pending;
use crate::stats::Stats;
use crate::telemetry::events::RecordFailed;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::collections::hash_map::Entry;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{Ordering::Relaxed, Ordering::Release};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

/// Starts a partition's task on `runtime` for one epoch and returns its handle.
pub(crate) fn start<P: Processor>(
    shared: &Arc<Shared<P>>,
    runtime: &tokio::runtime::Handle,
    topic: Arc<str>,
    partition: i32,
    epoch: u64,
) -> Arc<PartitionHandle> {
    let (handle, rx) = PartitionHandle::new(topic, partition, epoch, shared.backpressure.load().clone());
    runtime.spawn(PartitionTask::new(shared.clone(), handle.clone()).run(rx));
    handle
}

/// A record's processing, finished.
struct Finished {
    lane: LaneId,
    offset: i64,
    bytes: u64,
    outcome: Outcome,
    /// Exactly-once with dedup: the key to record once the record's transaction commits.
    dedup_key: Option<Vec<u8>>,
    /// Exactly-once: produce its outputs in a batch of their own (see [`crate::rejected`]).
    alone: bool,
    /// Its idempotency key was looked up and not found.
    dedup_miss: bool,
    /// It was dead-lettered as `parked` (its key was parked), not run.
    parked: bool,
    /// The change it made to its key's parking, with the key.
    park: Option<(Vec<u8>, Change)>,
    /// Exactly-once: the parked-keys record of that change, for the transaction.
    park_record: Option<crate::record::OutputRecord>,
}

struct Stopping {
    deadline: Instant,
    done: Option<std::sync::mpsc::SyncSender<bool>>,
    /// What a call still running at the deadline is told.
    reason: CancelReason,
}

struct PartitionTask<P> {
    shared: Arc<Shared<P>>,
    handle: Arc<PartitionHandle>,
    ordering: ProcessingOrder,
    tracker: OffsetTracker,
    /// Present while a record of the lane runs; holds the lane's waiting records.
    lanes: FxHashMap<LaneId, VecDeque<Record>>,
    /// The partition's parked keys (empty with parking off), read before its first record.
    parked: ParkedKeys,
    stopping: Option<Stopping>,
    /// What each record's processing future holds; cloned per record, and local to this task, so the
    /// clone does not bounce a shared counter between cores.
    ctx: Arc<TaskCtx<P>>,
    /// Counts not yet added to the shared statistics (added once per batch of work).
    tally: Tally,
}

struct TaskCtx<P> {
    shared: Arc<Shared<P>>,
    handle: Arc<PartitionHandle>,
    epoch: u64,
    /// Cancelled on revoke, at the stop deadline and at shutdown: retries and DLQ produces give up.
    cancel: CancellationToken,
    /// Its drain deadline, fired at the stop deadline: calls still inside the processor are
    /// cancelled (and dropped); and its slot in the blocked-call detector.
    scope: CallScope,
}

/// Outcomes and releases of one batch of work, added to the shared counters together.
#[derive(Default)]
struct Tally {
    processed: u64,
    dedup_hits: u64,
    dedup_misses: u64,
    dead_lettered: u64,
    parked: u64,
    failed: u64,
    released: usize,
    released_bytes: u64,
    succeeded_for_breaker: u32,
    /// Records that had waited (counted as running) and finished.
    finished_running: u64,
}

/// Ready completions a partition task takes in one go before it looks at its commands again.
const DRAIN_AT_ONCE: usize = 256;

/// Sleeps until `deadline`, or forever without one. Nothing happens (no clock read, no timer) until
/// it is polled, so building it on every turn of the task's loop costs nothing.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// Records being processed by a partition task, whatever the processor's future type.
type Running = FuturesUnordered<Pin<Box<dyn Future<Output = Finished> + Send>>>;

impl<P: Processor> PartitionTask<P> {
    fn new(shared: Arc<Shared<P>>, handle: Arc<PartitionHandle>) -> Self {
        let ordering = shared.config.ordering;
        let cancel = shared.handles.shutdown.child_token();
        let scope = CallScope::new(shared.blocking.slot(handle.topic.clone(), handle.partition));
        let ctx =
            Arc::new(TaskCtx { shared: shared.clone(), handle: handle.clone(), epoch: handle.epoch, cancel, scope });
        Self {
            shared,
            handle,
            ordering,
            tracker: OffsetTracker::new(),
            lanes: FxHashMap::default(),
            parked: ParkedKeys::new(0),
            stopping: None,
            ctx,
            tally: Tally::default(),
        }
    }

    async fn run(mut self, mut rx: UnboundedReceiver<Command>) {
        // A partition that moved here may bring dedup keys this instance has never seen.
        changelog::restore(&self.shared, &self.handle.topic, self.handle.partition).await;
        let mut running = Running::new();
        // A parked key must be known before any of its records starts; batches wait meanwhile.
        for batch in self.restore_parked(&mut rx).await {
            self.on_command(&mut running, Some(Command::Records(batch)));
        }
        loop {
            if let Some(stop) = &mut self.stopping {
                let idle = running.is_empty();
                if (idle || Instant::now() >= stop.deadline)
                    && let Some(done) = stop.done.take()
                {
                    let reason = stop.reason;
                    // The poll thread commits what is done now; nothing after this is read.
                    self.flush_tally();
                    let _ = done.send(idle);
                    self.drop_queued();
                    self.ctx.cancel.cancel();
                    // Calls still running are cancelled, given their grace, then dropped; the task
                    // ends when the last has.
                    self.ctx.scope.drain.fire(reason);
                }
                if idle {
                    // Refuse further batches and release the ones that arrived after the stop.
                    rx.close();
                    while let Ok(command) = rx.try_recv() {
                        if let Command::Records(batch) = command {
                            for record in batch {
                                self.release(record.byte_len() as u64);
                            }
                        }
                    }
                    self.flush_tally();
                    if let Some(dedup) = &self.shared.dedup {
                        dedup.save_position_of(&self.handle.topic, self.handle.partition);
                    }
                    return;
                }
            }
            let deadline = self.stopping.as_ref().map(|s| s.deadline);
            tokio::select! {
                command = rx.recv(), if self.stopping.is_none() => self.on_command(&mut running, command),
                Some(finished) = running.next(), if !running.is_empty() => {
                    // Completions arrive in bursts (one produce request acknowledges many outputs):
                    // take every one that is ready, so the shared counters are touched once per burst.
                    let mut ready = Some(finished);
                    let mut taken = 0;
                    while let Some(finished) = ready.take() {
                        self.tally.finished_running += 1;
                        if let Some(next) = self.finish(finished) {
                            self.launch(&mut running, next);
                        }
                        taken += 1;
                        if taken < DRAIN_AT_ONCE {
                            ready = running.next().now_or_never().flatten();
                        }
                    }
                }
                () = until(deadline), if deadline.is_some() => {}
            }
            self.flush_tally();
        }
    }

    /// Acts on a command from the poll thread (`None`: the handle is gone).
    fn on_command(&mut self, running: &mut Running, command: Option<Command>) {
        match command {
            Some(Command::Records(batch)) if self.stopping.is_some() => {
                for record in batch {
                    self.release(record.byte_len() as u64);
                }
            }
            Some(Command::Records(batch)) => {
                for record in batch {
                    if let Some(start) = self.admit(record) {
                        self.launch(running, start);
                    }
                }
            }
            Some(Command::Stop { finish_queued, deadline, done }) => {
                if !finish_queued {
                    // Revoke: the next owner redoes anything unfinished, so waiting retries and
                    // DLQ produces give up now; records inside the processor may still finish.
                    self.drop_queued();
                    self.ctx.cancel.cancel();
                }
                let reason = if finish_queued { CancelReason::Shutdown } else { CancelReason::Revoked };
                self.stopping = Some(Stopping { deadline, done: Some(done), reason });
            }
            None => {
                // The handle is gone without a stop (the pipeline was dropped).
                self.drop_queued();
                let (done, _) = std::sync::mpsc::sync_channel(1);
                let reason = CancelReason::Shutdown;
                self.stopping = Some(Stopping { deadline: Instant::now(), done: Some(done), reason });
            }
        }
    }

    /// With key parking, reads the partition's parked keys; batches that arrive meanwhile are
    /// returned to be admitted after, and a stop ends the wait.
    async fn restore_parked(&mut self, rx: &mut UnboundedReceiver<Command>) -> Vec<Vec<Record>> {
        let mut held = Vec::new();
        if !self.shared.config.dlq.park_keys {
            return held;
        }
        let (topic, partition) = (self.handle.topic.clone(), self.handle.partition);
        let shared = self.shared.clone();
        let cancel = self.ctx.cancel.clone();
        let restore = crate::park::store::restore(&shared, &topic, partition, &cancel);
        tokio::pin!(restore);
        loop {
            tokio::select! {
                parked = &mut restore => {
                    if let Some(parked) = parked {
                        self.parked = parked;
                    }
                    return held;
                }
                command = rx.recv(), if self.stopping.is_none() => match command {
                    Some(Command::Records(batch)) => held.push(batch),
                    other => {
                        // A stop: cancels the restore (the task then ends, having run nothing).
                        self.on_command(&mut Running::new(), other);
                        self.ctx.cancel.cancel();
                    }
                },
            }
        }
    }

    /// Tracks a polled record; returns it if its lane was idle (it starts now), else queues it.
    fn admit(&mut self, record: Record) -> Option<(LaneId, Record)> {
        if !self.tracker.track(record.offset) {
            self.release(record.byte_len() as u64);
            return None;
        }
        let lane = LaneId::of(self.ordering, &record);
        match self.lanes.entry(lane) {
            Entry::Occupied(mut queue) => {
                queue.get_mut().push_back(record);
                None
            }
            Entry::Vacant(slot) => {
                slot.insert(VecDeque::new());
                Some((lane, record))
            }
        }
    }

    /// Starts processing a lane's record. A processor that finishes without waiting completes inline,
    /// and its lane's next record starts at once; only records that wait join `running`.
    fn launch(&mut self, running: &mut Running, mut start: (LaneId, Record)) {
        loop {
            let mut processing = Box::pin(self.process(start));
            match (&mut processing).now_or_never() {
                None => {
                    // It waits (I/O, a timer, the concurrency bound): counted as running until it ends.
                    self.shared.telemetry.stats.started();
                    return running.push(processing);
                }
                Some(finished) => match self.finish(finished) {
                    Some(next) => start = next,
                    None => return,
                },
            }
        }
    }

    /// The processing future of one record: every layer in order ([`crate::layer`]).
    fn process(&self, (lane, record): (LaneId, Record)) -> impl Future<Output = Finished> + Send + use<P> {
        let ctx = self.ctx.clone();
        let parking = self.parked.decide(&self.handle.topic, self.handle.partition, &record);
        async move {
            let TaskCtx { shared, handle, epoch, cancel, scope } = &*ctx;
            let Processed { outcome, dedup_key, alone, dedup_miss, park, park_record } =
                layer::process(shared, &handle.pending, *epoch, &record, parking, cancel, scope).await;
            let bytes = record.byte_len() as u64;
            let parked = matches!(parking, Decision::Park { .. });
            let park = park.and_then(|change| Some((record.key.clone()?, change)));
            let offset = record.offset;
            Finished { lane, offset, bytes, outcome, dedup_key, alone, dedup_miss, parked, park, park_record }
        }
    }

    /// Books a finished record and returns the next record of its lane, if it should start.
    fn finish(&mut self, mut f: Finished) -> Option<(LaneId, Record)> {
        self.tally.dedup_misses += u64::from(f.dedup_miss);
        // A parking change applies before the key's next record starts (it is decided at its start).
        if let Some((key, change)) = &f.park {
            self.parked.apply(key, *change);
            let s = &self.shared.telemetry.stats;
            Stats::bump(if matches!(change, Change::Park(_)) { &s.keys_parked } else { &s.keys_released });
        }
        let park_record = f.park_record.take();
        let completes = match &mut f.outcome {
            Outcome::Done(outputs) => {
                self.tally.processed += 1;
                outputs.extend(park_record);
                let entry = pending::Entry {
                    outputs: std::mem::take(outputs),
                    dedup_key: f.dedup_key.take(),
                    alone: f.alone,
                    dead_letter: false,
                };
                self.keep_for_transaction(f.offset, entry);
                true
            }
            Outcome::Duplicate | Outcome::Skipped => {
                self.tally.dedup_hits += u64::from(matches!(f.outcome, Outcome::Duplicate));
                if let Some(out) = park_record {
                    let entry = pending::Entry { outputs: vec![out], ..Default::default() };
                    self.keep_for_transaction(f.offset, entry);
                }
                true
            }
            Outcome::DeadLettered(outputs) => {
                self.tally.dead_lettered += 1;
                self.tally.parked += u64::from(f.parked);
                outputs.extend(park_record);
                let entry = pending::Entry {
                    outputs: std::mem::take(outputs),
                    dedup_key: None,
                    alone: false,
                    dead_letter: true,
                };
                self.keep_for_transaction(f.offset, entry);
                true
            }
            Outcome::Failed(failure) => {
                self.tally.failed += 1;
                RecordFailed { topic: &self.handle.topic, partition: self.handle.partition, offset: f.offset, failure }
                    .emit(&self.shared.telemetry);
                false
            }
            Outcome::Abandoned => false,
        };
        if completes && self.tracker.complete(f.offset) {
            self.publish();
        }
        // The circuit breaker counts successes in bulk, failures one by one (after the successes
        // before them), so that its "in a row" count stays exact.
        match f.outcome {
            Outcome::Done(_) | Outcome::Duplicate => self.tally.succeeded_for_breaker += 1,
            // A parked record did not run: it says nothing about the processor's health.
            Outcome::DeadLettered(_) if f.parked => {}
            Outcome::DeadLettered(_) | Outcome::Failed(_) => {
                self.flush_breaker();
                if self.shared.breaker.record(1, true, &self.shared.telemetry) {
                    self.shared.backpressure.wake();
                }
            }
            Outcome::Abandoned | Outcome::Skipped => {}
        }
        self.release(f.bytes);
        let next = self.lanes.get_mut(&f.lane).and_then(VecDeque::pop_front);
        if next.is_none() {
            self.lanes.remove(&f.lane);
        }
        next.map(|r| (f.lane, r))
    }

    /// Exactly-once: keeps a completed record's outputs (and dedup key) for the transaction that will
    /// commit its offset; done before the offset is published as committable.
    fn keep_for_transaction(&self, offset: i64, entry: pending::Entry) {
        if !entry.outputs.is_empty() || entry.dedup_key.is_some() {
            self.handle.pending.push(offset, entry);
        }
    }

    fn flush_breaker(&mut self) {
        let ok = std::mem::take(&mut self.tally.succeeded_for_breaker);
        if ok > 0 {
            self.shared.breaker.record(ok, false, &self.shared.telemetry);
        }
    }

    /// Adds this batch's counts to the shared statistics and in-flight accounting, and wakes the poll
    /// thread if it waits for room.
    fn flush_tally(&mut self) {
        self.flush_breaker();
        let t = std::mem::take(&mut self.tally);
        let s = &self.shared.telemetry.stats;
        self.ctx.scope.attempts.flush(&s.attempts);
        self.ctx.scope.latency.flush(&s.latency);
        if t.finished_running > 0 {
            s.running.fetch_sub(t.finished_running, Relaxed);
        }
        for (counter, n) in [
            (&s.processed, t.processed),
            (&s.dedup_hits, t.dedup_hits),
            (&s.dedup_misses, t.dedup_misses),
            (&s.dead_lettered, t.dead_lettered),
            (&s.parked, t.parked),
            (&s.failed, t.failed),
        ] {
            if n > 0 {
                counter.fetch_add(n, Relaxed);
            }
        }
        if t.released == 0 {
            return;
        }
        let left = self.handle.release(t.released, t.released_bytes);
        if self.handle.is_paused() && left <= self.shared.config.bounds.max_in_flight_per_partition / 2 {
            self.shared.backpressure.hint_resume();
        }
        self.shared.backpressure.wake();
    }

    fn publish(&self) {
        if let Some(c) = self.tracker.committable() {
            self.handle.committable.store(c, Release);
        }
    }

    /// Drops every queued (not started) record: they stay uncommitted and are redelivered later.
    fn drop_queued(&mut self) {
        let queued: Vec<Record> = self.lanes.values_mut().flat_map(|q| q.drain(..)).collect();
        self.shared.telemetry.stats.discarded_on_revoke.fetch_add(queued.len() as u64, Relaxed);
        for record in queued {
            self.release(record.byte_len() as u64);
        }
        self.flush_tally();
    }

    /// One record left the partition (finished or dropped); booked at the next [`Self::flush_tally`].
    fn release(&mut self, bytes: u64) {
        self.tally.released += 1;
        self.tally.released_bytes += bytes;
    }
}
