//! # dlq-replay: break, dead-letter, fix, replay
//!
//! `shipping` is a small label service: for each order it picks a carrier for the order's country
//! and writes a shipping label to `shipping.labels`. Version 1 has no carrier for some countries: it
//! fails those orders as permanent, Millrace dead-letters them to `shipping.orders.dlq` with their
//! bytes and the reason, and the partition keeps flowing. After the fix (`--also-ship-to NZ`), the
//! operator replays the DLQ with `millrace dlq replay` and the fixed version ships them.
//!
//! [`walkthrough.sh`](../walkthrough.sh) is the operator's script, step by step; `scripts/demo
//! dlq-replay` runs it. See README.md.

mod topics;

use anyhow::Result;
use clap::{Parser, Subcommand};
use millrace::{Context, OutputRecord, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(about = "A shipping label service, broken and fixed: the DLQ replay walkthrough")]
struct Args {
    /// Orders topic (its DLQ is `<topic>.dlq`).
    #[arg(long, env = "SHIPPING_TOPIC", default_value = "shipping.orders", global = true)]
    topic: String,
    /// Labels topic.
    #[arg(long, env = "SHIPPING_LABELS_TOPIC", default_value = "shipping.labels", global = true)]
    labels_topic: String,
    /// Consumer group.
    #[arg(long, env = "SHIPPING_GROUP", default_value = "shipping", global = true)]
    group: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Produce sample orders: one in ten ships to New Zealand.
    Produce {
        #[arg(long, default_value_t = 200)]
        orders: u64,
    },
    /// Ship orders until the group has caught up with the topic (as of the start).
    Run {
        /// Countries this version also has a carrier for (the fix).
        #[arg(long = "also-ship-to", value_name = "COUNTRY")]
        also: Vec<String>,
    },
    /// Compare the orders with the labels: each order labelled once?
    Check,
}

#[derive(Serialize, Deserialize)]
struct Order {
    id: String,
    country: String,
}

#[derive(Serialize, Deserialize)]
struct Label {
    order: String,
    carrier: String,
}

struct Shipping {
    carriers: BTreeMap<String, String>,
    labels_topic: String,
}

impl Processor for Shipping {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let order: Order =
            serde_json::from_slice(record.value.as_deref().unwrap_or_default()).map_err(ProcessError::decode)?;
        // A country without a carrier fails the same way on every attempt: permanent, not retried.
        let Some(carrier) = self.carriers.get(&order.country) else {
            return Err(ProcessError::permanent(format!("no carrier for country {}", order.country)));
        };
        let label = serde_json::to_vec(&Label { order: order.id.clone(), carrier: carrier.clone() })
            .map_err(ProcessError::permanent)?;
        ctx.emit(OutputRecord::to(&self.labels_topic).key(order.id).value(label)).await?;
        Ok(())
    }
}

async fn produce(bootstrap: &str, topic: &str, n: u64) -> Result<()> {
    let producer: FutureProducer = ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    let countries = ["DE", "FR", "US", "JP", "BR", "IN", "ES", "IT", "CA"];
    let mut deliveries = Vec::new();
    for i in 0..n {
        let country = if i % 10 == 9 { "NZ" } else { countries[i as usize % countries.len()] };
        let order = Order { id: format!("order-{i}"), country: country.into() };
        let value = serde_json::to_vec(&order)?;
        deliveries
            .push(producer.send_result(FutureRecord::to(topic).key(&order.id).payload(&value)).map_err(|(e, _)| e)?);
    }
    for d in deliveries {
        d.await?.map_err(|(e, _)| e)?;
    }
    println!("produced {n} orders to `{topic}` ({} to NZ)", n / 10);
    Ok(())
}

async fn run(bootstrap: &str, args: &Args, also: &[String]) -> Result<()> {
    let mut carriers: BTreeMap<String, String> = ["DE", "FR", "US", "JP", "BR", "IN", "ES", "IT", "CA"]
        .iter()
        .map(|c| (c.to_string(), format!("post-{c}")))
        .collect();
    carriers.extend(also.iter().map(|c| (c.clone(), format!("post-{c}"))));
    let ends = topics::end_offsets(bootstrap, &args.topic)?;
    let config = PipelineConfig::new(bootstrap, &args.group, [&args.topic]).commit_interval(Duration::from_millis(100));
    let pipeline = Pipeline::new(config, Shipping { carriers, labels_topic: args.labels_topic.clone() })?;
    let (stats, stop) = (pipeline.stats(), pipeline.shutdown_token());
    millrace::shutdown::on_signals(stop.clone());
    let running = tokio::spawn(pipeline.run());
    // Caught up once the group's committed offsets reach the ends read at the start.
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    while !topics::caught_up(bootstrap, &args.group, &args.topic, &ends)? {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => break,
        }
    }
    stop.cancel();
    running.await??;
    let s = stats.snapshot();
    println!("shipped {} orders, dead-lettered {} to `{}.dlq`", s.processed, s.dead_lettered, args.topic);
    Ok(())
}

fn check(bootstrap: &str, args: &Args) -> Result<()> {
    let ids = |topic: &str, field: &str| -> Result<Vec<String>> {
        let mut ids = Vec::new();
        for value in topics::read_values(bootstrap, topic)? {
            let v: serde_json::Value = serde_json::from_slice(&value)?;
            ids.extend(v[field].as_str().map(str::to_owned));
        }
        Ok(ids)
    };
    let orders: BTreeSet<String> = ids(&args.topic, "id")?.into_iter().collect();
    let labels = ids(&args.labels_topic, "order")?;
    let labelled: BTreeSet<&String> = labels.iter().collect();
    let missing = orders.iter().filter(|o| !labelled.contains(o)).count();
    println!(
        "orders: {}, labelled: {}, labelled twice: {}, without a label: {missing}",
        orders.len(),
        labelled.len(),
        labels.len() - labelled.len()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "error,librdkafka=error".into()),
        )
        .init();
    let args = Args::parse();
    let bootstrap = PipelineConfig::bootstrap_from_env();
    let config = PipelineConfig::new(&bootstrap, &args.group, [&args.topic]);
    millrace::create_topics(&config, &[&args.topic, &args.labels_topic], 4).await?;
    match &args.command {
        Command::Produce { orders } => produce(&bootstrap, &args.topic, *orders).await,
        Command::Run { also } => run(&bootstrap, &args, also).await,
        Command::Check => check(&bootstrap, &args),
    }
}
