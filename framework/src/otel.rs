//! OTLP export of the per-record spans (cargo feature `otel`).
//!
//! Each processing attempt runs in a `tracing` span named `record` (target `millrace::record`,
//! debug level). With this feature and [`OtlpTracing::layer`] on the application's subscriber,
//! those spans (and the application's own spans inside them) are exported over OTLP/HTTP
//! (protobuf) to a collector, and:
//!
//! - a record whose headers carry a W3C `traceparent` is exported as a child of that remote span,
//!   in the same trace;
//! - the `traceparent` Millrace writes into the record's outputs names the exported span as their
//!   parent, so the trace continues with what consumes them. (Without the layer, or with the span
//!   disabled, Millrace draws a span id of its own, as without the feature.)
//!
//! Only the `millrace::record` spans the subscriber enables are exported: filter the layer, e.g.
//! with `tracing_subscriber::filter::Targets::new().with_target("millrace::record", Level::DEBUG)`.
//! The SDK's batch processor sends them from a thread of its own, off the record's path; spans a
//! collector does not take are dropped by the SDK (with its own log line), never retried into
//! memory without bound.
//!
//! ```no_run
//! use tracing_subscriber::{Layer as _, filter::Targets, layer::SubscriberExt as _, util::SubscriberInitExt as _};
//!
//! let otlp = millrace::otel::OtlpTracing::new("billing", Some("http://127.0.0.1:4318/v1/traces"))?;
//! let spans = Targets::new().with_target("millrace::record", tracing::Level::DEBUG);
//! tracing_subscriber::registry().with(otlp.layer().with_filter(spans)).init();
//! // ... run the pipeline; `otlp` sends what is left when it is dropped.
//! # Ok::<(), millrace::ConfigError>(())
//! ```

use crate::error::ConfigError;
use crate::trace::TraceContext;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::registry::LookupSpan;

/// An OTLP/HTTP span exporter and the tracer provider that batches spans for it. Dropping it sends
/// the spans still buffered (within the SDK's export timeout) and stops its thread.
#[derive(Debug)]
pub struct OtlpTracing {
    provider: SdkTracerProvider,
}

impl OtlpTracing {
    /// Spans of `service_name` (the `service.name` resource attribute), exported to `endpoint`,
    /// the full traces URL (e.g. `http://127.0.0.1:4318/v1/traces`); with `None`, where the standard
    /// variables say (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` +
    /// `/v1/traces`, else `http://localhost:4318/v1/traces`). A malformed endpoint fails here,
    /// naming the field `otel.endpoint`.
    pub fn new(service_name: &str, endpoint: Option<&str>) -> Result<Self, ConfigError> {
        use opentelemetry_otlp::WithExportConfig as _;
        let mut builder = opentelemetry_otlp::SpanExporter::builder().with_http();
        if let Some(endpoint) = endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        let exporter = builder.build().map_err(|e| ConfigError::new("otel.endpoint", e.to_string()))?;
        let resource = Resource::builder().with_service_name(service_name.to_owned()).build();
        let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
        Ok(Self { provider })
    }

    /// The `tracing` layer that hands spans to this exporter; add it to the application's
    /// subscriber (filtered to what should be exported, `millrace::record` at debug level at least).
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        tracing_opentelemetry::layer().with_tracer(self.provider.tracer("millrace"))
    }

    /// Sends every span ended so far (blocks until the collector answered or the export timed out).
    pub fn flush(&self) -> Result<(), String> {
        self.provider.force_flush().map_err(|e| e.to_string())
    }
}

impl Drop for OtlpTracing {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "OTLP span export did not shut down cleanly");
        }
    }
}

/// Makes `span` (a record's attempt span) a child of the remote span `trace` names, and returns
/// the span id the exporter gave it, when an OpenTelemetry layer records it.
pub(crate) fn adopt(span: &tracing::Span, trace: &TraceContext) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let trace_id = TraceId::from_hex(trace.trace_id()).ok()?;
    let parent = SpanId::from_hex(trace.parent_id()).ok()?;
    let flags = TraceFlags::new(u8::from_str_radix(trace.flags(), 16).ok()?);
    let state = trace.state().and_then(|s| std::str::from_utf8(s).ok()?.parse::<TraceState>().ok());
    let remote = SpanContext::new(trace_id, parent, flags, true, state.unwrap_or_default());
    span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote)).ok()?;
    let context = span.context();
    let own = context.span().span_context().clone();
    (own.is_valid() && own.trace_id() == trace_id).then(|| own.span_id().to_string())
}
