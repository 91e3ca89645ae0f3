//! The `report` subcommand: `BENCHMARKS.md` and its chart, from the `RESULT` lines that `compare`,
//! `slow` and `memory` print (what `scripts/bench` saves in its results directory).
//!
//! Nothing is measured here: the report can be written again from saved logs (`--results DIR`), and
//! every figure in it comes from one of those lines. The targets come from
//! [`RATIOS`](crate::compare::workload::RATIOS) and from the `slow` and `memory` benchmarks' own
//! verdicts.

mod chart;
mod latency;
mod markdown;

use anyhow::{Context as _, bail};
use markdown::render;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Options of `report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Directory holding the logs of the run: compare.log, slow.log, memory.log, latency.log (any may be
    /// missing).
    #[arg(long)]
    results: PathBuf,
    /// Where to write the Markdown report.
    #[arg(long, default_value = "BENCHMARKS.md")]
    markdown: PathBuf,
    /// Where to write the PNG chart (its path in the Markdown is relative to the report's directory); the
    /// latency chart goes next to it, as `<stem>-latency.png`.
    #[arg(long, default_value = "docs/benchmarks.png")]
    chart: PathBuf,
    /// The command that produced the logs, quoted in the report.
    #[arg(long, default_value = "scripts/bench")]
    command: String,
    /// The commit measured, quoted in the report.
    #[arg(long, default_value = "")]
    commit: String,
    /// Hand-written notes appended to the report (what limits a missed target), if the file exists.
    #[arg(long, default_value = "benches/notes.md")]
    notes: PathBuf,
    /// A TrueType font for the chart's text [default: DejaVu Sans or the first .ttf found under
    /// /usr/share/fonts].
    #[arg(long, env = "MILLRACE_CHART_FONT")]
    font: Option<PathBuf>,
}

/// One `RESULT <kind> key=value …` line.
#[derive(Debug, Clone, Default)]
pub struct Line {
    pub fields: BTreeMap<String, String>,
}

impl Line {
    /// A field as text.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    /// A field as a number (`None` for "na" or missing).
    pub fn num(&self, key: &str) -> Option<f64> {
        self.get(key)?.parse().ok().filter(|v: &f64| v.is_finite())
    }
}

/// Every `RESULT` line of the logs, by kind (`compare-workload`, `slow`, …).
#[derive(Debug, Default)]
pub struct Results {
    pub lines: BTreeMap<String, Vec<Line>>,
}

impl Results {
    /// Parses the `RESULT` lines of `text`.
    pub fn parse(&mut self, text: &str) {
        for line in text.lines() {
            let Some(rest) = line.trim().strip_prefix("RESULT ") else { continue };
            let mut words = rest.split_whitespace();
            let Some(kind) = words.next() else { continue };
            let fields = words.filter_map(|w| w.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
            self.lines.entry(kind.to_owned()).or_default().push(Line { fields });
        }
    }

    /// The lines of one kind.
    pub fn of(&self, kind: &str) -> &[Line] {
        self.lines.get(kind).map_or(&[], Vec::as_slice)
    }

    /// The one line of a kind (the last, if several).
    pub fn one(&self, kind: &str) -> Option<&Line> {
        self.of(kind).last()
    }

    /// The `compare-ratio` line for `slug` at `size`.
    pub fn ratio(&self, size: &str, slug: &str) -> Option<&Line> {
        self.of("compare-ratio").iter().find(|l| l.get("size") == Some(size) && l.get("ratio") == Some(slug))
    }

    /// The record sizes `compare` ran, in bytes as text.
    pub fn sizes(&self) -> Vec<String> {
        self.one("compare-setup")
            .and_then(|l| l.get("value_sizes"))
            .map(|s| s.split(',').map(str::to_owned).collect())
            .unwrap_or_default()
    }
}

/// Writes the report and the chart.
pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    let mut results = Results::default();
    let mut found = Vec::new();
    for name in ["compare.log", "slow.log", "memory.log", "latency.log"] {
        let path = args.results.join(name);
        if let Ok(text) = std::fs::read_to_string(&path) {
            results.parse(&text);
            found.push(name);
        }
    }
    if results.lines.is_empty() {
        bail!(
            "no RESULT lines in {} (looked for compare.log, slow.log, memory.log, latency.log)",
            args.results.display()
        );
    }
    let chart_note = match chart::draw(&results, &args.chart, args.font.as_deref()) {
        Ok(()) => {
            println!("wrote {}", args.chart.display());
            None
        }
        Err(e) => {
            eprintln!("warning: no chart: {e:#}");
            Some(format!("{e:#}"))
        }
    };
    let latency_chart = latency::chart_path(&args.chart);
    let latency_link = match chart_note {
        None => match latency::draw(&results, &latency_chart) {
            Ok(true) => {
                println!("wrote {}", latency_chart.display());
                Some(chart_path_for(&args.markdown, &latency_chart))
            }
            Ok(false) => None,
            Err(e) => {
                eprintln!("warning: no latency chart: {e:#}");
                None
            }
        },
        Some(_) => None,
    };
    let markdown = render(&results, &args, chart_note.as_deref(), latency_link.as_deref());
    if let Some(dir) = args.markdown.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&args.markdown, markdown).with_context(|| format!("writing {}", args.markdown.display()))?;
    println!("wrote {} from {} in {}", args.markdown.display(), found.join(", "), args.results.display());
    Ok(())
}

fn size_label(size: &str) -> String {
    match size {
        "1024" => "1 KiB".into(),
        "1000" => "1 KB".into(),
        s => format!("{s} B"),
    }
}

/// The chart's path as the Markdown file should link it: relative to the Markdown file's directory
/// when the chart is under it.
fn chart_path_for(markdown: &Path, chart: &Path) -> String {
    let base = markdown.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_owned());
    let (base, chart_abs) = (abs(base), abs(chart));
    chart_abs.strip_prefix(&base).map_or_else(|_| chart.display().to_string(), |p| p.display().to_string())
}

/// `YYYY-MM-DD HH:MM UTC`, from the system clock (no date crate needed).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, rem % 3600 / 60)
}

/// CPU model and count, memory, kernel and load average, from `/proc`.
fn machine_description() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, v)| v.trim().to_owned()))
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let mem_gib = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:")?.split_whitespace().next()?.parse::<f64>().ok())
        .map_or("?".into(), |kib| format!("{:.0}", kib / 1024.0 / 1024.0));
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_owned();
    format!(
        "{cpus} CPUs ({model}), {mem_gib} GiB of memory, Linux {kernel}; load average {} when the report was \
         written. One Kafka broker (scripts/kafka, KRaft, single node) on the same machine.",
        crate::core_bench::load_average()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_result_lines() {
        let mut r = Results::default();
        r.parse(
            "noise\nRESULT compare-setup value_sizes=100,1024 pairs=3\n  RESULT slow key100_vs_partition=76.1 x=na\n",
        );
        assert_eq!(r.sizes(), vec!["100", "1024"]);
        let slow = r.one("slow").unwrap();
        assert_eq!(slow.num("key100_vs_partition"), Some(76.1));
        assert_eq!(slow.num("x"), None);
        assert!(r.one("memory").is_none());
    }

    #[test]
    fn dates_and_paths() {
        assert!(utc_now().ends_with(" UTC") && utc_now().len() == 20);
        assert_eq!(chart_path_for(Path::new("BENCHMARKS.md"), Path::new("docs/benchmarks.png")), "docs/benchmarks.png");
    }
}
