//! The pipeline's HTTP listener ([`PipelineConfig::http`](crate::PipelineConfig::http)):
//! `/metrics` in the Prometheus text format, `/health/live` and `/health/ready` for probes, and the
//! status page (`/`, and its data as JSON at `/status`).
//!
//! - `/health/live`: 200 while the poll thread turns ([`Telemetry::live`]); 503 otherwise.
//! - `/health/ready`: 200 when nothing holds the pipeline back ([`Telemetry::not_ready`]); 503
//!   otherwise. The body (JSON) lists the reasons either way.

use super::Telemetry;
use super::instruments::BUCKETS;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often histograms are folded in when nobody scrapes (bounds their memory).
const UPKEEP: Duration = Duration::from_secs(5);

/// The process-wide Prometheus recorder, installed by the first pipeline that has a listener; `None`
/// when the application installed another `metrics` recorder first (Millrace's metrics go there).
pub(crate) fn recorder() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            // Per-partition gauges of partitions moved away stop being updated: drop them after 2 min.
            let builder = PrometheusBuilder::new()
                .set_buckets(&BUCKETS)
                .expect("buckets are not empty")
                .idle_timeout(MetricKindMask::GAUGE, Some(Duration::from_secs(120)));
            match builder.install_recorder() {
                Ok(handle) => Some(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "another metrics recorder is installed: Millrace's metrics go to it, \
                        and the pipeline's /metrics endpoint answers 503");
                    None
                }
            }
        })
        .as_ref()
}

#[derive(Clone)]
struct Probe {
    telemetry: Arc<Telemetry>,
}

/// Binds `addr` (at start-up, so that a taken port fails `Pipeline::new`).
pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Serves on `listener` until `stop` is cancelled (spawned on the current runtime).
pub(crate) fn serve(
    listener: std::net::TcpListener,
    telemetry: Arc<Telemetry>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let bound = listener.local_addr()?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .route("/status", get(status))
        .route("/", get(page))
        .with_state(Probe { telemetry });
    if let Some(handle) = recorder() {
        let (handle, stop) = (handle.clone(), stop.clone());
        tokio::spawn(async move {
            while tokio::time::timeout(UPKEEP, stop.cancelled()).await.is_err() {
                handle.run_upkeep();
            }
        });
    }
    tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
        if let Err(e) = served {
            tracing::error!(error = %e, %bound, "the HTTP listener stopped");
        }
    });
    Ok(())
}

async fn metrics(State(p): State<Probe>) -> Response {
    let Some(handle) = recorder() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "another metrics recorder is installed in this process\n")
            .into_response();
    };
    p.telemetry.publish();
    handle.run_upkeep();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle.render()).into_response()
}

async fn live(State(p): State<Probe>) -> Response {
    match p.telemetry.live() {
        true => (StatusCode::OK, "live\n").into_response(),
        false => {
            (StatusCode::SERVICE_UNAVAILABLE, "the poll thread has not turned within its deadline\n").into_response()
        }
    }
}

async fn status(State(p): State<Probe>) -> Response {
    axum::Json(p.telemetry.status()).into_response()
}

async fn page(State(p): State<Probe>) -> Response {
    axum::response::Html(p.telemetry.status_page()).into_response()
}

async fn ready(State(p): State<Probe>) -> Response {
    let reasons = p.telemetry.not_ready();
    let status = if reasons.is_empty() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let body = serde_json::json!({ "pipeline": p.telemetry.name, "ready": reasons.is_empty(), "reasons": reasons });
    (status, axum::Json(body)).into_response()
}
