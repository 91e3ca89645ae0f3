//! The settings an operator tunes: stall, blocked-call and start-up reporting, missing topics, the HTTP listener.

use super::PipelineConfig;
use std::net::SocketAddr;
use std::time::Duration;

impl PipelineConfig {
    /// Sets how long a partition (or the cluster) may make no progress before it is reported.
    ///
    /// A partition is *stalled* when Millrace owns it, has not paused it and holds none of its
    /// records, and its fetch position has not moved for this long although either readable records
    /// lie ahead of it (the fetch keeps failing, e.g. on a compression codec the client cannot
    /// decode) or, in exactly-once mode (`read_committed`), a transaction left open holds the last
    /// stable offset below the high watermark (a hanging transaction), or librdkafka never starts
    /// fetching it because its start offset does not come (the group coordinator does not answer,
    /// or a transaction left open holds the group's offsets pending). Each stall is logged once at
    /// error level naming topic, partition, position and end, counted in
    /// [`StatsSnapshot::stalled_partitions`](crate::StatsSnapshot::stalled_partitions), and cleared
    /// when the partition moves. The watchdog reads librdkafka's statistics, which Millrace asks for
    /// four times per timeout (`statistics.interval.ms`, at most every 5 s) unless that property is
    /// set (0 turns the watchdog off). Stalls are reported, never acted on: `run()` goes on.
    ///
    /// ```
    /// use millrace::PipelineConfig;
    /// use std::time::Duration;
    ///
    /// let config = PipelineConfig::new("127.0.0.1:9092", "billing", ["orders"]).stall_timeout(Duration::from_secs(30));
    /// assert!(config.validate().is_ok());
    /// let bad = config.stall_timeout(Duration::from_millis(10));
    /// assert_eq!(bad.validate().unwrap_err().field, "stall_timeout");
    /// ```
    pub fn stall_timeout(mut self, timeout: Duration) -> Self {
        self.stall_timeout = timeout;
        self
    }

    /// Sets how long one poll of a processor call may hold its thread before it is reported.
    ///
    /// A call that blocks its thread without reaching an await (a blocking client, a long
    /// computation, `std::thread::sleep`) cannot be timed out, cancelled or dropped: it freezes every
    /// key of its partition and ties up a runtime worker. One poll longer than this is logged once
    /// at error level with the record's topic, partition, offset and attempt, counted in
    /// [`StatsSnapshot::blocked_calls`](crate::StatsSnapshot::blocked_calls) (the
    /// `millrace_blocked_calls` gauge) and makes `/health/ready` fail, until it returns. Move such
    /// work to `tokio::task::spawn_blocking` (or a thread pool of its own) and await it.
    ///
    /// ```
    /// use millrace::PipelineConfig;
    /// use std::time::Duration;
    ///
    /// let config = PipelineConfig::new("127.0.0.1:9092", "billing", ["orders"]);
    /// assert!(config.clone().blocked_poll_threshold(Duration::from_millis(250)).validate().is_ok());
    /// let bad = config.blocked_poll_threshold(Duration::from_millis(10));
    /// assert_eq!(bad.validate().unwrap_err().field, "blocked_poll_threshold");
    /// ```
    pub fn blocked_poll_threshold(mut self, threshold: Duration) -> Self {
        self.blocked_poll_threshold = threshold;
        self
    }

    /// Fails `run()` with [`Error::Unreachable`](crate::Error::Unreachable) (naming the bootstrap
    /// list) when no broker answered within `timeout` of the start. Without it the pipeline retries
    /// for as long as it runs (logging one error after [`stall_timeout`](Self::stall_timeout)), and
    /// if it is stopped before any broker answered, `run()` returns that same error rather than
    /// `Ok`. Only start-up is bounded: an outage after the cluster was reached is ridden out.
    ///
    /// ```
    /// use millrace::PipelineConfig;
    /// use std::time::Duration;
    ///
    /// let config = PipelineConfig::new("127.0.0.1:9092", "billing", ["orders"]).startup_timeout(Duration::from_secs(30));
    /// assert_eq!(config.startup_timeout, Some(Duration::from_secs(30)));
    /// ```
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = Some(timeout);
        self
    }

    /// Whether a missing input topic fails `run()` with
    /// [`Error::MissingTopic`](crate::Error::MissingTopic): at start-up (checked once the cluster
    /// answers) or when it disappears while running (deleted; librdkafka then revokes its
    /// partitions).
    ///
    /// Off by default, because a Kafka consumer normally waits for its topics (deployments often
    /// create them beside the application, and a re-created topic is picked up again): the missing
    /// topic is logged once at error level, counted in
    /// [`StatsSnapshot::missing_topics`](crate::StatsSnapshot::missing_topics) (cleared when it exists
    /// again), and the other topics keep flowing. Turn it on when a missing topic means a broken
    /// deployment that should stop the service.
    ///
    /// ```
    /// use millrace::PipelineConfig;
    ///
    /// let config = PipelineConfig::new("127.0.0.1:9092", "billing", ["orders"]).fail_on_missing_topic(true);
    /// assert!(config.fail_on_missing_topic);
    /// ```
    pub fn fail_on_missing_topic(mut self, fail: bool) -> Self {
        self.fail_on_missing_topic = fail;
        self
    }

    /// Serves the pipeline's metrics and health on `addr` (e.g. `127.0.0.1:9464`; port 0 picks a
    /// free one, see [`Pipeline::http_addr`](crate::Pipeline::http_addr)): `/metrics` in the
    /// Prometheus text format, `/health/live` and `/health/ready` for Kubernetes probes (see
    /// `docs/operating.md`). The address is bound by [`Pipeline::new`](crate::Pipeline::new), which
    /// fails naming the field `http` if it cannot be.
    ///
    /// Metrics go through the [`metrics`](https://docs.rs/metrics) facade: the first pipeline with a
    /// listener installs a Prometheus recorder for the process. An application that installs its own
    /// recorder before building the pipeline gets Millrace's metrics there instead (and `/metrics`
    /// answers 503).
    ///
    /// ```
    /// use millrace::PipelineConfig;
    ///
    /// let config = PipelineConfig::new("127.0.0.1:9092", "billing", ["orders"]).http("127.0.0.1:9464".parse().unwrap());
    /// assert_eq!(config.http.unwrap().port(), 9464);
    /// ```
    pub fn http(mut self, addr: SocketAddr) -> Self {
        self.http = Some(addr);
        self
    }
}
