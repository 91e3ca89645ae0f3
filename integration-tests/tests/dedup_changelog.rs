//! The dedup changelog's batch records (issue 17): a burst of new keys shares changelog records
//! (one per partition's burst at-least-once, per transaction exactly-once) and a restore reads every
//! key back; a changelog written in the per-key format of earlier versions still restores, and its
//! compact-only settings are reported with the command that fixes them. Against the real broker.

use anyhow::{Result, ensure};
use millrace::{Context, DedupConfig, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Every log line of this test binary (the pipelines' warnings are part of what is tested).
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter("warn,librdkafka=error")
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .try_init();
        logs
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        std::io::stderr().write_all(buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Noop;

impl Processor for Noop {
    async fn process(&self, _record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        Ok(())
    }
}

fn temp_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(unique(name))
}

fn config(topic: &str, group: &str, dir: &Path) -> PipelineConfig {
    PipelineConfig::new(bootstrap(), group, [topic])
        .commit_interval(Duration::from_millis(200))
        .dedup(DedupConfig::new(dir))
}

fn events(ids: std::ops::Range<usize>) -> Vec<RawRecord> {
    ids.map(|i| {
        (
            Some(format!("k{i}").into_bytes()),
            Some(b"x".to_vec()),
            vec![("idempotency-key".to_owned(), format!("evt-{i}").into_bytes())],
        )
    })
    .collect()
}

/// Runs a pipeline until `wanted` holds for its stats; returns them.
async fn run_until(
    config: PipelineConfig,
    wanted: impl Fn(&millrace::StatsSnapshot) -> bool,
) -> Result<millrace::StatsSnapshot> {
    let pipeline = Pipeline::new(config, Noop)?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    let s = eventually("the pipeline's counters", Duration::from_secs(60), || {
        let s = stats.snapshot();
        Ok(wanted(&s).then_some(s))
    })
    .await;
    stop.cancel();
    run.await??;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_keys_shares_changelog_records_and_a_move_restores_every_key() -> Result<()> {
    logs();
    const N: usize = 2_000;
    let (topic, group) = (unique("dedup-batch"), unique("dedup-batch-group"));
    let (dir_a, dir_b) = (temp_dir("dedup-batch-a"), temp_dir("dedup-batch-b"));
    create_topic(&topic, 1).await?;
    produce_raw(&topic, events(0..N)).await?;
    run_until(config(&topic, &group, &dir_a), |s| s.processed >= N as u64).await?;

    let changelog = millrace::dedup::changelog_topic(&group);
    let keys: BTreeSet<Vec<u8>> = read_changelog(&changelog)?.into_iter().map(|(_, k)| k).collect();
    let records = watermarks(&bootstrap(), &changelog, 1)?[&0].1;
    println!("{N} new keys took {records} changelog records ({:.1} keys per record)", N as f64 / records as f64);
    ensure!(keys.len() == N, "the changelog holds {} distinct keys of {N}", keys.len());
    ensure!(records as usize <= N / 4, "{records} changelog records for {N} keys: the burst was not batched");

    // Instance B on an empty disk restores every key and absorbs the same events again.
    produce_raw(&topic, events(0..N)).await?;
    let s = run_until(config(&topic, &group, &dir_b), |s| s.dedup_hits >= N as u64).await?;
    println!("instance B: restored {}, dedup hits {}, processed {}", s.dedup_restored, s.dedup_hits, s.processed);
    ensure!(s.dedup_restored >= N as u64 && s.processed == 0, "B: {s:?}");
    for d in [dir_a, dir_b] {
        std::fs::remove_dir_all(&d).ok();
    }
    Ok(())
}

/// A changelog written before issue 17 (compact-only, one record per key: key = the idempotency
/// key, value = its first-seen time) restores as before, and start-up names the settings it lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_key_changelog_of_an_earlier_version_restores_and_its_settings_are_reported() -> Result<()> {
    logs();
    let (topic, group) = (unique("dedup-v1"), unique("dedup-v1-group"));
    let changelog = millrace::dedup::changelog_topic(&group);
    let dir = temp_dir("dedup-v1");
    create_topic(&topic, 1).await?;
    create_topic_with(&changelog, 1, &[("cleanup.policy", "compact")]).await?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
    let old: Vec<RawRecord> = (0..100)
        .map(|i| {
            let source = ("millrace.source-topic".to_owned(), topic.clone().into_bytes());
            (Some(format!("evt-{i}").into_bytes()), Some(now.to_be_bytes().to_vec()), vec![source])
        })
        .collect();
    produce_raw(&changelog, old).await?;
    // The 100 keys of the old changelog arrive again, and 50 new ones.
    produce_raw(&topic, events(0..150)).await?;
    let s = run_until(config(&topic, &group, &dir), |s| s.processed + s.dedup_hits >= 150).await?;
    println!("restored {}, dedup hits {}, processed {}", s.dedup_restored, s.dedup_hits, s.processed);
    ensure!((s.dedup_restored, s.dedup_hits, s.processed) == (100, 100, 50), "{s:?}");

    let text = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
    let warning = text.lines().find(|l| l.contains("keeps expired keys") && l.contains(&changelog));
    let warning = warning.ok_or_else(|| anyhow::anyhow!("no warning about {changelog}'s settings"))?;
    println!("{warning}");
    for wanted in ["cleanup.policy=[compact,delete]", "segment.ms=60480000", "kafka-configs.sh"] {
        ensure!(warning.contains(wanted), "the warning lacks {wanted}: {warning}");
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
