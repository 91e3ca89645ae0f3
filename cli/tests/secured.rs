//! The CLI against the broker's SASL_SSL listener: `--command-config` (a Kafka-tools-style
//! properties file) and `MILLRACE_KAFKA_*` variables carry the client settings; a wrong password
//! fails with an error that says so, without printing it.

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
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_millrace"));
    cmd.args(args).env_remove("KAFKA_BOOTSTRAP_SERVERS").env("KAFKA_BOOTSTRAP_SERVERS", secure::sasl_bootstrap());
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
