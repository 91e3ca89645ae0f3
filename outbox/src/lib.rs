//! # millrace-outbox: events that start in a database reach Kafka when the database commits
//!
//! A service that changes its database and must tell others about it writes the event as a row of
//! an *outbox table* in the same database transaction as the change (see [`schema`]); this relay
//! publishes committed rows to Kafka and deletes them once the broker has acknowledged them. No
//! event is lost (a row leaves the table only after its record is committed to Kafka), none is
//! invented (a rolled-back transaction's row was never visible), and the service never dual-writes.
//!
//! What it promises:
//! - **At least once**, with the row id as the `idempotency-key` header: a Millrace consumer with
//!   the dedup store performs each event's effect once. The one duplicate is a batch published
//!   again because the relay stopped (or lost the database) after the Kafka commit and before the
//!   rows' delete; it is published again in the same order.
//! - **Per-key order**: rows with one `aggregate_key` go to one partition, in id order, by one
//!   producer. Id order is commit order for a key when the service writes a key's rows from
//!   transactions that serialise on that key (e.g. they lock or update the aggregate's row first, as
//!   any service changing one aggregate does); rows of different keys may commit out of id order,
//!   which is harmless.
//! - **Batches are atomic**: each is one Kafka transaction, so a `read_committed` reader (Millrace's
//!   default) never sees part of a batch, nor a batch the relay was killed in the middle of.
//! - **Several relays at once**: a PostgreSQL advisory lock makes one active; the others take over
//!   within `poll_interval` after its database session ends (a crash closes it). All share one
//!   Kafka transactional id, so a relay that lost its session but still runs is fenced.
//! - **Latency**: a trigger notifies the relay when rows are committed (`LISTEN`/`NOTIFY`); without a
//!   notification it looks anyway every `poll_interval`.
//!
//! ```no_run
//! # async fn run() -> Result<(), millrace_outbox::Error> {
//! use millrace_outbox::{Relay, RelayConfig, schema};
//! let config = RelayConfig::new("postgres://app@127.0.0.1/app", "127.0.0.1:9092");
//! schema::install(&config).await?; // CREATE TABLE IF NOT EXISTS millrace_outbox …
//! let stop = tokio_util::sync::CancellationToken::new();
//! Relay::new(config)?.run(stop).await
//! # }
//! ```
//!
//! A service writes its outbox row in its own transaction:
//!
//! ```sql
//! BEGIN;
//! UPDATE orders SET status = 'paid' WHERE id = 42;
//! INSERT INTO millrace_outbox (aggregate_key, topic, headers, payload)
//!     VALUES ('order-42', 'order-events', '{"type": "paid"}', '\x7b7d');
//! COMMIT;
//! ```

mod config;
mod error;
mod relay;
mod row;
pub mod schema;
mod stats;

pub use config::RelayConfig;
pub use error::Error;
pub use relay::Relay;
pub use row::IDEMPOTENCY_KEY_HEADER;
pub use stats::RelayStats;
