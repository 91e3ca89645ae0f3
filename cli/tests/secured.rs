//! The CLI against the broker's SASL_SSL listener: `--command-config` (a Kafka-tools-style
//! properties file) and `MILLRACE_KAFKA_*` variables carry the client settings; a wrong password
//! fails with an error that says so, without printing it; the DLQ commands connect with a client
//! certificate (mTLS) set through the environment, and an untrusted CA stops them saying so.

use millrace::{Context, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::secure::{self, ALICE};
use millrace_integration_tests::{committed_to_end, create_topic, keyed_records, produce, unique};
use serde_json::Value;
use std::process::{Command, Output};
use std::time::Duration;

struct Noop;

impl Processor for Noop {
    async fn process(&self, _: &Record, _: &Context) -> Result<(), ProcessError> {
        Ok(())
    }
}

fn millrace(args: &[&str], env: &[(&str, &str)]) -> Output {
    millrace_at(&secure::sasl_bootstrap(), args, env)
}

/// Runs the CLI against `bootstrap` with `env` added (and no client settings of this process).
fn millrace_at(bootstrap: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_millrace"));
    cmd.args(args).env("KAFKA_BOOTSTRAP_SERVERS", bootstrap);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("MILLRACE_KAFKA_")) {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run millrace")
}

#[tokio::test(flavor = "multi_thread")]
async fn status_over_scram_and_tls_with_a_command_config() -> anyhow::Result<()> {
    let (topic, group) = (unique("cli-secured"), unique("cli-secured-group"));
    create_topic(&topic, 1).await?;
    produce(&topic, keyed_records(5, 2)).await?;
    let config = PipelineConfig::new(millrace_integration_tests::bootstrap(), &group, [&topic])
        .commit_interval(Duration::from_millis(100));
    let pipeline = Pipeline::new(config, Noop)?;
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());
    committed_to_end(&group, &topic, 1, Duration::from_secs(60)).await?;
    stop.cancel();
    run.await??;

    let file = std::env::temp_dir().join(unique("client.properties"));
    let mut text = String::from("# a secured cluster\n");
    for (k, v) in secure::scram_properties(ALICE) {
        text += &format!("{k}={v}\n");
    }
    std::fs::write(&file, text)?;
    let path = file.display().to_string();
    let ok =
        millrace(&["status", "--group", &group, "--topic", &topic, "--format", "json", "--command-config", &path], &[]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let status: Value = serde_json::from_slice(&ok.stdout)?;
    assert_eq!((status["total_lag"].as_i64(), status["partitions"][0]["committed"].as_i64()), (Some(0), Some(5)));

    // The environment wins over the file: a wrong password fails, and is not printed.
    let bad = millrace(
        &["status", "--group", &group, "--topic", &topic, "--command-config", &path],
        &[("MILLRACE_KAFKA_SASL_PASSWORD", "not-her-pw")],
    );
    let said = format!("{}{}", String::from_utf8_lossy(&bad.stdout), String::from_utf8_lossy(&bad.stderr));
    assert!(!bad.status.success(), "{said}");
    assert!(said.to_lowercase().contains("authentication"), "{said}");
    assert!(!said.contains("not-her-pw") && !said.contains("alice-secret"), "no password printed: {said}");
    let _ = std::fs::remove_file(file);
    Ok(())
}

/// `MILLRACE_KAFKA_*` variables for mTLS (`ssl.ca.location` → `MILLRACE_KAFKA_SSL_CA_LOCATION`).
fn mtls_env(ca: &str) -> Vec<(String, String)> {
    secure::mtls_properties()
        .into_iter()
        .map(|(k, v)| {
            let v = if k == "ssl.ca.location" { secure::tls_file(ca) } else { v };
            (format!("MILLRACE_KAFKA_{}", k.replace('.', "_").to_uppercase()), v)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn dlq_commands_over_mtls_from_the_environment() -> anyhow::Result<()> {
    let topic = unique("cli-mtls-dlq");
    create_topic(&topic, 1).await?;
    produce(&topic, keyed_records(3, 1)).await?;
    let env = mtls_env("ca.crt");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let stats = millrace_at(&secure::mtls_bootstrap(), &["dlq", "stats", &topic, "--format", "json"], &env);
    assert!(stats.status.success(), "{}", String::from_utf8_lossy(&stats.stderr));
    let stats: Value = serde_json::from_slice(&stats.stdout)?;
    assert_eq!((stats["records"].as_i64(), stats["without_millrace_headers"].as_i64()), (Some(3), Some(3)));
    let list = millrace_at(&secure::mtls_bootstrap(), &["dlq", "list", &topic, "--format", "json"], &env);
    assert!(list.status.success(), "{}", String::from_utf8_lossy(&list.stderr));
    assert_eq!(String::from_utf8_lossy(&list.stdout).lines().count(), 3, "one line per record");

    // The same commands trusting another CA stop, in bounded time, with the reason.
    let untrusted = mtls_env("other-ca.crt");
    let untrusted: Vec<(&str, &str)> = untrusted.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    for command in ["stats", "list"] {
        let started = std::time::Instant::now();
        let out = millrace_at(&secure::mtls_bootstrap(), &["dlq", command, &topic], &untrusted);
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "{command}: {said}");
        assert!(said.contains("refused this client") && said.contains("certificate"), "{command}: {said}");
        assert!(started.elapsed() < Duration::from_secs(30), "{command} took {:?}", started.elapsed());
    }
    Ok(())
}
