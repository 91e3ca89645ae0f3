//! Records: what a processor receives ([`Record`]) and what it emits ([`OutputRecord`]).

use rdkafka::Message;
use rdkafka::message::{BorrowedMessage, Header as KafkaHeader, Headers as _, OwnedHeaders};
use rdkafka::producer::{BaseRecord, FutureRecord};
use rdkafka::util::IntoOpaque;
use std::sync::Arc;

/// One header: a name and an optional value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Header name.
    pub name: String,
    /// Header value; `None` for a null header.
    pub value: Option<Vec<u8>>,
}

/// The ordered headers of a record (names may repeat, as in Kafka).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<Header>);

impl Headers {
    /// The value of the last header called `name`, if any.
    ///
    /// ```
    /// use millrace::record::{Header, Headers};
    /// let h = Headers(vec![Header { name: "trace".into(), value: Some(b"abc".to_vec()) }]);
    /// assert_eq!(h.get("trace"), Some(&b"abc"[..]));
    /// assert_eq!(h.get("nope"), None);
    /// ```
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.0.iter().rev().find(|h| h.name == name).and_then(|h| h.value.as_deref())
    }

    /// Appends a header.
    pub fn push(&mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) {
        self.0.push(Header { name: name.into(), value: Some(value.into()) });
    }

    /// Iterates over the headers in order.
    pub fn iter(&self) -> impl Iterator<Item = &Header> {
        self.0.iter()
    }

    /// Number of headers.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no headers.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Copies the headers of a consumed message.
    pub fn of_message(msg: &impl Message) -> Self {
        msg.headers()
            .map(|hs| {
                Headers(
                    hs.iter().map(|h| Header { name: h.key.to_owned(), value: h.value.map(<[u8]>::to_vec) }).collect(),
                )
            })
            .unwrap_or_default()
    }

    fn byte_len(&self) -> usize {
        self.0.iter().map(|h| h.name.len() + h.value.as_ref().map_or(0, Vec::len)).sum()
    }
}

/// An input record, owned, as handed to a [`Processor`](crate::Processor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Source topic.
    pub topic: Arc<str>,
    /// Source partition.
    pub partition: i32,
    /// Offset in the source partition.
    pub offset: i64,
    /// Timestamp in milliseconds since the epoch, when the broker reports one.
    pub timestamp: Option<i64>,
    /// Key bytes; `None` for a null key.
    pub key: Option<Vec<u8>>,
    /// Value bytes; `None` for a null value (a tombstone).
    pub value: Option<Vec<u8>>,
    /// Headers in order.
    pub headers: Headers,
}

impl Record {
    /// Copies a polled message out of the consumer's buffers: partition, offset, timestamp, key,
    /// value and headers. `topic` is taken rather than read from the message so that the records of
    /// one partition can share one allocation of the name (`millrace dlq` reads with it too).
    pub fn from_message(msg: &BorrowedMessage<'_>, topic: Arc<str>) -> Self {
        let headers = Headers::of_message(msg);
        Record {
            topic,
            partition: msg.partition(),
            offset: msg.offset(),
            timestamp: msg.timestamp().to_millis(),
            key: msg.key().map(<[u8]>::to_vec),
            value: msg.payload().map(<[u8]>::to_vec),
            headers,
        }
    }

    /// The value as UTF-8 text, if it is present and valid.
    pub fn value_str(&self) -> Option<&str> {
        self.value.as_deref().and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The key as UTF-8 text, if it is present and valid.
    pub fn key_str(&self) -> Option<&str> {
        self.key.as_deref().and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Bytes this record holds (key, value, headers), for the buffered-bytes bound.
    pub fn byte_len(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len) + self.value.as_ref().map_or(0, Vec::len) + self.headers.byte_len()
    }
}

/// A record to emit to another topic from a processor, through [`Context::emit`](crate::Context::emit).
///
/// ```
/// use millrace::OutputRecord;
/// let out = OutputRecord::to("payments").key("order-7").value(r#"{"amount":12}"#).header("source", "orders");
/// assert_eq!(out.topic, "payments");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRecord {
    /// Destination topic.
    pub topic: String,
    /// Destination partition; `None` lets the producer's partitioner choose by key.
    pub partition: Option<i32>,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Headers.
    pub headers: Headers,
}

impl OutputRecord {
    /// A record for `topic` with no key, value or headers yet.
    pub fn to(topic: impl Into<String>) -> Self {
        Self { topic: topic.into(), partition: None, key: None, value: None, headers: Headers::default() }
    }

    /// Sets the key.
    pub fn key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets the value.
    pub fn value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push(name, value);
        self
    }

    /// Pins the destination partition.
    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Bytes this record holds (key, value, headers).
    pub fn byte_len(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len) + self.value.as_ref().map_or(0, Vec::len) + self.headers.byte_len()
    }

    /// This record as rdkafka's `FutureRecord`, borrowing its bytes, for a producer of your own
    /// (`millrace dlq replay` uses it to send DLQ records back).
    ///
    /// ```
    /// use millrace::OutputRecord;
    /// let out = OutputRecord::to("orders").key("customer-7").value("{}").header("trace", "abc");
    /// let record = out.as_future_record();
    /// assert_eq!(record.topic, "orders");
    /// assert_eq!(record.key, Some(&b"customer-7"[..]));
    /// ```
    pub fn as_future_record(&self) -> FutureRecord<'_, [u8], [u8]> {
        fill(FutureRecord::to(&self.topic), self)
    }
}

/// librdkafka's record types, filled from an [`OutputRecord`] by [`fill`]: the one conversion the
/// output producer (`FutureRecord`), the transactional producer (`BaseRecord`) and
/// [`OutputRecord::as_future_record`] share.
pub(crate) trait KafkaRecord<'a>: Sized {
    fn with_key(self, key: &'a [u8]) -> Self;
    fn with_payload(self, value: &'a [u8]) -> Self;
    fn with_partition(self, partition: i32) -> Self;
    fn with_headers(self, headers: OwnedHeaders) -> Self;
}

/// The two impls of [`KafkaRecord`]: rdkafka's record types have the same builder methods.
macro_rules! kafka_record {
    (impl<$a:lifetime $(, $d:ident: $bound:path)?> for $ty:ty) => {
        impl<$a $(, $d: $bound)?> KafkaRecord<$a> for $ty {
            fn with_key(self, key: &$a [u8]) -> Self {
                self.key(key)
            }
            fn with_payload(self, value: &$a [u8]) -> Self {
                self.payload(value)
            }
            fn with_partition(self, partition: i32) -> Self {
                self.partition(partition)
            }
            fn with_headers(self, headers: OwnedHeaders) -> Self {
                self.headers(headers)
            }
        }
    };
}

kafka_record!(impl<'a> for FutureRecord<'a, [u8], [u8]>);
kafka_record!(impl<'a, D: IntoOpaque> for BaseRecord<'a, [u8], [u8], D>);

/// Fills `record` (already addressed to `out.topic`) with `out`'s key, value, partition and headers.
pub(crate) fn fill<'a, R: KafkaRecord<'a>>(mut record: R, out: &'a OutputRecord) -> R {
    if let Some(h) = kafka_headers(&out.headers) {
        record = record.with_headers(h);
    }
    if let Some(k) = out.key.as_deref() {
        record = record.with_key(k);
    }
    if let Some(v) = out.value.as_deref() {
        record = record.with_payload(v);
    }
    if let Some(p) = out.partition {
        record = record.with_partition(p);
    }
    record
}

/// An output's headers as librdkafka takes them; `None` when there are none (saves an allocation).
fn kafka_headers(headers: &Headers) -> Option<OwnedHeaders> {
    (!headers.is_empty()).then(|| {
        headers.iter().fold(OwnedHeaders::new_with_capacity(headers.len()), |all, h| {
            all.insert(KafkaHeader { key: &h.name, value: h.value.as_deref() })
        })
    })
}
