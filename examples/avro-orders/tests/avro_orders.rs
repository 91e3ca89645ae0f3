//! The avro-orders example against the broker (and the registry double it starts): both schema
//! versions decode into one type, payments go out, and the record that is not Avro is in the DLQ
//! with its bytes intact and kind `decode`.

use anyhow::{Context as _, Result};
use millrace_testkit::{read_topic, record_count, unique};
use std::process::Command;

#[test]
fn both_schema_versions_decode_and_the_malformed_record_is_dead_lettered_intact() -> Result<()> {
    let (orders, payments) = (unique("avro-orders"), unique("avro-payments"));
    let out = Command::new(env!("CARGO_BIN_EXE_avro-orders"))
        .args(["--orders", "200"])
        .env("AVRO_ORDERS_TOPIC", &orders)
        .env("AVRO_PAYMENTS_TOPIC", &payments)
        .env("AVRO_ORDERS_GROUP", unique("avro-orders"))
        .env_remove("SCHEMA_REGISTRY_URL")
        .output()
        .context("running avro-orders")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // Orders 100..199 were written with v2, a coupon on the even ones.
    assert!(stdout.contains("decoded 200 orders into one type (50 with a coupon), 200 payments"), "{stdout}");
    assert!(stdout.contains("dead-lettered 1 (kind decode"), "{stdout}");
    assert!(stdout.contains("failed: 0; drained on stop: true"), "{stdout}");
    assert_eq!(record_count(&millrace_testkit::bootstrap(), &payments, 4)?, 200);

    let dlq = read_topic(&format!("{orders}.dlq"))?;
    assert_eq!(dlq.len(), 1, "one record in the DLQ");
    assert_eq!(dlq[0].value.as_deref(), Some(&b"{\"id\": 1, \"note\": \"JSON, not Avro\"}"[..]), "bytes intact");
    assert_eq!(dlq[0].headers.get("millrace.error.kind"), Some(&b"decode"[..]));
    Ok(())
}
