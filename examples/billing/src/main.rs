//! # billing: charge each order exactly once
//!
//! A consumer group reads orders and charges them through a payment provider. Orders are redelivered
//! after a crash or a rebalance, and the order service resubmits some (a client retried): the dedup
//! store skips every order whose idempotency key was already charged, and the key is passed to the
//! provider too, which absorbs the one repeat the store cannot see (a crash between the charge and
//! the store's write). The pipeline is configured by `billing.toml` (and `MILLRACE_*` variables).
//!
//! `scripts/demo billing` produces 1000 orders and resubmits 100 of them, charges them and prints
//! what it did; `--produce 0` runs it as a service until SIGINT or SIGTERM. See README.md.

mod ledger;

use anyhow::{Context as _, Result};
use clap::Parser;
use ledger::{Charge, Provider};
use millrace::{Context, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(about = "Charge orders exactly once per order: the dedup store and the provider's idempotency key")]
struct Args {
    /// The pipeline's configuration (MILLRACE_* variables override it).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/billing.toml"))]
    config: PathBuf,
    /// The payment provider's ledger: one line per charge.
    #[arg(long, default_value = "/tmp/millrace-billing/ledger.txt")]
    ledger: PathBuf,
    /// Sample orders to produce, then stop once they are handled; 0 runs as a service until a signal.
    #[arg(long, default_value_t = 1000)]
    produce: u64,
    /// Share of the sample orders the order service submits twice, in percent.
    #[arg(long, default_value_t = 10)]
    resubmit_percent: u64,
}

#[derive(Serialize, Deserialize)]
struct Order {
    customer: String,
    amount_cents: u64,
}

/// Charges each order under its idempotency key.
struct Billing {
    provider: Provider,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    charged: AtomicU64,
    already_charged: AtomicU64,
}

impl Processor for Billing {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let value = record.value.as_deref().unwrap_or_default();
        let order: Order = serde_json::from_slice(value).map_err(ProcessError::permanent)?;
        // With the dedup store on, every record has one: the same on each attempt and redelivery.
        let key = ctx.idempotency_key().ok_or_else(|| ProcessError::permanent("no idempotency key"))?;
        let key = String::from_utf8_lossy(key).replace(' ', "_");
        // Stand-in for the provider's network round trip.
        tokio::time::sleep(Duration::from_millis(1)).await;
        match self.provider.charge(&key, &order.customer, order.amount_cents).map_err(ProcessError::transient)? {
            Charge::Charged => self.counts.charged.fetch_add(1, Relaxed),
            Charge::AlreadyCharged => self.counts.already_charged.fetch_add(1, Relaxed),
        };
        Ok(())
    }
}

/// Produces `n` orders keyed by customer, each with an `idempotency-key` header (its order id), then
/// `resubmit` of them again, as an order service retrying a submit does. Returns how many it wrote.
async fn produce_orders(bootstrap: &str, topic: &str, n: u64, resubmit: u64) -> Result<u64> {
    let producer: FutureProducer =
        ClientConfig::new().set("bootstrap.servers", bootstrap).set("linger.ms", "10").create()?;
    let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
    let mut deliveries = Vec::new();
    for i in (0..n).chain((0..n).step_by((n / resubmit.max(1)).max(1) as usize).take(resubmit as usize)) {
        let order = Order { customer: format!("customer-{}", i % 50), amount_cents: 100 + (i * 37) % 10_000 };
        let id = format!("order-{run}-{i}");
        let value = serde_json::to_vec(&order)?;
        let headers = OwnedHeaders::new().insert(Header { key: "idempotency-key", value: Some(id.as_bytes()) });
        let record = FutureRecord::to(topic).key(&order.customer).payload(&value).headers(headers);
        deliveries.push(producer.send_result(record).map_err(|(e, _)| e)?);
    }
    let written = deliveries.len() as u64;
    for d in deliveries {
        d.await?.map_err(|(e, _)| e)?;
    }
    Ok(written)
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
    let dedup_dir = config.dedup.as_ref().map(|d| d.dir.display().to_string()).unwrap_or_else(|| "off".into());
    println!("brokers: {}", config.bootstrap_servers);
    println!("config: {} (group `{}`, dedup store at {dedup_dir})", args.config.display(), config.group_id);
    let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
    millrace::create_topics(&config, &topics, 4).await?;

    let mut expected = None;
    if args.produce > 0 {
        let resubmit = args.produce * args.resubmit_percent / 100;
        let topic = &config.topics[0];
        let written = produce_orders(&config.bootstrap_servers, topic, args.produce, resubmit).await?;
        println!("produced {} orders to `{topic}`, {resubmit} of them submitted twice", args.produce);
        expected = Some(written);
    }

    let counts = Arc::new(Counts::default());
    let provider = Provider::open(&args.ledger).with_context(|| format!("opening {}", args.ledger.display()))?;
    let billing = Billing { provider, counts: counts.clone() };
    let pipeline = Pipeline::new(config, billing)?;
    let (stats, stop) = (pipeline.stats(), pipeline.shutdown_token());
    millrace::shutdown::on_signals(stop.clone());
    let run = tokio::spawn(pipeline.run());
    if let Some(expected) = expected {
        // Every record written was charged, found charged by the provider, or skipped by the store.
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        while !stop.is_cancelled() {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => break,
            }
            let s = stats.snapshot();
            if s.processed + s.dedup_hits >= expected {
                break;
            }
        }
        stop.cancel();
    }
    let summary = run.await??;
    let skipped = stats.snapshot().dedup_hits;
    println!(
        "charged {} orders, {} repeats absorbed by the provider's idempotency key, {skipped} skipped by the dedup store",
        counts.charged.load(Relaxed),
        counts.already_charged.load(Relaxed),
    );
    println!("ledger: {}", args.ledger.display());
    println!("failed: {}; drained on stop: {}", summary.failed, summary.drained);
    Ok(())
}
