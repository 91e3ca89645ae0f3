//! The relay against a real PostgreSQL (`scripts/postgres`, `MILLRACE_POSTGRES_URL`) and a real
//! broker: committed rows are published once, in id order per key, with their bytes and headers
//! and the row id as idempotency key; a rolled-back row never; a bad setting is named at start.

use anyhow::{Result, bail};
use millrace_outbox::{Error, Relay, RelayConfig, schema};
use millrace_testkit::{Isolation, bootstrap, create_topic, read_topic_as, unique};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

fn postgres_url() -> String {
    std::env::var("MILLRACE_POSTGRES_URL").unwrap_or_else(|_| "postgres://millrace@127.0.0.1:5432/millrace".into())
}

async fn client() -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
        .await
        .map_err(|e| anyhow::anyhow!("connecting to PostgreSQL at MILLRACE_POSTGRES_URL (scripts/postgres up): {e}"))?;
    tokio::spawn(connection);
    Ok(client)
}

/// Inserts rows `(key, seq)` in one transaction, committed or rolled back; returns their ids.
async fn insert(
    db: &mut tokio_postgres::Client,
    table: &str,
    topic: &str,
    rows: &[(String, u32)],
    commit: bool,
) -> Result<Vec<i64>> {
    let tx = db.transaction().await?;
    let sql = format!(
        "INSERT INTO {table} (aggregate_key, topic, headers, payload) VALUES ($1, $2, $3::text::jsonb, $4) RETURNING id"
    );
    let mut ids = Vec::new();
    for (key, seq) in rows {
        let headers = format!(r#"{{"seq": "{seq}", "type": "test"}}"#);
        // Every 7th row a tombstone (NULL payload); the others carry bytes that are not UTF-8.
        let payload: Option<Vec<u8>> =
            (seq % 7 != 3).then(|| [&[0xff, 0x00][..], key.as_bytes(), &seq.to_be_bytes()].concat());
        ids.push(tx.query_one(&sql, &[key, &topic, &headers, &payload]).await?.get(0));
    }
    if commit {
        tx.commit().await?
    } else {
        tx.rollback().await?
    }
    Ok(ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_rows_are_published_once_in_key_order_and_rolled_back_ones_never() -> Result<()> {
    let table = unique("outbox").replace('-', "_");
    let topic = unique("outbox-events");
    create_topic(&topic, 3).await?;
    let mut config = RelayConfig::new(postgres_url(), bootstrap());
    config.table = table.clone();
    config.batch_size = 40;
    config.poll_interval = Duration::from_secs(5); // notifications, not polls, must wake it
    schema::install(&config).await?;
    let mut db = client().await?;

    // A backlog before the relay starts, then rows while it runs; one transaction rolled back.
    let mut committed = Vec::new();
    let mut seq: BTreeMap<String, u32> = BTreeMap::new();
    let mut batch = |n: usize| -> Vec<(String, u32)> {
        (0..n)
            .map(|i| {
                let key = format!("order-{}", i % 10);
                let s = seq.entry(key.clone()).or_default();
                *s += 1;
                (key, *s)
            })
            .collect()
    };
    for _ in 0..10 {
        committed.extend(insert(&mut db, &table, &topic, &batch(10), true).await?);
    }
    let stop = CancellationToken::new();
    let relay = Relay::new(config.clone())?;
    let stats = relay.stats();
    let run = tokio::spawn(relay.run(stop.clone()));
    let rolled_back = insert(&mut db, &table, &topic, &[("order-0".into(), 999)], false).await?;
    for _ in 0..10 {
        committed.extend(insert(&mut db, &table, &topic, &batch(10), true).await?);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let started = Instant::now();
    while stats.published.load(std::sync::atomic::Ordering::Relaxed) < committed.len() as u64 {
        if started.elapsed() > Duration::from_secs(30) {
            bail!(
                "published {} of {} rows in 30 s",
                stats.published.load(std::sync::atomic::Ordering::Relaxed),
                committed.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left: i64 = db.query_one(&format!("SELECT count(*) FROM {table}"), &[]).await?.get(0);
    assert_eq!(left, 0, "published rows are deleted");
    assert!(stats.is_active());
    stop.cancel();
    run.await??;

    let records = read_topic_as(&topic, Isolation::ReadCommitted)?;
    let id_of = |r: &millrace_testkit::ReadRecord| -> i64 {
        std::str::from_utf8(r.headers.get("idempotency-key").expect("idempotency-key")).unwrap().parse().unwrap()
    };
    let ids: Vec<i64> = records.iter().map(id_of).collect();
    assert_eq!(ids.len(), committed.len(), "each committed row once");
    assert_eq!(ids.iter().copied().collect::<BTreeSet<_>>(), committed.iter().copied().collect::<BTreeSet<_>>());
    assert!(!ids.contains(&rolled_back[0]), "the rolled-back row is never published");
    // Per key: one partition, ids and sequence numbers increasing in offset order.
    let mut per_key: BTreeMap<Vec<u8>, Vec<&millrace_testkit::ReadRecord>> = BTreeMap::new();
    for r in &records {
        per_key.entry(r.key.clone().unwrap()).or_default().push(r);
    }
    assert_eq!(per_key.len(), 10);
    for (key, mut rs) in per_key {
        assert_eq!(rs.iter().map(|r| r.partition).collect::<BTreeSet<_>>().len(), 1, "one partition per key");
        rs.sort_by_key(|r| r.offset);
        let seqs: Vec<u32> =
            rs.iter().map(|r| std::str::from_utf8(r.headers.get("seq").unwrap()).unwrap().parse().unwrap()).collect();
        assert_eq!(seqs, (1..=20).collect::<Vec<u32>>(), "key {}", String::from_utf8_lossy(&key));
        for (r, s) in rs.iter().zip(&seqs) {
            let want = (s % 7 != 3).then(|| [&[0xff, 0x00][..], &key, &s.to_be_bytes()].concat());
            assert_eq!(r.value, want, "payload bytes intact, NULL as a tombstone");
            assert_eq!(r.headers.get("type"), Some(&b"test"[..]));
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_bad_setting_or_a_missing_table_is_named() -> Result<()> {
    let mut config = RelayConfig::new(postgres_url(), bootstrap());
    config.table = "Robert'); DROP TABLE students;--".into();
    match Relay::new(config.clone()) {
        Err(Error::Config { field: "table", .. }) => {}
        other => bail!("want a table error, got {:?}", other.err()),
    }
    config.table = unique("missing").replace('-', "_");
    let stop = CancellationToken::new();
    // A missing table ends each session with an error naming it; the relay keeps trying until stopped.
    let relay = Relay::new(config.clone())?;
    let stats = relay.stats();
    let run = tokio::spawn(relay.run(stop.clone()));
    let started = Instant::now();
    while stats.last_error().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            bail!("no session error in 20 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    run.await??;
    let message = stats.last_error().unwrap();
    assert!(message.contains(&config.table) && message.contains("millrace outbox install"), "{message}");
    Ok(())
}
