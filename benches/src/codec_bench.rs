//! `codec`: decode + encode throughput of the JSON and Avro codecs on ~1 KB records, in process (no
//! broker). The Avro codec's schema is registered and fetched once before the clock starts, so the
//! figures are the cached path every record after the first takes.
//!
//! The registry is `SCHEMA_REGISTRY_URL` when set, else the in-process test double
//! `millrace-registry-double` (only the two first lookups touch it).
//!
//! One operation = decode one record's value into the typed struct, then encode that struct again
//! (what a typed processor that re-emits its input costs). The codecs run interleaved (JSON, Avro,
//! JSON, …) for `--rounds` rounds; medians and ranges are printed.

use anyhow::Result;
use clap::Args;
use millrace::codec::avro::Avro;
use millrace::codec::schema_registry::{SchemaRegistry, SchemaRegistryConfig, URL_ENV};
use millrace::codec::{Decode, Encode, Json};
use millrace_registry_double::RegistryDouble;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Options of `codec`.
#[derive(Debug, Args)]
pub struct CodecArgs {
    /// Decode+encode operations per codec per round [default: 200000, 20000 with --quick].
    #[arg(long)]
    ops: Option<u64>,
    /// Rounds, interleaved JSON/Avro [default: 5, 1 with --quick].
    #[arg(long)]
    rounds: Option<u32>,
    /// A smoke run small enough for CI.
    #[arg(long)]
    quick: bool,
}

const ORDER_SCHEMA: &str = r#"{"type": "record", "name": "BenchOrder", "namespace": "bench", "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "created_at", "type": "long"},
    {"name": "currency", "type": "string"},
    {"name": "amount_cents", "type": "long"},
    {"name": "paid", "type": "boolean"},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
        {"name": "sku", "type": "string"},
        {"name": "title", "type": "string"},
        {"name": "quantity", "type": "int"},
        {"name": "price_cents", "type": "long"}]}}}]}"#;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct BenchOrder {
    id: i64,
    customer: String,
    created_at: i64,
    currency: String,
    amount_cents: i64,
    paid: bool,
    note: Option<String>,
    lines: Vec<Line>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Line {
    sku: String,
    title: String,
    quantity: i32,
    price_cents: i64,
}

/// A record whose JSON encoding is about 1 KB.
fn order() -> BenchOrder {
    let lines = (0..8)
        .map(|i| Line {
            sku: format!("SKU-{:08}", 1000 + i),
            title: format!("Stainless steel widget, model {i}, pack of 12"),
            quantity: 1 + i,
            price_cents: 1999 + i64::from(i) * 100,
        })
        .collect();
    BenchOrder {
        id: 1_234_567,
        customer: "customer-000042".into(),
        created_at: 1_764_547_200_000,
        currency: "EUR".into(),
        amount_cents: 123_456,
        paid: true,
        note: Some("Leave the parcel at the back door, please.".into()),
        lines,
    }
}

async fn ops<C>(codec: &C, value: &[u8], n: u64) -> Result<Duration>
where
    C: Decode<BenchOrder> + Encode<BenchOrder>,
{
    let started = Instant::now();
    for _ in 0..n {
        let decoded: BenchOrder = codec.decode(Some(value)).await?;
        let encoded = codec.encode("bench-orders", &decoded).await?;
        std::hint::black_box(encoded);
    }
    Ok(started.elapsed())
}

/// Decode-only and encode-only time of `n` operations, to show where the time goes.
async fn split<C>(codec: &C, value: &[u8], n: u64) -> Result<(Duration, Duration)>
where
    C: Decode<BenchOrder> + Encode<BenchOrder>,
{
    let decoded: BenchOrder = codec.decode(Some(value)).await?;
    let started = Instant::now();
    for _ in 0..n {
        std::hint::black_box(Decode::<BenchOrder>::decode(codec, Some(value)).await?);
    }
    let decode = started.elapsed();
    let started = Instant::now();
    for _ in 0..n {
        std::hint::black_box(codec.encode("bench-orders", &decoded).await?);
    }
    Ok((decode, started.elapsed()))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the benchmark and prints its table.
pub async fn run(args: CodecArgs) -> Result<()> {
    let n = args.ops.unwrap_or(if args.quick { 20_000 } else { 200_000 });
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 5 }).max(1);
    let (registry, _double) = match std::env::var(URL_ENV) {
        Ok(url) => (SchemaRegistry::new(SchemaRegistryConfig::new(url))?, None),
        Err(_) => {
            let double = RegistryDouble::start().await?;
            (SchemaRegistry::new(SchemaRegistryConfig::new(double.url()))?, Some(double))
        }
    };
    let avro = Avro::new(&registry, ORDER_SCHEMA)?;
    let value = order();
    let json_bytes = Json.encode("bench-orders", &value).await?;
    let avro_bytes = avro.encode("bench-orders", &value).await?; // registers the schema
    let back: BenchOrder = avro.decode(Some(&avro_bytes)).await?; // fetches the writer schema
    anyhow::ensure!(back == value, "Avro round trip changed the record");
    println!(
        "codec: decode+encode of one record, {n} operations per codec per round, {rounds} rounds interleaved; \
         value size JSON {} B, Avro {} B (5-byte header included)",
        json_bytes.len(),
        avro_bytes.len()
    );
    let (mut json_rates, mut avro_rates) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let j = ops(&Json, &json_bytes, n).await?;
        let a = ops(&avro, &avro_bytes, n).await?;
        let (jr, ar) = (n as f64 / j.as_secs_f64(), n as f64 / a.as_secs_f64());
        println!("  round {round}: json {jr:>10.0} ops/s   avro {ar:>10.0} ops/s");
        json_rates.push(jr);
        avro_rates.push(ar);
    }
    for (name, rates, bytes) in
        [("json", &mut json_rates, json_bytes.len()), ("avro", &mut avro_rates, avro_bytes.len())]
    {
        let (lo, hi) = (rates.iter().copied().fold(f64::MAX, f64::min), rates.iter().copied().fold(0.0, f64::max));
        let m = median(rates);
        println!(
            "{name}: median {m:.0} decode+encode/s (range {lo:.0}-{hi:.0}), {:.1} µs per record, {:.0} MB/s of values",
            1e6 / m,
            m * bytes as f64 / 1e6
        );
    }
    println!("avro / json: {:.2}", median(&mut avro_rates) / median(&mut json_rates));
    for (name, (d, e)) in [("json", split(&Json, &json_bytes, n).await?), ("avro", split(&avro, &avro_bytes, n).await?)]
    {
        let us = |t: Duration| t.as_secs_f64() * 1e6 / n as f64;
        println!("{name}: decode alone {:.1} µs, encode alone {:.1} µs per record", us(d), us(e));
    }
    Ok(())
}
