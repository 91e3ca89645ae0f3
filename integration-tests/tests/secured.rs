//! A secured broker (scripts/kafka's SASL_SSL and mTLS listeners, ACLs enforced): pipelines connect
//! with SCRAM-SHA-512 over TLS in both delivery modes and with a client certificate, and process
//! everything; a wrong password and an untrusted CA stop the pipeline with an error that says so,
//! within a bounded time, and print no secret.

use anyhow::{Context as _, Result};
use millrace::{Context, ExactlyOnce, OutputRecord, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use millrace_testkit::secure::{self, ALICE};
use std::time::Duration;

/// Copies every record to its output topic; a value starting with `poison` fails permanently (→ DLQ).
struct Copy(String);

impl Processor for Copy {
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        if record.value.as_deref().is_some_and(|v| v.starts_with(b"poison")) {
            return Err(ProcessError::permanent("a poison record"));
        }
        ctx.emit(OutputRecord::to(&self.0).value(record.value.clone().unwrap_or_default())).await?;
        Ok(())
    }
}

fn secured(mut config: PipelineConfig, properties: Vec<(String, String)>) -> PipelineConfig {
    for (k, v) in properties {
        config = config.kafka_property(k, v);
    }
    config
}

/// Runs a copying pipeline over `bootstrap` with `properties` until it committed all of `N` records;
/// returns the outputs read back over the plaintext listener.
async fn copies_everything(bootstrap: String, properties: Vec<(String, String)>, exactly_once: bool) -> Result<()> {
    const N: usize = 40;
    let (input, out, group) = (unique("secured-in"), unique("secured-out"), unique("secured-group"));
    create_topic(&input, 2).await?;
    create_topic(&out, 1).await?;
    produce(&input, keyed_records(N, 8)).await?;
    let mut config = PipelineConfig::new(bootstrap, &group, [&input]).commit_interval(Duration::from_millis(100));
    if exactly_once {
        config = config.exactly_once(ExactlyOnce::default().transactional_id(format!("{group}-tx")));
    }
    let pipeline = Pipeline::new(secured(config, properties), Copy(out.clone()))?;
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());
    committed_to_end(&group, &input, 2, Duration::from_secs(60)).await?;
    stop.cancel();
    run.await??;
    let isolation = if exactly_once { Isolation::ReadCommitted } else { Isolation::ReadUncommitted };
    let outputs = read_topic_as(&out, isolation)?;
    assert_eq!(outputs.len(), N, "every record copied once over the secured listener");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_over_tls_at_least_once() -> Result<()> {
    init_logs();
    copies_everything(secure::sasl_bootstrap(), secure::scram_properties(ALICE), false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_over_tls_exactly_once() -> Result<()> {
    init_logs();
    copies_everything(secure::sasl_bootstrap(), secure::scram_properties(ALICE), true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_with_a_client_certificate() -> Result<()> {
    init_logs();
    copies_everything(secure::mtls_bootstrap(), secure::mtls_properties(), false).await
}

/// Runs a pipeline that cannot connect, with no `startup_timeout` (so it would retry for ever);
/// returns its error's text, which must come within `within`.
async fn refused(bootstrap: String, properties: Vec<(String, String)>, within: Duration) -> Result<String> {
    let (input, group) = (unique("secured-refused"), unique("secured-refused-group"));
    create_topic(&input, 1).await?;
    let config = PipelineConfig::new(bootstrap, &group, [&input]);
    let pipeline = Pipeline::new(secured(config, properties), Copy(unique("unused")))?;
    let ended = tokio::time::timeout(within, pipeline.run()).await.context("the pipeline kept retrying")?;
    let err = ended.err().context("a pipeline that cannot connect must not succeed")?;
    assert!(matches!(err, millrace::Error::Refused { .. }), "{err:?}");
    Ok(format!("{err} | {err:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_stops_the_pipeline_saying_so() -> Result<()> {
    init_logs();
    let text =
        refused(secure::sasl_bootstrap(), secure::scram_properties(("alice", "not-her-pw")), Duration::from_secs(30))
            .await?;
    assert!(text.to_lowercase().contains("authentication"), "{text}");
    assert!(!text.contains("not-her-pw"), "the password is not printed: {text}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_ca_stops_the_pipeline_saying_so() -> Result<()> {
    init_logs();
    let mut properties = secure::scram_properties(ALICE);
    properties.retain(|(k, _)| k != "ssl.ca.location");
    properties.push(("ssl.ca.location".into(), secure::tls_file("other-ca.crt")));
    let text = refused(secure::sasl_bootstrap(), properties, Duration::from_secs(30)).await?;
    assert!(text.to_lowercase().contains("certificate"), "{text}");
    assert!(!text.contains("alice-secret"), "the password is not printed: {text}");
    Ok(())
}

/// A pipeline as `alice` over SCRAM that copies `input` to `out` in `group`.
fn as_alice(input: &str, out: &str, group: &str, exactly_once: bool) -> Result<Pipeline<Copy>> {
    let mut config =
        PipelineConfig::new(secure::sasl_bootstrap(), group, [input]).commit_interval(Duration::from_millis(100));
    if exactly_once {
        config = config.exactly_once(ExactlyOnce::default().transactional_id(format!("{group}-tx")));
    }
    Ok(Pipeline::new(secured(config, secure::scram_properties(ALICE)), Copy(out.to_owned()))?)
}

/// Lets only admin do `operation` on `resource` (AclCommand's `["--group", name]`, `["--topic", name]`,
/// ...), so alice may not; runs alice's pipeline, which must stop within 60 s with an error naming the
/// resource and the operation; runs `denied` (the checks that nothing was lost or done); then grants
/// alice the operation and restarts her pipeline until it has committed all of `input`.
async fn denied_then_granted(
    (input, out, group): (&str, &str, &str),
    exactly_once: bool,
    operation: &str,
    resource: [&str; 2],
    denied: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let allow = |user: &str| {
        let principal = format!("User:{user}");
        secure::acl(&["--add", "--allow-principal", &principal, "--operation", operation, resource[0], resource[1]])
    };
    allow("admin")?;
    let stopped = tokio::time::timeout(Duration::from_secs(60), as_alice(input, out, group, exactly_once)?.run())
        .await
        .context("the pipeline kept retrying")?;
    let err = stopped.err().with_context(|| format!("alice may not {operation} {resource:?}"))?;
    let text = format!("{err}");
    assert!(text.contains(resource[1]) && text.to_uppercase().contains(&operation.to_uppercase()), "{text}");
    denied()?;

    allow("alice")?;
    let pipeline = as_alice(input, out, group, exactly_once)?;
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());
    committed_to_end(group, input, 1, Duration::from_secs(60)).await?;
    stop.cancel();
    run.await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_read_on_the_group_it_stops_naming_it_and_after_the_grant_processes_everything() -> Result<()> {
    init_logs();
    const N: usize = 20;
    let (input, out, group) = (unique("acl-in"), unique("acl-out"), unique("acl-group"));
    create_topic(&input, 1).await?;
    create_topic(&out, 1).await?;
    produce(&input, keyed_records(N, 4)).await?;
    let nothing_processed = || {
        assert_eq!(read_topic(&out)?.len(), 0, "nothing processed");
        Ok(())
    };
    denied_then_granted((&input, &out, &group), false, "Read", ["--group", &group], nothing_processed).await?;
    assert_eq!(read_topic(&out)?.len(), N, "everything, once, after the grant");
    Ok(())
}

async fn without_write_on_the_output(exactly_once: bool) -> Result<()> {
    init_logs();
    const N: usize = 20;
    let (input, out, group) = (unique("acl-w-in"), unique("acl-w-out"), unique("acl-w-group"));
    create_topic(&input, 1).await?;
    create_topic(&out, 1).await?;
    produce(&input, keyed_records(N, 4)).await?;
    let nothing_done = || {
        assert!(committed_offsets(&group, &input, 1)?.get(&0).is_none_or(|&o| o == 0), "nothing committed");
        assert!(read_topic(&format!("{input}.dlq")).map(|r| r.is_empty()).unwrap_or(true), "nothing dead-lettered");
        Ok(())
    };
    denied_then_granted((&input, &out, &group), exactly_once, "Write", ["--topic", &out], nothing_done).await?;
    let isolation = if exactly_once { Isolation::ReadCommitted } else { Isolation::ReadUncommitted };
    assert_eq!(read_topic_as(&out, isolation)?.len(), N, "everything, once, after the grant");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_write_on_the_output_it_stops_naming_it_at_least_once() -> Result<()> {
    without_write_on_the_output(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_write_on_the_output_it_stops_naming_it_exactly_once() -> Result<()> {
    without_write_on_the_output(true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_write_on_the_dlq_it_stops_naming_it_and_after_the_grant_dead_letters_the_poison() -> Result<()> {
    init_logs();
    const N: usize = 20;
    const POISON: usize = 5;
    let (input, out, group) = (unique("acl-d-in"), unique("acl-d-out"), unique("acl-d-group"));
    let dlq = format!("{input}.dlq");
    for topic in [&input, &out, &dlq] {
        create_topic(topic, 1).await?;
    }
    let value = |i: usize| if i == POISON { format!("poison-{i}") } else { format!("value-{i}") };
    produce(&input, (0..N).map(|i| (format!("key-{}", i % 4), value(i).into_bytes()))).await?;
    let nothing_past_the_poison = || {
        let committed = committed_offsets(&group, &input, 1)?.get(&0).copied().unwrap_or(0);
        assert!(committed <= POISON as i64, "nothing committed past the poison record: {committed}");
        Ok(())
    };
    denied_then_granted((&input, &out, &group), false, "Write", ["--topic", &dlq], nothing_past_the_poison).await?;
    let dead: Vec<_> = read_topic(&dlq)?.into_iter().map(|r| r.value).collect();
    assert_eq!(dead, vec![Some(value(POISON).into_bytes())], "the poison record dead-lettered once, bytes intact");
    let copied: std::collections::BTreeSet<_> = read_topic(&out)?.into_iter().filter_map(|r| r.value).collect();
    let expected = (0..N).filter(|&i| i != POISON).map(|i| value(i).into_bytes()).collect();
    assert_eq!(copied, expected, "every other record copied");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_transactional_id_it_stops_naming_it_and_after_the_grant_processes_everything() -> Result<()> {
    init_logs();
    const N: usize = 20;
    let (input, out, group) = (unique("acl-t-in"), unique("acl-t-out"), unique("acl-t-group"));
    let id = format!("{group}-tx");
    create_topic(&input, 1).await?;
    create_topic(&out, 1).await?;
    produce(&input, keyed_records(N, 4)).await?;
    let nothing_done = || {
        assert!(committed_offsets(&group, &input, 1)?.get(&0).is_none_or(|&o| o == 0), "nothing committed");
        assert_eq!(read_topic_as(&out, Isolation::ReadCommitted)?.len(), 0, "nothing written");
        Ok(())
    };
    denied_then_granted((&input, &out, &group), true, "Write", ["--transactional-id", &id], nothing_done).await?;
    assert_eq!(read_topic_as(&out, Isolation::ReadCommitted)?.len(), N, "everything, once, after the grant");
    Ok(())
}
