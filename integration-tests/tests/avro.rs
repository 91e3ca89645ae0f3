//! Avro with a schema registry, end to end against the broker: Avro orders in, Avro payments out;
//! schema evolution in both directions through the registry; the Avro poison corpus in the DLQ once
//! each with its bytes untouched and its schema id; a registry outage retried, not dead-lettered;
//! schema lookups cached; basic auth sent.
//!
//! The registry is `SCHEMA_REGISTRY_URL` when it is set (any Confluent-compatible registry), else the
//! in-process test double `millrace-registry-double` (see `docs/schema-registry.md` for why). The
//! outage, cache and auth tests need to control or count the registry, so they always use the double.

use anyhow::Result;
use millrace::codec::avro::{Avro, SubjectStrategy};
use millrace::codec::schema_registry::{SchemaRegistry, SchemaRegistryConfig, URL_ENV, wire};
use millrace::codec::{CodecError, Decode, Encode};
use millrace::dlq::{self, DlqErrorKind, DlqInfo};
use millrace::typed::{EmitEncoded, Typed, TypedProcessor};
use millrace::{Context, Pipeline, PipelineConfig, ProcessError, ProcessingOrder, Record, RetryPolicy};
use millrace_integration_tests::*;
use millrace_registry_double::RegistryDouble;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::watch;

const ORDER_V1: &str = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "amount_cents", "type": "long"},
    {"name": "note", "type": "string", "default": ""}]}"#;
/// V1 with `note` removed and `currency` added, both with defaults: compatible both ways.
const ORDER_V2: &str = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "amount_cents", "type": "long"},
    {"name": "currency", "type": "string", "default": "EUR"}]}"#;
/// Same name, but `id` is a string: a reader of V1 cannot resolve it.
const ORDER_INCOMPATIBLE: &str = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "string"}]}"#;
const PAYMENT: &str = r#"{"type": "record", "name": "Payment", "namespace": "shop", "fields": [
    {"name": "order", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "amount_cents", "type": "long"}]}"#;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct OrderV1 {
    id: i64,
    customer: String,
    amount_cents: i64,
    note: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct OrderV2 {
    id: i64,
    customer: String,
    amount_cents: i64,
    currency: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Payment {
    order: i64,
    customer: String,
    amount_cents: i64,
}

fn v1(id: i64) -> OrderV1 {
    OrderV1 { id, customer: format!("c{}", id % 5), amount_cents: id * 100, note: format!("note {id}") }
}

fn v2(id: i64) -> OrderV2 {
    OrderV2 { id, customer: format!("c{}", id % 5), amount_cents: id * 100, currency: "SEK".into() }
}

/// The registry for tests that need no control over it: `SCHEMA_REGISTRY_URL` or a fresh double
/// (kept alive by the returned guard).
async fn registry() -> Result<(SchemaRegistry, Option<RegistryDouble>)> {
    if let Ok(url) = std::env::var(URL_ENV) {
        return Ok((SchemaRegistry::new(SchemaRegistryConfig::new(url))?, None));
    }
    let double = RegistryDouble::start().await?;
    Ok((SchemaRegistry::new(SchemaRegistryConfig::new(double.url()))?, Some(double)))
}

/// Encodes `value` for `topic` with `codec` (registering its schema) as a record to produce.
async fn avro_record<T: Serialize + Sync>(codec: &Avro, topic: &str, key: &str, value: &T) -> Result<RawRecord> {
    let bytes = codec.encode(topic, value).await?;
    Ok((Some(key.as_bytes().to_vec()), Some(bytes), vec![]))
}

/// Decodes orders, emits an Avro payment for each.
struct Billing {
    payments_topic: String,
    payments: Avro,
    seen: watch::Sender<Vec<i64>>,
}

impl TypedProcessor for Billing {
    type Input = OrderV2;

    async fn process(&self, order: OrderV2, _record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let payment = Payment { order: order.id, customer: order.customer.clone(), amount_cents: order.amount_cents };
        ctx.emit_encoded(&self.payments, &self.payments_topic, Some(order.customer.into_bytes()), &payment).await?;
        self.seen.send_modify(|v| v.push(order.id));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_orders_become_avro_payments() -> Result<()> {
    init_logs();
    let (registry, _double) = registry().await?;
    let (orders, payments) = (unique("avro-orders"), unique("avro-payments"));
    create_topic(&orders, 2).await?;
    create_topic(&payments, 2).await?;
    let order_codec = Avro::new(&registry, ORDER_V2)?;
    let mut records = Vec::new();
    for id in 1..=30 {
        records.push(avro_record(&order_codec, &orders, &format!("c{}", id % 5), &v2(id)).await?);
    }
    produce_raw(&orders, records).await?;

    let payment_codec = Avro::new(&registry, PAYMENT)?.subject_strategy(SubjectStrategy::TopicRecordName)?;
    assert_eq!(payment_codec.subject(&payments), format!("{payments}-shop.Payment"));
    let (tx, mut seen) = watch::channel(Vec::new());
    let billing = Billing { payments_topic: payments.clone(), payments: payment_codec.clone(), seen: tx };
    let config = PipelineConfig::new(bootstrap(), unique("avro-billing"), [&orders]);
    let pipeline = Pipeline::new(config, Typed::new(billing, order_codec))?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    tokio::time::timeout(Duration::from_secs(60), seen.wait_for(|v| v.len() >= 30)).await??;
    stop.cancel();
    run.await??;
    assert_eq!(stats.snapshot().dead_lettered, 0);

    // The payments are Avro in the wire format, readable by any consumer of the registry.
    let mut out = Vec::new();
    for r in read_topic(&payments)? {
        let bytes = r.value.as_deref().expect("a value");
        assert!(wire::schema_id(bytes).is_some(), "wire-format header");
        let p: Payment = payment_codec.decode(Some(bytes)).await?;
        assert_eq!(r.key.as_deref(), Some(p.customer.as_bytes()));
        out.push(p);
    }
    out.sort_by_key(|p| p.order);
    let expected: Vec<Payment> =
        (1..=30).map(|i| Payment { order: i, customer: format!("c{}", i % 5), amount_cents: i * 100 }).collect();
    assert_eq!(out, expected);
    Ok(())
}

/// Collects every decoded value.
struct Collect<T> {
    seen: watch::Sender<Vec<T>>,
}

impl<T: Send + Sync + 'static> TypedProcessor for Collect<T> {
    type Input = T;

    async fn process(&self, value: T, _record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        self.seen.send_modify(|v| v.push(value));
        Ok(())
    }

    fn name(&self) -> &str {
        "Collect"
    }
}

/// Runs a `Collect<T>` pipeline over `topic` with `codec` until `n` values arrived; returns them.
async fn collect<T>(topic: &str, codec: Avro, n: usize) -> Result<Vec<T>>
where
    T: serde::de::DeserializeOwned + Clone + Send + Sync + 'static,
{
    let (tx, mut seen) = watch::channel(Vec::new());
    let config = PipelineConfig::new(bootstrap(), unique("avro-collect"), [topic]).ordering(ProcessingOrder::Partition);
    let pipeline = Pipeline::new(config, Typed::new(Collect { seen: tx }, codec))?;
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());
    tokio::time::timeout(Duration::from_secs(60), seen.wait_for(|v| v.len() >= n)).await??;
    stop.cancel();
    run.await??;
    let values = seen.borrow().clone();
    Ok(values)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_evolution_works_in_both_directions() -> Result<()> {
    init_logs();
    let (registry, _double) = registry().await?;
    let topic = unique("avro-evolution");
    create_topic(&topic, 1).await?;
    // Old producers (V1) and new producers (V2) write to the same topic and subject.
    let (old, new) = (Avro::new(&registry, ORDER_V1)?, Avro::new(&registry, ORDER_V2)?);
    let mut records = Vec::new();
    for id in 1..=10 {
        records.push(avro_record(&old, &topic, "k", &v1(id)).await?);
        records.push(avro_record(&new, &topic, "k", &v2(id + 100)).await?);
    }
    let (id_v1, id_v2) =
        (wire::schema_id(records[0].1.as_ref().unwrap()), wire::schema_id(records[1].1.as_ref().unwrap()));
    assert_ne!(id_v1, id_v2, "the two versions have their own ids");
    produce_raw(&topic, records).await?;

    // A new reader: V1 records lose `note` and get the default currency.
    let read: Vec<OrderV2> = collect(&topic, Avro::new(&registry, ORDER_V2)?, 20).await?;
    let mut expected = Vec::new();
    for id in 1..=10 {
        expected.push(OrderV2 { currency: "EUR".into(), ..v2(id) });
        expected.push(v2(id + 100));
    }
    assert_eq!(read, expected);

    // An old reader: V2 records lose `currency` and get the default (empty) note.
    let read: Vec<OrderV1> = collect(&topic, Avro::new(&registry, ORDER_V1)?, 20).await?;
    let mut expected = Vec::new();
    for id in 1..=10 {
        expected.push(v1(id));
        expected.push(OrderV1 { note: String::new(), ..v1(id + 100) });
    }
    assert_eq!(read, expected);
    Ok(())
}

/// A poison record: case name, value, the schema id expected in the DLQ header.
type PoisonCase = (&'static str, Option<Vec<u8>>, Option<u32>);

/// Counts what it processed; Avro orders (V1 reader).
struct Orders {
    seen: watch::Sender<Vec<i64>>,
}

impl TypedProcessor for Orders {
    type Input = OrderV1;

    async fn process(&self, order: OrderV1, _record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        self.seen.send_modify(|v| v.push(order.id));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_poison_corpus_lands_in_the_dlq_once_with_bytes_and_schema_id() -> Result<()> {
    init_logs();
    let (registry, _double) = registry().await?;
    let topic = unique("avro-poison");
    let group = unique("avro-poison-group");
    create_topic(&topic, 1).await?;
    let codec = Avro::new(&registry, ORDER_V1)?;
    let good = codec.encode(&topic, &v1(1)).await?;
    let (id, body) = wire::split(&good)?;
    let incompatible = Avro::new(&registry, ORDER_INCOMPATIBLE)?
        .subject_strategy(SubjectStrategy::TopicRecordName)? // its own subject: no compatibility clash
        .encode(&topic, &serde_json::json!({"id": "seven"}))
        .await?;
    let unknown_id = 0x7fff_0000u32;
    let mut wrong_magic = good.clone();
    wrong_magic[0] = 1;
    let mut trailing = good.clone();
    trailing.extend_from_slice(b"garbage");
    let cases: Vec<PoisonCase> = vec![
        ("wrong-magic-byte", Some(wrong_magic), None),
        ("json-not-avro", Some(br#"{"id": 1}"#.to_vec()), None),
        ("unknown-schema-id", Some(wire::frame(unknown_id, body)), Some(unknown_id)),
        ("truncated-body", Some(good[..good.len() - 3].to_vec()), Some(id)),
        ("header-only", Some(wire::frame(id, &[])), Some(id)),
        ("too-short", Some(vec![0, 0, 1]), None),
        ("trailing-bytes", Some(trailing), Some(id)),
        ("body-of-another-schema", Some(wire::frame(id, &[0x02, b'x', 0xff, 0xff, 0xff, 0xff, 0x0f])), Some(id)),
        ("incompatible-writer-schema", Some(incompatible.clone()), wire::schema_id(&incompatible)),
        ("empty-value", Some(Vec::new()), None),
        ("null-value", None, None),
    ];
    let mut records = Vec::new();
    let mut next = 0;
    for (case, value, _) in &cases {
        for _ in 0..3 {
            next += 1;
            records.push(avro_record(&codec, &topic, &format!("good-{next}"), &v1(next)).await?);
        }
        records.push((
            Some(format!("poison-{case}").into_bytes()),
            value.clone(),
            vec![("case".into(), case.as_bytes().to_vec())],
        ));
    }
    produce_raw(&topic, records).await?;

    let (tx, mut seen) = watch::channel(Vec::new());
    let config = PipelineConfig::new(bootstrap(), &group, [&topic]).ordering(ProcessingOrder::Partition);
    let pipeline = Pipeline::new(config, Typed::new(Orders { seen: tx }, codec))?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    tokio::time::timeout(Duration::from_secs(60), seen.wait_for(|v| v.len() >= next as usize)).await??;
    committed_to_end(&group, &topic, 1, Duration::from_secs(30)).await?;
    stop.cancel();
    run.await??;

    assert_eq!(*seen.borrow(), (1..=next).collect::<Vec<_>>(), "good records once each, in order");
    let s = stats.snapshot();
    assert_eq!((s.dead_lettered as usize, s.retries), (cases.len(), 0), "permanent: no retries");
    let dlq = read_topic(&format!("{topic}.dlq"))?;
    assert_eq!(dlq.len(), cases.len(), "each poison record in the DLQ exactly once");
    let by_case: HashMap<String, _> =
        dlq.iter().map(|r| (String::from_utf8(r.headers.get("case").unwrap().to_vec()).unwrap(), r)).collect();
    for (case, value, schema_id) in &cases {
        let r = by_case.get(*case).unwrap_or_else(|| panic!("{case} missing from the DLQ"));
        assert_eq!(&r.value, value, "{case}: bytes untouched");
        let info = DlqInfo::from_headers(&r.headers).unwrap();
        assert_eq!((info.kind, info.attempts), (DlqErrorKind::Decode, 1), "{case}");
        assert_eq!(dlq::schema_id(&r.headers), *schema_id, "{case}: schema id header");
        println!("{case}: {}", info.message);
    }
    let message = |case: &str| DlqInfo::from_headers(&by_case[case].headers).unwrap().message;
    assert!(message("wrong-magic-byte").contains("magic byte is 0x01"), "{}", message("wrong-magic-byte"));
    assert!(message("unknown-schema-id").contains(&format!("schema id {unknown_id} is unknown")));
    assert!(message("trailing-bytes").contains("7 of"), "{}", message("trailing-bytes"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_outage_is_retried_not_dead_lettered() -> Result<()> {
    init_logs();
    let double = RegistryDouble::start().await?;
    let writer = SchemaRegistry::new(SchemaRegistryConfig::new(double.url()))?;
    let topic = unique("avro-outage");
    create_topic(&topic, 1).await?;
    let codec = Avro::new(&writer, ORDER_V1)?;
    let mut records = Vec::new();
    for id in 1..=5 {
        records.push(avro_record(&codec, &topic, "k", &v1(id)).await?);
    }
    produce_raw(&topic, records).await?;

    // A fresh client (nothing cached) while the registry is down.
    double.set_available(false);
    let reader = SchemaRegistry::new(SchemaRegistryConfig::new(double.url()).timeout(Duration::from_secs(2)))?;
    let (tx, mut seen) = watch::channel(Vec::new());
    let policy = RetryPolicy {
        max_attempts: 1000,
        base_delay: Duration::from_millis(50),
        max_delay: Duration::from_millis(200),
    };
    let config = PipelineConfig::new(bootstrap(), unique("avro-outage-group"), [&topic])
        .ordering(ProcessingOrder::Partition)
        .retry(policy);
    let pipeline = Pipeline::new(config, Typed::new(Orders { seen: tx }, Avro::new(&reader, ORDER_V1)?))?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    eventually("three retries during the outage", Duration::from_secs(60), || {
        Ok((stats.snapshot().retries >= 3).then_some(()))
    })
    .await?;
    assert!(seen.borrow().is_empty());
    double.set_available(true);
    tokio::time::timeout(Duration::from_secs(60), seen.wait_for(|v| v.len() >= 5)).await??;
    stop.cancel();
    run.await??;
    assert_eq!(*seen.borrow(), [1, 2, 3, 4, 5]);
    assert_eq!(stats.snapshot().dead_lettered, 0, "an outage is transient: nothing dead-lettered");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_lookups_are_cached_and_basic_auth_is_sent() -> Result<()> {
    init_logs();
    let double = RegistryDouble::start_with_auth("millrace", "s3cret").await?;
    let registry = SchemaRegistry::new(SchemaRegistryConfig::new(double.url()).basic_auth("millrace", "s3cret"))?;
    let codec = Avro::new(&registry, ORDER_V1)?;
    let mut encoded = Vec::new();
    for id in 0..100 {
        encoded.push(codec.encode("orders", &v1(id)).await?);
    }
    assert_eq!(double.requests(), 1, "one registration, then the subject's id is cached");
    for (id, bytes) in encoded.iter().enumerate() {
        let order: OrderV1 = codec.decode(Some(bytes)).await?;
        assert_eq!(order, v1(id as i64));
    }
    assert_eq!(double.schema_fetches(), 1, "one fetch of the writer schema, then cached");

    // Wrong credentials: the registry refuses, which is transient (the record would be retried).
    let wrong = SchemaRegistry::new(SchemaRegistryConfig::new(double.url()).basic_auth("millrace", "nope"))?;
    let err = Decode::<OrderV1>::decode(&Avro::new(&wrong, ORDER_V1)?, Some(&encoded[0])).await.unwrap_err();
    assert!(matches!(err, CodecError::RegistryUnavailable { .. }), "{err}");
    // An unknown id is permanent, and cached too.
    let unknown = wire::frame(999, &encoded[0][5..]);
    let err = Decode::<OrderV1>::decode(&codec, Some(&unknown)).await.unwrap_err();
    assert!(matches!(err, CodecError::UnknownSchema { id: 999 }), "{err}");
    let fetches = double.schema_fetches();
    assert!(Decode::<OrderV1>::decode(&codec, Some(&unknown)).await.is_err());
    assert_eq!(double.schema_fetches(), fetches, "the unknown id is not asked for again");
    Ok(())
}
