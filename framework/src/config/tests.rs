//! Validation names the field at fault.

use super::*;

fn ok() -> PipelineConfig {
    PipelineConfig::new("localhost:9092", "g", ["t"])
}

#[test]
fn names_the_field_at_fault() {
    let cases: Vec<(PipelineConfig, &str)> = vec![
        (PipelineConfig::new(" ", "g", ["t"]), "bootstrap_servers"),
        (PipelineConfig::new("b:1", "g", Vec::<String>::new()), "topics"),
        (PipelineConfig::new("b:1", "g", ["bad topic!"]), "topics"),
        (ok().bounds(Bounds { max_concurrency: 0, ..Bounds::default() }), "bounds.max_concurrency"),
        (
            ok().bounds(Bounds { max_in_flight_per_partition: 20, max_in_flight_total: 10, ..Bounds::default() }),
            "bounds.max_in_flight_per_partition",
        ),
        (ok().commit_interval(Duration::ZERO), "commit_interval"),
        (ok().commit_every_records(0), "commit_every_records"),
        (ok().dlq(DlqConfig { topic: "{topic} dead".into(), ..DlqConfig::default() }), "dlq.topic"),
        (ok().dlq(DlqConfig { topic: "t".into(), ..DlqConfig::default() }), "dlq.topic"),
        (ok().dlq(DlqConfig { park_keys: true, enabled: false, ..DlqConfig::default() }), "dlq.park_keys"),
        (
            ok().dlq(DlqConfig { park_keys: true, ..DlqConfig::default() }).ordering(ProcessingOrder::Unordered),
            "dlq.park_keys",
        ),
        (ok().dlq(DlqConfig { park_keys: true, max_parked_keys: 0, ..DlqConfig::default() }), "dlq.max_parked_keys"),
        (
            ok().circuit_breaker(CircuitBreakerConfig { max_dlq_share: 1.5, ..CircuitBreakerConfig::default() }),
            "circuit_breaker.max_dlq_share",
        ),
        (
            ok().circuit_breaker(CircuitBreakerConfig { max_transient_share: -0.1, ..CircuitBreakerConfig::default() }),
            "circuit_breaker.max_transient_share",
        ),
        (
            ok().circuit_breaker(CircuitBreakerConfig { transient_window: 0, ..CircuitBreakerConfig::default() }),
            "circuit_breaker.transient_window",
        ),
        (ok().rate_limit(RateLimit { burst: 11, ..RateLimit::per_second(10) }), "rate_limit.burst"),
        (ok().rate_limit(RateLimit { burst: 0, ..RateLimit::per_second(10) }), "rate_limit.burst"),
        (ok().rate_limit(RateLimit::per_second(0)), "rate_limit.per_second"),
        (ok().consumer_property("enable.auto.commit", "true"), "consumer.enable.auto.commit"),
        (ok().consumer_property("max.poll.interval.ms", "soon"), "max.poll.interval.ms"),
        (
            ok().consumer_property("max.poll.interval.ms", "5000").drain_timeout(Duration::from_secs(10)),
            "drain_timeout",
        ),
        (
            ok().exactly_once(ExactlyOnce::default().transaction_timeout(Duration::from_millis(150))),
            "delivery.transaction_timeout",
        ),
        (ok().exactly_once(ExactlyOnce::default().transactional_id(" ")), "delivery.transactional_id"),
        (ok().stall_timeout(Duration::from_millis(999)), "stall_timeout"),
        (ok().startup_timeout(Duration::ZERO), "startup_timeout"),
        (ok().blocked_poll_threshold(Duration::from_millis(99)), "blocked_poll_threshold"),
        (ok().attempt_timeout(Duration::ZERO), "attempt_timeout"),
        (
            ok().exactly_once(ExactlyOnce::default().transaction_timeout(Duration::from_secs(5)))
                .attempt_timeout(Duration::from_secs(6)),
            "attempt_timeout",
        ),
        (ok().exactly_once(ExactlyOnce::default()).producer_property("transactional.id", "x"), "transactional.id"),
    ];
    for (config, field) in cases {
        assert_eq!(config.validate().unwrap_err().field, field, "{config:?}");
    }
    assert!(ok().validate().is_ok());
}

#[test]
fn debug_never_shows_a_secret() {
    let config = ok()
        .kafka_property("security.protocol", "SASL_SSL")
        .kafka_property("sasl.username", "billing")
        .kafka_property("sasl.password", "hunter2-pw")
        .consumer_property("ssl.key.pem", "-----BEGIN PRIVATE KEY-----pem-secret")
        .producer_property("sasl.oauthbearer.client.secret", "oauth-secret");
    let shown = format!("{config:?} {config:#?}");
    for secret in ["hunter2-pw", "pem-secret", "oauth-secret"] {
        assert!(!shown.contains(secret), "{secret} shown in {shown}");
    }
    assert!(shown.contains("SASL_SSL") && shown.contains("billing") && shown.contains(properties::REDACTED));
}

#[test]
fn a_rejected_secret_property_is_named_but_not_shown() {
    // A Java client's property: librdkafka rejects it, and its error carries the value.
    let jaas =
        r#"org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="hunter2-pw";"#;
    let config = ok().kafka_property("sasl.jaas.config", jaas);
    struct Noop;
    impl crate::Processor for Noop {
        async fn process(&self, _: &crate::Record, _: &crate::Context) -> Result<(), crate::ProcessError> {
            Ok(())
        }
    }
    let err = crate::Pipeline::new(config, Noop).err().expect("rejected");
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("sasl.jaas.config") && !shown.contains("hunter2-pw"), "{shown}");
}
