//! What the `slow` benchmark prints after its runs: the table, the targets and the `RESULT` line.

use super::{KEYS_FOR_TARGETS, Mode, Plan, Run, TARGET_SPEEDUP, TARGET_VS_IDEAL};
use crate::core_bench::load_average;
use crate::measure::Summary;
use std::time::Duration;

/// Prints the summary (medians per configuration), the ratios against the targets and the `RESULT`
/// line.
pub(super) fn report(plan: &Plan, runs: &[Run]) {
    let median = |mode: Mode, f: &dyn Fn(&Run) -> f64| -> Option<f64> {
        Summary::of(runs.iter().filter(|r| r.mode == mode).map(f)).map(|s| s.median)
    };
    let secs = |d: Duration| d.as_secs_f64();
    println!();
    println!("summary over {} round(s) of {} records (medians):", plan.pairs, plan.records);
    println!(
        "{:<10}  {:>10}  {:>9}  {:>9}  {:>11}  {:>10}  {:>11}  {:>11}  {:>11}  {:>7}  {:>12}",
        "mode",
        "records/s",
        "elapsed s",
        "start s",
        "x ideal req",
        "x ideal ms",
        "x ideal act",
        "x bound req",
        "x bound act",
        "conc.",
        "running peak"
    );
    for (mode, _) in &plan.modes {
        let m = |f: &dyn Fn(&Run) -> f64| median(*mode, f).unwrap_or(f64::NAN);
        println!(
            "{:<10}  {:>10.0}  {:>9.3}  {:>9.3}  {:>11.2}  {:>10.2}  {:>11.2}  {:>11.2}  {:>11.2}  {:>7.1}  {:>12.0}",
            mode.name(),
            m(&|r| r.rps(plan.records)),
            m(&|r| secs(r.elapsed)),
            m(&|r| secs(r.from_start)),
            m(&|r| secs(r.elapsed) / secs(r.ideal.requested)),
            m(&|r| secs(r.elapsed) / secs(r.ideal.whole_ms)),
            m(&|r| secs(r.elapsed) / secs(r.ideal.actual)),
            m(&|r| secs(r.elapsed) / secs(r.bound.requested)),
            m(&|r| secs(r.elapsed) / secs(r.bound.actual)),
            m(&|r| r.concurrency(plan)),
            m(&|r| r.running_peak as f64),
        );
    }
    let any = runs.first();
    let ideal_req = any.map_or(f64::NAN, |r| secs(r.ideal.requested));
    let ideal_ms = any.map_or(f64::NAN, |r| secs(r.ideal.whole_ms));
    let key = Mode::Key(KEYS_FOR_TARGETS);
    let key_rps = median(key, &|r| r.rps(plan.records));
    let key_elapsed = median(key, &|r| secs(r.elapsed));
    let partition_rps = median(Mode::Partition, &|r| r.rps(plan.records));
    let speedup = key_rps.zip(partition_rps).map(|(k, p)| k / p);
    let vs_ideal = key_elapsed.map(|e| e / ideal_req);
    let vs_ideal_ms = key_elapsed.map(|e| e / ideal_ms);
    let vs_ideal_act = median(key, &|r| secs(r.elapsed) / secs(r.ideal.actual));
    let key_bound = |f: &dyn Fn(&Run) -> Duration| median(key, &|r| secs(f(r)));
    let (bound_req, bound_ms, bound_act) =
        (key_bound(&|r| r.bound.requested), key_bound(&|r| r.bound.whole_ms), key_bound(&|r| r.bound.actual));
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "ideal elapsed: {ideal_req:.3} s ({:.0} records/s) with the requested delays, {ideal_ms:.3} s \
         ({:.0} records/s) \
         with delays rounded up to whole ms",
        plan.records as f64 / ideal_req,
        plan.records as f64 / ideal_ms,
    );
    let fmt = |v: Option<f64>, digits: usize| v.map_or_else(|| "na".to_owned(), |v| format!("{v:.digits$}"));
    match (speedup, vs_ideal, vs_ideal_ms) {
        (Some(s), Some(i), Some(im)) => {
            println!(
                "key order ({KEYS_FOR_TARGETS} keys) / partition order throughput: {s:.1}x (target >= \
                 {TARGET_SPEEDUP}x: {})",
                verdict(s >= TARGET_SPEEDUP)
            );
            println!(
                "key order ({KEYS_FOR_TARGETS} keys) elapsed / ideal: {i:.2}x with requested delays (target <= \
                 {TARGET_VS_IDEAL}x: {}), {im:.2}x with whole-ms delays ({}), {}x with the measured sleeps ({})",
                verdict(i <= TARGET_VS_IDEAL),
                verdict(im <= TARGET_VS_IDEAL),
                fmt(vs_ideal_act, 2),
                verdict(vs_ideal_act.is_some_and(|v| v <= TARGET_VS_IDEAL)),
            );
            println!(
                "key order ({KEYS_FOR_TARGETS} keys) zero-overhead bound (busiest keys run serially): {} s requested, \
                 {} s whole ms, {} s measured sleeps; elapsed / measured bound {}x",
                fmt(bound_req, 3),
                fmt(bound_ms, 3),
                fmt(bound_act, 3),
                fmt(key_elapsed.zip(bound_act).map(|(e, b)| e / b), 2),
            );
            let factor = |f: &dyn Fn(&Run) -> f64| fmt(median(key, f), 2);
            println!(
                "key order ({KEYS_FOR_TARGETS} keys) elapsed / ideal {i:.2}x = key order's tail {}x (bound req / ideal \
                 req) x timer {}x (bound act / bound req) x Millrace {}x (elapsed / bound act)",
                factor(&|r| secs(r.bound.requested) / secs(r.ideal.requested)),
                factor(&|r| secs(r.bound.actual) / secs(r.bound.requested)),
                factor(&|r| secs(r.elapsed) / secs(r.bound.actual)),
            );
        }
        _ => println!("no key order run with {KEYS_FOR_TARGETS} keys: no ratios against the targets"),
    }
    println!("load average {}", load_average());
    let rps_of = |mode: Mode| fmt(median(mode, &|r| r.rps(plan.records)), 0);
    let k = KEYS_FOR_TARGETS;
    let mut fields = vec![("partition_rps".to_owned(), rps_of(Mode::Partition))];
    for (mode, _) in &plan.modes {
        if let Mode::Key(keys) = mode {
            fields.push((format!("key{keys}_rps"), rps_of(*mode)));
        }
    }
    fields.extend([
        ("unordered_rps".to_owned(), rps_of(Mode::Unordered)),
        ("ideal_rps".to_owned(), format!("{:.0}", plan.records as f64 / ideal_req)),
        ("ideal_ms_rps".to_owned(), format!("{:.0}", plan.records as f64 / ideal_ms)),
        (format!("key{k}_elapsed_s"), fmt(key_elapsed, 3)),
        ("ideal_s".to_owned(), format!("{ideal_req:.3}")),
        ("ideal_ms_s".to_owned(), format!("{ideal_ms:.3}")),
        (format!("key{k}_vs_partition"), fmt(speedup, 1)),
        (format!("key{k}_vs_ideal"), fmt(vs_ideal, 3)),
        (format!("key{k}_vs_ideal_ms"), fmt(vs_ideal_ms, 3)),
        (format!("key{k}_vs_ideal_act"), fmt(vs_ideal_act, 3)),
        (format!("key{k}_bound_s"), fmt(bound_act, 3)),
        (format!("key{k}_vs_bound"), fmt(key_elapsed.zip(bound_act).map(|(e, b)| e / b), 3)),
        ("records".to_owned(), plan.records.to_string()),
        ("concurrency".to_owned(), plan.concurrency.to_string()),
        ("pairs".to_owned(), plan.pairs.to_string()),
        ("seed".to_owned(), plan.seed.to_string()),
    ]);
    let fields: Vec<String> = fields.into_iter().map(|(name, value)| format!("{name}={value}")).collect();
    println!("RESULT slow {}", fields.join(" "));
}
