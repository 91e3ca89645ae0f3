//! `millrace dlq stats`: counts of a DLQ topic's records by error kind, original topic, processor,
//! group and replay count, with the oldest and newest failure, and the replay state: how far each
//! replay group of the topic got ([`crate::replay::groups`]).

use crate::args::{Format, StatsArgs};
use crate::filter::Filter;
use crate::parked::{self, Parking};
use crate::read::{DlqRecord, TopicScan};
use crate::replay::groups::{self, ReplayGroup};
use crate::time::format_ms;
use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Where and when one failure happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailurePoint {
    /// Last failure time, RFC 3339 (UTC).
    pub failed_at: String,
    /// Last failure time, ms since the epoch.
    pub failed_at_ms: i64,
    /// Original topic.
    pub original_topic: String,
    /// Original partition.
    pub original_partition: i32,
    /// Original offset.
    pub original_offset: i64,
    /// Partition in the DLQ topic.
    pub dlq_partition: i32,
    /// Offset in the DLQ topic.
    pub dlq_offset: i64,
}

/// The statistics of a DLQ topic (of the records matching the filters).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DlqStats {
    /// The DLQ topic.
    pub topic: String,
    /// Records read.
    pub scanned: u64,
    /// Records matching the filters (all records without filters).
    pub records: u64,
    /// Records not matching the filters.
    pub filtered_out: u64,
    /// Matching records without (valid) Millrace headers.
    pub without_millrace_headers: u64,
    /// Counts by error kind.
    pub by_kind: BTreeMap<String, u64>,
    /// Counts by original topic.
    pub by_original_topic: BTreeMap<String, u64>,
    /// Counts by processor name.
    pub by_processor: BTreeMap<String, u64>,
    /// Counts by consumer group.
    pub by_group: BTreeMap<String, u64>,
    /// Counts by replay count (`millrace.replay.count`; 0 when absent).
    pub by_replay_count: BTreeMap<u32, u64>,
    /// The replay groups of the topic: what each handled and what it would still read.
    pub replay_groups: Vec<ReplayGroup>,
    /// Keys parked now by the groups of the records read (key parking), each with the records of
    /// this topic parked behind its blocking record.
    pub parked_keys: Vec<Parking>,
    /// Records of kind `parked`, by the blocking record they wait behind (`topic/partition/offset`).
    #[serde(skip)]
    pub parked_behind: BTreeMap<String, u64>,
    /// The failure with the earliest last-failure time.
    pub oldest: Option<FailurePoint>,
    /// The failure with the latest last-failure time.
    pub newest: Option<FailurePoint>,
}

impl DlqStats {
    /// Counts one record.
    pub fn add(&mut self, record: &DlqRecord, filter: &Filter) {
        self.scanned += 1;
        if !filter.matches(record) {
            self.filtered_out += 1;
            return;
        }
        self.records += 1;
        *self.by_replay_count.entry(millrace::dlq::replay_count(&record.record.headers)).or_default() += 1;
        for g in &mut self.replay_groups {
            g.add(record);
        }
        let Some(info) = &record.info else {
            self.without_millrace_headers += 1;
            return;
        };
        *self.by_kind.entry(info.kind.to_string()).or_default() += 1;
        *self.by_original_topic.entry(info.original_topic.clone()).or_default() += 1;
        *self.by_processor.entry(info.processor.clone()).or_default() += 1;
        *self.by_group.entry(info.group.clone()).or_default() += 1;
        if let Some(by) = record.record.headers.get(millrace::dlq::headers::PARKED_BY) {
            *self.parked_behind.entry(String::from_utf8_lossy(by).into_owned()).or_default() += 1;
        }
        let point = || FailurePoint {
            failed_at: format_ms(info.last_failure_ms),
            failed_at_ms: info.last_failure_ms,
            original_topic: info.original_topic.clone(),
            original_partition: info.original_partition,
            original_offset: info.original_offset,
            dlq_partition: record.record.partition,
            dlq_offset: record.record.offset,
        };
        if self.oldest.as_ref().is_none_or(|o| info.last_failure_ms < o.failed_at_ms) {
            self.oldest = Some(point());
        }
        if self.newest.as_ref().is_none_or(|n| info.last_failure_ms > n.failed_at_ms) {
            self.newest = Some(point());
        }
    }

    /// The human-readable report.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let _ = write!(out, "DLQ topic {}: {} records", self.topic, self.records);
        if self.filtered_out > 0 {
            let _ = write!(out, " matching the filters ({} scanned, {} filtered out)", self.scanned, self.filtered_out);
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "without Millrace headers: {}", self.without_millrace_headers);
        for (title, counts) in [
            ("by error kind", &self.by_kind),
            ("by original topic", &self.by_original_topic),
            ("by processor", &self.by_processor),
            ("by group", &self.by_group),
        ] {
            let _ = writeln!(out, "\n{title}:");
            if counts.is_empty() {
                let _ = writeln!(out, "  (none)");
            }
            let width = counts.keys().map(|k| k.chars().count()).max().unwrap_or(0).max(8);
            for (name, n) in counts {
                let name = if name.is_empty() { "(unnamed)" } else { name };
                let _ = writeln!(out, "  {name:<width$}  {n:>8}");
            }
        }
        let _ = writeln!(out, "\nby replay count:");
        for (n, count) in &self.by_replay_count {
            let _ = writeln!(out, "  {n:<8}  {count:>8}");
        }
        let _ = writeln!(out, "\nreplay groups (committed past: replayed, exhausted, filtered out or skipped by it):");
        if self.replay_groups.is_empty() {
            let _ = writeln!(out, "  (none)");
        }
        for g in &self.replay_groups {
            let counts: Vec<String> =
                g.outstanding_by_replay_count.iter().map(|(n, c)| format!("{c} at {n}")).collect();
            let by_count =
                if counts.is_empty() { String::new() } else { format!(" (by replay count: {})", counts.join(", ")) };
            let _ = writeln!(
                out,
                "  {}  committed past {}, outstanding {}{by_count}",
                g.group, g.committed_past, g.outstanding
            );
        }
        let _ = writeln!(out, "\nparked keys (key parking: held behind a failed record until replayed or released):");
        if self.parked_keys.is_empty() {
            let _ = writeln!(out, "  (none)");
        }
        for p in &self.parked_keys {
            let _ = writeln!(
                out,
                "  group {}  key {:?}  in {}/{}  behind offset {}  parked records here {}",
                p.group, p.key, p.topic, p.partition, p.blocking_offset, p.parked_records
            );
        }
        let _ = writeln!(out);
        for (title, point) in [("oldest failure", &self.oldest), ("newest failure", &self.newest)] {
            match point {
                Some(p) => {
                    let _ = writeln!(
                        out,
                        "{title}: {}  {} partition {} offset {}  (DLQ partition {} offset {})",
                        p.failed_at,
                        p.original_topic,
                        p.original_partition,
                        p.original_offset,
                        p.dlq_partition,
                        p.dlq_offset
                    );
                }
                None => {
                    let _ = writeln!(out, "{title}: -");
                }
            }
        }
        out
    }
}

/// Runs `millrace dlq stats`.
pub async fn run(bootstrap: &str, args: &StatsArgs) -> Result<()> {
    let filter = args.filter.to_filter()?;
    let mut scan = TopicScan::open(bootstrap, &args.topic, None)?;
    let replay_groups = groups::find(bootstrap, &args.topic)?;
    let mut stats = DlqStats { topic: args.topic.clone(), replay_groups, ..DlqStats::default() };
    while let Some(record) = scan.next().await? {
        stats.add(&record, &filter);
    }
    for group in stats.by_group.keys() {
        for mut p in parked::read(bootstrap, group).await? {
            if stats.by_original_topic.contains_key(&p.topic) {
                p.parked_records = stats.parked_behind.get(&p.blocking().to_string()).copied().unwrap_or(0);
                stats.parked_keys.push(p);
            }
        }
    }
    match args.format {
        Format::Table => print!("{}", stats.to_table()),
        Format::Json => println!("{}", serde_json::to_string_pretty(&stats)?),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace::dlq::headers;
    use millrace::record::Headers;

    fn record(offset: i64, kind: Option<&str>, last_failure: i64) -> DlqRecord {
        let mut h = Headers::default();
        if let Some(kind) = kind {
            for (n, v) in [
                (headers::ORIGINAL_TOPIC, "orders"),
                (headers::ORIGINAL_PARTITION, "2"),
                (headers::GROUP, "billing"),
                (headers::PROCESSOR, "Charge"),
                (headers::ERROR_KIND, kind),
                (headers::ATTEMPTS, "3"),
                (headers::FIRST_FAILURE, "1"),
            ] {
                h.push(n, v);
            }
            h.push(headers::ORIGINAL_OFFSET, (offset + 100).to_string());
            h.push(headers::LAST_FAILURE, last_failure.to_string());
        }
        let mut out = millrace::OutputRecord::to("orders.dlq");
        out.headers = h;
        DlqRecord::written(out, 0, offset)
    }

    #[test]
    fn counts_and_extremes() {
        let mut stats = DlqStats::default();
        let f = Filter::default();
        stats.add(&record(0, Some("panic"), 500), &f);
        stats.add(&record(1, Some("permanent"), 100), &f);
        stats.add(&record(2, Some("panic"), 900), &f);
        stats.add(&record(3, None, 0), &f);
        assert_eq!((stats.scanned, stats.records, stats.without_millrace_headers), (4, 4, 1));
        assert_eq!(stats.by_kind.get("panic"), Some(&2));
        assert_eq!(stats.by_kind.get("permanent"), Some(&1));
        assert_eq!(stats.by_original_topic.get("orders"), Some(&3));
        assert_eq!(stats.by_processor.get("Charge"), Some(&3));
        let oldest = stats.oldest.as_ref().unwrap();
        assert_eq!((oldest.failed_at_ms, oldest.original_offset, oldest.dlq_offset), (100, 101, 1));
        assert_eq!(stats.newest.as_ref().unwrap().dlq_offset, 2);
        assert!(stats.to_table().contains("panic"));
    }

    #[test]
    fn replay_state_per_group() {
        let group = ReplayGroup {
            group: "millrace-replay.orders.dlq".into(),
            committed: BTreeMap::from([(0, 1)]),
            ..ReplayGroup::default()
        };
        let mut stats = DlqStats { replay_groups: vec![group], ..DlqStats::default() };
        let f = Filter::default();
        stats.add(&record(0, Some("panic"), 500), &f);
        stats.add(&record(1, Some("panic"), 600), &f);
        assert_eq!(stats.by_replay_count, BTreeMap::from([(0, 2)]));
        let table = stats.to_table();
        assert!(
            table.contains("millrace-replay.orders.dlq  committed past 1, outstanding 1 (by replay count: 1 at 0)"),
            "{table}"
        );
    }

    #[test]
    fn filters_apply() {
        let mut stats = DlqStats::default();
        let f = Filter { kinds: vec![millrace::dlq::DlqErrorKind::Panic], ..Filter::default() };
        stats.add(&record(0, Some("panic"), 500), &f);
        stats.add(&record(1, Some("permanent"), 100), &f);
        stats.add(&record(2, None, 0), &f);
        assert_eq!((stats.scanned, stats.records, stats.filtered_out), (3, 1, 2));
        assert_eq!(stats.oldest.as_ref().unwrap().dlq_offset, 0);
    }
}
