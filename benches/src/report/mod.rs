//! The `report` subcommand: `BENCHMARKS.md` and its chart, from the `RESULT` lines that `compare`,
//! `slow` and `memory` print (what `scripts/bench` saves in its results directory).
//!
//! Nothing is measured here: the report can be written again from saved logs (`--results DIR`), and
//! every figure in it comes from one of those lines. The targets come from [`RATIOS`] and from the
//! `slow` and `memory` benchmarks' own verdicts.

mod chart;

use crate::compare::workload::{RATIOS, Workload};
use anyhow::{Context as _, bail};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Options of `report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Directory holding the logs of the run: compare.log, slow.log, memory.log (any may be missing).
    #[arg(long)]
    results: PathBuf,
    /// Where to write the Markdown report.
    #[arg(long, default_value = "BENCHMARKS.md")]
    markdown: PathBuf,
    /// Where to write the PNG chart (its path in the Markdown is relative to the report's directory).
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
    for name in ["compare.log", "slow.log", "memory.log"] {
        let path = args.results.join(name);
        if let Ok(text) = std::fs::read_to_string(&path) {
            results.parse(&text);
            found.push(name);
        }
    }
    if results.lines.is_empty() {
        bail!("no RESULT lines in {} (looked for compare.log, slow.log, memory.log)", args.results.display());
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
    let markdown = render(&results, &args, chart_note.as_deref());
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

fn verdict_text(v: Option<&str>) -> &'static str {
    match v {
        Some("met") => "met",
        Some("not-met") => "**not met**",
        _ => "not measured",
    }
}

/// The whole Markdown document.
fn render(results: &Results, args: &ReportArgs, chart_note: Option<&str>) -> String {
    let mut md = String::new();
    let setup = results.one("compare-setup");
    let sizes = results.sizes();
    let _ = writeln!(md, "# Benchmarks\n");
    let _ = writeln!(
        md,
        "<!-- Generated by `{}` (millrace-bench report): run it again rather than editing this file. -->\n",
        args.command
    );
    let commit = if args.commit.is_empty() { String::new() } else { format!(", commit `{}`", args.commit) };
    let _ = writeln!(md, "Measured {}{commit}, with `{}`.\n", utc_now(), args.command);
    let _ = writeln!(md, "**Machine.** {}\n", machine_description());
    let _ = writeln!(
        md,
        "The machine is small and shared (other builds may run while it measures), so figures drift from \
         minute to minute: every comparison runs its two sides back to back in interleaved rounds (A B, then \
         B A, …) against the same broker and the same pre-loaded topic, and reports the ratio of the \
         medians with the range of the per-round ratios. Read the ratios, not the absolute numbers.\n"
    );

    // Targets.
    let _ = writeln!(md, "## Targets\n");
    let _ = writeln!(md, "| target | measured | verdict |\n|---|---|---|");
    for ratio in RATIOS.iter().filter(|r| r.at_least.is_some()) {
        let mut measured = Vec::new();
        let mut verdicts = Vec::new();
        for size in &sizes {
            let line = results.ratio(size, &ratio.slug());
            verdicts.push(line.and_then(|l| l.get("verdict")).unwrap_or("na").to_owned());
            measured.push(match line.and_then(|l| l.num("value")) {
                Some(v) => {
                    let l = line.expect("a value has a line");
                    let cpu = if ratio.cpu_at_most.is_some() {
                        format!(", CPU/record {:.2}×", l.num("cpu_ratio").unwrap_or(f64::NAN))
                    } else {
                        String::new()
                    };
                    format!(
                        "{}: {v:.2} (rounds {:.2}–{:.2}{cpu})",
                        size_label(size),
                        l.num("min").unwrap_or(f64::NAN),
                        l.num("max").unwrap_or(f64::NAN)
                    )
                }
                None => format!("{}: not measured{}", size_label(size), why_missing(results, size, *ratio)),
            });
        }
        let verdict = if verdicts.iter().all(|v| v == "met") {
            "met"
        } else if verdicts.iter().any(|v| v == "not-met") {
            "**not met**"
        } else {
            "not measured"
        };
        let _ = writeln!(md, "| {} {} | {} | {verdict} |", ratio.label(), ratio.target_text(), measured.join("; "));
    }
    if let Some(slow) = results.one("slow") {
        let k = "key100";
        let speedup = slow.num(&format!("{k}_vs_partition"));
        let vs_ideal = slow.num(&format!("{k}_vs_ideal"));
        let vs_act = slow.num(&format!("{k}_vs_ideal_act"));
        let _ = writeln!(
            md,
            "| slow handler: key order (100 keys) / partition order ≥ 50× | {} | {} |",
            speedup.map_or("—".into(), |s| format!("{s:.0}×")),
            verdict_text(speedup.map(|s| if s >= 50.0 { "met" } else { "not-met" }))
        );
        let _ = writeln!(
            md,
            "| slow handler: key order (100 keys) within 1.3× of ideal | {} × the ideal with the requested delays; \
             {} × with the measured sleeps | {} |",
            vs_ideal.map_or("—".into(), |v| format!("{v:.2}")),
            vs_act.map_or("—".into(), |v| format!("{v:.2}")),
            verdict_text(vs_ideal.map(|v| if v <= 1.3 { "met" } else { "not-met" })),
        );
    }
    if let Some(memory) = results.one("memory") {
        let peak = memory.num("peak_rss_mib");
        let _ = writeln!(
            md,
            "| peak RSS draining {} records ≤ 256 MB | {} | {} |",
            memory.get("records").unwrap_or("?"),
            peak.map_or("—".into(), |p| format!("{p:.0} MiB ({:.0} MB)", p * 1.048_576)),
            verdict_text(peak.map(|p| if p * 1.048_576 <= 256.0 { "met" } else { "not-met" })),
        );
    }
    match chart_note {
        None => {
            let path = chart_path_for(&args.markdown, &args.chart);
            let _ = writeln!(md, "\n![ratios against their targets, and the slow-handler table]({path})\n");
        }
        Some(why) => {
            let _ = writeln!(md, "\n(No chart: {why}.)\n");
        }
    }

    // Workloads, per size.
    for size in &sizes {
        let records = results
            .of("compare-workload")
            .iter()
            .find(|l| l.get("size") == Some(size.as_str()) && l.get("records").is_some())
            .and_then(|l| l.get("records"))
            .unwrap_or("?");
        let _ = writeln!(
            md,
            "## Workloads, {} values ({records} records per run, {} rounds)\n",
            size_label(size),
            setup.and_then(|s| s.get("pairs")).unwrap_or("?")
        );
        let _ = writeln!(
            md,
            "| workload | what it does | records/s (median) | min–max | steady records/s | CPU s per M records \
             (min–max) |\n|---|---|---:|---:|---:|---:|"
        );
        for line in results.of("compare-workload").iter().filter(|l| l.get("size") == Some(size.as_str())) {
            let Some(w) = line.get("workload").and_then(|s| s.parse::<Workload>().ok()) else { continue };
            let cells = match line.num("rps") {
                Some(rps) => {
                    let process = line
                        .num("process_cpu_s_per_m")
                        .map_or(String::new(), |p| format!("; whole JVM process {p:.1}"));
                    format!(
                        "{rps:.0} | {:.0}–{:.0} | {:.0} | {:.2} ({:.2}–{:.2}){process}",
                        line.num("rps_min").unwrap_or(f64::NAN),
                        line.num("rps_max").unwrap_or(f64::NAN),
                        line.num("steady_rps").unwrap_or(f64::NAN),
                        line.num("cpu_s_per_m").unwrap_or(f64::NAN),
                        line.num("cpu_min").unwrap_or(f64::NAN),
                        line.num("cpu_max").unwrap_or(f64::NAN),
                    )
                }
                None => format!(
                    "{} | | |",
                    line.get("status").unwrap_or("not measured").replace("unavailable", "not available")
                ),
            };
            let _ = writeln!(md, "| {} | {} | {cells} |", w.label(), w.describe());
        }
        let _ = writeln!(md);
        let _ = writeln!(md, "| ratio | throughput (median) | per-round range | steady | CPU per record | target |");
        let _ = writeln!(md, "|---|---:|---:|---:|---:|---|");
        for ratio in RATIOS {
            let Some(line) = results.ratio(size, &ratio.slug()) else { continue };
            let target = if ratio.at_least.is_some() {
                format!("{} ({})", ratio.target_text(), verdict_text(line.get("verdict")).replace("**", ""))
            } else {
                "for information".into()
            };
            match line.num("value") {
                Some(v) => {
                    let _ = writeln!(
                        md,
                        "| {} | {v:.3} | {:.3}–{:.3} | {} | {:.2}× | {target} |",
                        ratio.label(),
                        line.num("min").unwrap_or(f64::NAN),
                        line.num("max").unwrap_or(f64::NAN),
                        line.num("steady").map_or("—".into(), |s| format!("{s:.3}")),
                        line.num("cpu_ratio").unwrap_or(f64::NAN),
                    );
                }
                None => {
                    let _ = writeln!(md, "| {} | not measured | | | | {target} |", ratio.label());
                }
            }
        }
        let _ = writeln!(md);
    }

    if let Some(slow) = results.one("slow") {
        render_slow(&mut md, slow);
    }
    if let Some(memory) = results.one("memory") {
        let _ = writeln!(md, "## Memory\n");
        let _ = writeln!(
            md,
            "Peak RSS of a child process running a default pipeline (key order, default bounds, no-op processor) \
             draining {} records of {} B over {} partitions: **{:.1} MiB**, at {:.0} records/s (`millrace-bench \
             memory`).\n",
            memory.get("records").unwrap_or("?"),
            memory.get("value_size").unwrap_or("?"),
            memory.get("partitions").unwrap_or("?"),
            memory.num("peak_rss_mib").unwrap_or(f64::NAN),
            memory.num("rps").unwrap_or(f64::NAN),
        );
    }
    md.push_str(METHOD);
    if let Ok(notes) = std::fs::read_to_string(&args.notes) {
        let _ = writeln!(md, "\n## Notes\n\n<!-- From {}, written by hand. -->\n", args.notes.display());
        md.push_str(notes.trim_end());
        md.push('\n');
    }
    md
}

/// Why a ratio has no figure: which side was not measured.
fn why_missing(results: &Results, size: &str, ratio: crate::compare::workload::Ratio) -> String {
    let missing: Vec<String> = [ratio.a, ratio.b]
        .into_iter()
        .filter(|w| {
            results
                .of("compare-workload")
                .iter()
                .find(|l| l.get("size") == Some(size) && l.get("workload") == Some(w.slug().as_str()))
                .is_none_or(|l| l.num("rps").is_none())
        })
        .map(|w| w.label())
        .collect();
    if missing.is_empty() { String::new() } else { format!(" ({} not available yet)", missing.join(", ")) }
}

fn render_slow(md: &mut String, slow: &Line) {
    let _ = writeln!(md, "## Slow handler\n");
    let _ = writeln!(
        md,
        "{} records on one partition, a handler sleeping 0–5 ms (async), {} records at once (`millrace-bench \
         slow`; medians of {} rounds). The ideal is the sum of the delays / {}.\n",
        slow.get("records").unwrap_or("?"),
        slow.get("concurrency").unwrap_or("?"),
        slow.get("pairs").unwrap_or("?"),
        slow.get("concurrency").unwrap_or("?"),
    );
    let _ = writeln!(md, "| order | records/s |\n|---|---:|");
    for (label, key) in chart::slow_rows(slow) {
        if let Some(v) = slow.num(&key) {
            let _ = writeln!(md, "| {label} | {v:.0} |");
        }
    }
    let _ = writeln!(
        md,
        "\nKey order with 100 keys: {}× partition order; {}× the ideal with the requested delays, {}× with \
         delays rounded up to whole milliseconds (Tokio's timer), {}× with the measured sleeps; the \
         zero-overhead bound for key order (the busiest key runs its records one after another) is {} s, and \
         the measured time is {}× that bound.\n",
        slow.get("key100_vs_partition").unwrap_or("?"),
        fmt2(slow.num("key100_vs_ideal")),
        fmt2(slow.num("key100_vs_ideal_ms")),
        fmt2(slow.num("key100_vs_ideal_act")),
        slow.get("key100_bound_s").unwrap_or("?"),
        fmt2(slow.num("key100_vs_bound")),
    );
}

fn fmt2(v: Option<f64>) -> String {
    v.map_or("?".into(), |v| format!("{v:.2}"))
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

const METHOD: &str = "## Method

- **Input.** Every run drains a topic loaded before timing: 4 partitions, keys drawn uniformly from
  10,000, values of 100 B (and of 1 KiB, fewer records), each with a unique `idempotency-key` header.
  F_dedup(10%) and F_dedup_eos(10%) read a second topic where every tenth record repeats an earlier
  record's key and idempotency key; in F_dlq, 1% of the records are poison (a permanent failure each,
  dead-lettered). F_dedup runs the dedup store at-least-once (each new key's changelog entry
  acknowledged and its RocksDB write done before the record completes), F_dedup_eos in exactly-once
  mode (the changelog entry in the transaction, the RocksDB writes of a transaction's keys in one
  batch after its commit), so F_dedup_eos / F_eos is the store's own cost.
- **Workloads.** The raw rdkafka baselines use the settings Millrace gives its own clients (consumer
  cooperative-sticky, `fetch.queue.backoff.ms=20`; producer `acks=all`, idempotent, `linger.ms=5`).
  P0 commits its consumed position asynchronously every second without waiting for acknowledgements,
  so it is a limit rather than an at-least-once program; Pt(i) does `send_offsets_to_transaction`
  with the consumer's group metadata and commits every i. Millrace runs key order with default
  bounds and a processor that emits each record with `ctx.emit` (completed when acknowledged).
  Kafka Streams 4.4 (`benches/streams-peer`) runs the same pass-through with one stream thread and
  its defaults otherwise, `at_least_once` with a 1 s commit interval and `exactly_once_v2` with
  100 ms.
- **Timing.** Each run has a fresh consumer group and output topic; the clock starts before the
  group join (for Kafka Streams at `KafkaStreams.start()`, JVM start-up left out) and stops when every
  output is acknowledged (at-least-once) or committed (transactions). \"Steady\" leaves out the time
  to the first record. CPU is the measured process's own (getrusage for the Rust workloads, the JVM's
  process CPU over the same window for Kafka Streams, whose whole-process figure from getrusage of
  the child is given too).
- **Interleaving.** A round runs every workload once, the two sides of each targeted ratio back to
  back; the next round runs in reverse order. Ratios are of the medians over the rounds.
- **Reproduce.** `scripts/bench` (about 10 minutes; `--quick` for a smoke run); see the README's
  Performance section. The raw logs of a run are kept under `~/.cache/millrace/bench-results/`.
";

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
