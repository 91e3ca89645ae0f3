//! `millrace`: the operator's command-line tool for Millrace dead-letter topics.
//!
//! ```text
//! millrace dlq stats  <dlq-topic> [filters] [--format table|json]
//! millrace dlq list   <dlq-topic> [filters] [--limit N] [--format table|json]
//! millrace dlq replay <dlq-topic> [--to TOPIC] [filters] [--dry-run] [--rate N/s] [--max-replays N] [--group G]
//! millrace status --group G [--topic T]... [--url http://HOST:PORT] [--format table|json]
//! millrace outbox install --postgres URL [--table T]
//! millrace outbox relay   --postgres URL [--table T] [--batch-size N] [--poll-interval-ms N] [--http ADDR]
//! ```
//!
//! Brokers come from `--bootstrap` or `KAFKA_BOOTSTRAP_SERVERS` (default `127.0.0.1:9092`). Errors
//! are printed on stderr with a non-zero exit status (1; 2 for invalid arguments; 130 when a replay
//! was interrupted by a signal after committing its progress).

mod args;
mod client;
mod filter;
mod list;
mod outbox;
mod parked;
mod progress;
mod read;
mod replay;
mod show;
mod stats;
mod status;
mod time;

use anyhow::Result;
use args::{Cli, Command, DlqCommand, OutboxCommand};
use clap::Parser as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,librdkafka=off,rdkafka=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("millrace: error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("millrace: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: &Cli) -> Result<ExitCode> {
    client::init(cli.command_config.as_deref())?;
    let bootstrap = cli.bootstrap();
    match &cli.command {
        Command::Dlq(DlqCommand::Stats(a)) => stats::run(bootstrap, a).await?,
        Command::Dlq(DlqCommand::List(a)) => list::run(bootstrap, a).await?,
        Command::Dlq(DlqCommand::Release(a)) => {
            let n = parked::release(bootstrap, a).await?;
            let verb = if a.dry_run { "would write" } else { "wrote" };
            println!("{verb} {n} release marker{}", if n == 1 { "" } else { "s" });
        }
        Command::Status(a) => status::run(bootstrap, a).await?,
        Command::Outbox(OutboxCommand::Install(a)) => outbox::install(bootstrap, a).await?,
        Command::Outbox(OutboxCommand::Relay(a)) => outbox::relay(bootstrap, a).await?,
        Command::Dlq(DlqCommand::Replay(a)) => {
            let summary = replay::run(bootstrap, a).await?;
            replay::print_summary(&summary, a.format)?;
            if summary.interrupted {
                return Ok(ExitCode::from(130));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
