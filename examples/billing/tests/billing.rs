//! The billing example as its README runs it, against the broker: orders charged across a SIGKILL,
//! resubmitted orders skipped by the dedup store, every order in the provider's ledger once.

use anyhow::{Context as _, Result};
use millrace_testkit::{Reaped, committed_to_end, create_topic, eventually, produce_raw, signal, unique, wait_exit};
use std::collections::BTreeSet;
use std::io::Read as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);
const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

/// The orders `ids`, keyed by customer, each with its order id as `idempotency-key`.
fn orders(ids: impl Iterator<Item = u64>) -> Vec<millrace_testkit::RawRecord> {
    ids.map(|i| {
        let customer = format!("customer-{}", i % 20);
        let value = format!(r#"{{"customer":"{customer}","amount_cents":{}}}"#, 100 + i);
        (
            Some(customer.into_bytes()),
            Some(value.into_bytes()),
            vec![("idempotency-key".into(), format!("order-{i}").into_bytes())],
        )
    })
    .collect()
}

fn ledger_keys(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    Ok(text.lines().map(|l| l.split(' ').next().unwrap_or_default().to_owned()).collect())
}

/// The example as a service (`--produce 0`), with the shipped billing.toml and this test's names
/// set through MILLRACE_* variables.
fn billing(dir: &Path, group: &str, topic: &str) -> Result<Reaped> {
    let child = Command::new(env!("CARGO_BIN_EXE_billing"))
        .args(["--produce", "0", "--ledger"])
        .arg(dir.join("ledger.txt"))
        .env("MILLRACE_GROUP_ID", group)
        .env("MILLRACE_TOPICS", format!(r#"["{topic}"]"#))
        .env("MILLRACE_COMMIT_INTERVAL", "100ms")
        .env("MILLRACE_DEDUP__DIR", dir.join("dedup"))
        // The killed instance's partitions move once the broker's session of it times out.
        .env("MILLRACE_CONSUMER_SESSION_TIMEOUT_MS", "6000")
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the billing example")?;
    Ok(Reaped(child))
}

/// The three counts of the example's closing line: charged, absorbed by the provider, skipped by
/// the store.
fn counts(output: &str) -> Result<(u64, u64, u64)> {
    let line = output.lines().find(|l| l.starts_with("charged ")).context(format!("no closing line in {output}"))?;
    let n: Vec<u64> = line.split(' ').filter_map(|w| w.parse().ok()).collect();
    Ok((n[0], n[1], n[2]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_is_charged_once_across_a_sigkill_and_resubmissions() -> Result<()> {
    let (topic, group) = (unique("billing-orders"), unique("billing"));
    let dir = std::env::temp_dir().join(unique("billing-example"));
    create_topic(&topic, 4).await?;
    produce_raw(&topic, orders(0..400)).await?;

    let mut first = billing(&dir, &group, &topic)?;
    let ledger = dir.join("ledger.txt");
    eventually("the first instance to charge 100 orders", TIMEOUT, || {
        Ok((ledger_keys(&ledger)?.len() >= 100).then_some(()))
    })
    .await?;
    signal(&first, SIGKILL)?;
    wait_exit(&mut first, TIMEOUT).await?;
    let charged_before_kill = ledger_keys(&ledger)?.len() as u64;

    // The order service resubmits 100 orders (a client retried) and sends 200 new ones.
    produce_raw(&topic, orders((0..100).chain(400..600))).await?;
    let mut second = billing(&dir, &group, &topic)?;
    eventually("all 600 orders in the ledger", TIMEOUT, || Ok((ledger_keys(&ledger)?.len() >= 600).then_some(())))
        .await?;
    committed_to_end(&group, &topic, 4, TIMEOUT).await?;
    signal(&second, SIGTERM)?;
    assert!(wait_exit(&mut second, TIMEOUT).await?.success(), "the second instance exits cleanly on SIGTERM");
    let mut output = String::new();
    second.stdout.take().context("stdout")?.read_to_string(&mut output)?;

    // Every order once: the ledger holds exactly the 600 order ids (the store's keys came from the
    // header; a resubmission charged under another key would add a line).
    let keys = ledger_keys(&ledger)?;
    let expected: BTreeSet<String> = (0..600).map(|i| format!("order-{i}")).collect();
    assert_eq!(keys.len(), 600, "one ledger line per order");
    assert_eq!(keys.into_iter().collect::<BTreeSet<_>>(), expected);
    println!("second instance: {output}");
    let (charged, absorbed, skipped) = counts(&output)?;
    assert_eq!(charged_before_kill + charged, 600, "{output}");
    // Redeliveries of what the first instance charged are skipped by the store, except those in
    // flight when it was killed (at most max_concurrency = 32, billing.toml), charged but not yet
    // recorded: the provider's idempotency key absorbs them. Each resubmission follows its original
    // in the customer's lane, so the store has the key by then: all 100 are skipped.
    assert!(absorbed <= 32, "{absorbed} repeats reached the provider: more than were in flight ({output})");
    assert!(skipped >= 100, "{skipped} skipped by the store, fewer than the 100 resubmissions ({output})");
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
