//! The `millrace` binary against a real broker (`scripts/kafka up`; `KAFKA_BOOTSTRAP_SERVERS`, default
//! `127.0.0.1:9092`). Every test uses topics with a random suffix, so tests never see each other's data.

use millrace::OutputRecord;
use millrace::dlq::{DlqErrorKind, Failure, dead_letter, headers};
use millrace::record::{Header, Headers, Record};
use millrace_integration_tests::{bootstrap, unique};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers as _, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde_json::Value;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

async fn create_topic(name: &str, partitions: i32) {
    millrace_integration_tests::create_topic(name, partitions).await.expect("topic created");
}

async fn produce(records: &[OutputRecord]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("max.in.flight.requests.per.connection", "1") // see the integration tests' `produce`
        .set("linger.ms", "0")
        .create()
        .expect("producer");
    for out in records {
        let mut hs = OwnedHeaders::new();
        for h in out.headers.iter() {
            hs = hs.insert(rdkafka::message::Header { key: &h.name, value: h.value.as_deref() });
        }
        let mut r: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&out.topic).headers(hs);
        if let Some(k) = &out.key {
            r = r.key(k);
        }
        if let Some(v) = &out.value {
            r = r.payload(v);
        }
        if let Some(p) = out.partition {
            r = r.partition(p);
        }
        producer.send(r, Duration::from_secs(10)).await.map_err(|(e, _)| e).expect("produce");
    }
}

/// One record read back: partition, key, value, headers.
#[derive(Debug)]
struct Read {
    partition: i32,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Headers,
}

/// Every record of `topic`, up to its current end.
fn read_all(topic: &str) -> Vec<Read> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", "millrace-cli-test-reader")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).expect("metadata");
    let partitions = md.topics()[0].partitions().len() as i32;
    let mut tpl = TopicPartitionList::new();
    let mut left = 0;
    for p in 0..partitions {
        let (low, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10)).expect("watermarks");
        if high > low {
            tpl.add_partition_offset(topic, p, Offset::Offset(low)).expect("offset");
            left += high - low;
        }
    }
    consumer.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while left > 0 {
        assert!(Instant::now() < deadline, "reading {topic} timed out with {left} records left");
        let Some(msg) = consumer.poll(Duration::from_millis(100)) else { continue };
        let msg = msg.expect("consume");
        let headers = msg
            .headers()
            .map(|hs| {
                Headers(hs.iter().map(|h| Header { name: h.key.into(), value: h.value.map(<[u8]>::to_vec) }).collect())
            })
            .unwrap_or_default();
        out.push(Read {
            partition: msg.partition(),
            key: msg.key().map(<[u8]>::to_vec),
            value: msg.payload().map(<[u8]>::to_vec),
            headers,
        });
        left -= 1;
    }
    out
}

/// Runs the binary; returns its output (stdout and stderr captured).
fn millrace(args: &[&str]) -> Output {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_millrace"))
        .args(args)
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
        .output()
        .expect("run millrace");
    eprintln!(
        "millrace {} -> {} in {:.2} s\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        out.status,
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ok(args: &[&str]) -> String {
    let out = millrace(args);
    assert!(out.status.success(), "millrace {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn last_json(stdout: &str) -> Value {
    serde_json::from_str(stdout.lines().last().expect("a line")).expect("JSON")
}

/// A DLQ record built by Millrace's own builder, as a pipeline would write it.
#[allow(clippy::too_many_arguments)]
fn dlq(
    dlq_topic: &str,
    original: &str,
    partition: i32,
    offset: i64,
    key: &str,
    value: &[u8],
    kind: DlqErrorKind,
    replays: u32,
    last_failure_ms: i64,
) -> OutputRecord {
    let mut headers = Headers::default();
    headers.push("idempotency-key", format!("idem-{offset}"));
    if replays > 0 {
        headers.push(headers::REPLAY_COUNT, replays.to_string());
    }
    let record = Record {
        topic: original.into(),
        partition,
        offset,
        timestamp: Some(1_700_000_000_000),
        key: Some(key.as_bytes().to_vec()),
        value: Some(value.to_vec()),
        headers,
    };
    let failure =
        Failure { kind, message: format!("failed {offset}"), attempts: 3, first_failure_ms: 1_000, last_failure_ms };
    dead_letter(&record, dlq_topic, "billing", "Charge", &failure).partition(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_and_list_read_the_whole_topic() {
    let dlq_topic = unique("cli-stats-dlq");
    create_topic(&dlq_topic, 2).await;
    let mut records = vec![
        dlq(&dlq_topic, "orders", 0, 10, "k1", b"{\"n\":1}", DlqErrorKind::Permanent, 0, 5_000),
        dlq(&dlq_topic, "orders", 1, 11, "k2", b"{\"n\":2}", DlqErrorKind::Permanent, 0, 3_000),
        dlq(&dlq_topic, "orders", 1, 12, "k3", b"{\"n\":3}", DlqErrorKind::TransientExhausted, 1, 9_000),
        dlq(&dlq_topic, "payments", 0, 7, "k4", &[0xff, 0x00, 0xfe], DlqErrorKind::Decode, 0, 7_000).partition(1),
    ];
    records.push(OutputRecord::to(&dlq_topic).key("plain").value("no headers").header("trace", "t1").partition(1));
    produce(&records).await;

    let stats = last_json(&ok(&["dlq", "stats", &dlq_topic, "--format", "json"]).replace('\n', " "));
    assert_eq!(stats["records"], 5);
    assert_eq!(stats["without_millrace_headers"], 1);
    assert_eq!(stats["by_kind"]["permanent"], 2);
    assert_eq!(stats["by_kind"]["transient-exhausted"], 1);
    assert_eq!(stats["by_kind"]["decode"], 1);
    assert_eq!(stats["by_original_topic"]["orders"], 3);
    assert_eq!(stats["by_original_topic"]["payments"], 1);
    assert_eq!(stats["by_processor"]["Charge"], 4);
    assert_eq!(
        (stats["oldest"]["failed_at_ms"].as_i64(), stats["oldest"]["original_offset"].as_i64()),
        (Some(3_000), Some(11))
    );
    assert_eq!(stats["newest"]["original_offset"], 12);
    assert_eq!(stats["newest"]["failed_at"], "1970-01-01T00:00:09.000Z");

    let filtered =
        last_json(&ok(&["dlq", "stats", &dlq_topic, "--format", "json", "--kind", "permanent"]).replace('\n', " "));
    assert_eq!((filtered["records"].as_u64(), filtered["filtered_out"].as_u64()), (Some(2), Some(3)));
    let table = ok(&["dlq", "stats", &dlq_topic]);
    assert!(table.contains("without Millrace headers: 1"), "{table}");

    let listed = ok(&["dlq", "list", &dlq_topic, "--format", "json", "--limit", "2"]);
    assert_eq!(listed.lines().count(), 2, "--limit 2");
    let binary = ok(&["dlq", "list", &dlq_topic, "--format", "json", "--key", "k4"]);
    let v = last_json(&binary);
    assert_eq!(binary.lines().count(), 1);
    assert_eq!(
        (v["value"].as_str(), v["value_encoding"].as_str(), v["value_bytes"].as_u64()),
        (Some("ff00fe"), Some("hex"), Some(3))
    );
    assert_eq!(v["millrace"]["original_topic"], "payments");
    assert_eq!(v["headers"][0]["name"], "idempotency-key");
    assert_eq!(v["partition"], 1);
    let window = ok(&[
        "dlq",
        "list",
        &dlq_topic,
        "--format",
        "json",
        "--from-offset",
        "11",
        "--to-offset",
        "12",
        "--original-topic",
        "orders",
    ]);
    assert_eq!(window.lines().count(), 2, "original offsets 11..=12 of orders");
    let by_header = ok(&["dlq", "list", &dlq_topic, "--format", "json", "--header", "trace=t1"]);
    assert_eq!(last_json(&by_header)["millrace"], Value::Null);
    let by_time =
        ok(&["dlq", "list", &dlq_topic, "--format", "json", "--since", "6000", "--until", "1970-01-01T00:00:08Z"]);
    assert_eq!(last_json(&by_time)["key"], "k4");
    let text = ok(&["dlq", "list", &dlq_topic, "--key", "k1"]);
    assert!(text.contains("orders partition 0 offset 10") && text.contains("{\"n\":1}"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_produces_originals_once_and_resumes() {
    let original = unique("cli-orders");
    let retry = unique("cli-retry");
    let dlq_topic = unique("cli-replay-dlq");
    create_topic(&original, 2).await;
    create_topic(&retry, 1).await;
    create_topic(&dlq_topic, 1).await;
    let binary = [0x00, 0xff, 0x10, 0x80];
    produce(&[
        dlq(&dlq_topic, &original, 1, 20, "a", &binary, DlqErrorKind::TransientExhausted, 0, 1_000),
        dlq(&dlq_topic, &original, 1, 21, "b", b"second", DlqErrorKind::Permanent, 2, 1_000),
        dlq(&dlq_topic, &original, 0, 22, "c", b"exhausted", DlqErrorKind::Panic, 3, 1_000),
        OutputRecord::to(&dlq_topic).key("plain").value("no headers").header("trace", "t1").partition(0),
    ])
    .await;

    // Dry run: reports, produces and commits nothing.
    let dry = ok(&["dlq", "replay", &dlq_topic, "--dry-run", "--format", "json"]);
    let summary = last_json(&dry);
    assert_eq!((summary["replayed"].as_u64(), summary["exhausted"].as_u64()), (Some(2), Some(1)));
    assert_eq!(summary["skipped_no_headers"], 1);
    assert_eq!(dry.lines().filter(|l| l.contains("\"would-replay\"")).count(), 2);
    assert!(read_all(&original).is_empty(), "a dry run produces nothing");

    // The replay: two records back to their original partition, one exhausted, one without headers.
    let out = ok(&["dlq", "replay", &dlq_topic]);
    assert_eq!(out.lines().last(), Some("replayed 2, exhausted 1, skipped-no-headers 1, filtered-out 0"), "{out}");
    assert!(out.contains("--min-replays 3 --max-replays 6") && out.contains("skipped"), "{out}");
    let replayed = read_all(&original);
    assert_eq!(replayed.len(), 2);
    let a = replayed.iter().find(|r| r.key.as_deref() == Some(b"a")).expect("record a");
    assert_eq!(a.partition, 1, "back to the original partition");
    assert_eq!(a.value.as_deref(), Some(&binary[..]), "value bytes unchanged");
    assert_eq!(a.headers.get("idempotency-key"), Some(&b"idem-20"[..]));
    assert_eq!(a.headers.get(headers::REPLAY_COUNT), Some(&b"1"[..]));
    let ours: Vec<&str> =
        a.headers.iter().filter(|h| h.name.starts_with(headers::PREFIX)).map(|h| h.name.as_str()).collect();
    assert_eq!(ours, [headers::REPLAY_COUNT, headers::REPLAY_OF], "only the replay count and where it came from");
    let b = replayed.iter().find(|r| r.key.as_deref() == Some(b"b")).expect("record b");
    assert_eq!(b.headers.get(headers::REPLAY_COUNT), Some(&b"3"[..]));

    // The replay state: the default group handled all four records; by replay count 0, 0, 2, 3.
    let stats: Value = serde_json::from_str(&ok(&["dlq", "stats", &dlq_topic, "--format", "json"])).expect("JSON");
    assert_eq!(stats["by_replay_count"], serde_json::json!({"0": 2, "2": 1, "3": 1}), "{stats}");
    let groups = stats["replay_groups"].as_array().expect("replay groups");
    assert_eq!(groups.len(), 1, "{stats}");
    assert_eq!(groups[0]["group"], format!("millrace-replay.{dlq_topic}"));
    assert_eq!((groups[0]["committed_past"].as_u64(), groups[0]["outstanding"].as_u64()), (Some(4), Some(0)));

    // Same group: resumes at the end, replays nothing.
    let again = ok(&["dlq", "replay", &dlq_topic]);
    assert_eq!(again.lines().last(), Some("replayed 0, exhausted 0, skipped-no-headers 0, filtered-out 0"));
    assert_eq!(read_all(&original).len(), 2);

    // A filtered replay has its own group; --to also replays records without headers.
    let to = ok(&["dlq", "replay", &dlq_topic, "--to", &retry, "--key", "plain", "--format", "json"]);
    let summary = last_json(&to);
    assert_eq!((summary["replayed"].as_u64(), summary["filtered_out"].as_u64()), (Some(1), Some(3)));
    assert!(summary["group"].as_str().is_some_and(|g| g.starts_with(&format!("millrace-replay.{dlq_topic}."))));
    let moved = read_all(&retry);
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0].value.as_deref(), Some(&b"no headers"[..]));
    assert_eq!(moved[0].headers.get("trace"), Some(&b"t1"[..]));
    assert_eq!(moved[0].headers.get(headers::REPLAY_COUNT), Some(&b"1"[..]));

    // --max-replays: with a fresh group and a limit of 1, only the never-replayed record goes.
    let group = unique("cli-group");
    let limited = ok(&["dlq", "replay", &dlq_topic, "--group", &group, "--max-replays", "1", "--to", &retry]);
    assert_eq!(
        limited.lines().last(),
        Some("replayed 2, exhausted 2, skipped-no-headers 0, filtered-out 0"),
        "{limited}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_rate_limits() {
    let original = unique("cli-rate");
    let dlq_topic = unique("cli-rate-dlq");
    create_topic(&original, 1).await;
    create_topic(&dlq_topic, 1).await;
    let records: Vec<_> =
        (0..6).map(|i| dlq(&dlq_topic, &original, 0, i, "k", b"v", DlqErrorKind::Permanent, 0, 1_000)).collect();
    produce(&records).await;
    let started = Instant::now();
    let out = ok(&["dlq", "replay", &dlq_topic, "--rate", "20/s"]);
    let took = started.elapsed();
    assert_eq!(out.lines().last(), Some("replayed 6, exhausted 0, skipped-no-headers 0, filtered-out 0"));
    assert!(took >= Duration::from_millis(250), "6 records at 20/s take at least 0.25 s, took {took:?}");
    assert_eq!(read_all(&original).len(), 6);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_fails_clearly() {
    let missing = unique("cli-missing");
    for args in [
        vec!["dlq", "stats", missing.as_str()],
        vec!["dlq", "list", missing.as_str()],
        vec!["dlq", "replay", missing.as_str()],
    ] {
        let out = millrace(&args);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("topic {missing} does not exist")), "{err}");
    }
    let dlq_topic = unique("cli-bad-dlq");
    create_topic(&dlq_topic, 1).await;
    let out = millrace(&["dlq", "replay", &dlq_topic, "--to", &missing]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
    // A record whose original topic is gone stops the replay after the records before it, which
    // are committed; the next replay starts at the failing record.
    let original = unique("cli-bad-orders");
    create_topic(&original, 1).await;
    produce(&[
        dlq(&dlq_topic, &original, 0, 1, "ok", b"v", DlqErrorKind::Permanent, 0, 1_000),
        dlq(&dlq_topic, &missing, 0, 2, "gone", b"v", DlqErrorKind::Permanent, 0, 1_000),
    ])
    .await;
    let out = millrace(&["dlq", "replay", &dlq_topic]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("topic {missing} does not exist")) && err.contains("replayed 1"), "{err}");
    assert_eq!(read_all(&original).len(), 1);
    let again = millrace(&["dlq", "replay", &dlq_topic, "--dry-run"]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success() && err.contains("1 records to read (partition: from..to 0: 1..2)"), "{err}");

    let out = millrace(&["dlq", "list", &dlq_topic, "--kind", "sideways"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown error kind"));
    let out = millrace(&["dlq", "list", &dlq_topic, "--since", "2024-13-01"]);
    assert_eq!(out.status.code(), Some(2));
    let out = millrace(&["dlq", "stats", &dlq_topic, "--from-offset", "5", "--to-offset", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("greater than"));
}
