//! What a `slow` run's sleep log says: its throughput against the ideal the concurrency bound
//! allows, computed by simulating the permits and lanes over the sleeps it recorded.

use super::{Mode, Plan, Run, Slept, Triple, ceil_ms};
use anyhow::Context as _;
use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

/// Turns a run's sleeps into its elapsed time, ideals and bounds.
pub(super) fn analyse(
    plan: &Plan,
    mode: Mode,
    log: &[Slept],
    from_start: Duration,
    running_peak: u64,
) -> anyhow::Result<Run> {
    let began = log.iter().map(|s| s.began).min().context("no sleep was recorded")?;
    let ended = log.iter().map(|s| s.ended).max().context("no sleep was recorded")?;
    // One sleep per offset: the first, should a record have been redelivered.
    let mut by_offset: Vec<&Slept> = Vec::with_capacity(log.len());
    let mut seen = std::collections::HashSet::new();
    let mut sorted: Vec<&Slept> = log.iter().collect();
    sorted.sort_by_key(|s| (s.offset, s.began));
    for s in sorted {
        if seen.insert(s.offset) {
            by_offset.push(s);
        }
    }
    let sum = |f: &dyn Fn(&Slept) -> Duration| -> Duration { by_offset.iter().map(|s| f(s)).sum() };
    let total = Triple {
        requested: sum(&|s| s.requested),
        whole_ms: sum(&|s| ceil_ms(s.requested)),
        actual: sum(&Slept::actual),
    };
    let n = by_offset.len().max(1) as u32;
    let c = plan.concurrency as u32;
    // The lane of every record, as Millrace orders them.
    let mut key_ids: HashMap<Option<&[u8]>, u64> = HashMap::new();
    let lanes: Vec<u64> = by_offset
        .iter()
        .map(|s| match mode {
            Mode::Partition => 0,
            Mode::Key(_) => {
                let next = key_ids.len() as u64;
                *key_ids.entry(s.key.as_deref()).or_insert(next)
            }
            Mode::Unordered => s.offset as u64,
        })
        .collect();
    let bound_of = |f: &dyn Fn(&Slept) -> Duration| -> Duration {
        let jobs: Vec<(u64, u64)> =
            lanes.iter().zip(&by_offset).map(|(&lane, s)| (lane, f(s).as_nanos() as u64)).collect();
        Duration::from_nanos(simulate(&jobs, plan.concurrency))
    };
    Ok(Run {
        mode,
        elapsed: ended - began,
        from_start,
        sleeps: log.len(),
        ideal: Triple { requested: total.requested / c, whole_ms: total.whole_ms / c, actual: total.actual / c },
        bound: Triple {
            requested: bound_of(&|s| s.requested),
            whole_ms: bound_of(&|s| ceil_ms(s.requested)),
            actual: bound_of(&Slept::actual),
        },
        overshoot: total.actual.saturating_sub(total.requested) / n,
        running_peak,
    })
}

/// The makespan, in nanoseconds, of `jobs` (lane, duration in ns, in offset order, all available at
/// time 0) under Millrace's discipline with no overhead: a lane runs one job at a time in order, at
/// most `permits` jobs run at once, and a job that finds no permit waits in a first-come, first-served
/// queue (a finished job's permit goes to the queue's head before its lane's next job asks for one).
pub(super) fn simulate(jobs: &[(u64, u64)], permits: usize) -> u64 {
    struct Sim<'a> {
        jobs: &'a [(u64, u64)],
        free: usize,
        waiting: VecDeque<usize>,
        ends: BinaryHeap<Reverse<(u64, usize)>>,
    }
    impl Sim<'_> {
        fn ask(&mut self, job: usize, now: u64) {
            if self.free > 0 {
                self.free -= 1;
                self.ends.push(Reverse((now + self.jobs[job].1, job)));
            } else {
                self.waiting.push_back(job);
            }
        }
    }
    let mut sim = Sim { jobs, free: permits.max(1), waiting: VecDeque::new(), ends: BinaryHeap::new() };
    // Present while a job of the lane runs or waits for a permit; holds the lane's later jobs.
    let mut lanes: HashMap<u64, VecDeque<usize>> = HashMap::new();
    for (job, &(lane, _)) in jobs.iter().enumerate() {
        match lanes.entry(lane) {
            Entry::Occupied(mut queued) => queued.get_mut().push_back(job),
            Entry::Vacant(slot) => {
                slot.insert(VecDeque::new());
                sim.ask(job, 0);
            }
        }
    }
    let mut makespan = 0;
    while let Some(Reverse((now, job))) = sim.ends.pop() {
        makespan = now;
        match sim.waiting.pop_front() {
            Some(next) => sim.ends.push(Reverse((now + jobs[next].1, next))),
            None => sim.free += 1,
        }
        let lane = jobs[job].0;
        match lanes.get_mut(&lane).and_then(VecDeque::pop_front) {
            Some(next) => sim.ask(next, now),
            None => {
                lanes.remove(&lane);
            }
        }
    }
    makespan
}
