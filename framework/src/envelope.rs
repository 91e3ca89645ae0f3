//! A standard event envelope, for teams that want one: identity, type, version, time, idempotency key
//! and trace context around a typed payload.
//!
//! Evolving it (and payloads inside it):
//! - never reuse a field name with a new meaning: add a new field instead;
//! - add fields with a default (`#[serde(default)]`) so that old readers and old records keep working
//!   in both directions; unknown fields are ignored when decoding;
//! - bump `version` when a payload changes in a way old readers cannot read, and branch on it in the
//!   processor (`match envelope.version { 1 => …, 2 => …, v => Err(ProcessError::permanent(…)) }`);
//! - keep `idempotency_key` stable for the same business event across retries and replays: it is
//!   what the dedup store and downstream APIs deduplicate on.
//!
//! ```
//! use millrace::envelope::Envelope;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, Debug, PartialEq)]
//! struct OrderPlaced { order: u64 }
//!
//! let e = Envelope::new("evt-1", "order.placed", 1, 1_700_000_000_000, "order-1", OrderPlaced { order: 1 });
//! let json = serde_json::to_string(&e).unwrap();
//! let back: Envelope<OrderPlaced> = serde_json::from_str(&json).unwrap();
//! assert_eq!(back, e);
//! ```

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An event with its metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// Unique id of this event.
    pub id: String,
    /// What kind of event it is, e.g. `order.placed`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// Version of the payload's shape; processors branch on it.
    pub version: u32,
    /// When it happened, milliseconds since the epoch.
    pub occurred_at: i64,
    /// Stable key of the business event (the dedup store's key).
    pub idempotency_key: String,
    /// The event itself.
    pub payload: T,
    /// How many times it was attempted before (0 for a new event).
    #[serde(default)]
    pub attempts: u32,
    /// Trace context (e.g. W3C `traceparent`, `tracestate`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub trace: BTreeMap<String, String>,
}

impl<T> Envelope<T> {
    /// An envelope with no attempts and no trace context.
    pub fn new(
        id: impl Into<String>,
        event_type: impl Into<String>,
        version: u32,
        occurred_at: i64,
        idempotency_key: impl Into<String>,
        payload: T,
    ) -> Self {
        Self {
            id: id.into(),
            event_type: event_type.into(),
            version,
            occurred_at,
            idempotency_key: idempotency_key.into(),
            payload,
            attempts: 0,
            trace: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct V1 {
        order: u64,
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct V2 {
        order: u64,
        #[serde(default)]
        currency: Option<String>,
    }

    #[test]
    fn evolves_in_both_directions() {
        // An old writer, a new reader: the added field takes its default.
        let old = serde_json::to_vec(&Envelope::new("e1", "order.placed", 1, 5, "k1", V1 { order: 7 })).unwrap();
        let read: Envelope<V2> = serde_json::from_slice(&old).unwrap();
        assert_eq!(read.payload, V2 { order: 7, currency: None });
        assert_eq!((read.version, read.attempts), (1, 0));
        // A new writer, an old reader: the unknown field is ignored.
        let mut new = Envelope::new("e2", "order.placed", 2, 6, "k2", V2 { order: 8, currency: Some("EUR".into()) });
        new.trace.insert("traceparent".into(), "00-abc-def-01".into());
        let bytes = serde_json::to_vec(&new).unwrap();
        let read: Envelope<V1> = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(read.payload, V1 { order: 8 });
        assert_eq!(read.trace["traceparent"], "00-abc-def-01");
        assert!(String::from_utf8(bytes).unwrap().contains(r#""type":"order.placed""#));
    }
}
