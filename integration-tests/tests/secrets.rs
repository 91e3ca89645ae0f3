//! Secrets are never printed: this test binary captures every log line (Millrace's and librdkafka's,
//! at debug level, with librdkafka's own `conf` and `security` debug contexts on) of a secured run
//! that works and of one that is refused, and reads the pipeline's status page, `/status`, `/metrics`
//! and health endpoints, the configuration's `Debug` and the error; none holds a password.

use anyhow::{Context as _, Result};
use millrace::{Context, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use millrace_testkit::secure::{self, ALICE};
use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

/// Every line any thread logged since the process started.
static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the capturing subscriber before any Kafka client exists (rdkafka picks librdkafka's
/// log level from it when a client is created).
fn capture_logs() {
    let _ = tracing_subscriber::fmt().with_env_filter("debug").with_ansi(false).with_writer(|| Capture).try_init();
}

fn logs() -> String {
    String::from_utf8_lossy(&LOGS.lock().unwrap()).into_owned()
}

struct Noop;

impl Processor for Noop {
    async fn process(&self, _: &Record, _: &Context) -> Result<(), ProcessError> {
        Ok(())
    }
}

/// A pipeline config as `user` over SCRAM/TLS, with librdkafka's configuration dump and security
/// debugging on (the places a client library would print a password if it ever did).
fn config(input: &str, group: &str, user: (&str, &str)) -> PipelineConfig {
    let mut config = PipelineConfig::new(secure::sasl_bootstrap(), group, [input])
        .commit_interval(Duration::from_millis(100))
        .http("127.0.0.1:0".parse().unwrap())
        .kafka_property("debug", "conf,security,broker");
    for (k, v) in secure::scram_properties(user) {
        config = config.kafka_property(k, v);
    }
    config
}

async fn get(url: &str) -> Result<String> {
    Ok(reqwest::get(url).await.with_context(|| format!("GET {url}"))?.text().await?)
}

fn assert_no_secret(what: &str, text: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(!text.contains(secret), "{what} prints the secret {secret:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_logs_pages_config_or_errors_of_a_secured_run_that_works_and_one_that_is_refused() -> Result<()> {
    capture_logs();
    const WRONG: &str = "wrong-pw-7f3a";
    let secrets = [ALICE.1, WRONG];
    let (input, group) = (unique("secrets-in"), unique("secrets-group"));
    create_topic(&input, 1).await?;
    produce(&input, keyed_records(10, 2)).await?;

    let good = config(&input, &group, ALICE);
    assert_no_secret("the configuration's Debug", &format!("{good:?}"), &secrets);
    let pipeline = Pipeline::new(good, Noop)?;
    let addr = pipeline.http_addr().context("the http listener")?;
    let stop = pipeline.shutdown_token();
    let run = tokio::spawn(pipeline.run());
    committed_to_end(&group, &input, 1, Duration::from_secs(60)).await?;
    for path in ["/", "/status", "/metrics", "/health/live", "/health/ready"] {
        let body = get(&format!("http://{addr}{path}")).await?;
        assert_no_secret(path, &body, &secrets);
    }
    stop.cancel();
    run.await??;

    let refused = Pipeline::new(config(&input, &unique("secrets-refused"), (ALICE.0, WRONG)), Noop)?;
    let ended = tokio::time::timeout(Duration::from_secs(30), refused.run()).await.context("kept retrying")?;
    let err = ended.err().context("a wrong password must not connect")?;
    assert_no_secret("the error", &format!("{err} | {err:?}"), &secrets);

    let logs = logs();
    // The capture saw librdkafka's configuration dump and the SASL exchange: the check is not vacuous.
    for seen in ["sasl.password", "SCRAM", "Authentication"] {
        assert!(logs.contains(seen), "the captured logs show {seen:?} ({} bytes captured)", logs.len());
    }
    assert_no_secret("the logs", &logs, &secrets);
    Ok(())
}
