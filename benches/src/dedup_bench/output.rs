//! What the `dedup` benchmark prints: the settings before it runs, and the summary and `RESULT` line after.

use super::{Plan, Restore, Results, Run, Side, TARGET_RATIO, Workload};
use crate::core_bench::load_average;
use crate::measure::{Summary, other_process_cpu};
use millrace::DedupConfig;
use std::path::Path;

/// The settings, including the dedup store's write settings, before anything runs.
pub(super) fn print_header(plan: &Plan) {
    let workloads: Vec<&str> = plan.topics.iter().map(|(w, _)| w.name()).collect();
    println!(
        "dedup: {} records x {} B values per workload ({} duplicates), {} keys, {} partitions, {} pair(s), \
         brokers {}, {} CPUs, load average {}",
        plan.records(),
        plan.load.value_size,
        workloads.join(" and "),
        plan.load.keys,
        plan.partitions,
        plan.pairs,
        plan.bootstrap,
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average(),
    );
    let defaults = DedupConfig::new(&plan.base_dir);
    println!(
        "dedup store: RocksDB under {} ({} file system), fresh per run; write-ahead log on (always); \
         sync_writes={} ({}); one column family per topic-partition; TTL {} s; header {:?}",
        plan.base_dir.display(),
        file_system_of(&plan.base_dir),
        plan.sync_writes,
        if plan.sync_writes {
            "every write fsynced before the record completes"
        } else {
            "WAL written but not fsynced per write: survives a process kill, not a power loss"
        },
        defaults.ttl.as_secs(),
        defaults.header,
    );
    if plan.changelog {
        println!(
            "dedup changelog: each new key produced to <group>.dedup-changelog (compacted; the pipeline's \
             producer: acks=all, enable.idempotence=true, linger.ms=5 unless overridden) and acknowledged \
             before its offset completes; restore timeout {} s",
            defaults.restore_timeout.as_secs(),
        );
    } else {
        println!("dedup changelog: OFF (--no-changelog experiment: RocksDB only, nothing to restore)");
    }
    for (k, v) in &plan.producer_properties {
        println!("producer property for both sides: {k}={v}");
    }
    if let Some(pid) = plan.broker_pid {
        match other_process_cpu(pid) {
            Some(_) => println!("broker process {pid}: its CPU time is reported per run"),
            None => println!("broker process {pid}: not found, its CPU time is not reported"),
        }
    }
}

/// Prints the summary table, the ratios, the restore rate and the machine-readable `RESULT` line.
pub(super) fn report(plan: &Plan, results: &Results) {
    let summarise = |workload: Workload, side: Side, metric: &dyn Fn(&Run) -> f64| {
        Summary::of(results.runs.iter().filter(|r| r.workload == workload && r.side == side).map(metric))
    };
    let rps = |w, s| summarise(w, s, &|r: &Run| r.m.rps());
    let steady = |w, s| summarise(w, s, &Run::steady_rps);
    let cpu = |w, s| summarise(w, s, &|r: &Run| r.m.cpu_s_per_m());
    let broker = |w, s| summarise(w, s, &|r: &Run| r.broker_cpu_s_per_m().unwrap_or(f64::NAN));
    let busy = |w, s| summarise(w, s, &|r: &Run| r.machine_busy.map_or(f64::NAN, |b| b * 100.0));

    println!();
    println!("summary over {} pair(s) of {} records (median, min-max):", plan.pairs, plan.records());
    let broker_column = plan.broker_pid.is_some();
    println!(
        "{:<8}  {:<8}  {:>11}  {:>23}  {:>12}  {:>19}  {:>12}{}",
        "workload",
        "side",
        "records/s",
        "min-max records/s",
        "steady rec/s",
        "cpu s/M (min-max)",
        "machine busy",
        if broker_column { "  broker cpu s/M" } else { "" },
    );
    for &(workload, _) in &plan.topics {
        for &side in &plan.sides {
            let (Some(r), Some(st), Some(c)) = (rps(workload, side), steady(workload, side), cpu(workload, side))
            else {
                continue;
            };
            let (b, m) = (broker(workload, side).map_or(f64::NAN, |b| b.median), busy(workload, side));
            println!(
                "{:<8}  {:<8}  {:>11.0}  {:>23}  {:>12.0}  {:>19}  {:>12}{}",
                workload.name(),
                side.name(),
                r.median,
                format!("{:.0}-{:.0}", r.min, r.max),
                st.median,
                format!("{:.2} ({:.2}-{:.2})", c.median, c.min, c.max),
                m.filter(|m| !m.median.is_nan()).map_or_else(|| "?".to_owned(), |m| format!("{:.0}%", m.median)),
                match (broker_column, b.is_nan()) {
                    (false, _) => String::new(),
                    (true, true) => format!("  {:>14}", "?"),
                    (true, false) => format!("  {b:>14.2}"),
                },
            );
        }
    }
    let ratio = |w, metric: &dyn Fn(Workload, Side) -> Option<Summary>| {
        Some(metric(w, Side::Dedup)?.median / metric(w, Side::Nodedup)?.median)
    };
    for &(w, _) in &plan.topics {
        let (Some(r), Some(st), Some(c)) = (ratio(w, &rps), ratio(w, &steady), ratio(w, &cpu)) else { continue };
        println!(
            "dedup/nodedup, {} duplicates: throughput {r:.3} (steady {st:.3}), CPU per record {c:.2}x; target >= \
             {TARGET_RATIO}: {}",
            w.name(),
            if r >= TARGET_RATIO { "met" } else { "NOT met" },
        );
    }
    let restore_rate = Summary::of(results.restores.iter().map(Restore::rate));
    if let Some(rate) = restore_rate {
        let secs = Summary::of(results.restores.iter().map(|r| r.elapsed.as_secs_f64())).expect("non-empty");
        let after = Summary::of(results.restores.iter().map(Restore::rate_after_assignment)).expect("non-empty");
        let entries = Summary::of(results.restores.iter().map(|r| r.entries as f64)).expect("non-empty");
        println!(
            "restore into an empty store: {:.0} entries in {:.3} s ({:.3}-{:.3}): {:.0} entries/s ({:.0}-{:.0}); \
             {:.0} entries/s after assignment",
            entries.median, secs.median, secs.min, secs.max, rate.median, rate.min, rate.max, after.median,
        );
    }
    if results.problems.is_empty() {
        println!("checks: dedup hit counts and restored entries as expected");
    } else {
        println!("checks FAILED: {}", results.problems.join("; "));
    }
    println!("load average {}", load_average());

    let fmt = |v: Option<f64>, digits: usize| v.map_or_else(|| "na".to_owned(), |v| format!("{v:.digits$}"));
    let median = |s: Option<Summary>| s.map(|s| s.median);
    println!(
        "RESULT dedup ratio_0pct={} ratio_10pct={} restore_rate={} nodedup_rps={} dedup_rps={} \
         nodedup_rps_10pct={} dedup_rps_10pct={} steady_ratio_0pct={} steady_ratio_10pct={} \
         cpu_ratio_0pct={} cpu_ratio_10pct={} nodedup_cpu_s_per_m={} dedup_cpu_s_per_m={} records={} pairs={} \
         sync_writes={} changelog={} checks={}",
        fmt(ratio(Workload::Unique, &rps), 3),
        fmt(ratio(Workload::Duplicates, &rps), 3),
        fmt(median(restore_rate), 0),
        fmt(median(rps(Workload::Unique, Side::Nodedup)), 0),
        fmt(median(rps(Workload::Unique, Side::Dedup)), 0),
        fmt(median(rps(Workload::Duplicates, Side::Nodedup)), 0),
        fmt(median(rps(Workload::Duplicates, Side::Dedup)), 0),
        fmt(ratio(Workload::Unique, &steady), 3),
        fmt(ratio(Workload::Duplicates, &steady), 3),
        fmt(ratio(Workload::Unique, &cpu), 3),
        fmt(ratio(Workload::Duplicates, &cpu), 3),
        fmt(median(cpu(Workload::Unique, Side::Nodedup)), 3),
        fmt(median(cpu(Workload::Unique, Side::Dedup)), 3),
        plan.records(),
        plan.pairs,
        plan.sync_writes,
        plan.changelog,
        if results.problems.is_empty() { "ok" } else { "failed" },
    );
}

/// The type of the file system holding `path` (from `/proc/mounts`; "?" where unknown).
fn file_system_of(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, mount_point, fs_type) = (fields.next()?, fields.next()?, fields.next()?);
            path.starts_with(mount_point).then(|| (mount_point.len(), fs_type.to_owned()))
        })
        .max_by_key(|(len, _)| *len)
        .map_or_else(|| "?".to_owned(), |(_, fs_type)| fs_type)
}
