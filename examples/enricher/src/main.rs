//! # enricher: exactly-once read-process-write
//!
//! Reads orders, adds the customer's tier and discount, and writes the enriched order to another
//! topic, in Kafka transactions: each transaction commits the outputs together with the input
//! offsets they came from, or neither. A crash, a kill or a rebalance aborts the open transaction,
//! and its inputs are processed again into a new one, so a `read_committed` consumer of the output
//! sees every order exactly once. This program reads its output back that way and says so.
//!
//! `scripts/demo enricher` produces 1000 orders, enriches them and checks the output; `--produce 0`
//! runs it as a service until SIGINT or SIGTERM. See README.md.

mod verify;

use anyhow::{Result, bail};
use clap::Parser;
use millrace::{Context, OutputRecord, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(about = "Enrich orders exactly once: Kafka transactions, read back with read_committed")]
struct Args {
    /// The pipeline's configuration (MILLRACE_* variables override it).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/enricher.toml"))]
    config: PathBuf,
    /// Where the enriched orders go.
    #[arg(long, env = "ENRICHER_OUTPUT_TOPIC", default_value = "enricher.orders.enriched")]
    output_topic: String,
    /// Sample orders to produce, then stop once they are enriched and check the output; 0 runs as
    /// a service until a signal.
    #[arg(long, default_value_t = 1000)]
    produce: u64,
    /// The prefix of the produced orders' ids (default: `run-<milliseconds since the epoch>`);
    /// `--check` counts the orders with this prefix.
    #[arg(long)]
    run_id: Option<String>,
    /// Only produce this many orders to the input topic, then exit (no pipeline): feeds instances
    /// that run as a service, as `scripts/docker test` does.
    #[arg(long, value_name = "N", conflicts_with = "check")]
    produce_only: Option<u64>,
    /// Only read the output back with read_committed until it holds `N` distinct orders of
    /// `--run-id`, then exit: 0 when each is there exactly once, 1 when one is missing after
    /// `--check-timeout-secs` or repeated.
    #[arg(long, value_name = "N", requires = "run_id")]
    check: Option<u64>,
    /// How long `--check` waits for the last orders to be committed.
    #[arg(long, default_value_t = 120)]
    check_timeout_secs: u64,
    /// A pause per order, standing in for the customer lookup of a real enricher (so that a test
    /// can stop an instance mid-stream).
    #[arg(long, env = "ENRICHER_LOOKUP_DELAY_MS", default_value_t = 0)]
    lookup_delay_ms: u64,
}

#[derive(Serialize, Deserialize)]
struct Order {
    id: String,
    customer: String,
    amount_cents: u64,
}

#[derive(Serialize, Deserialize)]
struct Enriched {
    id: String,
    customer: String,
    amount_cents: u64,
    tier: &'static str,
    discount_cents: u64,
}

/// The customer's tier (a stand-in for a lookup table loaded at start).
fn tier(customer: &str) -> (&'static str, u64) {
    match customer.bytes().map(u64::from).sum::<u64>() % 3 {
        0 => ("gold", 10),
        1 => ("silver", 5),
        _ => ("standard", 0),
    }
}

struct Enricher {
    output_topic: String,
    lookup_delay: Duration,
}

impl Processor for Enricher {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let order: Order =
            serde_json::from_slice(record.value.as_deref().unwrap_or_default()).map_err(ProcessError::permanent)?;
        if !self.lookup_delay.is_zero() {
            tokio::time::sleep(self.lookup_delay).await;
        }
        let (tier, percent) = tier(&order.customer);
        let discount_cents = order.amount_cents * percent / 100;
        let key = order.customer.clone();
        let enriched =
            Enriched { id: order.id, customer: order.customer, amount_cents: order.amount_cents, tier, discount_cents };
        let value = serde_json::to_vec(&enriched).map_err(ProcessError::permanent)?;
        // Produced in the transaction that commits this record's offset.
        ctx.emit(OutputRecord::to(&self.output_topic).key(key).value(value)).await?;
        Ok(())
    }
}

/// Produces `n` orders whose ids start with `run`, keyed by customer.
async fn produce_orders(bootstrap: &str, topic: &str, run: &str, n: u64) -> Result<()> {
    let producer: FutureProducer =
        ClientConfig::new().set("bootstrap.servers", bootstrap).set("linger.ms", "10").create()?;
    let mut deliveries = Vec::new();
    for i in 0..n {
        let order =
            Order { id: format!("{run}-{i}"), customer: format!("customer-{}", i % 50), amount_cents: 100 + i % 900 };
        let value = serde_json::to_vec(&order)?;
        deliveries.push(
            producer.send_result(FutureRecord::to(topic).key(&order.customer).payload(&value)).map_err(|(e, _)| e)?,
        );
    }
    for d in deliveries {
        d.await?.map_err(|(e, _)| e)?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn,librdkafka=error".into()),
        )
        .init();
    let args = Args::parse();
    let config = PipelineConfig::load(Some(&args.config))?;
    let bootstrap = config.bootstrap_servers.clone();
    println!("brokers: {bootstrap}");
    println!("config: {} (group `{}`, exactly-once)", args.config.display(), config.group_id);
    let mut topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
    topics.push(&args.output_topic);
    millrace::create_topics(&config, &topics, 4).await?;

    let run = match &args.run_id {
        Some(run) => run.clone(),
        None => format!("run-{}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis()),
    };
    if let Some(n) = args.produce_only {
        produce_orders(&bootstrap, &config.topics[0], &run, n).await?;
        println!("produced {n} orders of run `{run}` to `{}`", config.topics[0]);
        return Ok(());
    }
    if let Some(n) = args.check {
        let timeout = Duration::from_secs(args.check_timeout_secs);
        let (distinct, repeated) =
            verify::until_committed(&bootstrap, &args.output_topic, &format!("{run}-"), n, timeout)?;
        println!(
            "read back with isolation.level=read_committed: {distinct} of {n} orders of run `{run}`, {repeated} repeated"
        );
        if distinct != n || repeated > 0 {
            bail!("run `{run}`: {distinct} of {n} orders committed, {repeated} repeated");
        }
        return Ok(());
    }
    if args.produce > 0 {
        produce_orders(&bootstrap, &config.topics[0], &run, args.produce).await?;
        println!("produced {} orders to `{}`", args.produce, config.topics[0]);
    }

    let pipeline = Pipeline::new(
        config,
        Enricher { output_topic: args.output_topic.clone(), lookup_delay: Duration::from_millis(args.lookup_delay_ms) },
    )?;
    let (stats, stop) = (pipeline.stats(), pipeline.shutdown_token());
    millrace::shutdown::on_signals(stop.clone());
    let running = tokio::spawn(pipeline.run());
    if args.produce > 0 {
        // Done once this run's orders are processed; stopping commits the last transaction.
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            let s = stats.snapshot();
            if s.processed + s.dead_lettered >= args.produce {
                break;
            }
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => break,
            }
        }
        stop.cancel();
    }
    let summary = running.await??;
    println!("enriched {} orders; failed: {}; drained on stop: {}", summary.processed, summary.failed, summary.drained);
    if args.produce > 0 {
        let (distinct, repeated) = verify::read_committed(&bootstrap, &args.output_topic, &format!("{run}-"))?;
        println!(
            "read back with isolation.level=read_committed: {distinct} of {} orders of this run, {repeated} repeated",
            args.produce
        );
    }
    Ok(())
}
