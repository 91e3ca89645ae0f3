//! The command line: `millrace dlq stats|list|replay` and their options.

use crate::filter::{Filter, parse_header_condition, parse_kind, parse_offset, parse_time_arg};
use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};
use millrace::dlq::DlqErrorKind;

/// Operator tool for Millrace: inspect and replay dead-letter topics.
#[derive(Debug, Parser)]
#[command(name = "millrace", version, about, long_about = None)]
pub struct Cli {
    /// Kafka bootstrap servers (comma-separated host:port).
    #[arg(long, global = true, env = "KAFKA_BOOTSTRAP_SERVERS", default_value = "127.0.0.1:9092")]
    pub bootstrap: String,
    /// Kafka client properties for a secured cluster (a Java properties file: security.protocol,
    /// sasl.mechanism, sasl.username, sasl.password, ssl.ca.location, ...); environment variables
    /// MILLRACE_KAFKA_<NAME> (e.g. MILLRACE_KAFKA_SASL_PASSWORD) set or override single properties.
    #[arg(long, global = true, env = "MILLRACE_COMMAND_CONFIG", value_name = "FILE")]
    pub command_config: Option<std::path::PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The bootstrap servers, with an empty setting taken as the default.
    pub fn bootstrap(&self) -> &str {
        if self.bootstrap.trim().is_empty() { "127.0.0.1:9092" } else { self.bootstrap.trim() }
    }
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Dead-letter topics: statistics, listing and replay.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// A consumer group's lag per partition (committed offsets against end offsets, from the
    /// broker), and with `--url` what the pipeline's `/health/ready` says.
    Status(StatusArgs),
    /// The transactional outbox: publish the rows a service commits to a PostgreSQL table
    /// (millrace-outbox; outbox/README.md).
    #[command(subcommand)]
    Outbox(OutboxCommand),
}

/// `millrace outbox …` commands.
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Create the outbox table and its notify trigger if they are missing.
    Install(OutboxArgs),
    /// Publish committed rows to Kafka (one Kafka transaction per batch) and delete them, until
    /// SIGINT or SIGTERM. Run several for failover: one is active, the others stand by.
    Relay(RelayArgs),
}

/// Where the outbox is.
#[derive(Debug, Clone, Args)]
pub struct OutboxArgs {
    /// The database: a libpq URL (postgres://user:password@host:port/db) or key=value string.
    #[arg(long, env = "MILLRACE_POSTGRES_URL", hide_env_values = true)]
    pub postgres: String,
    /// The outbox table (optionally schema.table).
    #[arg(long, default_value = "millrace_outbox")]
    pub table: String,
}

/// `millrace outbox relay` options.
#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    /// The outbox.
    #[command(flatten)]
    pub outbox: OutboxArgs,
    /// Rows per Kafka transaction, at most.
    #[arg(long, default_value_t = 500)]
    pub batch_size: usize,
    /// Look at the table at least this often without a notification (ms); also how often a standby
    /// relay tries to take over.
    #[arg(long, default_value_t = 1000)]
    pub poll_interval_ms: u64,
    /// The Kafka transactional id shared by this outbox's relays (default millrace-outbox-<table>).
    #[arg(long)]
    pub transactional_id: Option<String>,
    /// Put before the row id in the idempotency-key header.
    #[arg(long, default_value = "")]
    pub idempotency_key_prefix: String,
    /// Serve /metrics (Prometheus) and /health/live on this address, e.g. 127.0.0.1:9465.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<std::net::SocketAddr>,
}

/// `millrace status` options.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// The consumer group (a pipeline's group id).
    #[arg(long)]
    pub group: String,
    /// Topics to report (repeatable); default every topic the group committed to.
    #[arg(long = "topic", value_name = "TOPIC")]
    pub topics: Vec<String>,
    /// The pipeline's HTTP listener (`PipelineConfig::http`), e.g. `http://127.0.0.1:9464`.
    #[arg(long)]
    pub url: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// `millrace dlq …` commands.
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Count the records of a DLQ topic by error kind, original topic and processor, with the oldest
    /// and newest failure. Reads the whole topic (to its end at start); commits nothing.
    Stats(StatsArgs),
    /// Show DLQ records: coordinates, key, Millrace information, user headers and value (text when
    /// printable UTF-8, else hex). `--format json` writes one JSON object per line.
    List(ListArgs),
    /// Produce DLQ records back to their original topic (or `--to`), resuming where an earlier
    /// replay with the same group stopped.
    Replay(ReplayArgs),
    /// Release a key parked by a pipeline (key parking): its later records run again, whatever
    /// became of the record it was parked behind. Writes a release marker to the key's source
    /// partition, which the pipeline applies in order with the partition's records.
    Release(ReleaseArgs),
}

/// `millrace dlq release`.
#[derive(Debug, Clone, Args)]
pub struct ReleaseArgs {
    /// The pipeline's consumer group (the one that parked the key).
    #[arg(long)]
    pub group: String,
    /// The parked key (UTF-8).
    #[arg(long)]
    pub key: String,
    /// Only the key's parking in this source topic (default: in every topic).
    #[arg(long)]
    pub topic: Option<String>,
    /// Say what would be released; write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Human-readable text.
    Table,
    /// JSON (one object per line where there are several).
    Json,
}

/// Record filters shared by the commands; all given conditions must hold.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Filters")]
pub struct FilterArgs {
    /// Error kind (transient-exhausted, permanent, decode, panic, timeout, parked); repeat for any of several.
    #[arg(long = "kind", value_name = "KIND", value_parser = parse_kind)]
    pub kinds: Vec<DlqErrorKind>,
    /// Original topic the record was consumed from.
    #[arg(long, value_name = "TOPIC")]
    pub original_topic: Option<String>,
    /// Exact record key (UTF-8).
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
    /// Smallest original offset (inclusive).
    #[arg(long, value_name = "N", value_parser = parse_offset)]
    pub from_offset: Option<i64>,
    /// Largest original offset (inclusive).
    #[arg(long, value_name = "N", value_parser = parse_offset)]
    pub to_offset: Option<i64>,
    /// Last failure at or after this time: ms since the epoch, YYYY-MM-DD or RFC 3339.
    #[arg(long, value_name = "TIME", value_parser = parse_time_arg)]
    pub since: Option<i64>,
    /// Last failure at or before this time: ms since the epoch, YYYY-MM-DD or RFC 3339.
    #[arg(long, value_name = "TIME", value_parser = parse_time_arg)]
    pub until: Option<i64>,
    /// A header (user or millrace.*) equal to a value, as name=value; repeat for several.
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_header_condition)]
    pub headers: Vec<(String, String)>,
    /// Replayed at least N times already (`millrace.replay.count`): with N = an earlier
    /// `--max-replays`, the records that replay set aside as exhausted.
    #[arg(long, value_name = "N")]
    pub min_replays: Option<u32>,
}

impl FilterArgs {
    /// The validated, normalized filter.
    pub fn to_filter(&self) -> Result<Filter> {
        Filter {
            kinds: self.kinds.clone(),
            original_topic: self.original_topic.clone(),
            key: self.key.clone(),
            from_offset: self.from_offset,
            to_offset: self.to_offset,
            since_ms: self.since,
            until_ms: self.until,
            headers: self.headers.clone(),
            min_replays: self.min_replays,
        }
        .normalized()
    }
}

/// `millrace dlq stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The DLQ topic.
    pub topic: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Filters.
    #[command(flatten)]
    pub filter: FilterArgs,
}

/// `millrace dlq list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// The DLQ topic.
    pub topic: String,
    /// Show at most N matching records.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Output format (json: one object per line).
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Filters.
    #[command(flatten)]
    pub filter: FilterArgs,
}

/// `millrace dlq replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The DLQ topic.
    pub topic: String,
    /// Produce to this topic instead of each record's original topic (also replays records without
    /// Millrace headers).
    #[arg(long, value_name = "TOPIC")]
    pub to: Option<String>,
    /// Show what would be replayed; produce and commit nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// At most N records per second (e.g. 100 or 100/s).
    #[arg(long, value_name = "N/s", value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// Records already replayed this many times are exhausted: reported, not produced, committed
    /// past (replay them after a fix with `--min-replays N --max-replays M`, M > N).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub max_replays: u32,
    /// Consumer group keeping the replay position [default: millrace-replay.TOPIC, plus .HASH of the
    /// filters when filters are given]
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// Output format of the per-record reports and the summary.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Filters.
    #[command(flatten)]
    pub filter: FilterArgs,
}

/// Parses `--rate`: a positive number of records per second, optionally suffixed `/s`.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let n = s.trim().strip_suffix("/s").unwrap_or(s.trim());
    match n.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!("{s:?} is not a rate (a positive number of records per second, like 100 or 100/s)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_replay_with_filters() {
        let cli = Cli::try_parse_from([
            "millrace",
            "--bootstrap",
            "b:9092",
            "dlq",
            "replay",
            "orders.dlq",
            "--kind",
            "panic",
            "--kind",
            "decode",
            "--header",
            "tenant=acme",
            "--since",
            "2024-01-01T00:00:00Z",
            "--rate",
            "50/s",
            "--dry-run",
        ])
        .unwrap();
        assert_eq!(cli.bootstrap(), "b:9092");
        let Command::Dlq(DlqCommand::Replay(r)) = cli.command else { panic!("replay expected") };
        assert_eq!(r.topic, "orders.dlq");
        assert!(r.dry_run);
        assert_eq!(r.rate, Some(50.0));
        assert_eq!(r.max_replays, 3);
        let f = r.filter.to_filter().unwrap();
        assert_eq!(f.kinds, vec![DlqErrorKind::Decode, DlqErrorKind::Panic]);
        assert_eq!(f.headers, vec![("tenant".to_owned(), "acme".to_owned())]);
        assert_eq!(f.since_ms, Some(1_704_067_200_000));
    }

    #[test]
    fn rejects_bad_values() {
        for args in [
            &["millrace", "dlq", "list", "t", "--kind", "oops"][..],
            &["millrace", "dlq", "list", "t", "--from-offset", "-3"],
            &["millrace", "dlq", "list", "t", "--since", "last tuesday"],
            &["millrace", "dlq", "list", "t", "--header", "novalue"],
            &["millrace", "dlq", "replay", "t", "--rate", "0"],
            &["millrace", "dlq", "stats", "t", "--format", "yaml"],
        ] {
            assert!(Cli::try_parse_from(args).is_err(), "{args:?} should be rejected");
        }
        let cli =
            Cli::try_parse_from(["millrace", "dlq", "list", "t", "--from-offset", "9", "--to-offset", "2"]).unwrap();
        let Command::Dlq(DlqCommand::List(l)) = cli.command else { panic!("list expected") };
        assert!(l.filter.to_filter().is_err());
    }
}
