//! The dedup changelog forgets expired keys (issue 17): the topic is compacted and deleted by age
//! (`retention.ms` = the TTL, segments of a tenth of it, at least 1 s), so after many TTLs it holds
//! about a TTL's worth of keys and a restore onto an empty disk reads only those, while every key
//! younger than the TTL is still there. Against the real broker (`scripts/kafka` checks retention
//! every second; a broker's default is every 5 minutes, which only delays the deletion).

use anyhow::{Result, ensure};
use millrace::{Context, DedupConfig, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

const TTL: Duration = Duration::from_secs(3);
const WAVES: usize = 12;
const PER_WAVE: usize = 300;

struct Count(watch::Sender<usize>);

impl Processor for Count {
    async fn process(&self, _record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        self.0.send_modify(|n| *n += 1);
        Ok(())
    }
}

fn config(topic: &str, group: &str, dir: &Path) -> PipelineConfig {
    let mut dedup = DedupConfig::new(dir);
    dedup.ttl = TTL;
    PipelineConfig::new(bootstrap(), group, [topic]).commit_interval(Duration::from_millis(200)).dedup(dedup)
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn wave(w: usize) -> Vec<RawRecord> {
    (0..PER_WAVE)
        .map(|i| {
            let id = format!("w{w}-{i}");
            (Some(id.clone().into_bytes()), Some(b"x".to_vec()), vec![("idempotency-key".to_owned(), id.into_bytes())])
        })
        .collect()
}

/// The changelog's (low, high) watermarks.
fn changelog_span(changelog: &str) -> Result<(i64, i64)> {
    Ok(watermarks(&bootstrap(), changelog, 1)?[&0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_changelog_forgets_expired_keys_and_a_restore_reads_only_live_ones() -> Result<()> {
    init_logs();
    let topic = unique("dedup-ttl-changelog");
    let group = unique("dedup-ttl-changelog-group");
    let changelog = format!("{group}.dedup-changelog");
    let (dir_a, dir_b) =
        (std::env::temp_dir().join(unique("dedup-ttl-a")), std::env::temp_dir().join(unique("dedup-ttl-b")));
    create_topic(&topic, 1).await?;

    // Instance A sees 12 waves of new keys, one wave about every 1.3 s: 4 TTLs and more.
    let (tx, mut done) = watch::channel(0);
    let pipeline = Pipeline::new(config(&topic, &group, &dir_a), Count(tx))?;
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());
    let mut started = Vec::new();
    for w in 0..WAVES {
        started.push(now_ms());
        produce_raw(&topic, wave(w)).await?;
        let wanted = (w + 1) * PER_WAVE;
        tokio::time::timeout(Duration::from_secs(60), done.wait_for(|n| *n >= wanted)).await??;
        if w + 1 < WAVES {
            // The TTL is the subject: time has to pass between the waves.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    let written = WAVES * PER_WAVE;

    // Every key younger than the TTL is in the changelog (read right after the last wave).
    let entries = read_changelog(&changelog)?;
    let read_done = now_ms();
    let keys: BTreeSet<Vec<u8>> = entries.into_iter().map(|(_, key)| key).collect();
    let live_waves: Vec<usize> = (0..WAVES).filter(|w| read_done - started[*w] < TTL.as_millis() as i64).collect();
    ensure!(
        !live_waves.is_empty(),
        "no wave younger than the TTL when the changelog was read (the test ran too slowly)"
    );
    for w in &live_waves {
        let missing = (0..PER_WAVE).filter(|i| !keys.contains(format!("w{w}-{i}").as_bytes())).count();
        ensure!(missing == 0, "{missing} keys of wave {w}, younger than the TTL, are gone from the changelog");
    }
    let (low, high) = changelog_span(&changelog)?;
    println!(
        "after the last wave: changelog offsets {low}..{high} ({} batch records) holding {} of the {written} keys written; waves {live_waves:?} live and complete",
        high - low,
        keys.len()
    );

    // Expired keys leave it: within a bounded time the changelog holds at most 4 waves' worth (a
    // TTL, a 1 s segment and the 1 s retention check), whatever ran before.
    let bound = 4 * PER_WAVE;
    let waiting = Instant::now();
    let left = eventually("the changelog to forget expired keys", Duration::from_secs(60), || {
        let left = read_changelog(&changelog)?.len();
        Ok((left <= bound).then_some(left))
    })
    .await?;
    println!(
        "{:.1} s later: {left} keys left in the changelog of {written} written (bound {bound})",
        waiting.elapsed().as_secs_f64()
    );
    stop.cancel();
    run.await??;

    // Instance B, on an empty disk, restores only what is left.
    let (tx, _done) = watch::channel(0);
    let pipeline = Pipeline::new(config(&topic, &group, &dir_b), Count(tx))?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let began = Instant::now();
    let run = tokio::spawn(pipeline.run());
    let s = eventually("instance B to restore the partition", Duration::from_secs(60), || {
        let s = stats.snapshot();
        Ok((s.dedup_restores >= 1).then_some(s))
    })
    .await?;
    let restore_secs = began.elapsed().as_secs_f64();
    stop.cancel();
    run.await??;
    println!(
        "instance B restored {} entries (of {written} ever written) in {restore_secs:.2} s from its start",
        s.dedup_restored
    );
    ensure!(s.dedup_restored as usize <= bound, "B restored {} entries, more than the {bound} live", s.dedup_restored);
    for d in [dir_a, dir_b] {
        std::fs::remove_dir_all(&d).ok();
    }
    Ok(())
}
