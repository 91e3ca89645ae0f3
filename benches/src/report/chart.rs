//! The report's PNG: on the left every ratio with a target (one bar per record size, the target as a
//! red tick), on the right the slow-handler table (records/s per order, log scale, the ideal as a
//! dashed line).
//!
//! Drawn with `plotters`' bitmap backend and `ab_glyph` text, so it needs no system font library:
//! only a TrueType file, read at run time (`--font`, else DejaVu Sans, which Debian and Ubuntu images
//! carry as `fonts-dejavu-core`, else the first `.ttf` under `/usr/share/fonts`).

use super::{Line, Results, size_label};
use crate::compare::workload::RATIOS;
use anyhow::{Context as _, anyhow, bail};
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::{Path, PathBuf};

const WIDTH: u32 = 1400;
const HEIGHT: u32 = 560;
const SIZE_COLOURS: [RGBColor; 3] = [RGBColor(52, 101, 164), RGBColor(114, 159, 207), RGBColor(78, 154, 6)];

/// The slow-handler rows: (label, `RESULT slow` field).
pub fn slow_rows(slow: &Line) -> Vec<(String, String)> {
    let mut rows = vec![("partition order".to_owned(), "partition_rps".to_owned())];
    let mut keys: Vec<u64> =
        slow.fields.keys().filter_map(|k| k.strip_prefix("key")?.strip_suffix("_rps")?.parse().ok()).collect();
    keys.sort_unstable();
    rows.extend(
        keys.into_iter()
            .map(|k| (format!("key order, {k} key{}", if k == 1 { "" } else { "s" }), format!("key{k}_rps"))),
    );
    rows.push(("unordered".into(), "unordered_rps".into()));
    rows
}

/// Finds a font: `explicit`, DejaVu Sans, or any `.ttf` under /usr/share/fonts.
fn font_file(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_owned());
    }
    let dejavu = Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf");
    if dejavu.is_file() {
        return Ok(dejavu.to_owned());
    }
    let mut stack = vec![PathBuf::from("/usr/share/fonts")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf")) {
                return Ok(path);
            }
        }
    }
    bail!("no TrueType font found (install fonts-dejavu-core, or pass --font / MILLRACE_CHART_FONT)")
}

/// Draws the chart into `out`.
pub fn draw(results: &Results, out: &Path, font: Option<&Path>) -> anyhow::Result<()> {
    let font = font_file(font)?;
    let bytes = std::fs::read(&font).with_context(|| format!("reading {}", font.display()))?;
    // plotters keeps registered fonts for the life of the process.
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into_boxed_slice()))
        .map_err(|_| anyhow!("{} is not a usable TrueType font", font.display()))?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let root = BitMapBackend::new(out, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let (left, right) = root.split_horizontally(WIDTH * 58 / 100);
    ratios(results, &left).map_err(|e| anyhow!("drawing the ratios: {e}"))?;
    match results.one("slow") {
        Some(slow) => slow_table(slow, &right).map_err(|e| anyhow!("drawing the slow-handler table: {e}"))?,
        None => {
            right
                .draw_text("slow handler: not measured", &("sans-serif", 18).into_font().color(&BLACK), (40, 40))
                .map_err(|e| anyhow!("{e}"))?;
        }
    }
    root.present().map_err(|e| anyhow!("writing {}: {e}", out.display()))?;
    Ok(())
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;
type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// Horizontal bars: one group per targeted ratio, one bar per size, the target as a red tick.
fn ratios(results: &Results, area: &Area<'_>) -> DrawResult {
    let sizes = results.sizes();
    // The targeted ratios, then two for information that need no exactly-once mode.
    let shown = ["f-alos/streams-alos", "f-dedup-0/f-alos"];
    let targeted: Vec<_> =
        RATIOS.iter().filter(|r| r.at_least.is_some() || shown.contains(&r.slug().as_str())).collect();
    let n = targeted.len();
    let value = |size: &str, slug: &str| results.ratio(size, slug).and_then(|l| l.num("value"));
    let max = targeted
        .iter()
        .flat_map(|r| sizes.iter().filter_map(move |s| value(s, &r.slug())).chain(r.at_least))
        .fold(1.0f64, f64::max)
        * 1.15;
    let labels: Vec<String> = targeted.iter().map(|r| r.label()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption("Throughput ratios A / B against their targets (red)", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(250)
        .build_cartesian_2d(0.0..max, -0.5..(n as f64 - 0.5))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&|y| bar_label(&labels, *y))
        .x_desc("A / B, ratio of median records/s")
        .label_style(("sans-serif", 15))
        .draw()?;
    let bar = 0.8 / sizes.len().max(1) as f64;
    for (i, ratio) in targeted.iter().enumerate() {
        // The first ratio at the top.
        let y = (n - 1 - i) as f64;
        for (j, size) in sizes.iter().enumerate() {
            let y0 = y + 0.4 - bar * (j as f64 + 1.0);
            let colour = SIZE_COLOURS[j % SIZE_COLOURS.len()];
            match value(size, &ratio.slug()) {
                Some(v) => {
                    chart.draw_series(std::iter::once(Rectangle::new(
                        [(0.0, y0 + 0.02), (v, y0 + bar - 0.02)],
                        colour.filled(),
                    )))?;
                    chart.draw_series(std::iter::once(Text::new(
                        format!("{v:.2}"),
                        (v + max * 0.01, y0 + bar * 0.8),
                        ("sans-serif", 13),
                    )))?;
                }
                None => {
                    chart.draw_series(std::iter::once(Text::new(
                        format!("{}: not measured", size_label(size)),
                        (max * 0.01, y0 + bar * 0.8),
                        ("sans-serif", 13).into_font().color(&RGBColor(120, 120, 120)),
                    )))?;
                }
            }
        }
        if let Some(t) = ratio.at_least {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(t, y - 0.45), (t, y + 0.45)],
                RED.stroke_width(3),
            )))?;
        }
    }
    // Legend: record sizes.
    for (j, size) in sizes.iter().enumerate() {
        let (x, y) = (area.dim_in_pixel().0 as i32 - 110, 50 + j as i32 * 22);
        let colour = SIZE_COLOURS[j % SIZE_COLOURS.len()];
        area.draw(&Rectangle::new([(x, y), (x + 14, y + 14)], colour.filled()))?;
        area.draw(&Text::new(size_label(size), (x + 20, y), ("sans-serif", 14)))?;
    }
    Ok(())
}

/// Horizontal bars, log scale: records/s of each order, the ideal as a dashed line.
fn slow_table(slow: &Line, area: &Area<'_>) -> DrawResult {
    let rows: Vec<(String, f64)> =
        slow_rows(slow).into_iter().filter_map(|(label, key)| Some((label, slow.num(&key)?))).collect();
    let ideal = slow.num("ideal_rps");
    let n = rows.len();
    let max = rows.iter().map(|r| r.1).chain(ideal).fold(10.0f64, f64::max) * 8.0;
    let min = rows.iter().map(|r| r.1).fold(max, f64::min).max(1.0) / 3.0;
    let labels: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption("Slow handler (0–5 ms sleeps, 100 at once)", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(150)
        .build_cartesian_2d((min..max).log_scale(), -0.5..(n as f64 - 0.5))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&|y| bar_label(&labels, *y))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .x_desc("records/s (log scale)")
        .label_style(("sans-serif", 15))
        .draw()?;
    for (i, (_, v)) in rows.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(min, y - 0.35), (*v, y + 0.35)],
            SIZE_COLOURS[0].filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(format!("{v:.0}"), (*v * 1.05, y + 0.1), ("sans-serif", 13))))?;
    }
    if let Some(ideal) = ideal {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(ideal, -0.5), (ideal, n as f64 - 0.5)],
                6,
                4,
                RED.stroke_width(2),
            ))?
            .label(format!("ideal {ideal:.0}/s"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], RED.stroke_width(2)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()?;
    }
    Ok(())
}

/// The label of the horizontal bar at `y` (bars are listed top to bottom; ticks between bars get none).
pub(super) fn bar_label(labels: &[String], y: f64) -> String {
    let (n, i) = (labels.len(), y.round());
    if (y - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n {
        labels[n - 1 - i as usize].clone()
    } else {
        String::new()
    }
}
