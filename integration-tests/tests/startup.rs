//! Start-up: a bad configuration fails naming the field; a broker that is not there yet is waited for,
//! not crashed on.

use anyhow::Result;
use millrace::{Context, Error, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

struct Count(watch::Sender<usize>);

impl Processor for Count {
    async fn process(&self, _record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
        self.0.send_modify(|n| *n += 1);
        Ok(())
    }
}

#[tokio::test]
async fn bad_configuration_fails_at_start_naming_the_field() {
    let (tx, _) = watch::channel(0);
    let err = Pipeline::new(PipelineConfig::new(bootstrap(), "", ["t"]), Count(tx.clone())).err().unwrap();
    assert!(err.to_string().contains("`group_id`"), "{err}");

    let config = PipelineConfig::new(bootstrap(), "g", ["t"]).consumer_property("fetch.wait.max.msx", "5");
    let err = Pipeline::new(config, Count(tx.clone())).err().unwrap();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(err.to_string().contains("fetch.wait.max.msx"), "the unknown property is named: {err}");

    let config = PipelineConfig::new(bootstrap(), "g", ["t"]).producer_property("acks", "several");
    let err = Pipeline::new(config, Count(tx)).err().unwrap();
    assert!(err.to_string().contains("acks"), "the bad value's property is named: {err}");
}

/// Forwards every connection on `listener` to the real broker.
async fn forward(listener: TcpListener) {
    while let Ok((mut inbound, _)) = listener.accept().await {
        tokio::spawn(async move {
            if let Ok(mut outbound) = TcpStream::connect(bootstrap()).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_unreachable_at_start_is_retried_until_it_appears() -> Result<()> {
    init_logs();
    let topic = unique("late-broker");
    create_topic(&topic, 2).await?;
    produce(&topic, keyed_records(100, 10)).await?;

    // A port with nothing behind it yet.
    let port = TcpListener::bind("127.0.0.1:0").await?.local_addr()?.port();
    let (tx, mut processed) = watch::channel(0);
    let config = PipelineConfig::new(format!("127.0.0.1:{port}"), unique("late-broker-group"), [&topic]);
    let pipeline = Pipeline::new(config, Count(tx))?;
    let stop = pipeline.shutdown_token();
    let mut run = tokio::spawn(pipeline.run());
    let still_running = tokio::time::timeout(Duration::from_secs(3), &mut run).await.is_err();
    assert!(still_running, "the pipeline must keep retrying, not return, while no broker answers");
    assert_eq!(*processed.borrow(), 0);

    // The broker "comes up" on that port.
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    tokio::spawn(forward(listener));
    tokio::time::timeout(Duration::from_secs(60), processed.wait_for(|n| *n >= 100)).await??;
    stop.cancel();
    let summary = run.await??;
    assert_eq!(summary.processed, 100);
    Ok(())
}
