//! Kafka's own command-line tools (Java), run through `scripts/kafka tool` from the local broker's
//! distribution: the ACL command, the console producer, and the log-segment dumper that shows how
//! the broker stored a batch. Each start is a JVM: about two seconds.

use anyhow::{Context as _, Result, ensure};
use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The local broker's data directory (`$KAFKA_DATA_DIR`, default `~/.cache/millrace/kafka-data`),
/// which holds its log directories and the test CA (see `scripts/kafka`).
pub fn data_dir() -> PathBuf {
    std::env::var_os("KAFKA_DATA_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/millrace/kafka-data")
    })
}

/// Runs the Java class `class` of the broker's distribution with `args`, feeding it `stdin`;
/// returns its standard output, or an error with both outputs if it exits non-zero.
pub fn kafka_tool(class: &str, args: &[&str], stdin: &[u8]) -> Result<String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/kafka");
    let mut child = Command::new(script)
        .arg("tool")
        .arg(class)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {class}"))?;
    child.stdin.take().context("the tool's stdin")?.write_all(stdin)?;
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "{class} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Writes `records` (key, value; neither may contain `:` or a newline) to `topic` with Kafka's
/// console producer (the Java client) compressing with `codec` (`gzip`, `snappy`, `lz4`, `zstd`).
pub fn console_produce(topic: &str, codec: &str, records: &[(String, String)]) -> Result<()> {
    let lines: String = records.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let args = [
        "--bootstrap-server",
        &crate::bootstrap(),
        "--topic",
        topic,
        "--compression-codec",
        codec,
        "--reader-property",
        "parse.key=true",
        "--reader-property",
        "key.separator=:",
    ];
    kafka_tool("org.apache.kafka.tools.ConsoleProducer", &args, lines.as_bytes()).map(drop)
}

/// The compression codecs of the batches the broker stored in the first segment of `topic`'s
/// `partition` (read with Kafka's `DumpLogSegments`), e.g. `{"zstd"}`.
pub fn stored_codecs(topic: &str, partition: i32) -> Result<BTreeSet<String>> {
    let segment = data_dir().join("kraft-logs").join(format!("{topic}-{partition}")).join("00000000000000000000.log");
    let segment = segment.display().to_string();
    let dump = kafka_tool("org.apache.kafka.tools.DumpLogSegments", &["--files", &segment], b"")?;
    let codecs: BTreeSet<String> = dump
        .lines()
        .filter(|l| l.contains(" isControl: false"))
        .filter_map(|l| l.split(" compresscodec: ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    ensure!(!codecs.is_empty(), "no data batch in {segment}: {dump}");
    Ok(codecs)
}
