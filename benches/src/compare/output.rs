//! What `compare` prints: the settings before it runs, and after it the per-workload medians, the
//! ratios against their targets and the `RESULT` lines.

use super::workload::{RATIOS, Workload};
use super::{Done, Plan, Results};
use crate::core_bench::load_average;
use crate::measure::{Measurement, Summary};
use std::collections::BTreeSet;

/// One figure of a run.
type Figure = fn(&Measurement) -> f64;

pub(super) fn print_header(plan: &Plan) {
    let sizes: Vec<String> =
        plan.sizes.iter().map(|s| format!("{} records x {} B", s.load.records, s.load.value_size)).collect();
    println!(
        "compare: {}; {} keys, {} partitions, {} round(s), brokers {}, {} CPUs, load average {}",
        sizes.join(" and "),
        plan.sizes[0].load.keys,
        plan.partitions,
        plan.pairs,
        plan.bootstrap,
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average(),
    );
    for w in &plan.workloads {
        println!("  {:<15} {}", w.label(), w.describe());
    }
    println!(
        "RESULT compare-setup records={} large_records={} value_sizes={} keys={} partitions={} pairs={} workloads={}",
        plan.sizes[0].load.records,
        plan.sizes.get(1).map_or(0, |s| s.load.records),
        plan.sizes.iter().map(|s| s.load.value_size.to_string()).collect::<Vec<_>>().join(","),
        plan.sizes[0].load.keys,
        plan.partitions,
        plan.pairs,
        plan.workloads.iter().map(|w| w.slug()).collect::<Vec<_>>().join(","),
    );
}

/// Per-workload medians and per-ratio figures, printed and as `RESULT` lines. Returns how many runs
/// failed.
pub(super) fn report(plan: &Plan, results: &Results) -> usize {
    let ok_runs = |index: usize, w: Workload| -> Vec<&Done> {
        results
            .runs
            .get(&(index, w))
            .map(|runs| runs.iter().filter_map(|r| r.as_ref().ok()).collect())
            .unwrap_or_default()
    };
    let mut failed = 0;
    for (index, size) in plan.sizes.iter().enumerate() {
        let bytes = size.load.value_size;
        println!();
        println!("summary, {bytes} B values, {} records per run (median, min-max):", size.load.records);
        println!(
            "{:<15}  {:>11}  {:>23}  {:>12}  {:>19}  {:>14}",
            "workload", "records/s", "min-max records/s", "steady rec/s", "cpu s/M (min-max)", "process cpu s/M"
        );
        for &w in &plan.workloads {
            let runs = ok_runs(index, w);
            let failures: Vec<&String> = results
                .runs
                .get(&(index, w))
                .map(|r| r.iter().filter_map(|r| r.as_ref().err()).collect())
                .unwrap_or_default();
            failed += failures.len();
            let rps = Summary::of(runs.iter().map(|d| d.m.rps()));
            let steady = Summary::of(runs.iter().map(|d| d.m.steady_rps()));
            let cpu = Summary::of(runs.iter().map(|d| d.m.cpu_s_per_m()));
            let process =
                Summary::of(runs.iter().filter_map(|d| Some(d.process_cpu?.as_secs_f64() / d.m.records as f64 * 1e6)));
            let warm = Summary::of(runs.iter().filter_map(|d| d.m.warm.map(|w| w.rps())));
            let warm_cpu = Summary::of(runs.iter().filter_map(|d| d.m.warm.map(|w| w.cpu_s_per_m())));
            let na = |s: Option<Summary>, digits: usize| {
                s.map_or_else(|| "na".to_owned(), |s| format!("{:.digits$}", s.median))
            };
            let status = if results.unavailable.contains_key(&w) {
                "unavailable"
            } else if !failures.is_empty() {
                "failed"
            } else {
                "ok"
            };
            match (rps, steady, cpu) {
                (Some(r), Some(st), Some(c)) => {
                    println!(
                        "{:<15}  {:>11.0}  {:>23}  {:>12.0}  {:>19}  {:>14}",
                        w.label(),
                        r.median,
                        format!("{:.0}-{:.0}", r.min, r.max),
                        st.median,
                        format!("{:.2} ({:.2}-{:.2})", c.median, c.min, c.max),
                        process.map_or_else(|| "-".to_owned(), |p| format!("{:.2}", p.median)),
                    );
                    println!(
                        "RESULT compare-workload size={bytes} workload={} records={} runs={} rps={:.0} rps_min={:.0} \
                         rps_max={:.0} steady_rps={:.0} cpu_s_per_m={:.3} cpu_min={:.3} cpu_max={:.3} \
                         process_cpu_s_per_m={} warm_rps={} warm_cpu_s_per_m={} status={status}",
                        w.slug(),
                        size.load.records,
                        runs.len(),
                        r.median,
                        r.min,
                        r.max,
                        st.median,
                        c.median,
                        c.min,
                        c.max,
                        na(process, 3),
                        na(warm, 0),
                        na(warm_cpu, 3),
                    );
                    if let (Some(w), Some(c)) = (warm, warm_cpu) {
                        println!("{:<15}  warm window: {:.0} records/s, {:.2} CPU s/M", "", w.median, c.median);
                    }
                }
                _ => {
                    let why = results.unavailable.get(&w).cloned().or_else(|| failures.first().map(|f| f.to_string()));
                    println!("{:<15}  {status}: {}", w.label(), why.unwrap_or_default());
                    println!("RESULT compare-workload size={bytes} workload={} runs=0 status={status}", w.slug());
                }
            }
        }
        println!();
        for ratio in RATIOS {
            if !plan.workloads.contains(&ratio.a) || !plan.workloads.contains(&ratio.b) {
                continue;
            }
            let (a, b) = (ok_runs(index, ratio.a), ok_runs(index, ratio.b));
            let median = |runs: &[&Done], f: fn(&Measurement) -> f64| {
                Summary::of(runs.iter().map(|d| f(&d.m)).filter(|v| !v.is_nan()))
            };
            // A warm ratio compares the warm windows (see `Ratio::warm`).
            let (rps, cpu): (Figure, Figure) = if ratio.warm {
                (Measurement::warm_rps, Measurement::warm_cpu_s_per_m)
            } else {
                (Measurement::rps, Measurement::cpu_s_per_m)
            };
            let (Some(ra), Some(rb), Some(ca), Some(cb)) =
                (median(&a, rps), median(&b, rps), median(&a, cpu), median(&b, cpu))
            else {
                let missing: BTreeSet<String> = [ratio.a, ratio.b]
                    .into_iter()
                    .filter(|w| results.unavailable.contains_key(w) || ok_runs(index, *w).is_empty())
                    .map(|w| w.label())
                    .collect();
                println!(
                    "{:<32}  not available ({} not measured){}",
                    ratio.label(),
                    missing.into_iter().collect::<Vec<_>>().join(", "),
                    if ratio.at_least.is_some() { format!("; target {}", ratio.target_text()) } else { String::new() },
                );
                println!("RESULT compare-ratio size={bytes} ratio={} verdict=na", ratio.slug());
                continue;
            };
            let value = ra.median / rb.median;
            let steady = median(&a, Measurement::steady_rps)
                .zip(median(&b, Measurement::steady_rps))
                .map_or(f64::NAN, |(x, y)| x.median / y.median);
            let cpu_ratio = ca.median / cb.median;
            // Per-round ratios: the runs of one round were back to back.
            let per_round = Summary::of(a.iter().zip(&b).map(|(x, y)| rps(&x.m) / rps(&y.m)).filter(|v| !v.is_nan()))
                .unwrap_or(Summary { median: f64::NAN, min: f64::NAN, max: f64::NAN });
            let verdict = match ratio.verdict(value, cpu_ratio) {
                Some(true) => "met",
                Some(false) => "not-met",
                None => "info",
            };
            println!(
                "{:<32}  {value:.3} (rounds {:.3}-{:.3}; steady {steady:.3}), CPU per record {cpu_ratio:.2}x{}",
                ratio.label(),
                per_round.min,
                per_round.max,
                match ratio.at_least {
                    Some(_) => format!("; target {}: {}", ratio.target_text(), verdict.replace('-', " ")),
                    None => String::new(),
                },
            );
            println!(
                "RESULT compare-ratio size={bytes} ratio={} value={value:.3} min={:.3} max={:.3} steady={steady:.3} \
                 cpu_ratio={cpu_ratio:.3} verdict={verdict}",
                ratio.slug(),
                per_round.min,
                per_round.max,
            );
        }
    }
    println!("load average {}", load_average());
    failed
}
