//! Exactly-once mode with outputs the broker rejects for one record (issue 12, item 1): such a
//! record ends in the DLQ, in the transaction that commits its offset, and the rest of the
//! partition commits — instead of every transaction aborting and rewinding forever.

use anyhow::Result;
use millrace::Context;
use millrace::dlq::{DlqErrorKind, DlqInfo};
use millrace::{ExactlyOnce, OutputRecord, Pipeline, PipelineConfig, ProcessError, Processor, Record, RetryPolicy};
use millrace_integration_tests::*;
use std::collections::HashMap;
use std::time::Duration;

const PARTITIONS: i32 = 2;
/// The output topic's `max.message.bytes`: below the producer's, so librdkafka sends a larger
/// output and the broker rejects its whole batch (which holds other records' outputs too).
const TOPIC_MAX_BYTES: usize = 100_000;

/// Copies `id-N` to the output; `missing-N` emits to a topic that does not exist (auto-creation
/// is off); `big-N` emits an output larger than the output topic accepts.
struct Copy {
    output: String,
    missing: String,
}

impl Processor for Copy {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let value = record.value_str().unwrap_or_default();
        let out = match value.split('-').next() {
            Some("missing") => OutputRecord::to(&self.missing).value(value.as_bytes().to_vec()),
            Some("big") => OutputRecord::to(&self.output).value(vec![b'x'; TOPIC_MAX_BYTES * 2]),
            _ => OutputRecord::to(&self.output).value(value.as_bytes().to_vec()),
        };
        let mut out = out;
        out.key = record.key.clone();
        ctx.emit(out).await?;
        Ok(())
    }
}

fn value_of(i: usize) -> String {
    match i % 50 {
        7 => format!("missing-{i}"),
        31 => format!("big-{i}"),
        _ => format!("id-{i}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_the_broker_rejects_dead_letter_their_record_and_the_partition_commits() -> Result<()> {
    init_logs();
    const N: usize = 400;
    let input = unique("reject-in");
    let output = unique("reject-out");
    let group = unique("reject-group");
    create_topic(&input, PARTITIONS).await?;
    create_topic_with(&output, PARTITIONS, &[("max.message.bytes", &TOPIC_MAX_BYTES.to_string())]).await?;
    produce(&input, (0..N).map(|i| (format!("k{}", i % 40), value_of(i).into_bytes()))).await?;

    let policy =
        RetryPolicy { max_attempts: 3, base_delay: Duration::from_millis(20), max_delay: Duration::from_millis(50) };
    let config = PipelineConfig::new(bootstrap(), &group, [&input])
        .exactly_once(ExactlyOnce::default().transactional_id(format!("{group}-tx")))
        .commit_interval(Duration::from_millis(100))
        .retry(policy);
    let processor = Copy { output: output.clone(), missing: unique("no-such-topic") };
    let pipeline = Pipeline::new(config, processor)?;
    let (stats, stop) = (pipeline.stats(), pipeline.shutdown_token());
    let run = tokio::spawn(pipeline.run());
    let ends = end_offsets(&input, PARTITIONS)?;
    // Before the fix: no transaction ever committed (each aborted on the rejected output).
    let waited = eventually("committed offsets to reach the input's end", Duration::from_secs(90), || {
        Ok((committed_offsets(&group, &input, PARTITIONS)? == ends).then_some(()))
    })
    .await;
    stop.cancel();
    let s = stats.snapshot();
    println!(
        "rejected outputs: {} processed for {N} inputs, {} dead-lettered, {} committed / {} aborted transactions",
        s.processed, s.dead_lettered, s.transactions_committed, s.transactions_aborted
    );
    waited?;
    run.await??;

    let poison: Vec<String> = (0..N).map(value_of).filter(|v| !v.starts_with("id-")).collect();
    let dlq = read_topic_as(&format!("{input}.dlq"), Isolation::ReadCommitted)?;
    let mut kinds = HashMap::new();
    for r in &dlq {
        let value = String::from_utf8(r.value.clone().unwrap_or_default())?;
        let info = DlqInfo::from_headers(&r.headers).expect("DLQ headers");
        let expected = if value.starts_with("missing-") {
            (DlqErrorKind::TransientExhausted, policy.max_attempts)
        } else {
            (DlqErrorKind::Permanent, 1)
        };
        assert_eq!((info.kind, info.attempts), expected, "{value}: {}", info.message);
        let why = if value.starts_with("missing-") { "not available" } else { "rejected" };
        assert!(info.message.contains(why), "{value}: {}", info.message);
        *kinds.entry(value).or_insert(0) += 1;
    }
    let mut dead: Vec<&String> = kinds.keys().collect();
    dead.sort();
    let mut want: Vec<&String> = poison.iter().collect();
    want.sort();
    assert_eq!(dead, want, "exactly the records with a rejected output are dead-lettered, bytes intact");
    assert!(kinds.values().all(|&n| n == 1), "each dead-lettered once: {kinds:?}");

    let mut seen: HashMap<String, u32> = HashMap::new();
    for r in read_topic_as(&output, Isolation::ReadCommitted)? {
        *seen.entry(String::from_utf8(r.value.unwrap_or_default())?).or_default() += 1;
    }
    assert_eq!(seen.len(), N - poison.len(), "every other record's output committed");
    assert!(seen.iter().all(|(v, &n)| v.starts_with("id-") && n == 1), "outputs exactly once, none of a poison record");
    Ok(())
}
