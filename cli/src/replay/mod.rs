//! `millrace dlq replay`: produces DLQ records back to their original topic (or `--to`).
//!
//! The replay keeps its position in a consumer group of its own on the DLQ topic, so an interrupted
//! replay resumes where it stopped. A DLQ offset is committed only when every earlier record of its
//! partition is finished: produced and acknowledged (idempotent producer, `acks=all`), or not to be
//! produced (filtered out, exhausted, without Millrace headers). Commits are synchronous and cover only
//! that contiguous prefix, so a crash replays at most the unacknowledged tail again, never skips.
//!
//! A replayed record is the original: key, value bytes unchanged, user headers (idempotency keys
//! survive), plus `millrace.replay.count` = previous count + 1 and `millrace.replay.of` = where it
//! had been consumed (`topic/partition/offset`); the other `millrace.*` headers are dropped. Sent back to its original topic it goes to its original partition while that still
//! exists, whatever partitioner first placed it, so the replayed records of a key keep their
//! offset order among themselves. Without key parking they land behind the key's records that ran
//! since: per-key order across a dead-lettered record is not kept; with it, the key's later records
//! were parked behind the failed one, so its replay runs first and releases the key, and theirs follow
//! in order (docs/guarantees.md, "Per-key order and the DLQ").
//!
//! This module decides what happens to each record ([`decide`]) and builds what is produced
//! ([`replay_output`]); `replayer` drives the scan, the produces and the commits; `output` reports.

pub mod groups;
mod output;
mod replayer;

pub use output::print_summary;
pub use replayer::run;

use crate::filter::Filter;
use crate::read::DlqRecord;
use millrace::dlq::{Coordinates, headers, replay_count, user_headers};
use millrace::record::OutputRecord;

/// What to do with one DLQ record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Not selected by the filters: skipped and committed past.
    FilteredOut,
    /// Already replayed `--max-replays` times (its replay budget is exhausted): reported, not
    /// produced, committed past. A replay with `--min-replays` = that limit and a higher
    /// `--max-replays` (a group of its own) brings such records back.
    Exhausted {
        /// Its replay count.
        replays: u32,
    },
    /// No Millrace headers and no `--to`: reported, not produced, committed past.
    SkippedNoHeaders,
    /// Produce it to `topic`.
    Replay {
        /// Destination topic.
        topic: String,
    },
}

/// Decides what happens to `record` (a pure function of the record and the options).
pub fn decide(record: &DlqRecord, filter: &Filter, to: Option<&str>, max_replays: u32) -> Action {
    if !filter.matches(record) {
        return Action::FilteredOut;
    }
    let replays = replay_count(&record.record.headers);
    if replays >= max_replays {
        return Action::Exhausted { replays };
    }
    match (to, &record.info) {
        (Some(to), _) => Action::Replay { topic: to.to_owned() },
        (None, Some(info)) => Action::Replay { topic: info.original_topic.clone() },
        (None, None) => Action::SkippedNoHeaders,
    }
}

/// The record to produce for a replay: original key, value bytes and user headers, plus
/// `millrace.replay.count` one higher than the DLQ record's and `millrace.replay.of` naming where
/// the record had been consumed (a parked key is released when its blocking record's replay is
/// processed); no other `millrace.*` header.
pub fn replay_output(record: &DlqRecord, topic: &str, partition: Option<i32>) -> OutputRecord {
    let mut out = OutputRecord::to(topic);
    out.partition = partition;
    out.key = record.record.key.clone();
    out.value = record.record.value.clone();
    out.headers = user_headers(&record.record.headers);
    out.headers.push(headers::REPLAY_COUNT, replay_count(&record.record.headers).saturating_add(1).to_string());
    if let Some(info) = &record.info {
        let of = Coordinates {
            topic: info.original_topic.clone(),
            partition: info.original_partition,
            offset: info.original_offset,
        };
        out.headers.push(headers::REPLAY_OF, of.to_string());
    }
    out
}

/// The partition to produce to: the original one when going back to the original topic and it still
/// exists there (`partitions` is the topic's current count), else `None` (the partitioner decides).
pub fn target_partition(record: &DlqRecord, topic: &str, partitions: i32) -> Option<i32> {
    let info = record.info.as_ref()?;
    (info.original_topic == topic && info.original_partition < partitions).then_some(info.original_partition)
}

/// The replay's default consumer group: `millrace-replay.<dlq topic>`, plus `.<filter hash>` when
/// filters are given, so differently filtered replays keep separate positions.
pub fn default_group(dlq_topic: &str, filter: &Filter) -> String {
    if filter.is_empty() {
        format!("millrace-replay.{dlq_topic}")
    } else {
        format!("millrace-replay.{dlq_topic}.{}", filter.short_hash())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace::dlq::{DlqErrorKind, Failure, dead_letter};
    use millrace::record::{Headers, Record};

    fn dlq_record(replays: Option<&str>) -> DlqRecord {
        let mut headers = Headers::default();
        headers.push("idempotency-key", "order-7");
        headers.0.push(millrace::record::Header { name: "null-header".into(), value: None });
        if let Some(n) = replays {
            headers.push(millrace::dlq::headers::REPLAY_COUNT, n);
        }
        let original = Record {
            topic: "orders".into(),
            partition: 3,
            offset: 42,
            timestamp: Some(1),
            key: Some(b"k".to_vec()),
            value: Some(vec![0xff, 0x00, 0xfe]),
            headers,
        };
        let failure = Failure {
            kind: DlqErrorKind::Permanent,
            message: "bad".into(),
            attempts: 1,
            first_failure_ms: 5,
            last_failure_ms: 6,
        };
        let record = DlqRecord::written(dead_letter(&original, "orders.dlq", "billing", "Charge", &failure), 0, 7);
        assert!(record.info.is_some());
        record
    }

    fn no_headers_record() -> DlqRecord {
        DlqRecord::written(OutputRecord::to("orders.dlq").key("k").value("v").header("trace", "t1"), 1, 0)
    }

    #[test]
    fn rewrite_keeps_the_original_and_counts_the_replay() {
        let record = dlq_record(Some("1"));
        let out = replay_output(&record, "orders", Some(3));
        assert_eq!(out.topic, "orders");
        assert_eq!(out.partition, Some(3));
        assert_eq!(out.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(out.value.as_deref(), Some(&[0xff, 0x00, 0xfe][..]), "value bytes unchanged");
        let names: Vec<&str> = out.headers.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(
            names,
            ["idempotency-key", "null-header", headers::REPLAY_COUNT, headers::REPLAY_OF],
            "user headers in order, then the count and where the record had been consumed"
        );
        assert_eq!(out.headers.get(headers::REPLAY_OF), Some(&b"orders/3/42"[..]));
        assert_eq!(out.headers.0[1].value, None, "null headers stay null");
        assert_eq!(out.headers.get(headers::REPLAY_COUNT), Some(&b"2"[..]));
        assert_eq!(
            replay_output(&dlq_record(None), "orders", None).headers.get(headers::REPLAY_COUNT),
            Some(&b"1"[..])
        );
        let plain = replay_output(&no_headers_record(), "retry", None);
        assert_eq!(plain.headers.get("trace"), Some(&b"t1"[..]));
        assert_eq!(plain.headers.get(headers::REPLAY_COUNT), Some(&b"1"[..]));
    }

    #[test]
    fn decisions() {
        let none = Filter::default();
        assert_eq!(decide(&dlq_record(None), &none, None, 3), Action::Replay { topic: "orders".into() });
        assert_eq!(decide(&dlq_record(Some("2")), &none, None, 3), Action::Replay { topic: "orders".into() });
        assert_eq!(decide(&dlq_record(Some("3")), &none, None, 3), Action::Exhausted { replays: 3 });
        assert_eq!(decide(&dlq_record(None), &none, None, 0), Action::Exhausted { replays: 0 });
        assert_eq!(decide(&dlq_record(None), &none, Some("retry"), 3), Action::Replay { topic: "retry".into() });
        assert_eq!(decide(&no_headers_record(), &none, None, 3), Action::SkippedNoHeaders);
        assert_eq!(decide(&no_headers_record(), &none, Some("retry"), 3), Action::Replay { topic: "retry".into() });
        let panics = Filter { kinds: vec![DlqErrorKind::Panic], ..Filter::default() };
        assert_eq!(decide(&dlq_record(Some("9")), &panics, None, 3), Action::FilteredOut, "filters come first");
    }

    #[test]
    fn original_partition_only_on_the_original_topic() {
        let record = dlq_record(None);
        assert_eq!(target_partition(&record, "orders", 4), Some(3));
        assert_eq!(target_partition(&record, "orders", 2), None, "partition gone: let the partitioner choose");
        assert_eq!(target_partition(&record, "retry", 8), None);
        assert_eq!(target_partition(&no_headers_record(), "orders", 8), None);
    }

    #[test]
    fn groups_differ_by_filter() {
        let none = Filter::default();
        assert_eq!(default_group("orders.dlq", &none), "millrace-replay.orders.dlq");
        let panics = Filter { kinds: vec![DlqErrorKind::Panic], ..Filter::default() };
        let decodes = Filter { kinds: vec![DlqErrorKind::Decode], ..Filter::default() };
        let g = default_group("orders.dlq", &panics);
        assert!(g.starts_with("millrace-replay.orders.dlq.") && g.len() == "millrace-replay.orders.dlq.".len() + 8);
        assert_ne!(g, default_group("orders.dlq", &decodes));
        assert_eq!(g, default_group("orders.dlq", &panics.clone().normalized().unwrap()));
    }
}
