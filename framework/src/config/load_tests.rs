use super::*;
use crate::config::{Delivery, ProcessingOrder};
use std::time::Duration;

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn file(text: &str) -> tempfile_path::TempToml {
    tempfile_path::TempToml::new(text)
}

/// A TOML file in the temp directory, removed on drop.
mod tempfile_path {
    pub struct TempToml(pub std::path::PathBuf);

    impl TempToml {
        pub fn new(text: &str) -> Self {
            let path = std::env::temp_dir().join(format!("millrace-config-{:016x}.toml", rand::random::<u64>()));
            std::fs::write(&path, text).expect("write the test file");
            Self(path)
        }
    }

    impl Drop for TempToml {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

const FULL: &str = r#"
bootstrap_servers = "broker-1:9092,broker-2:9092"
group_id = "billing"
topics = ["orders", "refunds"]
ordering = "partition"
commit_interval = "250ms"
attempt_timeout = "12s"
http = "127.0.0.1:9464"

[bounds]
max_concurrency = 32

[retry]
max_attempts = 3
base_delay = "50ms"

[dlq]
topic = "billing.dlq"

[circuit_breaker]
cooldown = "1m"

[dedup]
dir = "/var/lib/billing"
ttl = "2d"
fallback = "none"

[delivery.exactly_once]
transactional_id = "billing-0"
transaction_timeout = "15s"

[rate_limit]
per_second = 200

[kafka]
"security.protocol" = "SASL_SSL"
sasl.mechanism = "SCRAM-SHA-512"

[consumer]
"session.timeout.ms" = 10000
"#;

#[test]
fn a_file_sets_every_part() {
    let f = file(FULL);
    let c = PipelineConfig::load_with_env(Some(&f.0), vars(&[])).expect("valid");
    assert_eq!(c.bootstrap_servers, "broker-1:9092,broker-2:9092");
    assert_eq!((c.group_id.as_str(), c.name.as_str()), ("billing", "billing"), "the name defaults to the group");
    assert_eq!(c.topics, ["orders", "refunds"]);
    assert_eq!(c.ordering, ProcessingOrder::Partition);
    assert_eq!((c.commit_interval, c.attempt_timeout), (Duration::from_millis(250), Some(Duration::from_secs(12))));
    assert_eq!(c.http, Some("127.0.0.1:9464".parse().unwrap()));
    assert_eq!(c.bounds.max_concurrency, 32);
    assert_eq!(c.bounds.max_in_flight_total, crate::config::Bounds::default().max_in_flight_total, "the rest default");
    assert_eq!((c.retry.max_attempts, c.retry.base_delay), (3, Duration::from_millis(50)));
    assert_eq!(c.dlq.topic, "billing.dlq");
    assert!(c.dlq.enabled);
    assert_eq!(c.circuit_breaker.cooldown, Duration::from_secs(60));
    let dedup = c.dedup.as_ref().expect("a [dedup] table turns the store on");
    assert_eq!((dedup.dir.to_str(), dedup.ttl), (Some("/var/lib/billing"), Duration::from_secs(2 * 86_400)));
    assert_eq!(dedup.fallback, crate::dedup::DedupFallback::None);
    assert_eq!(dedup.header, "idempotency-key");
    let Delivery::ExactlyOnce(eos) = &c.delivery else { panic!("exactly-once: {:?}", c.delivery) };
    assert_eq!(
        (eos.transactional_id.as_deref(), eos.transaction_timeout),
        (Some("billing-0"), Duration::from_secs(15))
    );
    let limit = c.rate_limit.expect("rate limit");
    assert_eq!((limit.per_second, limit.burst), (200, 200), "the burst defaults to the rate");
    assert_eq!(c.kafka.get("security.protocol").map(String::as_str), Some("SASL_SSL"));
    assert_eq!(c.kafka.get("sasl.mechanism").map(String::as_str), Some("SCRAM-SHA-512"), "a dotted key");
    assert_eq!(c.consumer.get("session.timeout.ms").map(String::as_str), Some("10000"), "a number");
}

#[test]
fn the_environment_wins_over_the_file_and_sets_properties() {
    let f = file(FULL);
    let env = vars(&[
        ("MILLRACE_GROUP_ID", "billing-eu"),
        ("MILLRACE_TOPICS", "orders-eu, refunds-eu"),
        ("MILLRACE_BOUNDS__MAX_CONCURRENCY", "8"),
        ("MILLRACE_DELIVERY__EXACTLY_ONCE__TRANSACTIONAL_ID", "billing-eu-3"),
        ("MILLRACE_KAFKA_SASL_USERNAME", "billing"),
        ("MILLRACE_KAFKA_SASL_PASSWORD", "hunter2"),
        ("MILLRACE_PRODUCER_COMPRESSION_TYPE", "zstd"),
        ("MILLRACE_CACHE", "/somewhere"),
        ("HOME", "/root"),
    ]);
    let c = PipelineConfig::load_with_env(Some(&f.0), env).expect("valid");
    assert_eq!((c.group_id.as_str(), c.topics.clone()), ("billing-eu", vec!["orders-eu".into(), "refunds-eu".into()]));
    assert_eq!((c.bounds.max_concurrency, c.retry.max_attempts), (8, 3), "the file's other values stay");
    let Delivery::ExactlyOnce(eos) = &c.delivery else { panic!("exactly-once") };
    assert_eq!(eos.transactional_id.as_deref(), Some("billing-eu-3"));
    assert_eq!(eos.transaction_timeout, Duration::from_secs(15), "merged with the file's table");
    assert_eq!(c.commit_interval, Duration::from_millis(250), "the file's interval, though exactly-once");
    assert_eq!(c.kafka.get("sasl.password").map(String::as_str), Some("hunter2"));
    assert_eq!(c.kafka.get("security.protocol").map(String::as_str), Some("SASL_SSL"));
    assert_eq!(c.producer.get("compression.type").map(String::as_str), Some("zstd"));
    let shown = format!("{c:?}");
    assert!(shown.contains("billing-eu") && !shown.contains("hunter2"), "{shown}");
}

#[test]
fn the_environment_alone_is_enough() {
    let env = vars(&[("MILLRACE_GROUP_ID", "g"), ("MILLRACE_TOPICS", "t"), ("MILLRACE_COMMIT_INTERVAL", "2s")]);
    let c = PipelineConfig::load_with_env(None, env).expect("valid");
    assert_eq!((c.topics.clone(), c.commit_interval), (vec!["t".to_owned()], Duration::from_secs(2)));
    assert_eq!(c.delivery, Delivery::AtLeastOnce);
    assert!(c.dedup.is_none());

    let env = vars(&[("MILLRACE_GROUP_ID", "g"), ("MILLRACE_TOPICS", "t"), ("MILLRACE_DELIVERY__EXACTLY_ONCE", "{}")]);
    let c = PipelineConfig::load_with_env(None, env).expect("valid");
    assert!(c.exactly_once_settings().is_some(), "{:?}", c.delivery);
    assert_eq!(c.commit_interval, Duration::from_millis(100), "exactly-once's default interval");
}

fn error(file_text: Option<&str>, env: &[(&str, &str)]) -> ConfigError {
    let f = file_text.map(file);
    PipelineConfig::load_with_env(f.as_ref().map(|f| f.0.as_path()), vars(env)).expect_err("invalid")
}

#[test]
fn errors_name_the_field_and_where_the_value_came_from() {
    let e = error(Some("group_id = 'g'\ntopics = ['t']\n[bounds]\nmax_concurency = 8"), &[]);
    assert_eq!(e.field, "bounds.max_concurency");
    assert!(e.reason.contains("unknown field") && e.reason.contains(".toml"), "{e}");

    let e = error(Some("group_id = 'g'\ntopics = ['t']\ncommit_interval = 'soon'"), &[]);
    assert_eq!(e.field, "commit_interval", "{e}");

    let e = error(Some("group_id = 'g'\ntopics = ['t']"), &[("MILLRACE_BOUNDS__MAX_CONCURRENCY", "many")]);
    assert_eq!(e.field, "bounds.max_concurrency");
    assert!(e.reason.contains("MILLRACE_BOUNDS__MAX_CONCURRENCY"), "{e}");

    let e = error(Some("group_id = 'g'\ntopics = ['t']\n[bounds]\nmax_concurrency = 0"), &[]);
    assert_eq!(e.field, "bounds.max_concurrency", "validated as in code: {e}");
    assert_eq!(error(Some("topics = ['t']"), &[]).field, "group_id");
    assert_eq!(error(Some("group_id = 'g'"), &[]).field, "topics");
    assert_eq!(error(Some("group_id = 'g'\ntopics = ['t']\n[dedup]\nttl = '1d'"), &[]).field, "dedup.dir");
    assert_eq!(error(Some("group_id = 'g'\ntopics = ['t']\ndelivery = 'twice'"), &[]).field, "delivery");

    let missing = PipelineConfig::load_with_env(Some(Path::new("/nonexistent/millrace.toml")), vars(&[]));
    assert_eq!(missing.expect_err("no file").field, "config file");
}

#[test]
fn a_malformed_secret_is_not_repeated() {
    let e = error(Some("group_id = 'g'\ntopics = ['t']\n[kafka]\n'sasl.password' = ['hunter2']"), &[]);
    assert!(e.field.starts_with("kafka"), "{e}");
    assert!(!format!("{e} {e:?}").contains("hunter2"), "{e}");
}

/// Every field the README's "in the file" table names, spelled as there: unknown fields are refused,
/// so a name the table got wrong fails here.
const EVERY_FIELD: &str = r#"
bootstrap_servers = "127.0.0.1:9092"
group_id = "g"
topics = ["t"]
name = "n"
ordering = "unordered"
commit_interval = "2s"
commit_every_records = 500
drain_timeout = "5s"
attempt_timeout = "3s"
cancel_grace = "2s"
stall_timeout = "30s"
blocked_poll_threshold = "2s"
startup_timeout = "20s"
fail_on_missing_topic = true
http = "127.0.0.1:9464"

[bounds]
max_concurrency = 8
max_in_flight_total = 1000
max_buffered_bytes = 1048576
max_in_flight_per_partition = 500

[retry]
max_attempts = 2
base_delay = "10ms"
max_delay = "1s"

[dlq]
enabled = true
topic = "{topic}.dead"
create_topics = false

[circuit_breaker]
enabled = true
window = 100
max_dlq_share = 0.4
max_consecutive = 50
max_transient_share = 0.7
transient_window = 100
cooldown = "10s"

[rate_limit]
per_second = 100
burst = 10

[dedup]
dir = "/tmp/d"
header = "x-id"
fallback = "coordinates"
ttl = "1d"
sync_writes = true
changelog = false
restore_timeout = "30s"

[delivery.exactly_once]
transactional_id = "g-0"
transaction_timeout = "20s"

[producer]
"linger.ms" = 10
"#;

#[test]
fn every_documented_field_is_accepted() {
    let c = PipelineConfig::from_toml(EVERY_FIELD).expect("every documented field");
    assert_eq!((c.ordering, c.commit_every_records), (ProcessingOrder::Unordered, Some(500)));
    assert_eq!((c.bounds.max_in_flight_per_partition, c.dlq.topic.as_str()), (500, "{topic}.dead"));
    assert_eq!((c.circuit_breaker.transient_window, c.cancel_grace), (100, Duration::from_secs(2)));
    let dedup = c.dedup.expect("dedup");
    assert_eq!((dedup.header.as_str(), dedup.sync_writes, dedup.changelog), ("x-id", true, false));
    assert_eq!(c.rate_limit.map(|l| l.burst), Some(10));
    assert!(matches!(c.delivery, Delivery::ExactlyOnce(_)));
}
