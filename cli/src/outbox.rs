//! `millrace outbox install|relay`: the transactional outbox relay (millrace-outbox) as a command.

use crate::args::{OutboxArgs, RelayArgs};
use anyhow::{Context as _, Result};
use axum::Router;
use axum::routing::get;
use millrace_outbox::{Relay, RelayConfig, schema};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

fn config(bootstrap: &str, outbox: &OutboxArgs) -> RelayConfig {
    let mut config = RelayConfig::new(outbox.postgres.clone(), bootstrap);
    config.table = outbox.table.clone();
    config.kafka_properties = crate::client::properties().to_vec();
    config
}

/// Creates the table and trigger.
pub async fn install(bootstrap: &str, args: &OutboxArgs) -> Result<()> {
    let config = config(bootstrap, args);
    schema::install(&config).await.with_context(|| format!("installing the outbox table `{}`", config.table))?;
    println!("outbox table `{}` ready (relay notifications on channel `{}`)", config.table, config.channel());
    Ok(())
}

/// Runs the relay until SIGINT or SIGTERM.
pub async fn relay(bootstrap: &str, args: &RelayArgs) -> Result<()> {
    let mut config = config(bootstrap, &args.outbox);
    config.batch_size = args.batch_size;
    config.poll_interval = Duration::from_millis(args.poll_interval_ms);
    config.transactional_id = args.transactional_id.clone();
    config.idempotency_key_prefix = args.idempotency_key_prefix.clone();
    let relay = Relay::new(config)?;
    let stop = CancellationToken::new();
    millrace::shutdown::on_signals(stop.clone());
    if let Some(addr) = args.http {
        serve_metrics(addr, stop.clone()).await?;
    }
    relay.run(stop).await?;
    Ok(())
}

/// `/metrics` from a Prometheus recorder installed for this process, and `/health/live`.
async fn serve_metrics(addr: std::net::SocketAddr, stop: CancellationToken) -> Result<()> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")?;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding --http {addr}"))?;
    let upkeep = handle.clone();
    let app = Router::new()
        .route("/metrics", get(move || std::future::ready(handle.render())))
        .route("/health/live", get(|| std::future::ready("ok")));
    tokio::spawn(async move {
        let server = axum::serve(listener, app).with_graceful_shutdown(stop.clone().cancelled_owned());
        let tick = async {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                upkeep.run_upkeep();
            }
        };
        tokio::select! {
            result = server => if let Err(e) = result { tracing::warn!(error = %e, "outbox relay metrics listener") },
            () = tick => {}
        }
    });
    Ok(())
}
