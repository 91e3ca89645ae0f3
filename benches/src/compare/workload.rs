//! The workloads of the `compare` benchmark and the ratios between them that have targets.
//!
//! Every workload drains the same kind of pre-loaded input topic and, except C0, writes one output
//! record per input record to a fresh output topic. Adding a workload is one variant here, one entry in
//! [`Workload::ALL`] and one arm in `compare::run_one`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// One thing measured by `compare`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Workload {
    /// Raw rdkafka consumer: drain and discard (stores offsets; auto-commit).
    C0,
    /// Raw rdkafka consume -> produce pipe, offsets committed asynchronously every second.
    P0,
    /// The raw pipe in Kafka transactions committed every `ms` milliseconds (read_committed).
    Pt {
        /// Transaction commit interval in milliseconds.
        ms: u64,
    },
    /// Millrace at-least-once: a pass-through processor emitting one output per record.
    FAlos,
    /// F_alos with the HTTP listener on (Prometheus metrics, health), scraped every second.
    FObserved,
    /// Millrace exactly-once, committing a transaction every `ms` milliseconds. Not available until
    /// the mode exists: see `compare::millrace_side::exactly_once`.
    FEos {
        /// Transaction commit interval in milliseconds.
        ms: u64,
    },
    /// F_alos (or, with `eos`, F_eos(100 ms)) with the RocksDB dedup store on, on input with
    /// `pct`% duplicate idempotency keys.
    FDedup {
        /// Share of records repeating an earlier idempotency key: 0 or 10.
        pct: u8,
        /// In exactly-once mode (keys go to the changelog inside the transaction and to RocksDB
        /// after its commit) instead of at-least-once (each key's changelog entry acknowledged and
        /// written to RocksDB before its record completes).
        eos: bool,
    },
    /// F_alos with 1% poison records (a permanent failure each), which go to the DLQ.
    FDlq,
    /// Kafka Streams pass-through, a stream thread per core, `at_least_once`, commit interval 1 s.
    StreamsAlos,
    /// Kafka Streams pass-through, a stream thread per core, `exactly_once_v2`, commit interval 100 ms.
    StreamsEos,
}

/// The commit interval of the at-least-once workloads (Millrace's default `commit_interval`).
pub const ALOS_COMMIT: Duration = Duration::from_secs(1);
/// The transaction interval that Kafka Streams' `exactly_once_v2` run uses (its own EOS default too).
pub const STREAMS_EOS_COMMIT_MS: u64 = 100;

impl Workload {
    /// Every workload, in the order a round runs them (the next round runs them in reverse): the two
    /// sides of each ratio with a target sit next to each other, so they run back to back.
    pub const ALL: [Workload; 15] = [
        Workload::C0,
        Workload::P0,
        Workload::FAlos,
        Workload::FObserved,
        Workload::StreamsAlos,
        Workload::FDlq,
        Workload::FDedup { pct: 0, eos: false },
        Workload::FDedup { pct: 10, eos: false },
        Workload::FDedup { pct: 0, eos: true },
        Workload::FDedup { pct: 10, eos: true },
        Workload::FEos { ms: 100 },
        Workload::Pt { ms: 100 },
        Workload::StreamsEos,
        Workload::Pt { ms: 1000 },
        Workload::FEos { ms: 1000 },
    ];

    /// The short name used on the command line and in `RESULT` lines.
    pub fn slug(self) -> String {
        match self {
            Workload::C0 => "c0".into(),
            Workload::P0 => "p0".into(),
            Workload::Pt { ms } => format!("pt-{}", interval_slug(ms)),
            Workload::FAlos => "f-alos".into(),
            Workload::FObserved => "f-observed".into(),
            Workload::FEos { ms } => format!("f-eos-{}", interval_slug(ms)),
            Workload::FDedup { pct, eos: false } => format!("f-dedup-{pct}"),
            Workload::FDedup { pct, eos: true } => format!("f-dedup-eos-{pct}"),
            Workload::FDlq => "f-dlq".into(),
            Workload::StreamsAlos => "streams-alos".into(),
            Workload::StreamsEos => "streams-eos".into(),
        }
    }

    /// The name used in tables, as the issue writes it.
    pub fn label(self) -> String {
        match self {
            Workload::C0 => "C0".into(),
            Workload::P0 => "P0".into(),
            Workload::Pt { ms } => format!("Pt({})", interval_label(ms)),
            Workload::FAlos => "F_alos".into(),
            Workload::FObserved => "F_alos+metrics".into(),
            Workload::FEos { ms } => format!("F_eos({})", interval_label(ms)),
            Workload::FDedup { pct, eos: false } => format!("F_dedup({pct}%)"),
            Workload::FDedup { pct, eos: true } => format!("F_dedup_eos({pct}%)"),
            Workload::FDlq => "F_dlq".into(),
            Workload::StreamsAlos => "Streams alos".into(),
            Workload::StreamsEos => "Streams eos_v2".into(),
        }
    }

    /// One line on what the workload does.
    pub fn describe(self) -> String {
        match self {
            Workload::C0 => "raw rdkafka BaseConsumer: poll, discard, store the offset (auto-commit)".into(),
            Workload::P0 => "raw rdkafka pipe: poll, produce the same key and value, commit the position \
                             asynchronously every 1 s"
                .into(),
            Workload::Pt { ms } => format!(
                "the raw pipe in transactions: send_offsets_to_transaction + commit every {}, read_committed",
                interval_label(ms)
            ),
            Workload::FAlos => "Millrace, key order, default bounds, a processor emitting one output (ctx.emit)".into(),
            Workload::FObserved => {
                "F_alos with PipelineConfig::http on: Prometheus metrics and health, /metrics scraped every 1 s".into()
            }
            Workload::FEos { ms } => {
                format!("F_alos in Millrace's exactly-once mode, a transaction every {}", interval_label(ms))
            }
            Workload::FDedup { pct, eos: false } => {
                format!("F_alos with the RocksDB dedup store on, {pct}% duplicate inputs")
            }
            Workload::FDedup { pct, eos: true } => format!(
                "F_eos(100 ms) with the RocksDB dedup store on (keys committed with the transaction), {pct}% duplicate inputs"
            ),
            Workload::FDlq => "F_alos with 1% poison records (permanent failure, dead-lettered)".into(),
            Workload::StreamsAlos => {
                "Kafka Streams 4 pass-through, a stream thread per core, at_least_once, commit 1 s".into()
            }
            Workload::StreamsEos => format!(
                "Kafka Streams 4 pass-through, a stream thread per core, exactly_once_v2, commit {STREAMS_EOS_COMMIT_MS} ms"
            ),
        }
    }

    /// Whether it reads the topic with 10% duplicate idempotency keys (all others read the unique one).
    pub fn reads_duplicates(self) -> bool {
        matches!(self, Workload::FDedup { pct: 10, .. })
    }

    /// Whether it writes an output topic.
    pub fn has_output(self) -> bool {
        self != Workload::C0
    }

    /// Outputs expected from `records` inputs, when the workload's outputs can be counted exactly from
    /// the output topic's end offsets (not for transactional outputs, whose end offsets include the
    /// commit markers).
    pub fn expected_outputs(self, records: u64) -> Option<u64> {
        match self {
            Workload::C0
            | Workload::Pt { .. }
            | Workload::FEos { .. }
            | Workload::StreamsEos
            | Workload::FDedup { eos: true, .. } => None,
            Workload::P0
            | Workload::FAlos
            | Workload::FObserved
            | Workload::StreamsAlos
            | Workload::FDedup { pct: 0, .. } => Some(records),
            Workload::FDedup { .. } => Some(records - records / super::DUPLICATE_EVERY),
            Workload::FDlq => Some(records - records / super::POISON_EVERY),
        }
    }
}

fn interval_slug(ms: u64) -> String {
    if ms.is_multiple_of(1000) { format!("{}s", ms / 1000) } else { format!("{ms}ms") }
}

fn interval_label(ms: u64) -> String {
    if ms.is_multiple_of(1000) { format!("{} s", ms / 1000) } else { format!("{ms} ms") }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

impl FromStr for Workload {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Workload::ALL.into_iter().find(|w| w.slug() == s.trim()).ok_or_else(|| {
            let known: Vec<String> = Workload::ALL.iter().map(|w| w.slug()).collect();
            format!("unknown workload {s:?}; known: {}", known.join(", "))
        })
    }
}

/// A target on a ratio of two workloads' median throughputs (and, optionally, of their CPU per record).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    /// The numerator.
    pub a: Workload,
    /// The denominator.
    pub b: Workload,
    /// Throughput a / b must be at least this; `None` for a ratio reported for information.
    pub at_least: Option<f64>,
    /// CPU seconds per record, a / b, must be at most this.
    pub cpu_at_most: Option<f64>,
    /// Compared over the runs' warm windows ([`crate::measure::Window`]), not the whole runs: for
    /// Kafka Streams, whose JVM compiles its hot path during the run.
    pub warm: bool,
}

impl Ratio {
    const fn target(a: Workload, b: Workload, at_least: f64) -> Self {
        Self { a, b, at_least: Some(at_least), cpu_at_most: None, warm: false }
    }

    const fn info(a: Workload, b: Workload) -> Self {
        Self { a, b, at_least: None, cpu_at_most: None, warm: false }
    }

    /// `a/b` with slugs, as in `RESULT` lines.
    pub fn slug(&self) -> String {
        format!("{}/{}", self.a.slug(), self.b.slug())
    }

    /// `A / B` with labels (and "warm" for a ratio of warm windows).
    pub fn label(&self) -> String {
        format!("{} / {}{}", self.a.label(), self.b.label(), if self.warm { " (warm)" } else { "" })
    }

    /// The target in words, e.g. "≥ 0.90, CPU ≤ 0.5×"; empty when there is none.
    pub fn target_text(&self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = self.at_least {
            parts.push(format!("≥ {t:.2}"));
        }
        if let Some(c) = self.cpu_at_most {
            parts.push(format!("CPU/record ≤ {c}×"));
        }
        parts.join(", ")
    }

    /// Whether the figures meet the target (`None` without a target).
    pub fn verdict(&self, ratio: f64, cpu_ratio: f64) -> Option<bool> {
        let at_least = self.at_least?;
        Some(ratio >= at_least && self.cpu_at_most.is_none_or(|c| cpu_ratio <= c))
    }
}

/// The ratios reported: first those with a target (the list), then some for information.
///
/// F_dedup / F_eos has two readings, both reported against the target: the dedup store in
/// at-least-once mode (its home: side effects outside Kafka) and in exactly-once mode (the same
/// pipeline as F_eos plus the store, so the ratio is the store's own cost).
pub const RATIOS: [Ratio; 14] = [
    Ratio::target(Workload::FAlos, Workload::P0, 0.90),
    Ratio::target(Workload::FEos { ms: 100 }, Workload::Pt { ms: 100 }, 0.85),
    Ratio {
        cpu_at_most: Some(0.25),
        warm: true,
        ..Ratio::target(Workload::FEos { ms: 100 }, Workload::StreamsEos, 4.0)
    },
    Ratio::target(Workload::FDedup { pct: 0, eos: false }, Workload::FEos { ms: 100 }, 0.85),
    Ratio::target(Workload::FDedup { pct: 10, eos: false }, Workload::FEos { ms: 100 }, 0.85),
    Ratio::target(Workload::FDedup { pct: 0, eos: true }, Workload::FEos { ms: 100 }, 0.85),
    Ratio::target(Workload::FDedup { pct: 10, eos: true }, Workload::FEos { ms: 100 }, 0.85),
    Ratio::target(Workload::FObserved, Workload::FAlos, 0.97),
    Ratio::info(Workload::FEos { ms: 1000 }, Workload::Pt { ms: 1000 }),
    Ratio { warm: true, ..Ratio::info(Workload::FAlos, Workload::StreamsAlos) },
    Ratio::info(Workload::FDedup { pct: 0, eos: false }, Workload::FAlos),
    Ratio::info(Workload::FDlq, Workload::FAlos),
    Ratio::info(Workload::P0, Workload::C0),
    Ratio::info(Workload::Pt { ms: 100 }, Workload::P0),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_unique_and_parse_back() {
        let mut slugs: Vec<String> = Workload::ALL.iter().map(|w| w.slug()).collect();
        for w in Workload::ALL {
            assert_eq!(w.slug().parse::<Workload>(), Ok(w));
        }
        slugs.sort();
        slugs.dedup();
        assert_eq!(slugs.len(), Workload::ALL.len());
        assert!("nope".parse::<Workload>().is_err());
        assert_eq!(Workload::Pt { ms: 100 }.slug(), "pt-100ms");
        assert_eq!(Workload::FEos { ms: 1000 }.label(), "F_eos(1 s)");
    }

    #[test]
    fn every_ratio_names_workloads_that_run() {
        for r in RATIOS {
            assert!(Workload::ALL.contains(&r.a) && Workload::ALL.contains(&r.b), "{r:?}");
        }
        let eos_vs_streams = RATIOS[2];
        assert!(eos_vs_streams.warm);
        assert_eq!(eos_vs_streams.verdict(4.1, 0.2), Some(true));
        assert_eq!(eos_vs_streams.verdict(4.1, 0.3), Some(false));
        assert_eq!(eos_vs_streams.verdict(3.9, 0.2), Some(false));
        assert_eq!(RATIOS[8].verdict(1.0, 1.0), None);
        assert_eq!(Workload::FDedup { pct: 10, eos: true }.slug(), "f-dedup-eos-10");
    }
}
