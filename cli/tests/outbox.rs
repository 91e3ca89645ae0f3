//! `millrace outbox relay` under fire: two relay processes over one outbox, the active one SIGKILLed
//! a dozen times mid-stream while four writers commit 50,000 rows (and roll some back), PostgreSQL
//! restarted once. Every committed row reaches Kafka, in order per key; a rolled-back row never;
//! the duplicates are re-published batches only, and a Millrace consumer with the dedup store
//! performs each event's effect exactly once. Needs `scripts/postgres` (MILLRACE_POSTGRES_URL) and
//! a broker; `scripts/test` starts both.

use anyhow::{Context as _, Result, bail};
use millrace::{Context, DedupConfig, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_testkit::{Isolation, Reaped, bootstrap, committed_to_end, create_topic, read_topic_as, signal, unique};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ROWS: usize = 50_000;
const WRITERS: usize = 4;
const KEYS: usize = 40;
const KILLS: usize = 12;
const BATCH: usize = 200;
/// Rows per second, all writers together: the writing lasts ~25 s, long enough for the kills to
/// land while rows keep arriving.
const RATE: f64 = 2_000.0;

fn postgres_url() -> String {
    std::env::var("MILLRACE_POSTGRES_URL").unwrap_or_else(|_| "postgres://millrace@127.0.0.1:5432/millrace".into())
}

async fn connect() -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// What the writers know: rows committed for sure, rows rolled back, rows whose commit's outcome
/// the database restart left unknown.
#[derive(Default)]
struct Written {
    committed: BTreeSet<i64>,
    rolled_back: BTreeSet<i64>,
    unknown: BTreeSet<i64>,
}

/// One writer: keys `w, w + WRITERS, …`, transactions of 1–8 rows, every 25th rolled back; the
/// payload is `key/seq` with seq rising per key. Reconnects after an error (the restart).
async fn writer(w: usize, table: String, topic: String, quota: usize, out: Arc<Mutex<Written>>) -> Result<()> {
    let sql = format!("INSERT INTO {table} (aggregate_key, topic, payload) VALUES ($1, $2, $3) RETURNING id");
    let mut seq = [0u32; KEYS];
    let (mut done, mut n, mut db) = (0, 0u64, None);
    let started = tokio::time::Instant::now();
    while done < quota {
        tokio::time::sleep_until(started + Duration::from_secs_f64(done as f64 * WRITERS as f64 / RATE)).await;
        let client = match &mut db {
            Some(c) => c,
            None => match connect().await {
                Ok(c) => db.insert(c),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        n += 1;
        let rows = 1 + (n as usize * 7 + w) % 8;
        let rollback = n % 25 == 0;
        let mut ids = Vec::new();
        let result: Result<(), tokio_postgres::Error> = async {
            let tx = client.transaction().await?;
            for r in 0..rows {
                let k = w + WRITERS * ((n as usize + r) % (KEYS / WRITERS));
                seq[k] += 1;
                let payload = format!("key-{k}/{}", seq[k]).into_bytes();
                ids.push(tx.query_one(&sql, &[&format!("key-{k}"), &topic, &payload]).await?.get::<_, i64>(0));
            }
            if rollback { tx.rollback().await } else { tx.commit().await }
        }
        .await;
        let mut out = out.lock().unwrap();
        match result {
            Ok(()) if rollback => out.rolled_back.extend(ids),
            Ok(()) => {
                done += ids.len();
                out.committed.extend(ids);
            }
            Err(_) => {
                // The restart: rows inserted before the error may or may not be committed.
                out.unknown.extend(ids);
                db = None;
            }
        }
    }
    Ok(())
}

fn relay(exe: &str, table: &str, log: &Path) -> Result<Reaped> {
    let log = std::fs::File::create(log)?;
    let child = std::process::Command::new(exe)
        .args(["outbox", "relay", "--table", table, "--batch-size", &BATCH.to_string(), "--poll-interval-ms", "200"])
        .env("MILLRACE_POSTGRES_URL", postgres_url())
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
        .env("RUST_LOG", "warn,millrace_outbox=info")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()?;
    Ok(Reaped(child))
}

/// Whether the relay's last word about its role was that it is active (not on standby, and not a
/// session ended since).
fn is_active(log: &Path) -> bool {
    let log = std::fs::read_to_string(log).unwrap_or_default();
    log.lines()
        .rev()
        .find(|l| l.contains("outbox relay active") || l.contains("on standby") || l.contains("session ended"))
        .is_some_and(|l| l.contains("outbox relay active"))
}

/// Counts each event's effect by its idempotency key.
struct Effect(Arc<Mutex<HashMap<String, u32>>>);

impl Processor for Effect {
    async fn process(&self, _record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let key = ctx.idempotency_key().ok_or_else(|| ProcessError::permanent("no idempotency key"))?;
        *self.0.lock().unwrap().entry(String::from_utf8_lossy(key).into_owned()).or_default() += 1;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_killed_mid_batch_and_a_database_restart_lose_nothing_and_keep_key_order() -> Result<()> {
    let exe = env!("CARGO_BIN_EXE_millrace");
    let scripts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts");
    let table = unique("outbox_chaos").replace('-', "_");
    let topic = unique("outbox-chaos");
    create_topic(&topic, 4).await?;
    let install = std::process::Command::new(exe)
        .args(["outbox", "install", "--table", &table])
        .env("MILLRACE_POSTGRES_URL", postgres_url())
        .output()?;
    assert!(install.status.success(), "{}", String::from_utf8_lossy(&install.stderr));
    let logs = std::env::temp_dir().join(&table);
    std::fs::create_dir_all(&logs)?;

    let written = Arc::new(Mutex::new(Written::default()));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(writer(w, table.clone(), topic.clone(), ROWS / WRITERS, written.clone())))
        .collect();
    let mut incarnation = 0;
    let spawn = |incarnation: &mut usize| -> Result<(Reaped, PathBuf)> {
        *incarnation += 1;
        let log = logs.join(format!("relay-{incarnation}.log"));
        Ok((relay(exe, &table, &log)?, log))
    };
    let mut relays = [spawn(&mut incarnation)?, spawn(&mut incarnation)?];
    let started = Instant::now();
    let (mut kills, mut restarted) = (0, false);
    let mut last_end = 0u64;
    while kills < KILLS {
        if started.elapsed() > Duration::from_secs(240) {
            bail!("only {kills} kills in 240 s");
        }
        tokio::time::sleep(Duration::from_millis(150 + rand::random::<u64>() % 300)).await;
        // Kill the active relay once it has published something new since the last kill.
        let end = millrace_testkit::record_count(&bootstrap(), &topic, 4)?;
        let Some(i) = relays.iter().position(|(_, log)| is_active(log)) else { continue };
        if end <= last_end {
            continue;
        }
        last_end = end;
        signal(&relays[i].0, 9)?; // SIGKILL
        relays[i].0.wait()?;
        kills += 1;
        if kills == KILLS / 2 && !restarted {
            let out = std::process::Command::new(scripts.join("postgres")).arg("restart").output()?;
            assert!(out.status.success(), "scripts/postgres restart: {}", String::from_utf8_lossy(&out.stderr));
            restarted = true;
        }
        relays[i] = spawn(&mut incarnation)?;
    }
    for w in writers {
        w.await??;
    }
    // Drained: the table is empty.
    let db = connect().await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left: i64 = db.query_one(&format!("SELECT count(*) FROM {table}"), &[]).await?.get(0);
        if left == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("{left} rows still in the outbox after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(relays);
    let written = std::mem::take(&mut *written.lock().unwrap());

    // What a read_committed reader sees, in offset order per partition.
    let mut records = read_topic_as(&topic, Isolation::ReadCommitted)?;
    records.sort_by_key(|r| (r.partition, r.offset));
    let id = |r: &millrace_testkit::ReadRecord| -> i64 {
        std::str::from_utf8(r.headers.get("idempotency-key").unwrap()).unwrap().parse().unwrap()
    };
    let published: BTreeSet<i64> = records.iter().map(id).collect();
    let lost: Vec<_> = written.committed.difference(&published).collect();
    assert!(lost.is_empty(), "{} committed rows lost, e.g. {:?}", lost.len(), &lost[..lost.len().min(5)]);
    assert!(written.rolled_back.is_disjoint(&published), "a rolled-back row was published");
    let stray: Vec<_> =
        published.iter().filter(|i| !written.committed.contains(i) && !written.unknown.contains(i)).collect();
    assert!(stray.is_empty(), "rows nobody wrote: {stray:?}");
    // Per key: one partition, and the first copies' sequence numbers rising.
    let mut seen = BTreeSet::new();
    let mut per_key: BTreeMap<String, (BTreeSet<i32>, Vec<u32>)> = BTreeMap::new();
    for r in &records {
        let (key, seq) = std::str::from_utf8(r.value.as_deref().unwrap())?.split_once('/').context("payload")?;
        let entry = per_key.entry(key.to_owned()).or_default();
        entry.0.insert(r.partition);
        if seen.insert(id(r)) {
            entry.1.push(seq.parse()?);
        }
    }
    assert_eq!(per_key.len(), KEYS);
    for (key, (partitions, seqs)) in &per_key {
        assert_eq!(partitions.len(), 1, "{key} in one partition");
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{key} out of order: {seqs:?}");
    }
    // Duplicates: at most one re-published batch per relay that stopped (killed, or cut off by the restart).
    let duplicates = records.len() - published.len();
    assert!(duplicates <= (KILLS + 2) * BATCH, "{duplicates} duplicates");
    // Some kills landed inside a batch: its records were written, then aborted.
    let uncommitted = read_topic_as(&topic, Isolation::ReadUncommitted)?.len();
    println!(
        "{} rows committed ({} of unknown outcome), {} rolled back; {} records, {duplicates} duplicates; \
         {} aborted by {kills} kills and a restart, in {:.1} s",
        written.committed.len(),
        written.unknown.len(),
        written.rolled_back.len(),
        records.len(),
        uncommitted - records.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(uncommitted > records.len(), "no kill landed inside a batch (no aborted records)");

    // Downstream: the dedup store absorbs the duplicates, so each event's effect happens once.
    let effects = Arc::new(Mutex::new(HashMap::new()));
    let group = unique("outbox-effects");
    let config = PipelineConfig::new(bootstrap(), &group, [topic.as_str()]).dedup(DedupConfig::new(logs.join("dedup")));
    let pipeline = Pipeline::new(config, Effect(effects.clone()))?;
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());
    committed_to_end(&group, &topic, 4, Duration::from_secs(120)).await?;
    stop.cancel();
    run.await??;
    let effects = effects.lock().unwrap();
    assert_eq!(effects.len(), published.len(), "an effect per event");
    let twice: Vec<_> = effects.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "effects performed more than once: {:?}", &twice[..twice.len().min(5)]);
    Ok(())
}
