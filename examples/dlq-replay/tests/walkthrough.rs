//! The operator's walkthrough as written (walkthrough.sh), against the broker: 20 of 200 orders
//! dead-lettered by version 1, replayed with `millrace dlq replay`, shipped by version 2, and every
//! order labelled exactly once.

use anyhow::{Context as _, Result, ensure};
use millrace_testkit::unique;
use std::path::PathBuf;
use std::process::Command;

/// The `millrace` CLI next to this example's binary (`scripts/test`, a workspace build, builds it).
fn millrace_cli() -> Result<PathBuf> {
    let shipping = PathBuf::from(env!("CARGO_BIN_EXE_shipping"));
    let cli = shipping.with_file_name("millrace");
    ensure!(
        cli.is_file(),
        "{} is missing: build it with `cargo build -p millrace-cli` (scripts/test does)",
        cli.display()
    );
    Ok(cli)
}

#[test]
fn the_walkthrough_dead_letters_replays_and_ships_every_order_once() -> Result<()> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/walkthrough.sh");
    let out = Command::new("bash")
        .arg(script)
        .env("SHIPPING", env!("CARGO_BIN_EXE_shipping"))
        .env("MILLRACE", millrace_cli()?)
        .env("SHIPPING_TOPIC", unique("shipping-orders"))
        .env("SHIPPING_LABELS_TOPIC", unique("shipping-labels"))
        .env("SHIPPING_GROUP", unique("shipping"))
        .output()
        .context("running walkthrough.sh")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    ensure!(out.status.success(), "walkthrough failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let step = |n: &str| stdout.split("\n## ").find(|s| s.starts_with(n)).map(str::to_owned).unwrap_or_default();
    assert!(step("2.").contains("shipped 180 orders, dead-lettered 20 to"), "version 1: {}", step("2."));
    assert!(step("3.").contains("20"), "the stats count 20 records: {}", step("3."));
    assert!(step("6.").contains("shipped 20 orders, dead-lettered 0 to"), "version 2: {}", step("6."));
    assert!(
        step("7.").contains("orders: 200, labelled: 200, labelled twice: 0, without a label: 0"),
        "check: {}",
        step("7.")
    );
    Ok(())
}
