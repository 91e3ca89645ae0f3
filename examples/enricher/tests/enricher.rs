//! The enricher example against the broker: SIGKILLed mid-stream with a transaction open, then
//! restarted; a read_committed reader of the output sees every order exactly once.

use anyhow::{Context as _, Result};
use millrace_testkit::{
    Isolation, Reaped, TopicReader, committed_to_end, create_topic, eventually, produce, read_topic_as, signal, unique,
    wait_exit,
};
use std::collections::BTreeMap;
use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);
const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

fn orders(ids: std::ops::Range<u64>) -> Vec<(String, Vec<u8>)> {
    ids.map(|i| {
        let customer = format!("customer-{}", i % 20);
        let value = format!(r#"{{"id":"order-{i}","customer":"{customer}","amount_cents":{}}}"#, 100 + i);
        (customer, value.into_bytes())
    })
    .collect()
}

/// The example as a service with the shipped enricher.toml; this test's names through variables.
fn enricher(group: &str, input: &str, output: &str) -> Result<Reaped> {
    let child = Command::new(env!("CARGO_BIN_EXE_enricher"))
        .args(["--produce", "0"])
        .env("MILLRACE_GROUP_ID", group)
        .env("MILLRACE_TOPICS", format!(r#"["{input}"]"#))
        .env("ENRICHER_OUTPUT_TOPIC", output)
        // The killed instance's partitions move once the broker's session of it times out.
        .env("MILLRACE_CONSUMER_SESSION_TIMEOUT_MS", "6000")
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the enricher example")?;
    Ok(Reaped(child))
}

/// How many times each order id appears in `records`.
fn ids(records: &[millrace_testkit::ReadRecord]) -> Result<BTreeMap<String, usize>> {
    let mut ids = BTreeMap::new();
    for r in records {
        let value: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap_or_default())?;
        *ids.entry(value["id"].as_str().context("an id")?.to_owned()).or_default() += 1;
    }
    Ok(ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_committed_reader_sees_each_order_once_across_a_sigkill() -> Result<()> {
    let (input, output, group) = (unique("enricher-orders"), unique("enricher-out"), unique("enricher"));
    create_topic(&input, 4).await?;
    create_topic(&output, 4).await?;
    produce(&input, orders(0..20_000)).await?;

    let mut first = enricher(&group, &input, &output)?;
    // Killed once some transactions committed and more were written since (uncommitted records
    // that read_uncommitted sees, in the transaction the kill leaves open).
    let reader = TopicReader::new(&output, Isolation::ReadUncommitted)?;
    let mut written = 0;
    eventually("the first instance to write 2000 outputs", TIMEOUT, || {
        written += reader.poll(Duration::from_millis(100))?.0.len();
        Ok((written >= 2000).then_some(()))
    })
    .await?;
    signal(&first, SIGKILL)?;
    wait_exit(&mut first, TIMEOUT).await?;

    let mut second = enricher(&group, &input, &output)?;
    committed_to_end(&group, &input, 4, TIMEOUT).await?;
    signal(&second, SIGTERM)?;
    assert!(wait_exit(&mut second, TIMEOUT).await?.success(), "the second instance exits cleanly on SIGTERM");
    let mut stdout = String::new();
    second.stdout.take().context("stdout")?.read_to_string(&mut stdout)?;
    assert!(stdout.contains("failed: 0"), "{stdout}");

    let committed = ids(&read_topic_as(&output, Isolation::ReadCommitted)?)?;
    let expected: BTreeMap<String, usize> = (0..20_000).map(|i| (format!("order-{i}"), 1)).collect();
    assert_eq!(committed, expected, "read_committed: every order exactly once");
    let all = read_topic_as(&output, Isolation::ReadUncommitted)?;
    // What read_committed hides: the aborted transaction's outputs, redone by the second instance.
    println!(
        "{} records in the output, {} of them in aborted transactions",
        all.len(),
        all.len().saturating_sub(20_000)
    );
    Ok(())
}
