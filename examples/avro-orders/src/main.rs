//! # avro-orders: typed Avro records with a schema registry
//!
//! Orders arrive as Avro in the Confluent wire format, written by two versions of the order service:
//! version 2 added a `coupon` field with a default. One reader schema decodes both into one Rust
//! type; the processor emits an Avro payment, its schema registered under `avro.payments-value`. A
//! record that is not Avro at all goes to the DLQ as a `decode` failure, bytes untouched, without
//! reaching the processor.
//!
//! The registry is the one at `SCHEMA_REGISTRY_URL`; when that is unset the program starts the
//! project's in-process registry double (no real registry installs here: docs/schema-registry.md).
//! `scripts/demo avro-orders` runs it. See README.md.

use anyhow::Result;
use clap::Parser;
use millrace::codec::Encode;
use millrace::codec::avro::Avro;
use millrace::codec::schema_registry::{SchemaRegistry, SchemaRegistryConfig};
use millrace::typed::{EmitEncoded, Typed, TypedProcessor};
use millrace::{Context, Pipeline, PipelineConfig, ProcessError, Record};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// What the order service wrote first.
const ORDER_V1: &str = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "customer", "type": "string"},
    {"name": "amount_cents", "type": "long"}]}"#;
/// Version 2 added a coupon, with a default: old readers skip it, new readers fill it in.
const ORDER_V2: &str = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "customer", "type": "string"},
    {"name": "amount_cents", "type": "long"}, {"name": "coupon", "type": "string", "default": ""}]}"#;
const PAYMENT: &str = r#"{"type": "record", "name": "Payment", "namespace": "shop", "fields": [
    {"name": "order", "type": "long"}, {"name": "amount_cents", "type": "long"}]}"#;

#[derive(Parser, Debug)]
#[command(
    about = "Typed Avro orders with a schema registry: two schema versions, payments out, a malformed record to the DLQ"
)]
struct Args {
    /// Orders to produce (half with each schema version), plus one malformed record.
    #[arg(long, default_value_t = 1000)]
    orders: u64,
    /// Orders topic (its DLQ is `<topic>.dlq`).
    #[arg(long, env = "AVRO_ORDERS_TOPIC", default_value = "avro.orders")]
    topic: String,
    /// Payments topic.
    #[arg(long, env = "AVRO_PAYMENTS_TOPIC", default_value = "avro.payments")]
    payments_topic: String,
    /// Consumer group.
    #[arg(long, env = "AVRO_ORDERS_GROUP", default_value = "avro-orders")]
    group: String,
}

#[derive(Serialize)]
struct OrderV1 {
    id: i64,
    customer: String,
    amount_cents: i64,
}

#[derive(Serialize, Deserialize)]
struct Order {
    id: i64,
    customer: String,
    amount_cents: i64,
    coupon: String,
}

#[derive(Serialize)]
struct Payment {
    order: i64,
    amount_cents: i64,
}

struct Billing {
    payments: Avro,
    payments_topic: String,
    with_coupon: Arc<AtomicU64>,
}

impl TypedProcessor for Billing {
    type Input = Order;
    async fn process(&self, order: Order, _record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let amount_cents = if order.coupon.is_empty() { order.amount_cents } else { order.amount_cents * 9 / 10 };
        if !order.coupon.is_empty() {
            self.with_coupon.fetch_add(1, Relaxed);
        }
        let payment = Payment { order: order.id, amount_cents };
        ctx.emit_encoded(&self.payments, &self.payments_topic, Some(order.customer.into_bytes()), &payment).await
    }
}

/// Half the orders as version 1 of the order service wrote them, half as version 2 (with a coupon
/// on every other one), then one record that is not Avro.
async fn produce(bootstrap: &str, registry: &SchemaRegistry, args: &Args) -> Result<()> {
    let (v1, v2) = (Avro::new(registry, ORDER_V1)?, Avro::new(registry, ORDER_V2)?);
    let producer: FutureProducer = ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    let mut deliveries = Vec::new();
    for i in 0..args.orders as i64 {
        let (customer, amount_cents) = (format!("customer-{}", i % 20), 100 + i);
        let bytes = if i < args.orders as i64 / 2 {
            v1.encode(&args.topic, &OrderV1 { id: i, customer: customer.clone(), amount_cents }).await?
        } else {
            let coupon = if i % 2 == 0 { "WINTER10".to_owned() } else { String::new() };
            v2.encode(&args.topic, &Order { id: i, customer: customer.clone(), amount_cents, coupon }).await?
        };
        let record = FutureRecord::to(&args.topic).key(&customer).payload(&bytes);
        deliveries.push(producer.send_result(record).map_err(|(e, _)| e)?);
    }
    let malformed =
        FutureRecord::to(&args.topic).key("customer-0").payload("{\"id\": 1, \"note\": \"JSON, not Avro\"}");
    deliveries.push(producer.send_result(malformed).map_err(|(e, _)| e)?);
    for d in deliveries {
        d.await?.map_err(|(e, _)| e)?;
    }
    println!(
        "produced {} orders to `{}` (half with schema v1, half v2) and 1 record that is not Avro",
        args.orders, args.topic
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
    // The double lives as long as this binding: the whole run.
    let (url, _double) = match std::env::var("SCHEMA_REGISTRY_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let double = millrace_registry_double::RegistryDouble::start().await?;
            (double.url(), Some(double))
        }
    };
    println!("brokers: {bootstrap}");
    println!("schema registry: {url}{}", if _double.is_some() { " (the in-process double)" } else { "" });
    let registry = SchemaRegistry::new(SchemaRegistryConfig::new(url))?;
    let config =
        PipelineConfig::new(&bootstrap, &args.group, [&args.topic]).commit_interval(Duration::from_millis(100));
    millrace::create_topics(&config, &[&args.topic, &args.payments_topic], 4).await?;
    produce(&bootstrap, &registry, &args).await?;

    let with_coupon = Arc::new(AtomicU64::new(0));
    let orders = Avro::new(&registry, ORDER_V2)?; // the reader schema: decodes v1 and v2
    let billing = Billing {
        payments: Avro::new(&registry, PAYMENT)?,
        payments_topic: args.payments_topic.clone(),
        with_coupon: with_coupon.clone(),
    };
    let pipeline = Pipeline::new(config, Typed::new(billing, orders))?;
    let (stats, stop) = (pipeline.stats(), pipeline.shutdown_token());
    millrace::shutdown::on_signals(stop.clone());
    let running = tokio::spawn(pipeline.run());
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        let s = stats.snapshot();
        if s.processed + s.dead_lettered > args.orders {
            break;
        }
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => break,
        }
    }
    stop.cancel();
    let summary = running.await??;
    let s = stats.snapshot();
    println!(
        "decoded {} orders into one type ({} with a coupon), {} payments emitted as Avro to `{}`",
        s.processed,
        with_coupon.load(Relaxed),
        s.processed,
        args.payments_topic
    );
    println!("dead-lettered {} (kind decode, bytes untouched) to `{}.dlq`", s.dead_lettered, args.topic);
    println!("failed: {}; drained on stop: {}", summary.failed, summary.drained);
    Ok(())
}
