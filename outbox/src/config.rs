//! The relay's settings.

use crate::Error;
use std::time::Duration;

/// How a relay reaches PostgreSQL and Kafka, and how it batches.
///
/// ```
/// let config = millrace_outbox::RelayConfig::new("postgres://app@127.0.0.1/app", "127.0.0.1:9092");
/// assert_eq!(config.table, "millrace_outbox");
/// assert_eq!(config.transactional_id(), "millrace-outbox-millrace_outbox");
/// ```
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The database (a libpq URL or key=value string; its password is never logged).
    pub postgres_url: String,
    /// Kafka bootstrap servers.
    pub bootstrap_servers: String,
    /// More Kafka client properties (a secured cluster's `security.protocol`, `sasl.*`, `ssl.*`).
    pub kafka_properties: Vec<(String, String)>,
    /// The outbox table, optionally schema-qualified (`[a-z_][a-z0-9_]*`, one dot at most).
    pub table: String,
    /// Rows published per Kafka transaction, at most.
    pub batch_size: usize,
    /// How long the relay waits for a notification before it looks at the table anyway (the bound
    /// on latency if a notification is missed), and how often a standby relay tries to take over.
    pub poll_interval: Duration,
    /// The Kafka transactional id; every relay of one outbox shares it, so a relay that takes over
    /// fences one that lost its database session but still runs. Default
    /// `millrace-outbox-<table>`.
    pub transactional_id: Option<String>,
    /// Put before the row id in the `idempotency-key` header (set it when several outbox tables feed
    /// one topic, so their ids cannot collide). Default empty: the header is the id in decimal.
    pub idempotency_key_prefix: String,
    /// Longest wait between reconnection attempts (backoff doubles from 100 ms, with full jitter).
    pub max_backoff: Duration,
}

impl RelayConfig {
    /// The defaults: table `millrace_outbox`, batches of 500 rows, a 1 s poll interval.
    pub fn new(postgres_url: impl Into<String>, bootstrap_servers: impl Into<String>) -> Self {
        Self {
            postgres_url: postgres_url.into(),
            bootstrap_servers: bootstrap_servers.into(),
            kafka_properties: Vec::new(),
            table: "millrace_outbox".into(),
            batch_size: 500,
            poll_interval: Duration::from_secs(1),
            transactional_id: None,
            idempotency_key_prefix: String::new(),
            max_backoff: Duration::from_secs(10),
        }
    }

    /// The Kafka transactional id in use.
    pub fn transactional_id(&self) -> String {
        self.transactional_id.clone().unwrap_or_else(|| format!("millrace-outbox-{}", self.table))
    }

    /// The advisory lock that elects the active relay: derived from the table name (FNV-1a), so
    /// relays of different outboxes in one database do not block each other.
    pub fn lock_key(&self) -> i64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in format!("millrace-outbox:{}", self.table).bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        h as i64
    }

    /// The `LISTEN` channel the table's trigger notifies.
    pub fn channel(&self) -> String {
        format!("{}_inserted", self.table.replace('.', "_"))
    }

    /// Checks every setting, naming the first bad one.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |field, reason: &str| Err(Error::Config { field, reason: reason.into() });
        if self.postgres_url.trim().is_empty() {
            return bad("postgres_url", "empty");
        }
        if let Err(e) = self.postgres_url.parse::<tokio_postgres::Config>() {
            return Err(Error::Config { field: "postgres_url", reason: e.to_string() });
        }
        if self.bootstrap_servers.trim().is_empty() {
            return bad("bootstrap_servers", "empty");
        }
        if !valid_table(&self.table) {
            return bad("table", "want a lower-case SQL identifier ([a-z_][a-z0-9_]*), optionally schema.table");
        }
        if self.batch_size == 0 || self.batch_size > 100_000 {
            return bad("batch_size", "want 1..=100000");
        }
        if self.poll_interval.is_zero() {
            return bad("poll_interval", "want more than 0");
        }
        if self.transactional_id.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return bad("transactional_id", "empty");
        }
        if let Some((name, _)) = self.kafka_properties.iter().find(|(k, _)| k == "transactional.id") {
            return Err(Error::Config {
                field: "kafka_properties",
                reason: format!("`{name}` is set by transactional_id"),
            });
        }
        Ok(())
    }
}

fn valid_table(table: &str) -> bool {
    let ident = |s: &str| {
        let mut chars = s.chars();
        chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && s.len() <= 50
    };
    let parts: Vec<&str> = table.split('.').collect();
    parts.len() <= 2 && parts.iter().all(|p| ident(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_named() {
        let ok = RelayConfig::new("postgres://u@127.0.0.1/db", "127.0.0.1:9092");
        assert!(ok.validate().is_ok());
        let field = |c: RelayConfig| match c.validate() {
            Err(Error::Config { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(RelayConfig { table: "Orders; drop".into(), ..ok.clone() }), "table");
        assert_eq!(field(RelayConfig { table: "a.b.c".into(), ..ok.clone() }), "table");
        assert_eq!(field(RelayConfig { batch_size: 0, ..ok.clone() }), "batch_size");
        assert_eq!(field(RelayConfig { postgres_url: "postgres://[x".into(), ..ok.clone() }), "postgres_url");
        assert_eq!(field(RelayConfig { bootstrap_servers: " ".into(), ..ok.clone() }), "bootstrap_servers");
        assert!(RelayConfig { table: "app.outbox_2".into(), ..ok }.validate().is_ok());
    }

    #[test]
    fn the_lock_and_channel_follow_the_table() {
        let a = RelayConfig::new("postgres://u@h/db", "b");
        let b = RelayConfig { table: "app.outbox".into(), ..a.clone() };
        assert_ne!(a.lock_key(), b.lock_key());
        assert_eq!(b.channel(), "app_outbox_inserted");
    }
}
