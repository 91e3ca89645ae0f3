//! # Millrace
//!
//! Effectively-once Kafka stream processing: per-key ordered pipelines that commit an offset only
//! after the record's effects are done.
//!
//! ## Module map: the path of one record, top to bottom
//! - [`pipeline`]: builds the clients and starts the poll thread; `poll` (internal): the poll
//!   thread's loop polls a record and hands it to its partition, throttles at the bounds, commits;
//!   `shared` (internal): what the poll thread and the partition tasks share.
//! - `partition` (internal): one task per owned partition; tracks offsets and routes the record to its
//!   key lane, running lanes concurrently.
//! - `layer` (internal): the per-record concerns, one module each, in the order written once in
//!   `layer/mod.rs`: circuit breaker, rejected outputs (exactly-once), dedup, the attempt loop
//!   around the [`Processor`] under the [`retry`] policy, and the DLQ.
//! - [`context`]: what the processor sees; emitted outputs must be acknowledged before completion.
//! - [`state`]: what a partition's commit rests on: [`state::offsets`], the completed prefix of
//!   each partition (what gets committed); `state::pending` and `state::assignments` (internal).
//! - `commit` (internal): the one owner of every commit (periodic, revoke, shutdown, lost
//!   partitions), as plain offsets (at-least-once) or transactions (exactly-once), chosen once.
//! - `rebalance` (internal): assign, revoke (drain, commit, release) and lost partitions;
//!   `state::assignments`: the partitions owned now.
//! - `state::pending` and `transaction` (internal): exactly-once mode; completed records' outputs wait by
//!   offset and commit with the input offsets in one Kafka transaction per commit interval.
//! - `rejected` (internal): exactly-once mode; a record whose output the broker rejects (unknown
//!   topic, too large, not authorised) runs again with its outputs alone, then goes to the DLQ in
//!   the transaction that commits its offset, instead of aborting every transaction forever;
//!   `kafka::output_topics` keeps outputs to a missing topic out of transactions altogether.
//! - `cluster` (internal): start-up waits for the brokers (bounded by `startup_timeout`) and checks
//!   that the input topics exist; a topic that goes missing later is reported.
//! - `watchdog` (internal): reads librdkafka's statistics on the poll thread and reports a partition
//!   that cannot make progress (`stall_timeout`) or a cluster that cannot be reached.
//! - `kafka` (internal): below the record's path, everything that talks to librdkafka: client
//!   settings, its logs and errors, producing an output and awaiting its acknowledgement, the
//!   transactional producer (replaced when a fence or a broker outage leaves it unusable), and the
//!   topics the pipeline creates on its own (DLQ, dedup changelog).
//! - [`dedup`] with [`dedup::store`], `dedup::runtime` and `dedup::changelog` (internal): idempotency keys,
//!   the RocksDB store, its run-time state, and its changelog topic (written, and restored on
//!   assignment).
//! - `telemetry` (internal): every happening as a typed event that logs, counts and records a
//!   metric in one place; the metrics (through the `metrics` facade), the per-partition lag and
//!   head-of-line gauges, the health probes and the HTTP listener ([`PipelineConfig::http`]).
//! - [`trace`]: W3C trace context from the input's headers to every output, and a `tracing` span
//!   per attempt (target `millrace::record`, debug level).
//! - [`config`], [`error`], [`record`], [`stats`], [`shutdown`], `clock`: the supporting pieces.
//! - [`typed`] and [`codec`]: typed processors decode the value before the processor sees it;
//!   [`codec::avro`] with a [`codec::schema_registry`] is the codec for Avro in the Confluent wire format.
//!
//! ## Guarantees
//! At-least-once with commit-after-effect (I1, I2), per-key order (I3), bounded memory (I4) and
//! fencing of revoked work (I5); exactly-once results for Kafka-to-Kafka pipelines in
//! [`Delivery::ExactlyOnce`]; see [`guarantees`] for what each promise means and which test checks it.
//!
//! ```no_run
//! use millrace::{Context, Pipeline, PipelineConfig, ProcessError, Processor, Record};
//!
//! struct Charge;
//! impl Processor for Charge {
//!     async fn process(&self, record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
//!         let order = record.value_str().ok_or_else(|| ProcessError::permanent("not UTF-8"))?;
//!         println!("charging {order}");
//!         Ok(())
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), millrace::Error> {
//!     let config = PipelineConfig::new(PipelineConfig::bootstrap_from_env(), "billing", ["orders"]);
//!     Pipeline::new(config, Charge)?.run_until_signal().await?;
//!     Ok(())
//! }
//! ```

mod blocking;
mod breaker;
mod clock;
mod cluster;
pub mod codec;
mod commit;
pub mod config;
pub mod context;
pub mod dedup;
pub mod dlq;
pub mod envelope;
pub mod error;
mod histogram;
mod limit;
#[cfg(feature = "otel")]
pub mod otel;
pub mod guarantees {
    #![doc = include_str!("../../docs/guarantees.md")]
}
mod kafka;
mod layer;
pub mod park;
mod partition;
pub mod pipeline;
mod poll;
pub mod processor;
mod rebalance;
pub mod record;
mod rejected;
pub mod retry;
mod shared;
pub mod shutdown;
pub mod state;
pub mod stats;
mod telemetry;
pub mod topics;
pub mod trace;
mod transaction;
pub mod typed;
mod watchdog;

pub use config::{
    Bounds, CircuitBreakerConfig, Delivery, DlqConfig, ExactlyOnce, PipelineConfig, ProcessingOrder, RateLimit,
};
pub use context::{CancelReason, Context};
pub use dedup::{DedupConfig, DedupFallback};
pub use error::{ConfigError, EmitError, Error, FailureKind, ProcessError, ResultExt};
pub use kafka::produce::delivery_offset;
pub use pipeline::{Pipeline, RunSummary};
pub use processor::Processor;
pub use record::{OutputRecord, Record};
pub use retry::RetryPolicy;
pub use stats::{Stats, StatsSnapshot};
pub use topics::create_topics;
