//! The relay: one active instance per outbox (a PostgreSQL advisory lock elects it), which reads
//! the oldest rows, publishes them in one Kafka transaction, and deletes them once the transaction
//! is committed.

use crate::row::{self, Row};
use crate::{Error, RelayConfig, stats::RelayStats};
use futures::StreamExt;
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, Client, NoTls};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How long a transaction call may take before the session is given up and started again.
const TXN_TIMEOUT: Duration = Duration::from_secs(30);

/// A relay of one outbox table to Kafka. Run several (on several hosts) for failover: one is active,
/// the others wait on its lock and take over within `poll_interval` of its database session ending.
pub struct Relay {
    config: RelayConfig,
    stats: Arc<RelayStats>,
}

impl Relay {
    /// Checks the settings (naming a bad one) and builds the relay; connects nothing yet.
    pub fn new(config: RelayConfig) -> Result<Self, Error> {
        config.validate()?;
        Ok(Self { config, stats: Arc::default() })
    }

    /// Counters a caller can read while the relay runs.
    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// Runs until `stop` is cancelled. Losing the database or the broker ends a session, reported
    /// as a warning naming the cause, and the relay connects again after a backoff (100 ms doubling
    /// to `max_backoff`, full jitter); only a bad setting ends it with an error.
    pub async fn run(self, stop: CancellationToken) -> Result<(), Error> {
        let mut backoff = Duration::from_millis(100);
        loop {
            let started = Instant::now();
            match self.session(&stop).await {
                Ok(()) => return Ok(()),
                Err(e) if e.is_fatal() => return Err(e),
                Err(e) => {
                    self.stats.record_error(&e);
                    if started.elapsed() > self.config.max_backoff * 2 {
                        backoff = Duration::from_millis(100);
                    }
                    let wait = backoff.mul_f64(rand::random::<f64>());
                    warn!(error = %e, retry_in_ms = wait.as_millis() as u64, table = %self.config.table,
                        "outbox relay session ended; connecting again");
                    backoff = (backoff * 2).min(self.config.max_backoff);
                    tokio::select! {
                        () = stop.cancelled() => return Ok(()),
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// One database session: wait for the lock, then publish until `stop` or an error.
    async fn session(&self, stop: &CancellationToken) -> Result<(), Error> {
        let (client, woken, driver) = connect(&self.config.postgres_url).await?;
        let _driver = AbortOnDrop(driver);
        let table_exists: bool =
            client.query_one("SELECT to_regclass($1) IS NOT NULL", &[&self.config.table]).await?.get(0);
        if !table_exists {
            return Err(Error::NoTable(self.config.table.clone()));
        }
        let key = self.config.lock_key();
        let mut said_standby = false;
        loop {
            let locked: bool = client.query_one("SELECT pg_try_advisory_lock($1)", &[&key]).await?.get(0);
            if locked {
                break;
            }
            if !said_standby {
                info!(table = %self.config.table, "outbox relay on standby: another relay holds the outbox lock");
                said_standby = true;
            }
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = tokio::time::sleep(self.config.poll_interval) => {}
            }
        }
        client.batch_execute(&format!("LISTEN {}", self.config.channel())).await?;
        let producer = self.producer().await?;
        info!(table = %self.config.table, transactional_id = %self.config.transactional_id(), "outbox relay active");
        self.stats.set_active(true);
        let select = client.prepare(&row::select(&self.config.table)).await?;
        let delete = client.prepare(&row::delete(&self.config.table)).await?;
        loop {
            if stop.is_cancelled() {
                self.stats.set_active(false);
                return Ok(());
            }
            let rows = client.query(&select, &[&(self.config.batch_size as i64)]).await?;
            if rows.is_empty() {
                metrics::gauge!("millrace_outbox_oldest_row_age_seconds").set(0.0);
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = woken.notified() => {}
                    () = tokio::time::sleep(self.config.poll_interval) => {}
                }
                continue;
            }
            let rows = rows.iter().map(Row::from_sql).collect::<Result<Vec<_>, _>>()?;
            metrics::gauge!("millrace_outbox_oldest_row_age_seconds").set(rows[0].age().as_secs_f64());
            self.publish(&producer, &rows).await?;
            let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
            client.execute(&delete, &[&ids]).await?;
            self.stats.record_batch(&rows);
        }
    }

    /// A transactional producer, its transactions initialised (which fences an earlier relay with the
    /// same transactional id and aborts the transaction it left open).
    async fn producer(&self) -> Result<FutureProducer, Error> {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", &self.config.bootstrap_servers)
            .set("transactional.id", self.config.transactional_id())
            .set("linger.ms", "5")
            .set("message.timeout.ms", "25000")
            .set("transaction.timeout.ms", "60000");
        for (k, v) in &self.config.kafka_properties {
            cfg.set(k, v);
        }
        let producer: FutureProducer = cfg.create()?;
        let p = producer.clone();
        blocking(move || p.init_transactions(Timeout::After(TXN_TIMEOUT))).await?;
        Ok(producer)
    }

    /// Publishes `rows` in one transaction; returns once it is committed.
    async fn publish(&self, producer: &FutureProducer, rows: &[Row]) -> Result<(), Error> {
        let p = producer.clone();
        blocking(move || p.begin_transaction()).await?;
        let result = self.send_all(producer, rows).await;
        let p = producer.clone();
        match result {
            Ok(()) => blocking(move || p.commit_transaction(Timeout::After(TXN_TIMEOUT))).await,
            Err(e) => {
                if let Err(abort) = blocking(move || p.abort_transaction(Timeout::After(TXN_TIMEOUT))).await {
                    debug!(error = %abort, "aborting the outbox batch's transaction");
                }
                Err(e)
            }
        }
    }

    async fn send_all(&self, producer: &FutureProducer, rows: &[Row]) -> Result<(), Error> {
        let mut deliveries = Vec::with_capacity(rows.len());
        for row in rows {
            let mut record = FutureRecord::<str, [u8]>::to(&row.topic)
                .key(&row.key)
                .headers(row.kafka_headers(&self.config.idempotency_key_prefix))
                .timestamp(row.timestamp_ms());
            if let Some(payload) = &row.payload {
                record = record.payload(payload);
            }
            let delivery = producer.send_result(record).map_err(|(source, _)| Error::Delivery {
                id: row.id,
                topic: row.topic.clone(),
                source,
            })?;
            deliveries.push((row, delivery));
        }
        for (row, delivery) in deliveries {
            let source = match delivery.await {
                Ok(Ok(_)) => continue,
                Ok(Err((e, _))) => e,
                Err(_) => rdkafka::error::KafkaError::Canceled,
            };
            return Err(Error::Delivery { id: row.id, topic: row.topic.clone(), source });
        }
        Ok(())
    }
}

/// Connects, and drives the connection on a task that wakes `Notify` on each notification.
async fn connect(url: &str) -> Result<(Client, Arc<Notify>, tokio::task::JoinHandle<()>), Error> {
    let (client, mut connection) = tokio_postgres::connect(url, NoTls).await?;
    let woken = Arc::new(Notify::new());
    let wake = woken.clone();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(_)) => wake.notify_one(),
                Ok(AsyncMessage::Notice(n)) => debug!(notice = %n.message(), "PostgreSQL notice"),
                Ok(_) => {}
                Err(e) => {
                    debug!(error = %e, "PostgreSQL connection ended");
                    break;
                }
            }
        }
    });
    Ok((client, woken, driver))
}

/// Runs a blocking producer call (the transaction API of librdkafka blocks) off the runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, rdkafka::error::KafkaError> + Send + 'static,
) -> Result<T, Error> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(Error::Kafka(rdkafka::error::KafkaError::Canceled)),
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
