//! Worker processes: how a scenario starts, signals and restarts `millrace-it-worker`, and what each
//! incarnation leaves behind (its journal of effects and its last counters).

use anyhow::{Context as _, Result};
use millrace_integration_tests::{JournalEntry, read_journal, signal, wait_exit};
use std::collections::HashMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How to start one logical worker (a "slot"): the same arguments for every incarnation.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// The worker binary.
    pub exe: PathBuf,
    /// Name of the slot (file names).
    pub name: String,
    /// Input topic.
    pub topic: String,
    /// Consumer group.
    pub group: String,
    /// Everything else.
    pub args: Vec<String>,
    /// Where journals, stats and the log go.
    pub dir: PathBuf,
}

/// One process of a slot.
#[derive(Debug)]
pub struct Incarnation {
    /// The process.
    pub child: Child,
    /// Its journal (one line per processor attempt: the effect log outside Kafka).
    pub journal: PathBuf,
    /// Its counters, rewritten every 250 ms.
    pub stats: PathBuf,
    /// How it ended: `None` while running.
    pub ended: Option<Ending>,
}

/// How an incarnation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// SIGKILLed by the harness.
    Killed,
    /// Exited by itself or after SIGTERM, with this status (`None`: killed by a signal).
    Exited(Option<i32>),
}

impl WorkerSpec {
    /// A spec with the common arguments; add more with [`arg`](Self::arg).
    pub fn new(exe: &Path, dir: &Path, name: &str, topic: &str, group: &str) -> Self {
        Self {
            exe: exe.to_owned(),
            name: name.into(),
            topic: topic.into(),
            group: group.into(),
            args: Vec::new(),
            dir: dir.to_owned(),
        }
    }

    /// Adds arguments.
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Adds a consumer property.
    pub fn consumer_prop(self, key: &str, value: &str) -> Self {
        self.args(["--consumer-prop".to_owned(), format!("{key}={value}")])
    }

    /// Starts incarnation `n` of this slot; stderr is appended to `<name>.log`.
    pub fn spawn(&self, n: usize) -> Result<Incarnation> {
        let journal = self.dir.join(format!("{}-{n}.journal", self.name));
        let stats = self.dir.join(format!("{}-{n}.stats", self.name));
        let log = OpenOptions::new().create(true).append(true).open(self.dir.join(format!("{}.log", self.name)))?;
        let child = Command::new(&self.exe)
            .args(["--topic", &self.topic, "--group", &self.group, "--journal"])
            .arg(&journal)
            .arg("--stats-file")
            .arg(&stats)
            .args(&self.args)
            // Warnings (commit failures, lost partitions, rewinds) stay in the run directory, which is
            // kept when a scenario fails.
            .env("RUST_LOG", std::env::var("CHAOS_WORKER_LOG").unwrap_or_else(|_| "warn,librdkafka=error".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.exe.display()))?;
        Ok(Incarnation { child, journal, stats, ended: None })
    }
}

impl Incarnation {
    /// SIGKILL and reap.
    pub async fn kill(&mut self) -> Result<()> {
        if self.ended.is_none() {
            signal(&self.child, libc::SIGKILL)?;
            wait_exit(&mut self.child, Duration::from_secs(10)).await?;
            self.ended = Some(Ending::Killed);
        }
        Ok(())
    }

    /// SIGTERM, wait up to `grace` for the drain and exit, then SIGKILL. Returns whether it exited
    /// by itself with status 0.
    pub async fn terminate(&mut self, grace: Duration) -> Result<bool> {
        if self.ended.is_some() {
            return Ok(matches!(self.ended, Some(Ending::Exited(Some(0)))));
        }
        signal(&self.child, libc::SIGTERM)?;
        match wait_exit(&mut self.child, grace).await {
            Ok(status) => {
                self.ended = Some(Ending::Exited(status.code()));
                Ok(status.success())
            }
            Err(_) => {
                self.kill().await?;
                Ok(false)
            }
        }
    }

    /// Waits up to `timeout` for the process to exit by itself; whether it did.
    pub async fn reap(&mut self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        while !self.exited()? {
            if Instant::now() > deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(true)
    }

    /// Whether the process has exited (reaping it if so).
    pub fn exited(&mut self) -> Result<bool> {
        if self.ended.is_some() {
            return Ok(true);
        }
        if let Some(status) = self.child.try_wait()? {
            self.ended = Some(Ending::Exited(status.code()));
            return Ok(true);
        }
        Ok(false)
    }

    /// The last counters the incarnation wrote (empty before its first write).
    pub fn stats(&self) -> HashMap<String, u64> {
        read_stats(&self.stats)
    }

    /// Its journal.
    pub fn journal(&self) -> Result<Vec<JournalEntry>> {
        read_journal(&self.journal)
    }
}

/// Parses a `--stats-file` (`name=value` pairs).
pub fn read_stats(path: &Path) -> HashMap<String, u64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// Sums one counter over incarnations.
pub fn sum_stat(incarnations: &[Incarnation], name: &str) -> u64 {
    incarnations.iter().map(|i| i.stats().get(name).copied().unwrap_or(0)).sum()
}

/// A slot and its incarnations, restarted after each kill: one long-lived logical worker.
pub struct Slot {
    /// How to start it.
    pub spec: WorkerSpec,
    /// Every process it ran, the current one last.
    pub incarnations: Vec<Incarnation>,
    /// SIGKILLs the harness sent.
    pub kills: usize,
    /// Exits the harness did not cause (the supervisor restarted the worker after each).
    pub unexpected_exits: Vec<Option<i32>>,
}

impl Slot {
    /// A slot with nothing started yet.
    pub fn new(spec: WorkerSpec) -> Self {
        Self { spec, incarnations: Vec::new(), kills: 0, unexpected_exits: Vec::new() }
    }

    /// Starts a new incarnation.
    pub fn start(&mut self) -> Result<()> {
        let inc = self.spec.spawn(self.incarnations.len())?;
        self.incarnations.push(inc);
        Ok(())
    }

    /// The current incarnation, if one runs.
    pub fn running(&mut self) -> Option<&mut Incarnation> {
        self.incarnations.last_mut().filter(|i| i.ended.is_none())
    }

    /// Supervisor: if the current incarnation exited by itself, note it and start another.
    pub fn supervise(&mut self) -> Result<()> {
        if let Some(inc) = self.incarnations.last_mut()
            && inc.ended.is_none()
            && inc.exited()?
        {
            let code = match inc.ended {
                Some(Ending::Exited(code)) => code,
                _ => None,
            };
            self.unexpected_exits.push(code);
            self.start()?;
        }
        Ok(())
    }

    /// SIGKILLs the current incarnation.
    pub async fn kill(&mut self) -> Result<()> {
        if let Some(inc) = self.running() {
            inc.kill().await?;
            self.kills += 1;
        }
        Ok(())
    }

    /// SIGTERMs the current incarnation; whether it drained and exited 0.
    pub async fn terminate(&mut self, grace: Duration) -> Result<bool> {
        match self.running() {
            Some(inc) => inc.terminate(grace).await,
            None => Ok(false),
        }
    }

    /// For the record of a stall: the current incarnation's threads' stacks (`gdb -batch`), written
    /// to `<name>-<n>.stacks` in the run directory; a line saying why when gdb is missing or fails.
    pub fn dump_stacks(&mut self) -> String {
        let dir = self.spec.dir.clone();
        let name = self.spec.name.clone();
        let n = self.incarnations.len().saturating_sub(1);
        let Some(inc) = self.running() else { return "no incarnation running: no stacks".into() };
        let pid = inc.child.id().to_string();
        let path = dir.join(format!("{name}-{n}.stacks"));
        let out = Command::new("gdb")
            .args(["-p", &pid, "-batch", "-ex", "set pagination off", "-ex", "thread apply all bt"])
            .stdin(Stdio::null())
            .output();
        let o = match out {
            Ok(o) => o,
            Err(e) => return format!("no stacks of the stuck worker (gdb: {e})"),
        };
        // gdb's complaints (no ptrace permission, the process gone) go in the file too.
        if let Err(e) = std::fs::write(&path, [&o.stdout[..], &o.stderr[..]].concat()) {
            return format!("writing {}: {e}", path.display());
        }
        let how = if o.status.success() { "stacks" } else { "gdb failed (see its output); stacks" };
        format!("{how} of {name} incarnation {n} (pid {pid}) in {}", path.display())
    }

    /// Every journal entry of every incarnation, with the incarnation's index.
    pub fn journals(&self) -> Result<Vec<(usize, JournalEntry)>> {
        let mut out = Vec::new();
        for (n, inc) in self.incarnations.iter().enumerate() {
            out.extend(inc.journal()?.into_iter().map(|e| (n, e)));
        }
        Ok(out)
    }

    /// One counter summed over incarnations.
    pub fn stat(&self, name: &str) -> u64 {
        sum_stat(&self.incarnations, name)
    }
}
