//! W3C trace context through Kafka: a `traceparent` on the input appears, with the same trace id and
//! this record's span as parent, on every output the processor emits; the DLQ record keeps the
//! input's own `traceparent` (so a replay continues the trace); a record without one starts none.
//! Both delivery modes.

use anyhow::Result;
use millrace::trace::{TRACEPARENT, TRACESTATE, TraceContext};
use millrace::{Context, ExactlyOnce, OutputRecord, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// (value, trace id the processor saw) per processed record.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// Forwards `ok` records to its output topic, fails `poison` ones permanently, and notes the trace
/// id it saw per value.
struct Forward {
    out: String,
    seen: Seen,
}

impl Processor for Forward {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let value = record.value_str().unwrap_or_default().to_owned();
        self.seen.lock().unwrap().push((value.clone(), ctx.trace().map(|t| t.trace_id().to_owned())));
        if value.starts_with("poison") {
            return Err(ProcessError::permanent("poison"));
        }
        ctx.emit(OutputRecord::to(&self.out).value(value)).await?;
        Ok(())
    }
}

async fn traces_reach_outputs_and_the_dlq(exactly_once: bool) -> Result<()> {
    init_logs();
    let (input, out) = (unique("traced-in"), unique("traced-out"));
    let group = unique("traced-group");
    create_topic(&input, 1).await?;
    create_topic(&out, 1).await?;
    let traced = vec![(TRACEPARENT.to_owned(), PARENT.as_bytes().to_vec()), (TRACESTATE.to_owned(), b"v=1".to_vec())];
    produce_raw(
        &input,
        [
            (None, Some(b"ok-traced".to_vec()), traced.clone()),
            (None, Some(b"poison-traced".to_vec()), traced.clone()),
            (None, Some(b"ok-plain".to_vec()), Vec::new()),
        ],
    )
    .await?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut config = PipelineConfig::new(bootstrap(), &group, [&input]).commit_interval(Duration::from_millis(100));
    if exactly_once {
        config = config.exactly_once(ExactlyOnce::default().transactional_id(format!("{group}-tx")));
    }
    let pipeline = Pipeline::new(config, Forward { out: out.clone(), seen: seen.clone() })?;
    let (stop, stats) = (pipeline.shutdown_token(), pipeline.stats());
    let run = tokio::spawn(pipeline.run());
    eventually("every record finished and committed", Duration::from_secs(60), || {
        Ok((committed_offsets(&group, &input, 1)?.get(&0) == Some(&3)).then_some(()))
    })
    .await?;
    stop.cancel();
    run.await??;
    assert_eq!((stats.snapshot().processed, stats.snapshot().dead_lettered), (2, 1));

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let seen = seen.lock().unwrap().clone();
    assert!(seen.contains(&("ok-traced".into(), Some(trace_id.into()))), "{seen:?}");
    assert!(seen.contains(&("ok-plain".into(), None)), "{seen:?}");

    let isolation = if exactly_once { Isolation::ReadCommitted } else { Isolation::ReadUncommitted };
    let outputs = read_topic_as(&out, isolation)?;
    let by_value = |v: &str| outputs.iter().find(|r| r.value.as_deref() == Some(v.as_bytes())).cloned();
    let traced_out = by_value("ok-traced").expect("the traced output");
    let parent = traced_out.headers.get(TRACEPARENT).expect("traceparent on the output");
    let out_ctx = TraceContext::parse(parent).expect("a valid traceparent");
    assert_eq!(out_ctx.trace_id(), trace_id, "same trace");
    assert_ne!(out_ctx.parent_id(), "00f067aa0ba902b7", "the record's own span is the parent");
    assert!(String::from_utf8_lossy(parent).ends_with("-01"), "sampled flag kept");
    assert_eq!(traced_out.headers.get(TRACESTATE), Some(&b"v=1"[..]), "tracestate kept");
    let plain_out = by_value("ok-plain").expect("the plain output");
    assert_eq!(plain_out.headers.get(TRACEPARENT), None, "no trace invented");

    let dlq = read_topic_as(&format!("{input}.dlq"), isolation)?;
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].headers.get(TRACEPARENT), Some(PARENT.as_bytes()), "the DLQ record keeps the input's trace");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_carries_the_trace() -> Result<()> {
    traces_reach_outputs_and_the_dlq(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_carries_the_trace() -> Result<()> {
    traces_reach_outputs_and_the_dlq(true).await
}
