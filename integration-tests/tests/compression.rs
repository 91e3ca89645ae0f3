//! Every compression codec Kafka has, both ways: input written by Kafka's own console producer (the
//! Java client) with gzip, snappy, lz4 or zstd is consumed, and a pipeline producing its outputs
//! with the same `compression.type` gets them stored that way. The broker's log segments (read with
//! Kafka's `DumpLogSegments`) show the codec on both sides, so neither half can pass uncompressed.

use anyhow::Result;
use millrace::{Context, ExactlyOnce, OutputRecord, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use std::collections::BTreeSet;
use std::time::Duration;

/// Copies every record, key and value, to its output topic.
struct Copy(String);

impl Processor for Copy {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let mut out = OutputRecord::to(&self.0).value(record.value.clone().unwrap_or_default());
        if let Some(key) = &record.key {
            out = out.key(key.clone());
        }
        ctx.emit(out).await?;
        Ok(())
    }
}

/// Writes 60 records with `codec` from the Java client, copies them with a pipeline whose producer
/// compresses with `codec`, and checks the copies (same keys and values, same order) and the codec
/// the broker stored on both topics.
async fn round_trip(codec: &str, exactly_once: bool) -> Result<()> {
    init_logs();
    let (input, out, group) = (unique(&format!("{codec}-in")), unique(&format!("{codec}-out")), unique("codec-group"));
    create_topic(&input, 1).await?;
    create_topic(&out, 1).await?;
    let records: Vec<(String, String)> =
        (0..60).map(|i| (format!("k{}", i % 7), format!("{codec}-value-{i}"))).collect();
    console_produce(&input, codec, &records)?;
    assert_eq!(stored_codecs(&input, 0)?, BTreeSet::from([codec.to_owned()]), "the Java client compressed");

    let mut config = PipelineConfig::new(bootstrap(), &group, [&input])
        .commit_interval(Duration::from_millis(100))
        .producer_property("compression.type", codec);
    if exactly_once {
        config = config.exactly_once(ExactlyOnce::default().transactional_id(format!("{group}-tx")));
    }
    let pipeline = Pipeline::new(config, Copy(out.clone()))?;
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());
    committed_to_end(&group, &input, 1, Duration::from_secs(60)).await?;
    stop.cancel();
    run.await??;

    let isolation = if exactly_once { Isolation::ReadCommitted } else { Isolation::ReadUncommitted };
    let copies: Vec<(String, String)> = read_topic_as(&out, isolation)?
        .into_iter()
        .map(|r| {
            let text = |b: Option<Vec<u8>>| String::from_utf8_lossy(&b.unwrap_or_default()).into_owned();
            (text(r.key), text(r.value))
        })
        .collect();
    assert_eq!(copies, records, "every {codec} record copied once, in order");
    assert_eq!(stored_codecs(&out, 0)?, BTreeSet::from([codec.to_owned()]), "the pipeline compressed");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_in_and_out() -> Result<()> {
    round_trip("gzip", false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snappy_in_and_out_exactly_once() -> Result<()> {
    round_trip("snappy", true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lz4_in_and_out() -> Result<()> {
    round_trip("lz4", false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_in_and_out_exactly_once() -> Result<()> {
    round_trip("zstd", true).await
}
