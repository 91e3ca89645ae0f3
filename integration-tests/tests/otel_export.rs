//! OTLP export (the `otel` feature) end to end through Kafka: the span of a record whose input
//! carries a `traceparent` reaches an OTLP/HTTP receiver as a child of that remote span, in the same
//! trace, and the record's output names the exported span as its parent; a record without one is
//! exported as a root span and its output carries no `traceparent`.
//!
//! The receiver is a double: an OpenTelemetry Collector (or Jaeger, Tempo) cannot be installed on
//! this machine (none is packaged for Debian, PyPI, npm or Maven Central). It decodes the real OTLP
//! protobuf messages (`opentelemetry-proto`) that the real exporter sends over HTTP.

use anyhow::{Context as _, Result};
use axum::body::Bytes;
use millrace::trace::{TRACEPARENT, TraceContext};
use millrace::{Context, OutputRecord, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing_subscriber::{Layer as _, filter::Targets, layer::SubscriberExt as _, util::SubscriberInitExt as _};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// A span as the receiver got it.
#[derive(Debug, Clone)]
struct Received {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    offset: Option<i64>,
    service: Option<String>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Starts the OTLP/HTTP receiver double; returns its traces URL and what it received.
async fn receiver() -> Result<(String, Arc<Mutex<Vec<Received>>>)> {
    let got = Arc::new(Mutex::new(Vec::new()));
    let sink = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let sink = sink.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
                for rs in request.resource_spans {
                    let service = rs.resource.iter().flat_map(|r| &r.attributes).find(|a| a.key == "service.name");
                    let service = service.and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                        AnyValue::StringValue(s) => Some(s.clone()),
                        _ => None,
                    });
                    for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                        let offset = span.attributes.iter().find(|a| a.key == "offset").and_then(|a| {
                            match a.value.as_ref()?.value.as_ref()? {
                                AnyValue::IntValue(i) => Some(*i),
                                _ => None,
                            }
                        });
                        sink.lock().unwrap().push(Received {
                            name: span.name,
                            trace_id: hex(&span.trace_id),
                            span_id: hex(&span.span_id),
                            parent_span_id: hex(&span.parent_span_id),
                            offset,
                            service: service.clone(),
                        });
                    }
                }
                ([("content-type", "application/x-protobuf")], ExportTraceServiceResponse::default().encode_to_vec())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1/traces", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((url, got))
}

struct Forward(String);

impl Processor for Forward {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        ctx.emit(OutputRecord::to(&self.0).value(record.value.clone().unwrap_or_default())).await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_spans_are_exported_over_otlp_in_the_inputs_trace() -> Result<()> {
    let (url, received) = receiver().await?;
    let otlp = millrace::otel::OtlpTracing::new("otel-export-test", Some(&url))?;
    let spans = Targets::new().with_target("millrace::record", tracing::Level::DEBUG);
    tracing_subscriber::registry()
        .with(otlp.layer().with_filter(spans))
        .with(
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(Targets::new().with_default(tracing::Level::WARN)),
        )
        .try_init()?;

    let (input, out, group) = (unique("otel-in"), unique("otel-out"), unique("otel-group"));
    create_topic(&input, 1).await?;
    create_topic(&out, 1).await?;
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let traced = vec![(TRACEPARENT.to_owned(), traceparent.into_bytes())];
    produce_raw(&input, [(None, Some(b"traced".to_vec()), traced), (None, Some(b"plain".to_vec()), Vec::new())])
        .await?;
    let config = PipelineConfig::new(bootstrap(), &group, [&input]).commit_interval(Duration::from_millis(100));
    let pipeline = Pipeline::new(config, Forward(out.clone()))?;
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());
    eventually("both records committed", Duration::from_secs(60), || {
        Ok((committed_offsets(&group, &input, 1)?.get(&0) == Some(&2)).then_some(()))
    })
    .await?;
    stop.cancel();
    run.await??;
    tokio::task::spawn_blocking(move || otlp.flush().map_err(anyhow::Error::msg)).await??;

    let spans = received.lock().unwrap().clone();
    let record_span = |offset| spans.iter().find(|s| s.name == "record" && s.offset == Some(offset)).cloned();
    let traced = record_span(0).with_context(|| format!("no span of offset 0 exported: {spans:?}"))?;
    assert_eq!((traced.trace_id.as_str(), traced.parent_span_id.as_str()), (TRACE_ID, PARENT_ID), "{traced:?}");
    assert_eq!(traced.service.as_deref(), Some("otel-export-test"));
    let plain = record_span(1).with_context(|| format!("no span of offset 1 exported: {spans:?}"))?;
    assert!(plain.parent_span_id.is_empty() && plain.trace_id != TRACE_ID, "a root span of its own: {plain:?}");

    let outputs = read_topic(&out)?;
    let output = |v: &[u8]| outputs.iter().find(|r| r.value.as_deref() == Some(v)).cloned().expect("an output");
    let parent = output(b"traced").headers.get(TRACEPARENT).map(<[u8]>::to_vec).context("traceparent on the output")?;
    let parent = TraceContext::parse(&parent).context("a valid traceparent")?;
    assert_eq!(parent.trace_id(), TRACE_ID);
    assert_eq!(parent.parent_id(), traced.span_id, "the output's parent is the exported span");
    assert!(output(b"plain").headers.get(TRACEPARENT).is_none(), "no trace in, none out");
    Ok(())
}
