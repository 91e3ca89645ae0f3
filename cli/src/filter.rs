//! Which DLQ records a command looks at: the `--kind`, `--original-topic`, `--key`, offset, time and
//! `--header` filters, and the stable hash that keeps differently filtered replays apart.

use crate::read::DlqRecord;
use anyhow::{Result, bail};
use millrace::dlq::DlqErrorKind;

/// A conjunction of conditions on a DLQ record; the empty filter selects every record.
///
/// Conditions on Millrace information (kind, original topic, original offsets, failure time) never
/// match a record without Millrace headers; `--key` and `--header` can.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Error kinds, any of which matches (empty: any kind).
    pub kinds: Vec<DlqErrorKind>,
    /// The original topic.
    pub original_topic: Option<String>,
    /// The exact key, as UTF-8.
    pub key: Option<String>,
    /// Smallest original offset (inclusive).
    pub from_offset: Option<i64>,
    /// Largest original offset (inclusive).
    pub to_offset: Option<i64>,
    /// Earliest last-failure time, ms since the epoch (inclusive).
    pub since_ms: Option<i64>,
    /// Latest last-failure time, ms since the epoch (inclusive).
    pub until_ms: Option<i64>,
    /// Header equalities, all of which must hold: some header called `name` has exactly `value`.
    pub headers: Vec<(String, String)>,
    /// Smallest replay count (`millrace.replay.count`, 0 when absent), inclusive: with
    /// `--min-replays` equal to an earlier `--max-replays`, the records that replay set aside.
    pub min_replays: Option<u32>,
}

impl Filter {
    /// Checks that ranges are not empty and puts the repeatable conditions in a canonical order, so
    /// that equal filter sets compare (and hash) equal whatever the order they were given in.
    pub fn normalized(mut self) -> Result<Self> {
        if let (Some(from), Some(to)) = (self.from_offset, self.to_offset)
            && from > to
        {
            bail!("--from-offset {from} is greater than --to-offset {to}");
        }
        if let (Some(since), Some(until)) = (self.since_ms, self.until_ms)
            && since > until
        {
            bail!(
                "--since ({}) is later than --until ({})",
                crate::time::format_ms(since),
                crate::time::format_ms(until)
            );
        }
        if self.original_topic.as_deref() == Some("") {
            bail!("--original-topic must not be empty");
        }
        self.kinds.sort();
        self.kinds.dedup();
        self.headers.sort();
        self.headers.dedup();
        Ok(self)
    }

    /// Whether no condition is set.
    pub fn is_empty(&self) -> bool {
        *self == Filter::default()
    }

    /// Whether the record meets every condition.
    pub fn matches(&self, record: &DlqRecord) -> bool {
        if let Some(key) = &self.key
            && record.record.key.as_deref() != Some(key.as_bytes())
        {
            return false;
        }
        let header_ok = |(name, value): &(String, String)| {
            record.record.headers.iter().any(|h| h.name == *name && h.value.as_deref() == Some(value.as_bytes()))
        };
        if !self.headers.iter().all(header_ok) {
            return false;
        }
        if self.min_replays.is_some_and(|min| millrace::dlq::replay_count(&record.record.headers) < min) {
            return false;
        }
        let needs_info = !self.kinds.is_empty()
            || self.original_topic.is_some()
            || self.from_offset.is_some()
            || self.to_offset.is_some()
            || self.since_ms.is_some()
            || self.until_ms.is_some();
        let Some(info) = &record.info else {
            return !needs_info;
        };
        (self.kinds.is_empty() || self.kinds.contains(&info.kind))
            && self.original_topic.as_ref().is_none_or(|t| *t == info.original_topic)
            && self.from_offset.is_none_or(|from| info.original_offset >= from)
            && self.to_offset.is_none_or(|to| info.original_offset <= to)
            && self.since_ms.is_none_or(|since| info.last_failure_ms >= since)
            && self.until_ms.is_none_or(|until| info.last_failure_ms <= until)
    }

    /// A canonical text form of a normalized filter: one `name=value` condition per line, in a fixed
    /// order, with times as milliseconds. Equal filter sets give equal text.
    pub fn canonical(&self) -> String {
        let mut lines = Vec::new();
        lines.extend(self.kinds.iter().map(|k| format!("kind={k}")));
        lines.extend(self.original_topic.iter().map(|t| format!("original-topic={t}")));
        lines.extend(self.key.iter().map(|k| format!("key={k}")));
        lines.extend(self.from_offset.iter().map(|o| format!("from-offset={o}")));
        lines.extend(self.to_offset.iter().map(|o| format!("to-offset={o}")));
        lines.extend(self.since_ms.iter().map(|t| format!("since={t}")));
        lines.extend(self.until_ms.iter().map(|t| format!("until={t}")));
        lines.extend(self.headers.iter().map(|(n, v)| format!("header={n}={v}")));
        lines.extend(self.min_replays.iter().map(|n| format!("min-replays={n}")));
        lines.join("\n")
    }

    /// Eight hex digits identifying the filter set: FNV-1a (64-bit) of [`canonical`](Self::canonical),
    /// folded to 32 bits. Stable across runs, platforms and versions of this tool.
    pub fn short_hash(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.canonical().bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{:08x}", (hash >> 32) ^ (hash & 0xffff_ffff))
    }
}

/// Parses `--header name=value` (split at the first `=`; the value may be empty).
pub fn parse_header_condition(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some(("", _)) => Err(format!("header filter {s:?} has no name (expected name=value)")),
        Some((name, value)) => Ok((name.to_owned(), value.to_owned())),
        None => Err(format!("header filter {s:?} has no '=' (expected name=value)")),
    }
}

/// Parses an original offset for `--from-offset`/`--to-offset`: a non-negative integer.
pub fn parse_offset(s: &str) -> Result<i64, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if n >= 0 => Ok(n),
        _ => Err(format!("{s:?} is not an offset (a non-negative integer)")),
    }
}

/// Parses `--kind`: one of the error kinds Millrace writes.
pub fn parse_kind(s: &str) -> Result<DlqErrorKind, String> {
    s.trim().parse()
}

/// Parses `--since`/`--until` into ms since the epoch.
pub fn parse_time_arg(s: &str) -> Result<i64, String> {
    crate::time::parse_time(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace::OutputRecord;
    use millrace::dlq::headers;
    use millrace::record::Headers;

    fn dlq_record(kind: &str, topic: &str, offset: i64, last_failure: i64, key: &str) -> DlqRecord {
        let mut h = Headers::default();
        h.push("tenant", "acme");
        h.push(headers::ORIGINAL_TOPIC, topic);
        h.push(headers::ORIGINAL_PARTITION, "0");
        h.push(headers::ORIGINAL_OFFSET, offset.to_string());
        h.push(headers::GROUP, "billing");
        h.push(headers::PROCESSOR, "Charge");
        h.push(headers::ERROR_KIND, kind);
        h.push(headers::ATTEMPTS, "1");
        h.push(headers::FIRST_FAILURE, last_failure.to_string());
        h.push(headers::LAST_FAILURE, last_failure.to_string());
        let mut out = OutputRecord::to("orders.dlq").key(key);
        out.headers = h;
        let record = DlqRecord::written(out, 0, 0);
        assert!(record.info.is_some());
        record
    }

    fn plain_record(key: &str) -> DlqRecord {
        DlqRecord::written(OutputRecord::to("orders.dlq").key(key).header("tenant", "acme"), 0, 0)
    }

    fn filter(f: Filter) -> Filter {
        f.normalized().expect("valid filter")
    }

    #[test]
    fn empty_filter_matches_everything() {
        let f = filter(Filter::default());
        assert!(f.is_empty());
        assert!(f.matches(&dlq_record("panic", "orders", 1, 10, "k")));
        assert!(f.matches(&plain_record("k")));
    }

    #[test]
    fn kinds_are_alternatives() {
        let f = filter(Filter { kinds: vec![DlqErrorKind::Panic, DlqErrorKind::Decode], ..Filter::default() });
        assert!(f.matches(&dlq_record("panic", "orders", 1, 10, "k")));
        assert!(f.matches(&dlq_record("decode", "orders", 1, 10, "k")));
        assert!(!f.matches(&dlq_record("permanent", "orders", 1, 10, "k")));
        assert!(!f.matches(&plain_record("k")), "no kind without millrace headers");
    }

    #[test]
    fn conditions_are_all_required() {
        let f = filter(Filter {
            original_topic: Some("orders".into()),
            key: Some("k1".into()),
            from_offset: Some(5),
            to_offset: Some(7),
            since_ms: Some(100),
            until_ms: Some(200),
            ..Filter::default()
        });
        assert!(f.matches(&dlq_record("panic", "orders", 5, 100, "k1")));
        assert!(f.matches(&dlq_record("panic", "orders", 7, 200, "k1")), "ranges are inclusive");
        assert!(!f.matches(&dlq_record("panic", "payments", 5, 100, "k1")));
        assert!(!f.matches(&dlq_record("panic", "orders", 5, 100, "k2")));
        assert!(!f.matches(&dlq_record("panic", "orders", 4, 100, "k1")));
        assert!(!f.matches(&dlq_record("panic", "orders", 8, 100, "k1")));
        assert!(!f.matches(&dlq_record("panic", "orders", 6, 99, "k1")));
        assert!(!f.matches(&dlq_record("panic", "orders", 6, 201, "k1")));
        assert!(!f.matches(&plain_record("k1")));
    }

    #[test]
    fn header_conditions_see_user_and_millrace_headers() {
        let tenant = filter(Filter { headers: vec![("tenant".into(), "acme".into())], ..Filter::default() });
        assert!(tenant.matches(&dlq_record("panic", "orders", 1, 10, "k")));
        assert!(tenant.matches(&plain_record("k")), "user headers match without millrace headers");
        let group = filter(Filter {
            headers: vec![(headers::GROUP.into(), "billing".into()), ("tenant".into(), "acme".into())],
            ..Filter::default()
        });
        assert!(group.matches(&dlq_record("panic", "orders", 1, 10, "k")));
        assert!(!group.matches(&plain_record("k")));
        let other = filter(Filter { headers: vec![("tenant".into(), "globex".into())], ..Filter::default() });
        assert!(!other.matches(&dlq_record("panic", "orders", 1, 10, "k")));
    }

    #[test]
    fn invalid_values_are_rejected() {
        assert!(Filter { from_offset: Some(9), to_offset: Some(3), ..Filter::default() }.normalized().is_err());
        assert!(Filter { since_ms: Some(9), until_ms: Some(3), ..Filter::default() }.normalized().is_err());
        assert!(Filter { original_topic: Some(String::new()), ..Filter::default() }.normalized().is_err());
        assert_eq!(parse_header_condition("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_header_condition("a="), Ok(("a".into(), String::new())));
        assert!(parse_header_condition("=b").is_err());
        assert!(parse_header_condition("ab").is_err());
        assert_eq!(parse_offset("42"), Ok(42));
        assert!(parse_offset("-1").is_err());
        assert!(parse_offset("x").is_err());
        assert!(parse_kind("oops").is_err());
        assert_eq!(parse_kind("transient-exhausted"), Ok(DlqErrorKind::TransientExhausted));
        assert!(parse_time_arg("soon").is_err());
    }

    #[test]
    fn hash_is_stable_and_order_independent() {
        let a = filter(Filter {
            kinds: vec![DlqErrorKind::Panic, DlqErrorKind::Decode],
            headers: vec![("b".into(), "2".into()), ("a".into(), "1".into())],
            ..Filter::default()
        });
        let b = filter(Filter {
            kinds: vec![DlqErrorKind::Decode, DlqErrorKind::Panic, DlqErrorKind::Decode],
            headers: vec![("a".into(), "1".into()), ("b".into(), "2".into())],
            ..Filter::default()
        });
        assert_eq!(a.short_hash(), b.short_hash());
        assert_eq!(a.short_hash().len(), 8);
        let c = filter(Filter { kinds: vec![DlqErrorKind::Panic], ..Filter::default() });
        assert_ne!(a.short_hash(), c.short_hash());
        let key = filter(Filter { key: Some("x".into()), ..Filter::default() });
        let topic = filter(Filter { original_topic: Some("x".into()), ..Filter::default() });
        assert_ne!(key.short_hash(), topic.short_hash(), "the condition's name is part of the hash");
        // Pinned: a replay group name must not change between versions of the tool.
        assert_eq!(c.canonical(), "kind=panic");
        assert_eq!(c.short_hash(), "0f8bfe25");
    }

    #[test]
    fn min_replays_selects_records_replayed_at_least_that_often() {
        let f = filter(Filter { min_replays: Some(2), ..Filter::default() });
        let with_count = |n: &str| {
            let mut r = dlq_record("panic", "orders", 1, 10, "k");
            r.record.headers.push(headers::REPLAY_COUNT, n);
            r
        };
        assert!(!f.matches(&dlq_record("panic", "orders", 1, 10, "k")), "never replayed: count 0");
        assert!(!f.matches(&with_count("1")));
        assert!(f.matches(&with_count("2")) && f.matches(&with_count("5")));
        assert_eq!(f.canonical(), "min-replays=2");
        assert!(!f.is_empty());
    }
}
