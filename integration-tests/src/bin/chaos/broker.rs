//! Restarting the broker: only the one `scripts/kafka` manages with this environment (the
//! developer's own, or the one `.ci/run` started), never a broker someone else runs.

use anyhow::{Context as _, Result, bail};
use millrace_integration_tests::bootstrap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn script() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/kafka"))
}

fn kafka(arg: &str) -> Result<bool> {
    Ok(Command::new("bash")
        .arg(script())
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("scripts/kafka {arg}"))?
        .success())
}

/// Why the broker may not be restarted by the harness, or `None` when it may: it must be the one
/// `scripts/kafka` runs with this environment (`KAFKA_PORT`, `KAFKA_DATA_DIR`), and the one
/// `KAFKA_BOOTSTRAP_SERVERS` names.
pub fn not_ours() -> Result<Option<String>> {
    let port = std::env::var("KAFKA_PORT").unwrap_or_else(|_| "9092".into());
    if bootstrap() != format!("127.0.0.1:{port}") {
        return Ok(Some(format!("the brokers at {} are not the scripts/kafka broker on port {port}", bootstrap())));
    }
    if !kafka("status")? {
        return Ok(Some(format!("no broker managed by scripts/kafka runs on port {port}")));
    }
    Ok(None)
}

fn data_dir() -> PathBuf {
    std::env::var_os("KAFKA_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/millrace/kafka-data"))
}

/// The broker's pid from `scripts/kafka`'s pid file, checked against the process's command line.
fn pid() -> Result<i32> {
    let dir = data_dir();
    let pid: i32 = std::fs::read_to_string(dir.join("broker.pid"))?.trim().parse()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline);
    let props = dir.join("server.properties");
    if !cmdline.contains("kafka.Kafka") || !cmdline.contains(props.to_string_lossy().as_ref()) {
        bail!("pid {pid} is not the scripts/kafka broker of {}", dir.display());
    }
    Ok(pid)
}

/// SIGKILLs the broker and waits until the process is gone.
pub fn kill() -> Result<()> {
    let pid = pid()?;
    if sigkill(pid) != 0 {
        bail!("kill -9 {pid}: {}", std::io::Error::last_os_error());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Stops the broker cleanly (`scripts/kafka down`: SIGTERM, controlled shutdown).
pub fn down() -> Result<()> {
    if !kafka("down")? {
        bail!("scripts/kafka down failed");
    }
    Ok(())
}

/// Starts it again and waits until it answers (`scripts/kafka up`).
pub fn up() -> Result<()> {
    if !kafka("up")? {
        bail!("scripts/kafka up failed");
    }
    Ok(())
}

#[allow(unsafe_code)]
fn sigkill(pid: i32) -> i32 {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid, libc::SIGKILL) }
}
