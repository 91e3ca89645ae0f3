//! A typed JSON pipeline end to end: `Order` in, `Payment` out; records that do not decode never reach
//! the processor and land in the DLQ with kind `decode` and their bytes untouched.

use anyhow::Result;
use millrace::codec::Json;
use millrace::dlq::{DlqErrorKind, DlqInfo};
use millrace::typed::{Typed, TypedProcessor};
use millrace::{Context, Pipeline, PipelineConfig, ProcessError, Record};
use millrace_integration_tests::*;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[derive(Deserialize)]
struct Order {
    id: u64,
    amount_cents: u64,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Payment {
    order: u64,
    amount_cents: u64,
}

struct Billing {
    payments: String,
    calls: Arc<AtomicU64>,
}

impl TypedProcessor for Billing {
    type Input = Order;

    async fn process(&self, order: Order, _record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        self.calls.fetch_add(1, Relaxed);
        let payment = Payment { order: order.id, amount_cents: order.amount_cents };
        ctx.emit_json(&self.payments, Some(order.id.to_string().into_bytes()), &payment).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_orders_become_payments_and_undecodable_ones_go_to_the_dlq() -> Result<()> {
    init_logs();
    let (orders, payments) = (unique("typed-orders"), unique("typed-payments"));
    create_topic(&orders, 2).await?;
    create_topic(&payments, 2).await?;
    let good = (1..=20u64).map(|i| {
        (Some(vec![i as u8]), Some(format!(r#"{{"id":{i},"amount_cents":{}}}"#, i * 100).into_bytes()), vec![])
    });
    let bad: Vec<RawRecord> = vec![
        (Some(b"b1".to_vec()), Some(br#"{"id":"x","amount_cents":1}"#.to_vec()), vec![]),
        (Some(b"b2".to_vec()), Some(vec![0xff, 0x00]), vec![]),
        (Some(b"b3".to_vec()), None, vec![]),
        // The field values as an array: serde would take it for an `Order`, the `Json` codec does not.
        (Some(b"b4".to_vec()), Some(b"[21, 2100]".to_vec()), vec![]),
    ];
    produce_raw(&orders, good.chain(bad.clone())).await?;

    let calls = Arc::new(AtomicU64::new(0));
    let billing = Billing { payments: payments.clone(), calls: calls.clone() };
    let pipeline =
        Pipeline::new(PipelineConfig::new(bootstrap(), unique("typed-group"), [&orders]), Typed::new(billing, Json))?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    eventually("20 payments and 4 dead letters", Duration::from_secs(60), || {
        let s = stats.snapshot();
        Ok((s.processed == 20 && s.dead_lettered == 4).then_some(()))
    })
    .await?;
    stop.cancel();
    run.await??;

    assert_eq!(calls.load(Relaxed), 20, "undecodable records never reach the processor");
    let mut out: Vec<Payment> = read_topic(&payments)?
        .iter()
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap()))
        .collect::<Result<_, _>>()?;
    out.sort_by_key(|p| p.order);
    assert_eq!(out, (1..=20).map(|i| Payment { order: i, amount_cents: i * 100 }).collect::<Vec<_>>());
    let dlq = read_topic(&format!("{orders}.dlq"))?;
    assert_eq!(dlq.len(), 4);
    for r in &dlq {
        let info = DlqInfo::from_headers(&r.headers).unwrap();
        assert_eq!(info.kind, DlqErrorKind::Decode);
        assert_eq!(info.processor, "Billing");
        let original = bad.iter().find(|b| b.0 == r.key).expect("a known bad record");
        assert_eq!(r.value, original.1, "bytes untouched");
        if r.key.as_deref() == Some(b"b4") {
            assert!(info.message.contains("expected a JSON object for Order, found an array"), "{}", info.message);
        }
    }
    Ok(())
}
