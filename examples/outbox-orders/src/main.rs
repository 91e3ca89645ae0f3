//! # outbox-orders: an order service that never dual-writes
//!
//! The order service places and pays orders in PostgreSQL. Each change and the event that tells
//! others about it are written in **one database transaction**: the `orders` row and a row of the
//! outbox table `orders_outbox`. The relay (millrace-outbox) publishes committed outbox rows to the
//! topic `order-events`, keyed by order, in one Kafka transaction per batch; a Millrace consumer
//! with the dedup store ships each paid order exactly once (the row id is the event's
//! idempotency key). Every tenth payment is declined: its transaction rolls back, so neither the
//! status change nor its event exists.
//!
//! `scripts/demo outbox-orders` starts PostgreSQL (scripts/postgres) and a broker, and runs this
//! with 1000 orders; it checks and prints what happened, exiting non-zero if an event was lost,
//! invented, seen out of order or acted on twice.

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use millrace::{Context, DedupConfig, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_outbox::{Relay, RelayConfig, schema};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_postgres::{Client, NoTls};

#[derive(Parser, Debug)]
#[command(about = "Orders and their events in one PostgreSQL transaction; the outbox relay publishes them")]
struct Args {
    /// The database (libpq URL).
    #[arg(long, env = "MILLRACE_POSTGRES_URL", hide_env_values = true)]
    postgres: String,
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BOOTSTRAP_SERVERS", default_value = "127.0.0.1:9092")]
    bootstrap: String,
    /// Orders to place.
    #[arg(long, default_value_t = 1000)]
    orders: u64,
    /// The events topic (created with 4 partitions if missing).
    #[arg(long, default_value = "order-events")]
    topic: String,
    /// Where the shipping consumer keeps its dedup store.
    #[arg(long, default_value = "/tmp/millrace-outbox-orders/dedup")]
    dedup_dir: std::path::PathBuf,
}

/// What the shipping consumer saw, per order: the events in the order it received them, and how
/// many times it shipped.
#[derive(Default)]
struct Seen {
    events: HashMap<String, Vec<String>>,
    shipped: HashMap<String, u32>,
}

struct Shipping(Arc<Mutex<Seen>>);

impl Processor for Shipping {
    async fn process(&self, record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        let order = String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()).into_owned();
        let event = record.headers.get("type").map(|t| String::from_utf8_lossy(t).into_owned()).unwrap_or_default();
        let mut seen = self.0.lock().unwrap();
        if event == "paid" {
            // The effect: ship the order. A paid event before its placed event would be a bug.
            if seen.events.get(&order).is_none_or(|e| e.last().map(String::as_str) != Some("placed")) {
                return Err(ProcessError::permanent(format!("{order}: paid before placed")));
            }
            *seen.shipped.entry(order.clone()).or_default() += 1;
        }
        seen.events.entry(order).or_default().push(event);
        Ok(())
    }
}

async fn connect(url: &str) -> Result<Client> {
    let (client, connection) =
        tokio_postgres::connect(url, NoTls).await.context("connecting to PostgreSQL (scripts/postgres up)")?;
    tokio::spawn(connection);
    Ok(client)
}

/// The order service: places order `n` (the order and its `placed` event), then pays it (status and
/// its `paid` event), each in one transaction; every tenth payment is declined and rolled back.
/// Returns whether the payment went through.
async fn place_and_pay(db: &mut Client, run: &str, n: u64, topic: &str) -> Result<bool> {
    let order = format!("order-{run}-{n}");
    let event =
        "INSERT INTO orders_outbox (aggregate_key, topic, headers, payload) VALUES ($1, $2, $3::text::jsonb, $4)";
    let tx = db.transaction().await?;
    tx.execute(
        "INSERT INTO orders (id, amount_cents, status) VALUES ($1, $2, 'placed')",
        &[&order, &((n * 37 % 9_000 + 100) as i64)],
    )
    .await?;
    tx.execute(event, &[&order, &topic, &r#"{"type": "placed"}"#, &format!(r#"{{"order":"{order}"}}"#).into_bytes()])
        .await?;
    tx.commit().await?;

    let tx = db.transaction().await?;
    tx.execute("UPDATE orders SET status = 'paid' WHERE id = $1", &[&order]).await?;
    tx.execute(event, &[&order, &topic, &r#"{"type": "paid"}"#, &format!(r#"{{"order":"{order}"}}"#).into_bytes()])
        .await?;
    if n % 10 == 9 {
        tx.rollback().await?; // the card was declined
        return Ok(false);
    }
    tx.commit().await?;
    Ok(true)
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn,librdkafka=error".into()),
        )
        .init();
    let args = Args::parse();
    let run = format!("{:x}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis());
    let mut db = connect(&args.postgres).await?;
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, amount_cents bigint NOT NULL, status text NOT NULL)",
    )
    .await?;
    let mut relay_config = RelayConfig::new(args.postgres.clone(), args.bootstrap.clone());
    relay_config.table = "orders_outbox".into();
    schema::install(&relay_config).await?;
    let config = PipelineConfig::new(&args.bootstrap, "outbox-orders-shipping", [args.topic.as_str()])
        .dedup(DedupConfig::new(&args.dedup_dir));
    millrace::create_topics(&config, &[&args.topic], 4).await?;

    let stop = tokio_util::sync::CancellationToken::new();
    let relay = Relay::new(relay_config)?;
    let relay_stats = relay.stats();
    let relay_run = tokio::spawn(relay.run(stop.clone()));

    let seen = Arc::new(Mutex::new(Seen::default()));
    let pipeline = Pipeline::new(config, Shipping(seen.clone()))?;
    let consumer_stop = pipeline.shutdown_token();
    let consumer = tokio::spawn(pipeline.run());

    let started = Instant::now();
    let mut paid = 0;
    for n in 0..args.orders {
        paid += u64::from(place_and_pay(&mut db, &run, n, &args.topic).await?);
    }
    println!(
        "order service: {} orders placed, {paid} paid, {} payments declined (rolled back)",
        args.orders,
        args.orders - paid
    );

    // Until the consumer has seen every committed event of this run.
    let expected = (args.orders + paid) as usize;
    let prefix = format!("order-{run}-");
    let count = |s: &Seen| s.events.iter().filter(|(k, _)| k.starts_with(&prefix)).map(|(_, e)| e.len()).sum::<usize>();
    while count(&seen.lock().unwrap()) < expected {
        if started.elapsed() > Duration::from_secs(120) {
            bail!("the consumer saw {} of {expected} events in 120 s", count(&seen.lock().unwrap()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed();
    stop.cancel();
    consumer_stop.cancel();
    relay_run.await??;
    consumer.await??;

    let seen = seen.lock().unwrap();
    let mine: Vec<(&String, &Vec<String>)> = seen.events.iter().filter(|(k, _)| k.starts_with(&prefix)).collect();
    let shipped: u32 = seen.shipped.iter().filter(|(k, _)| k.starts_with(&prefix)).map(|(_, n)| *n).sum();
    let twice = seen.shipped.iter().filter(|(k, n)| k.starts_with(&prefix) && **n > 1).count();
    let declined_published = mine
        .iter()
        .filter(|(k, e)| {
            let n: u64 = k.rsplit('-').next().and_then(|n| n.parse().ok()).unwrap_or(0);
            n % 10 == 9 && e.iter().any(|e| e == "paid")
        })
        .count();
    println!(
        "relay: {} rows published in {} Kafka transactions",
        relay_stats.published.load(std::sync::atomic::Ordering::Relaxed),
        relay_stats.batches.load(std::sync::atomic::Ordering::Relaxed)
    );
    println!(
        "shipping: {} events of {} orders in {:.1} s; {shipped} orders shipped, {twice} shipped twice, \
         {declined_published} declined payments published",
        expected,
        mine.len(),
        elapsed.as_secs_f64()
    );
    if mine.len() as u64 != args.orders || shipped as u64 != paid || twice > 0 || declined_published > 0 {
        bail!("the outbox lost, invented or repeated an event");
    }
    println!("ok: every committed event once, in order per order; no declined payment published");
    Ok(())
}
