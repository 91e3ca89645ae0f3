//! An outbox row as read by the relay, and the Kafka record it becomes.

use rdkafka::message::{Header, OwnedHeaders};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The header that carries the row's id, which Millrace's dedup store keys on.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// One row of the outbox table.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub id: i64,
    pub key: String,
    pub topic: String,
    /// `(name, value)`, from the `headers` object in its order.
    pub headers: Vec<(String, String)>,
    pub payload: Option<Vec<u8>>,
    pub created_at: SystemTime,
}

/// The query that reads the oldest rows first; `$1` is the batch size.
pub(crate) fn select(table: &str) -> String {
    format!("SELECT id, aggregate_key, topic, headers::text, payload, created_at FROM {table} ORDER BY id LIMIT $1")
}

/// The statement that removes acknowledged rows; `$1` is their ids.
pub(crate) fn delete(table: &str) -> String {
    format!("DELETE FROM {table} WHERE id = ANY($1)")
}

impl Row {
    pub fn from_sql(row: &tokio_postgres::Row) -> Result<Self, tokio_postgres::Error> {
        let headers: String = row.try_get(3)?;
        Ok(Self {
            id: row.try_get(0)?,
            key: row.try_get(1)?,
            topic: row.try_get(2)?,
            headers: parse_headers(&headers),
            payload: row.try_get(4)?,
            created_at: row.try_get(5)?,
        })
    }

    /// The record's headers: the row's, then `idempotency-key` (replacing one the row set).
    pub fn kafka_headers(&self, prefix: &str) -> OwnedHeaders {
        let mut out = OwnedHeaders::new_with_capacity(self.headers.len() + 1);
        for (name, value) in self.headers.iter().filter(|(n, _)| n != IDEMPOTENCY_KEY_HEADER) {
            out = out.insert(Header { key: name, value: Some(value.as_bytes()) });
        }
        let key = format!("{prefix}{}", self.id);
        out.insert(Header { key: IDEMPOTENCY_KEY_HEADER, value: Some(key.as_bytes()) })
    }

    /// Milliseconds since the epoch of `created_at` (the record's timestamp).
    pub fn timestamp_ms(&self) -> i64 {
        self.created_at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
    }

    /// How long ago the row was created (zero if the clocks disagree).
    pub fn age(&self) -> Duration {
        SystemTime::now().duration_since(self.created_at).unwrap_or_default()
    }
}

/// The `headers` column (a JSON object): string values as they are, `null` skipped, other values as
/// their JSON text (so a number header is not lost).
fn parse_headers(text: &str) -> Vec<(String, String)> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(map)) => map
            .into_iter()
            .filter_map(|(k, v)| match v {
                serde_json::Value::Null => None,
                serde_json::Value::String(s) => Some((k, s)),
                other => Some((k, other.to_string())),
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::Headers;

    #[test]
    fn headers_keep_their_values_and_the_id_wins() {
        let row = Row {
            id: 42,
            key: "k".into(),
            topic: "t".into(),
            headers: parse_headers(r#"{"a": "x", "n": 7, "z": null, "idempotency-key": "forged"}"#),
            payload: None,
            created_at: UNIX_EPOCH + Duration::from_millis(1500),
        };
        let h = row.kafka_headers("orders/");
        let got: Vec<(String, String)> = h
            .iter()
            .map(|h| (h.key.to_owned(), String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned()))
            .collect();
        let want = [("a", "x"), ("n", "7"), ("idempotency-key", "orders/42")];
        assert_eq!(got, want.map(|(a, b)| (a.to_owned(), b.to_owned())));
        assert_eq!(row.timestamp_ms(), 1500);
    }
}
