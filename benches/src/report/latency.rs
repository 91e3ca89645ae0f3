//! The latency part of the report: its rows in the targets table, its section, and its chart (p50,
//! p99 and p99.9 of each workload at each offered load, log scale), from `latency`'s `RESULT` lines.

use super::{Line, Results};
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const WIDTH: u32 = 1400;
const HEIGHT: u32 = 520;
const QUANTILES: [(&str, &str, RGBColor); 3] = [
    ("p50", "p50_ms", RGBColor(114, 159, 207)),
    ("p99", "p99_ms", RGBColor(52, 101, 164)),
    ("p99.9", "p999_ms", RGBColor(32, 54, 90)),
];
const WORKLOADS: [(&str, &str); 4] =
    [("p0", "P0"), ("f-alos", "F_alos"), ("pt-100ms", "Pt(100 ms)"), ("f-eos-100ms", "F_eos(100 ms)")];

/// The offered loads measured, in order, with their rate.
fn loads(results: &Results) -> Vec<(String, String)> {
    results
        .of("latency-plan")
        .iter()
        .filter_map(|l| Some((l.get("load")?.to_owned(), l.get("rate")?.to_owned())))
        .collect()
}

fn median<'a>(results: &'a Results, load: &str, workload: &str) -> Option<&'a Line> {
    results.of("latency-median").iter().find(|l| l.get("load") == Some(load) && l.get("workload") == Some(workload))
}

fn load_label(load: &str, rate: &str) -> String {
    match load.parse::<f64>() {
        Ok(f) => format!("{:.0}% of P0 ({rate}/s)", f * 100.0),
        _ => format!("{rate}/s"),
    }
}

/// The latency rows of the targets table.
pub(super) fn target_rows(md: &mut String, results: &Results) {
    for (of, to, label) in [
        ("f-alos", "p0", "end-to-end p99: F_alos ≤ 1.5× P0"),
        ("f-eos-100ms", "pt-100ms", "end-to-end p99: F_eos(100 ms) ≤ 1.2× Pt(100 ms)"),
    ] {
        let mut measured = Vec::new();
        let mut met = Vec::new();
        for (load, rate) in loads(results) {
            let Some(line) = results
                .of("latency-ratio")
                .iter()
                .find(|l| l.get("load") == Some(load.as_str()) && l.get("of") == Some(of) && l.get("to") == Some(to))
            else {
                continue;
            };
            let kept =
                [of, to].iter().all(|w| median(results, &load, w).and_then(|l| l.get("kept_up")) == Some("true"));
            let ratio = line.num("p99_ratio").unwrap_or(f64::NAN);
            let saturated = if kept { "" } else { ", a side did not keep up" };
            measured.push(format!("{}: {ratio:.2}{saturated}", load_label(&load, &rate)));
            met.push(line.get("met") == Some("true"));
        }
        if measured.is_empty() {
            continue;
        }
        let verdict = if met.iter().all(|m| *m) {
            "met"
        } else if met.iter().any(|m| *m) {
            "met at some loads"
        } else {
            "**not met**"
        };
        let _ = writeln!(md, "| {label} | {} | {verdict} |", measured.join("; "));
    }
}

/// The `## Latency` section (nothing without `latency` lines).
pub(super) fn section(md: &mut String, results: &Results, chart: Option<&str>) {
    let loads = loads(results);
    if loads.is_empty() {
        return;
    }
    let _ = writeln!(md, "## Latency\n");
    let p0 = results.one("latency-p0").and_then(|l| l.get("rps")).unwrap_or("?");
    let plan = results.one("latency-plan");
    let _ = writeln!(
        md,
        "End-to-end latency: from a record's hand-off to the input producer to its output reaching a reader \
         (`read_uncommitted` for P0 and F_alos, `read_committed` for the transactional workloads), at a fixed \
         offered load, {} s per run, medians over {} rounds of the per-run percentiles (`millrace-bench \
         latency`; P0 drained {p0} records/s first, the loads are fractions of that). A workload that did not \
         keep up (p99.9 ≥ 1 s) has a latency that grows with the run: its figures measure the backlog, not \
         the pipeline.\n",
        plan.and_then(|l| l.get("seconds")).unwrap_or("?"),
        plan.and_then(|l| l.get("rounds")).unwrap_or("?"),
    );
    for (load, rate) in &loads {
        let _ = writeln!(md, "Offered load {}:\n", load_label(load, rate));
        let _ = writeln!(md, "| workload | p50 ms | p99 ms | p99.9 ms | kept up |\n|---|---:|---:|---:|---|");
        for (slug, label) in WORKLOADS {
            let Some(line) = median(results, load, slug) else { continue };
            let ms = |k: &str| line.num(k).map_or("—".into(), |v| format!("{v:.1}"));
            let kept = if line.get("kept_up") == Some("true") { "yes" } else { "**no**" };
            let _ = writeln!(md, "| {label} | {} | {} | {} | {kept} |", ms("p50_ms"), ms("p99_ms"), ms("p999_ms"));
        }
        let _ = writeln!(md);
    }
    match chart {
        Some(path) => {
            let _ = writeln!(md, "![p50, p99 and p99.9 of each workload at each offered load]({path})\n");
        }
        None => {
            let _ = writeln!(md, "(No latency chart.)\n");
        }
    }
}

/// Where the latency chart goes: next to the main chart, `<stem>-latency.png`.
pub(super) fn chart_path(main: &Path) -> PathBuf {
    let stem = main.file_stem().and_then(|s| s.to_str()).unwrap_or("benchmarks");
    main.with_file_name(format!("{stem}-latency.png"))
}

/// Draws the latency chart (the font is registered by the main chart); false without `latency` lines.
pub(super) fn draw(results: &Results, out: &Path) -> anyhow::Result<bool> {
    let loads = loads(results);
    if loads.is_empty() {
        return Ok(false);
    }
    let root = BitMapBackend::new(out, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let areas = root.split_evenly((1, loads.len()));
    for ((load, rate), area) in loads.iter().zip(areas.iter()) {
        panel(results, load, rate, area).map_err(|e| anyhow::anyhow!("drawing the latency chart: {e}"))?;
    }
    root.present().map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
    Ok(true)
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// One offered load: a group of three bars (p50, p99, p99.9) per workload, log scale.
fn panel(results: &Results, load: &str, rate: &str, area: &Area<'_>) -> Result<(), Box<dyn std::error::Error>> {
    let rows: Vec<(&str, &Line)> =
        WORKLOADS.iter().filter_map(|(slug, label)| Some((*label, median(results, load, slug)?))).collect();
    let values = rows.iter().flat_map(|(_, l)| QUANTILES.iter().filter_map(|q| l.num(q.1)));
    let (min, max) = values.fold((f64::MAX, 1.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (min, max) = ((min / 2.0).max(0.1), max * 4.0);
    let n = rows.len();
    let labels: Vec<String> = rows.iter().map(|(l, _)| (*l).to_owned()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(format!("End-to-end latency, load {}", load_label(load, rate)), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(130)
        .build_cartesian_2d((min..max).log_scale(), -0.5..(n as f64 - 0.5))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&|y| super::chart::bar_label(&labels, *y))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .x_desc("milliseconds (log scale)")
        .label_style(("sans-serif", 14))
        .draw()?;
    let bar = 0.8 / QUANTILES.len() as f64;
    for (i, (_, line)) in rows.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        for (j, (_, key, colour)) in QUANTILES.iter().enumerate() {
            let Some(v) = line.num(key) else { continue };
            let y0 = y + 0.4 - bar * (j as f64 + 1.0);
            chart.draw_series(std::iter::once(Rectangle::new(
                [(min, y0 + 0.02), (v, y0 + bar - 0.02)],
                colour.filled(),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                format!("{v:.0}"),
                (v * 1.08, y0 + bar * 0.8),
                ("sans-serif", 12),
            )))?;
        }
    }
    for (j, (name, _, colour)) in QUANTILES.iter().enumerate() {
        let (x, y) = (area.dim_in_pixel().0 as i32 - 90, 50 + j as i32 * 20);
        area.draw(&Rectangle::new([(x, y), (x + 14, y + 14)], colour.filled()))?;
        area.draw(&Text::new(*name, (x + 20, y), ("sans-serif", 13)))?;
    }
    Ok(())
}
