//! The example as `scripts/demo outbox-orders` runs it, against PostgreSQL and the broker.

use anyhow::Result;
use std::process::Command;

#[test]
fn orders_and_their_events_reach_the_consumer_once_and_declined_payments_never() -> Result<()> {
    let dir = std::env::temp_dir().join(millrace_testkit::unique("outbox-orders"));
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-orders"))
        .args(["--orders", "300", "--topic", &millrace_testkit::unique("order-events"), "--dedup-dir"])
        .arg(&dir)
        .env("KAFKA_BOOTSTRAP_SERVERS", millrace_testkit::bootstrap())
        .env(
            "MILLRACE_POSTGRES_URL",
            std::env::var("MILLRACE_POSTGRES_URL")
                .unwrap_or_else(|_| "postgres://millrace@127.0.0.1:5432/millrace".into()),
        )
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("300 orders placed, 270 paid, 30 payments declined"), "{stdout}");
    assert!(stdout.contains("570 events of 300 orders"), "{stdout}");
    assert!(stdout.contains("270 orders shipped, 0 shipped twice, 0 declined payments published"), "{stdout}");
    Ok(())
}
