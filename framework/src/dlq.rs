//! The dead-letter queue: where a record goes when it cannot be processed, with everything needed to
//! understand and replay it.
//!
//! A DLQ record keeps the original key, the original value bytes unchanged and the original headers,
//! and adds the headers named in [`headers`] (all prefixed `millrace.`). Millrace headers already on
//! the original (from an earlier trip through the DLQ) are replaced, except that the replay count is
//! carried over. The DLQ produce is awaited (idempotent producer, `acks=all`) before the source offset
//! may be committed; if it fails, the record stays unfinished and the produce is retried.

use crate::record::{Header, Headers, OutputRecord, Record};
use std::fmt;
use std::str::FromStr;

/// Names of the headers Millrace adds to a dead-lettered record.
pub mod headers {
    /// Prefix of every Millrace header.
    pub const PREFIX: &str = "millrace.";
    /// Topic the record was consumed from.
    pub const ORIGINAL_TOPIC: &str = "millrace.original.topic";
    /// Partition it was consumed from (decimal).
    pub const ORIGINAL_PARTITION: &str = "millrace.original.partition";
    /// Its offset there (decimal).
    pub const ORIGINAL_OFFSET: &str = "millrace.original.offset";
    /// Its timestamp, milliseconds since the epoch (decimal; absent when the broker gave none).
    pub const ORIGINAL_TIMESTAMP: &str = "millrace.original.timestamp";
    /// Consumer group that failed to process it.
    pub const GROUP: &str = "millrace.group";
    /// Name of the processor that failed ([`Processor::name`](crate::Processor::name)).
    pub const PROCESSOR: &str = "millrace.processor";
    /// Why: `transient-exhausted`, `permanent`, `decode`, `panic`, `timeout` or `parked` (see
    /// [`DlqErrorKind`](super::DlqErrorKind)).
    pub const ERROR_KIND: &str = "millrace.error.kind";
    /// The last error's message, truncated to [`MAX_ERROR_MESSAGE`](super::MAX_ERROR_MESSAGE) bytes.
    pub const ERROR_MESSAGE: &str = "millrace.error.message";
    /// Attempts made (decimal).
    pub const ATTEMPTS: &str = "millrace.attempts";
    /// When the first attempt failed, milliseconds since the epoch (decimal).
    pub const FIRST_FAILURE: &str = "millrace.failure.first";
    /// When the last attempt failed, milliseconds since the epoch (decimal).
    pub const LAST_FAILURE: &str = "millrace.failure.last";
    /// How many times the record was replayed from a DLQ before this failure (decimal).
    pub const REPLAY_COUNT: &str = "millrace.replay.count";
    /// On a `decode` failure whose value starts with a Confluent wire-format header (magic byte 0,
    /// then 4 bytes), the schema id in it (decimal); absent otherwise.
    pub const SCHEMA_ID: &str = "millrace.schema.id";
    /// On a `parked` record (key parking, [`DlqConfig::park_keys`](crate::DlqConfig::park_keys)):
    /// the record its key is parked behind, as `topic/partition/offset`
    /// ([`Coordinates`](super::Coordinates)). On a release marker: the parking it releases.
    pub const PARKED_BY: &str = "millrace.parked.by";
    /// On a record replayed by `millrace dlq replay`: where the DLQ copy it came from had been
    /// consumed, as `topic/partition/offset`. A parked key is released when the replay of its
    /// blocking record is processed.
    pub const REPLAY_OF: &str = "millrace.replay.of";
    /// On a control record of Millrace's own (never given to a processor): `release`, produced by
    /// `millrace dlq release` to release a parked key in order with the partition's records.
    pub const CONTROL: &str = "millrace.control";
}

/// Where a record was consumed from: written `topic/partition/offset` in the headers
/// [`headers::PARKED_BY`] and [`headers::REPLAY_OF`].
///
/// ```
/// use millrace::dlq::Coordinates;
/// let c: Coordinates = "orders/3/42".parse().unwrap();
/// assert_eq!((c.topic.as_str(), c.partition, c.offset), ("orders", 3, 42));
/// assert_eq!(c.to_string(), "orders/3/42");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Coordinates {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

impl fmt::Display for Coordinates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.topic, self.partition, self.offset)
    }
}

impl FromStr for Coordinates {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{s:?} is not topic/partition/offset");
        let (rest, offset) = s.rsplit_once('/').ok_or_else(bad)?;
        let (topic, partition) = rest.rsplit_once('/').ok_or_else(bad)?;
        Ok(Coordinates {
            topic: topic.to_owned(),
            partition: partition.parse().map_err(|_| bad())?,
            offset: offset.parse().map_err(|_| bad())?,
        })
    }
}

impl Coordinates {
    /// The coordinates a header holds, if it is there and well formed.
    pub fn from_header(h: &Headers, name: &str) -> Option<Self> {
        h.get(name).and_then(|v| std::str::from_utf8(v).ok()).and_then(|v| v.parse().ok())
    }
}

/// Longest error message kept in [`headers::ERROR_MESSAGE`], in bytes.
pub const MAX_ERROR_MESSAGE: usize = 1024;

/// Why a record was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DlqErrorKind {
    /// A transient failure that outlasted the retry policy.
    TransientExhausted,
    /// A permanent failure (validation, malformed payload).
    Permanent,
    /// The payload could not be decoded.
    Decode,
    /// The processor panicked.
    Panic,
    /// The last attempt ran past [`attempt_timeout`](crate::PipelineConfig::attempt_timeout) and was
    /// cancelled (a timeout is a transient failure: this is the kind once the retries are used up).
    Timeout,
    /// Not run: its key was parked behind an earlier record of the key that failed for good (key
    /// parking, [`DlqConfig::park_keys`](crate::DlqConfig::park_keys)); the blocking record is named
    /// in [`headers::PARKED_BY`].
    Parked,
}

impl DlqErrorKind {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            DlqErrorKind::TransientExhausted => "transient-exhausted",
            DlqErrorKind::Permanent => "permanent",
            DlqErrorKind::Decode => "decode",
            DlqErrorKind::Panic => "panic",
            DlqErrorKind::Timeout => "timeout",
            DlqErrorKind::Parked => "parked",
        }
    }
}

impl fmt::Display for DlqErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DlqErrorKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "transient-exhausted" => Ok(DlqErrorKind::TransientExhausted),
            "permanent" => Ok(DlqErrorKind::Permanent),
            "decode" => Ok(DlqErrorKind::Decode),
            "panic" => Ok(DlqErrorKind::Panic),
            "timeout" => Ok(DlqErrorKind::Timeout),
            "parked" => Ok(DlqErrorKind::Parked),
            other => Err(format!(
                "unknown error kind {other:?} (transient-exhausted, permanent, decode, panic, timeout, parked)"
            )),
        }
    }
}

/// How a record failed, as written into its DLQ headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Why.
    pub kind: DlqErrorKind,
    /// The last error's message.
    pub message: String,
    /// Attempts made.
    pub attempts: u32,
    /// First failure, milliseconds since the epoch.
    pub first_failure_ms: i64,
    /// Last failure, milliseconds since the epoch.
    pub last_failure_ms: i64,
}

/// What the Millrace headers of a DLQ record say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DlqInfo {
    /// Source topic.
    pub original_topic: String,
    /// Source partition.
    pub original_partition: i32,
    /// Source offset.
    pub original_offset: i64,
    /// Source timestamp (ms).
    pub original_timestamp: Option<i64>,
    /// Consumer group.
    pub group: String,
    /// Processor name.
    pub processor: String,
    /// Why it failed.
    pub kind: DlqErrorKind,
    /// The error message.
    pub message: String,
    /// Attempts made.
    pub attempts: u32,
    /// First failure (ms).
    pub first_failure_ms: i64,
    /// Last failure (ms).
    pub last_failure_ms: i64,
    /// Replays before this failure.
    pub replay_count: u32,
}

impl DlqInfo {
    /// Reads the Millrace headers of a DLQ record; `None` when any required one is missing or
    /// malformed (the record did not come from Millrace).
    pub fn from_headers(h: &Headers) -> Option<Self> {
        let text = |name| h.get(name).and_then(|v| std::str::from_utf8(v).ok());
        let num = |name| text(name).and_then(|v| v.parse::<i64>().ok());
        Some(DlqInfo {
            original_topic: text(headers::ORIGINAL_TOPIC)?.to_owned(),
            original_partition: num(headers::ORIGINAL_PARTITION)?.try_into().ok()?,
            original_offset: num(headers::ORIGINAL_OFFSET)?,
            original_timestamp: num(headers::ORIGINAL_TIMESTAMP),
            group: text(headers::GROUP)?.to_owned(),
            processor: text(headers::PROCESSOR).unwrap_or_default().to_owned(),
            kind: text(headers::ERROR_KIND)?.parse().ok()?,
            message: text(headers::ERROR_MESSAGE).unwrap_or_default().to_owned(),
            attempts: num(headers::ATTEMPTS)?.try_into().ok()?,
            first_failure_ms: num(headers::FIRST_FAILURE)?,
            last_failure_ms: num(headers::LAST_FAILURE)?,
            replay_count: replay_count(h),
        })
    }
}

/// The replay count a record carries (0 when it was never replayed).
pub fn replay_count(h: &Headers) -> u32 {
    h.get(headers::REPLAY_COUNT).and_then(|v| std::str::from_utf8(v).ok()).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The original headers without any Millrace header.
pub fn user_headers(h: &Headers) -> Headers {
    Headers(h.iter().filter(|x| !x.name.starts_with(headers::PREFIX)).cloned().collect())
}

/// The DLQ topic for `source` from a template where `{topic}` stands for the source topic.
///
/// ```
/// assert_eq!(millrace::dlq::topic_for("{topic}.dlq", "orders"), "orders.dlq");
/// ```
pub fn topic_for(template: &str, source: &str) -> String {
    template.replace("{topic}", source)
}

/// Builds the DLQ record for `record`: original key, value bytes and (user) headers, plus the Millrace
/// headers describing where it came from and why it failed.
pub fn dead_letter(record: &Record, dlq_topic: &str, group: &str, processor: &str, failure: &Failure) -> OutputRecord {
    let mut out = OutputRecord::to(dlq_topic);
    out.key = record.key.clone();
    out.value = record.value.clone();
    out.headers = user_headers(&record.headers);
    let mut add =
        |name: &str, value: String| out.headers.0.push(Header { name: name.into(), value: Some(value.into()) });
    add(headers::ORIGINAL_TOPIC, record.topic.to_string());
    add(headers::ORIGINAL_PARTITION, record.partition.to_string());
    add(headers::ORIGINAL_OFFSET, record.offset.to_string());
    if let Some(ts) = record.timestamp {
        add(headers::ORIGINAL_TIMESTAMP, ts.to_string());
    }
    add(headers::GROUP, group.to_owned());
    add(headers::PROCESSOR, processor.to_owned());
    add(headers::ERROR_KIND, failure.kind.as_str().to_owned());
    add(headers::ERROR_MESSAGE, truncate(&failure.message, MAX_ERROR_MESSAGE).to_owned());
    add(headers::ATTEMPTS, failure.attempts.to_string());
    add(headers::FIRST_FAILURE, failure.first_failure_ms.to_string());
    add(headers::LAST_FAILURE, failure.last_failure_ms.to_string());
    add(headers::REPLAY_COUNT, replay_count(&record.headers).to_string());
    if failure.kind == DlqErrorKind::Decode
        && let Some(id) = record.value.as_deref().and_then(crate::codec::schema_registry::wire::schema_id)
    {
        add(headers::SCHEMA_ID, id.to_string());
    }
    out
}

/// The schema id a DLQ record's [`headers::SCHEMA_ID`] header carries.
pub fn schema_id(h: &Headers) -> Option<u32> {
    h.get(headers::SCHEMA_ID).and_then(|v| std::str::from_utf8(v).ok()).and_then(|v| v.parse().ok())
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        let mut headers = Headers::default();
        headers.push("idempotency-key", "order-7");
        headers.push(headers::REPLAY_COUNT, "2");
        headers.push(headers::ERROR_KIND, "permanent");
        Record {
            topic: "orders".into(),
            partition: 3,
            offset: 42,
            timestamp: Some(1_700_000_000_000),
            key: Some(b"k".to_vec()),
            value: Some(vec![0xff, 0x00, 0xfe]),
            headers,
        }
    }

    #[test]
    fn dead_letter_keeps_bytes_and_headers_and_says_why() {
        let failure = Failure {
            kind: DlqErrorKind::TransientExhausted,
            message: "é".repeat(2_000),
            attempts: 5,
            first_failure_ms: 10,
            last_failure_ms: 20,
        };
        let out = dead_letter(&record(), "orders.dlq", "billing", "Charge", &failure);
        assert_eq!(out.topic, "orders.dlq");
        assert_eq!(out.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(out.value.as_deref(), Some(&[0xff, 0x00, 0xfe][..]), "value bytes untouched");
        assert_eq!(out.headers.get("idempotency-key"), Some(&b"order-7"[..]));
        let info = DlqInfo::from_headers(&out.headers).expect("millrace headers");
        assert_eq!(info.original_topic, "orders");
        assert_eq!((info.original_partition, info.original_offset), (3, 42));
        assert_eq!(info.kind, DlqErrorKind::TransientExhausted);
        assert_eq!(info.replay_count, 2, "the replay count is carried over");
        assert_eq!(info.attempts, 5);
        assert!(info.message.len() <= MAX_ERROR_MESSAGE);
        let kinds = out.headers.iter().filter(|h| h.name == headers::ERROR_KIND).count();
        assert_eq!(kinds, 1, "an earlier trip's millrace headers are replaced");
        assert_eq!(schema_id(&out.headers), None, "no schema id outside decode failures");
    }

    #[test]
    fn decode_failures_carry_a_readable_schema_id() {
        let failure = Failure {
            kind: DlqErrorKind::Decode,
            message: "x".into(),
            attempts: 1,
            first_failure_ms: 1,
            last_failure_ms: 1,
        };
        let mut r = record();
        r.value = Some(vec![0, 0, 0, 1, 0, 9, 9]);
        let out = dead_letter(&r, "orders.dlq", "g", "p", &failure);
        assert_eq!(schema_id(&out.headers), Some(256));
        assert_eq!(out.value, r.value, "value bytes untouched");
        r.value = Some(vec![1, 0, 0, 1, 0, 9]); // wrong magic byte: no id to read
        assert_eq!(schema_id(&dead_letter(&r, "orders.dlq", "g", "p", &failure).headers), None);
        r.value = Some(vec![0, 0, 0]); // too short
        assert_eq!(schema_id(&dead_letter(&r, "orders.dlq", "g", "p", &failure).headers), None);
    }

    #[test]
    fn records_without_millrace_headers_are_recognised() {
        assert!(DlqInfo::from_headers(&Headers::default()).is_none());
        for kind in
            [DlqErrorKind::TransientExhausted, DlqErrorKind::Permanent, DlqErrorKind::Decode, DlqErrorKind::Panic]
        {
            assert_eq!(kind.as_str().parse::<DlqErrorKind>(), Ok(kind));
        }
    }
}
