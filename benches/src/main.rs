//! `millrace-bench`: throughput benchmarks of Millrace against a raw rdkafka baseline.
//!
//! # Method
//!
//! The machines this runs on (developers' and CI's) are small and shared, so absolute numbers drift
//! from minute to minute. Every benchmark therefore measures Millrace and its baseline **in one
//! process, against the same broker and the same pre-loaded topic, interleaved** (A B A B …), and
//! reports the ratio of the medians: slow drift hits both sides alike and cancels out of the ratio.
//!
//! Each run uses a fresh consumer group, so it reads the whole topic from the beginning; the clock
//! starts before the consumer joins its group, so group join and the first fetch are part of the
//! measurement for both sides (the "steady" column leaves them out). CPU time is the whole
//! process's (`getrusage(RUSAGE_SELF)`, user + system, all threads, librdkafka's included) over the
//! same interval, reported per million records: on a saturated machine it is the better measure of
//! cost, since wall-clock throughput also depends on what else is running.
//!
//! # Benchmarks
//! - `core`: consume-and-acknowledge throughput with a no-op processor; see [`core_bench`].
//! - `dedup`: the dedup store's cost (dedup on against off, with 0% and 10% duplicate idempotency
//!   keys) and the rate at which a partition's keys are restored from the changelog; see
//!   [`dedup_bench`].
//! - `slow`: a processor sleeping 0-5 ms on one partition, in partition, key (1 to 10,000 keys) and
//!   unordered order with 100 permits, against the ideal that the concurrency bound allows; see
//!   [`slow_bench`].
//! - `memory`: the peak resident memory of a process draining a 5,000,000-record backlog with
//!   default bounds, measured in a child process; see [`memory_bench`].
//! - `codec`: decode+encode per second of the JSON and Avro codecs on ~1 KB records, in process, no
//!   broker; see [`codec_bench`].
//!
//! - `compare`: the end-to-end workloads of the benchmark suite (raw rdkafka drain, pipe and
//!   transactional pipe; Millrace at-least-once, with dedup, with poison records, exactly-once; Kafka
//!   Streams) with the ratios that have targets; see [`compare`].
//! - `latency`: end-to-end latency of P0, F_alos, Pt(100 ms) and F_eos(100 ms) at a fixed offered
//!   load (half of P0's throughput by default); see [`latency_bench`].
//! - `report`: writes `BENCHMARKS.md` and its chart from the `RESULT` lines of `compare`, `slow` and
//!   `memory` (what `scripts/bench` runs); see [`report`].
//!
//! `slow` and `memory` have no baseline: `slow` compares its configurations (run round-robin, the
//! same way) with an ideal computed from the sleeps it recorded, `memory` reports an absolute peak.
//!
//! Run with `cargo run -p millrace-benches -- core` (or `dedup`, `slow`, `memory`; the `dev` profile
//! is optimised); `--quick` is a smoke run small enough for CI. The brokers are taken from
//! `KAFKA_BOOTSTRAP_SERVERS` (default `127.0.0.1:9092`); set `RUST_LOG` to see the clients' logs.

mod codec_bench;
/// Every benchmark (both sides of each ratio) runs on mimalloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod compare;
mod core_bench;
mod dedup_bench;
mod kafka;
mod latency_bench;
mod measure;
mod memory_bench;
mod outbox_bench;
mod report;
mod slow_bench;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// Throughput benchmarks of Millrace against a raw rdkafka baseline, run interleaved in one process.
#[derive(Debug, Parser)]
#[command(name = "millrace-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Consume-and-acknowledge throughput with a no-op processor: Millrace (Key ordering, default
    /// bounds) against a raw rdkafka `BaseConsumer` storing each offset.
    Core(core_bench::CoreArgs),
    /// The dedup store's cost: Millrace (Key ordering, no-op processor) with dedup on against off, on
    /// topics with 0% and 10% duplicate idempotency keys, and the restore rate from the changelog.
    Dedup(dedup_bench::DedupArgs),
    /// A processor sleeping 0-5 ms on one partition, in partition, key and unordered order with
    /// max_concurrency 100: throughput against the ideal (sum of the sleeps / 100).
    Slow(slow_bench::SlowArgs),
    /// Peak resident memory of a pipeline (default bounds, no-op processor) draining a large backlog,
    /// run in a child process.
    Memory(memory_bench::MemoryArgs),
    /// Millrace against the raw rdkafka limit and Kafka Streams, end to end: C0, P0, Pt(i), F_alos,
    /// F_eos(i), F_dedup, F_dlq and Kafka Streams (at_least_once, exactly_once_v2), in interleaved
    /// rounds, with the ratios that have targets.
    Compare(compare::CompareArgs),
    /// Writes BENCHMARKS.md and its PNG chart from the logs of `compare`, `slow` and `memory` (what
    /// `scripts/bench` runs and saves).
    Report(report::ReportArgs),
    /// Decode+encode throughput of the JSON and Avro codecs on ~1 KB records, in process (Avro schema
    /// cached; registry from SCHEMA_REGISTRY_URL or the in-process test double).
    Codec(codec_bench::CodecArgs),
    /// The outbox relay's latency: rows committed to PostgreSQL at a fixed rate, each timed from its
    /// commit to a read_committed consumer receiving it (needs MILLRACE_POSTGRES_URL).
    Outbox(outbox_bench::OutboxArgs),
    /// End-to-end latency (input hand-off to the output visible to its reader) at a fixed offered
    /// load, half of P0's throughput by default: P0, F_alos, Pt(100 ms) and F_eos(100 ms).
    Latency(latency_bench::LatencyArgs),
    /// The child process of `memory` (internal).
    #[command(hide = true)]
    MemoryChild(memory_bench::MemoryChildArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn,millrace::dead_letter=error")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Core(args) => core_bench::run(args).await,
        Command::Dedup(args) => dedup_bench::run(args).await,
        Command::Slow(args) => slow_bench::run(args).await,
        Command::Memory(args) => memory_bench::run(args).await,
        Command::Compare(args) => compare::run(args).await,
        Command::Report(args) => report::run(args),
        Command::Codec(args) => codec_bench::run(args).await,
        Command::Outbox(args) => outbox_bench::run(args).await,
        Command::Latency(args) => latency_bench::run(args).await,
        Command::MemoryChild(args) => memory_bench::run_child(args).await,
    }
}
