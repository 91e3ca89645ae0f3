//! The outbox relay's latency: rows committed at a fixed rate (one row per transaction, four writer
//! connections), each timed from its commit's return to a `read_committed` consumer receiving it,
//! all in this process (one clock). The relay runs in process with its defaults (LISTEN/NOTIFY,
//! batches of up to 500 rows, one Kafka transaction per batch). Needs PostgreSQL at
//! MILLRACE_POSTGRES_URL (scripts/postgres up) and the broker. One row goes through first, unmeasured
//! (the relay's start and the reader's assignment are not latency).

use anyhow::{Context as _, Result, bail};
use millrace_outbox::{Relay, RelayConfig, schema};
use millrace_testkit::{bootstrap, create_topic, unique};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `millrace-bench outbox` options.
#[derive(Debug, clap::Args)]
pub struct OutboxArgs {
    /// Rows committed per second, all writers together.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// How long to write.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// A few seconds at a low rate (the CI smoke run).
    #[arg(long)]
    quick: bool,
}

const WRITERS: u64 = 4;
const PARTITIONS: i32 = 4;

fn postgres_url() -> String {
    std::env::var("MILLRACE_POSTGRES_URL").unwrap_or_else(|_| "postgres://millrace@127.0.0.1:5432/millrace".into())
}

/// Runs the benchmark and prints one line of figures.
pub async fn run(args: OutboxArgs) -> Result<()> {
    let (rate, seconds) = if args.quick { (200, 3) } else { (args.rate, args.seconds) };
    let table = unique("outbox_bench").replace('-', "_");
    let topic = unique("outbox-bench");
    create_topic(&topic, PARTITIONS).await?;
    let mut config = RelayConfig::new(postgres_url(), bootstrap());
    config.table = table.clone();
    schema::install(&config).await.context("installing the outbox table (scripts/postgres up?)")?;

    let received: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (received, done, topic) = (received.clone(), done.clone(), topic.clone());
        std::thread::spawn(move || read(&topic, &received, &done))
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let relay = tokio::spawn(Relay::new(config)?.run(stop.clone()));

    // Warm-up, not measured: one row through the relay (its session, init_transactions) and the
    // reader (assignment, first fetch) before the clock starts.
    let warm = write(0, table.clone(), topic.clone(), 1, 1.0).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !received.lock().unwrap().contains_key(&warm[0].0) {
        if Instant::now() > deadline {
            bail!("the warm-up row did not arrive in 60 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    received.lock().unwrap().clear();

    let started = Instant::now();
    let per_writer = rate * seconds / WRITERS;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(write(w, table.clone(), topic.clone(), per_writer, rate as f64 / WRITERS as f64)))
        .collect();
    let mut committed = HashMap::new();
    for w in writers {
        committed.extend(w.await??);
    }
    let write_time = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.lock().unwrap().len() < committed.len() {
        if Instant::now() > deadline {
            bail!("the reader saw {} of {} rows", received.lock().unwrap().len(), committed.len());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    done.store(true, Ordering::Relaxed);
    stop.cancel();
    relay.await??;
    reader.join().map_err(|_| anyhow::anyhow!("reader panicked"))??;

    let received = received.lock().unwrap();
    let mut latencies: Vec<Duration> =
        committed.iter().map(|(id, at)| received[id].saturating_duration_since(*at)).collect();
    latencies.sort();
    let q = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)].as_secs_f64() * 1e3;
    println!(
        "outbox relay: {} rows at {:.0} rows/s offered over {:.1} s; commit -> read_committed consumer latency \
         p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms",
        latencies.len(),
        latencies.len() as f64 / write_time.as_secs_f64(),
        write_time.as_secs_f64(),
        q(0.50),
        q(0.99),
        q(0.999),
        latencies.last().unwrap().as_secs_f64() * 1e3
    );
    Ok(())
}

/// One writer: `n` rows, one per transaction, paced to `rate` rows/s; returns each row's id and the
/// instant its commit returned.
async fn write(w: u64, table: String, topic: String, n: u64, rate: f64) -> Result<Vec<(i64, Instant)>> {
    let (mut db, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let sql = format!("INSERT INTO {table} (aggregate_key, topic, payload) VALUES ($1, $2, $3) RETURNING id");
    let payload = vec![b'x'; 100];
    let start = tokio::time::Instant::now();
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        let tx = db.transaction().await?;
        let id: i64 = tx.query_one(&sql, &[&format!("key-{w}-{}", i % 100), &topic, &payload]).await?.get(0);
        tx.commit().await?;
        out.push((id, Instant::now()));
    }
    Ok(out)
}

fn read(topic: &str, received: &Mutex<HashMap<i64, Instant>>, done: &AtomicBool) -> Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("outbox-bench-reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "10")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    while !done.load(Ordering::Relaxed) {
        let Some(message) = consumer.poll(Duration::from_millis(50)) else { continue };
        let message = message?;
        let at = Instant::now();
        let id = message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == "idempotency-key").and_then(|h| h.value))
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .context("a record without an idempotency-key header")?;
        received.lock().unwrap().insert(id, at);
    }
    Ok(())
}
