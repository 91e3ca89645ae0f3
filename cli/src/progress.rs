//! Progress of a long scan: a bar with rate and ETA when stderr is a terminal, a plain line every few
//! seconds otherwise (logs, CI).

use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};

/// How often the plain (non-terminal) progress line is printed.
const PLAIN_EVERY: Duration = Duration::from_secs(5);

/// Progress of scanning `total` records.
pub struct Progress {
    bar: Option<ProgressBar>,
    label: &'static str,
    total: u64,
    done: u64,
    started: Instant,
    last_line: Instant,
}

impl Progress {
    /// A bar on stderr when it is a terminal, plain lines otherwise.
    pub fn new(label: &'static str, total: u64) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total);
            let style = ProgressStyle::with_template(
                "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} records ({per_sec:0}, ETA {eta}) {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_prefix(label);
            bar
        });
        let now = Instant::now();
        Progress { bar, label, total, done: 0, started: now, last_line: now }
    }

    /// One more record scanned; `status` describes the counts so far.
    pub fn inc(&mut self, status: impl FnOnce() -> String) {
        self.done += 1;
        match &self.bar {
            Some(bar) => {
                bar.inc(1);
                bar.set_message(status());
            }
            None if self.last_line.elapsed() >= PLAIN_EVERY => {
                self.last_line = Instant::now();
                let secs = self.started.elapsed().as_secs_f64().max(0.001);
                eprintln!(
                    "{}: {}/{} records scanned ({:.0}/s), {}",
                    self.label,
                    self.done,
                    self.total,
                    self.done as f64 / secs,
                    status()
                );
            }
            None => {}
        }
    }

    /// Prints a line on stdout without garbling the bar.
    pub fn println(&self, line: &str) {
        let print = || {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        };
        match &self.bar {
            Some(bar) => bar.suspend(print),
            None => print(),
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
