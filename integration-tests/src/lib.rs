//! Shared helpers for Millrace's integration tests, which run against a real Kafka broker
//! (`scripts/kafka up`; address from `KAFKA_BOOTSTRAP_SERVERS`, default `127.0.0.1:9092`).
//!
//! Every test uses its own topics and groups ([`unique`]), so tests never see each other's data.
//! The Kafka helpers (topics, producing, reading back, offsets, child processes) are
//! [`millrace_testkit`]'s, re-exported here; this crate adds the worker's journal and the checks on it
//! ([`read_journal`], [`assert_key_order`], …) and the command that starts the worker. The
//! `millrace-it-worker` binary beside this library is the pipeline the crash tests kill.

mod journal;

pub use journal::{
    JournalEntry, assert_commits_cover_only_processed, assert_key_order, distinct, processed_prefix, read_journal,
};
pub use millrace_testkit::*;

use anyhow::Result;
use std::path::Path;

/// Installs a log subscriber once (RUST_LOG controls it; warnings by default).
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn,librdkafka=error".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A fresh journal file for a `millrace-it-worker` (in the temp directory; not created yet).
pub fn journal_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{}.journal", unique(name)))
}

/// The command that runs the killable worker on `topic` in `group`, journaling to `journal`, with its
/// stdout piped (its SUMMARY line is read by [`worker_summary`]). `exe` is the calling test's
/// `env!("CARGO_BIN_EXE_millrace-it-worker")`; add worker options with `.args(…)`.
pub fn worker_command(exe: &str, topic: &str, group: &str, journal: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(exe);
    c.args(["--topic", topic, "--group", group, "--journal"])
        .arg(journal)
        .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .stdout(std::process::Stdio::piped());
    c
}

/// Everything an exited worker printed on stdout (its SUMMARY line).
pub fn worker_summary(child: &mut std::process::Child) -> Result<String> {
    let mut out = String::new();
    if let Some(stdout) = child.stdout.as_mut() {
        std::io::Read::read_to_string(stdout, &mut out)?;
    }
    Ok(out)
}

/// The idempotency keys in a dedup changelog topic (every entry of every batch record, in either
/// format), each with its partition.
pub fn read_changelog(changelog: &str) -> Result<Vec<(i32, Vec<u8>)>> {
    let records = read_topic(changelog)?;
    Ok(records
        .iter()
        .flat_map(|r| {
            millrace::dedup::changelog_entries(r.key.as_deref(), r.value.as_deref())
                .into_iter()
                .map(|(key, _)| (r.partition, key))
        })
        .collect())
}
