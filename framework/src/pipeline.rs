//! The pipeline: builds the Kafka clients and starts the poll thread (`poll`).
//!
//! The path of one record: the poll thread polls it and batches it to its partition's task
//! (`partition`); the task tracks its offset and routes it to its key lane; the lane runs it
//! through the per-record layers (`layer`: breaker, rejected outputs, dedup, the attempt loop
//! around the processor, DLQ); once the outputs are acknowledged the task completes the offset and
//! publishes the new committable offset; the poll thread commits the contiguous completed prefix
//! every `commit_interval`, at revoke and at shutdown.
//!
//! The poll thread is a dedicated OS thread that never runs user code, so the member keeps polling
//! (and stays in the group) however slow the processors are (I4). Backpressure: when the total of
//! in-flight records or bytes reaches its bound the poll thread stops taking records (it still polls at
//! least every 100 ms, so rebalances and the poll interval are served, admitting at most one record per
//! such poll); when one partition reaches its own bound that partition is paused until it drains to
//! half.

use crate::blocking::Blocking;
use crate::breaker::Breaker;
use crate::cluster::{self, TopicWatch};
use crate::commit::Committer;
use crate::config::PipelineConfig;
use crate::context::RuntimeHandles;
use crate::dedup::runtime::Dedup;
use crate::error::{ConfigError, Error};
use crate::kafka::config::{
    admin_config, client_creation, consumer_config, max_message_bytes, producer_config, transactional_producer_config,
};
use crate::kafka::log::{KafkaLog, Producer, ProducerHooks};
use crate::kafka::txn_producer::TxnClient;
use crate::limit::RateLimiter;
use crate::partition;
use crate::poll::PollLoop;
pub use crate::poll::RunSummary;
use crate::processor::Processor;
use crate::rebalance::Hooks;
use crate::rejected::Rejections;
use crate::shared::Shared;
use crate::state::assignments::{Assignments, Starter};
use crate::state::backpressure::Backpressure;
use crate::stats::Stats;
use crate::telemetry::Telemetry;
use crate::transaction::Transactions;
use crate::watchdog::Watchdog;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// A consumer group member running a [`Processor`].
///
/// ```no_run
/// use millrace::{Context, Pipeline, PipelineConfig, ProcessError, Processor, Record};
///
/// struct Print;
/// impl Processor for Print {
///     async fn process(&self, record: &Record, _ctx: &Context) -> Result<(), ProcessError> {
///         println!("{}@{}: {:?}", record.partition, record.offset, record.value_str());
///         Ok(())
///     }
/// }
///
/// # async fn run() -> Result<(), millrace::Error> {
/// let config = PipelineConfig::new(PipelineConfig::bootstrap_from_env(), "printer", ["events"]);
/// let pipeline = Pipeline::new(config, Print)?;
/// let stop = pipeline.shutdown_token(); // cancel it to stop gracefully
/// let summary = pipeline.run().await?;
/// println!("processed {}", summary.processed);
/// # Ok(()) }
/// ```
pub struct Pipeline<P: Processor> {
    pub(crate) shared: Arc<Shared<P>>,
    consumer: BaseConsumer<Hooks>,
    stop: CancellationToken,
    /// The HTTP listener, bound by `new` ([`PipelineConfig::http`]).
    http: Option<std::net::TcpListener>,
}

impl<P: Processor> Pipeline<P> {
    /// Validates `config` and creates the Kafka clients. Fails with the offending field or property
    /// named; does not need the brokers to be up.
    pub fn new(config: PipelineConfig, processor: P) -> Result<Self, Error> {
        config.validate()?;
        let http = config
            .http
            .map(|addr| {
                crate::telemetry::http::recorder(); // before the metric handles are registered
                crate::telemetry::http::bind(addr)
                    .map_err(|e| ConfigError::new("http", format!("cannot listen on {addr}: {e}")))
            })
            .transpose()?;
        let eos = config.exactly_once_settings().map_or(Duration::ZERO, |e| e.transaction_timeout);
        let live_within = config.drain_timeout + config.commit_interval * 2 + eos + Duration::from_secs(60);
        let telemetry = Arc::new(Telemetry::new(&config.name, &config.group_id, live_within));
        let log = Arc::new(KafkaLog::new(config.name.clone()));
        let producer: Producer = producer_config(&config)
            .create_with_context(ProducerHooks(log.clone()))
            .map_err(client_creation("producer"))?;
        let dedup = config.dedup.clone().map(|d| Dedup::open(d, &config.group_id)).transpose()?.map(Arc::new);
        let rejections = config.exactly_once_settings().map(|_| Arc::new(Rejections::default()));
        let committer = match (config.exactly_once_settings(), &rejections) {
            (Some(eo), Some(rejections)) => {
                let producer_config = transactional_producer_config(&config, eo);
                let client = TxnClient::new(producer_config, log.clone(), eo.transaction_timeout, rejections.clone())
                    .map_err(client_creation("transactional producer"))?;
                Committer::Transactions(Arc::new(Transactions::new(
                    client,
                    telemetry.clone(),
                    dedup.clone(),
                    eo.clone(),
                    config.name.clone(),
                )))
            }
            _ => Committer::offsets(),
        };
        let breaker = Arc::new(Breaker::new(config.circuit_breaker));
        let hooks = Hooks {
            committer,
            breaker: breaker.clone(),
            assignments: Arc::new(Mutex::new(Assignments::default())),
            starter: OnceLock::new(),
            telemetry: telemetry.clone(),
            drain_timeout: config.drain_timeout,
            name: config.name.clone(),
            version: AtomicU64::new(0),
            log: log.clone(),
            watchdog: Watchdog::new(
                config.bootstrap_servers.clone(),
                config.stall_timeout,
                config.exactly_once_settings().is_some(),
            ),
        };
        let consumer: BaseConsumer<Hooks> =
            consumer_config(&config).create_with_context(hooks).map_err(client_creation("consumer"))?;
        let admin: AdminClient<DefaultClientContext> =
            admin_config(&config).create().map_err(client_creation("admin"))?;
        let handles = RuntimeHandles {
            producer,
            shutdown: CancellationToken::new(),
            transactional: config.exactly_once_settings().is_some(),
            max_output_bytes: max_message_bytes(&config)?,
            output_topics: Default::default(),
            log: log.clone(),
        };
        let backpressure = Backpressure::new(&config.bounds, telemetry.stats.in_flight.clone());
        let shared = Shared {
            dedup,
            rejections,
            admin: Arc::new(admin),
            dlq_topics: Mutex::default(),
            breaker,
            blocking: Arc::new(Blocking::new(config.blocked_poll_threshold)),
            rate_limit: config.rate_limit.map(RateLimiter::new),
            log,
            processor,
            concurrency: Semaphore::new(config.bounds.max_concurrency),
            config,
            handles: Arc::new(handles),
            telemetry,
            backpressure,
        };
        Ok(Self { shared: Arc::new(shared), consumer, stop: CancellationToken::new(), http })
    }

    /// Live counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.shared.telemetry.stats.clone()
    }

    /// The address the HTTP listener is bound to ([`PipelineConfig::http`]; useful with port 0).
    pub fn http_addr(&self) -> Option<std::net::SocketAddr> {
        self.http.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// A token that stops the pipeline gracefully when cancelled: stop fetching, drain running and
    /// buffered records until `drain_timeout`, commit, leave the group.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Runs until SIGINT or SIGTERM (graceful), see [`crate::shutdown::on_signals`]; a second signal
    /// exits the process at once without committing past unfinished work.
    pub async fn run_until_signal(self) -> Result<RunSummary, Error> {
        crate::shutdown::on_signals(self.stop.clone());
        self.run().await
    }

    /// Runs until the [`shutdown_token`](Self::shutdown_token) is cancelled or a fatal error occurs.
    pub async fn run(self) -> Result<RunSummary, Error> {
        let Pipeline { shared, consumer, stop, http } = self;
        let runtime = tokio::runtime::Handle::current();
        // The listener and the blocked-call detector run until `run` returns (dropping `_served`
        // stops them).
        let served = CancellationToken::new();
        let _served = served.clone().drop_guard();
        if let Some(listener) = http {
            crate::telemetry::http::serve(listener, shared.telemetry.clone(), served.clone())
                .map_err(|e| Error::Runtime(format!("cannot serve HTTP: {e}")))?;
        }
        // Stops with the listener, when `run` returns.
        shared
            .blocking
            .start(shared.telemetry.clone(), served.clone())
            .map_err(|e| Error::Runtime(format!("cannot start the blocked-call detector: {e}")))?;
        let starter: Starter = {
            let (shared, runtime) = (shared.clone(), runtime.clone());
            Box::new(move |topic, partition, epoch| partition::start(&shared, &runtime, topic, partition, epoch))
        };
        if consumer.context().starter.set(starter).is_err() {
            return Err(Error::Runtime("pipeline started twice".into()));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("millrace-poll".into())
            .spawn(move || {
                let mut topics = TopicWatch::new(&shared.config);
                let log = consumer.context().log.clone();
                let result =
                    cluster::reach(&consumer, &shared.config, &stop, &shared.telemetry.stats, &mut topics, || {
                        log.take_fatal()
                    });
                let result = result.and_then(|()| match consumer.context().committer.transactions() {
                    // Fences earlier incarnations of this transactional id before consuming.
                    Some(txn) => txn.init(&stop).map_err(Error::Transaction),
                    None => Ok(()),
                });
                let config = shared.config.clone();
                let result = result.and_then(|()| PollLoop::new(shared, &consumer, stop, topics).run());
                drop(consumer); // leaves the group (runs the final revoke) before reporting
                let _ = tx.send(result.map_err(|e| crate::kafka::errors::explain(e, &config)));
            })
            .map_err(|e| Error::Runtime(format!("cannot start the poll thread: {e}")))?;
        rx.await.map_err(|_| Error::Runtime("the poll thread panicked".into()))?
    }
}
