//! librdkafka's logs and errors, routed to `tracing` with repeats throttled: a broker outage reports
//! the same error many times a second, which must not flood the logs while the client retries.

use crate::error::Error;
use crate::kafka::errors::{is_fatal, refuses_connection};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an identical warning is suppressed after it was logged.
const REPEAT_AFTER: Duration = Duration::from_secs(30);
/// Distinct warnings remembered for throttling (the table is cleared when it grows past this).
const REMEMBERED: usize = 64;

/// Throttled logging of one client's errors, plus the first fatal error seen.
#[derive(Debug)]
pub(crate) struct KafkaLog {
    pub(crate) name: String,
    /// Per warning text: when it was last logged and how many repeats were suppressed since.
    recent: Mutex<HashMap<String, (Instant, u64)>>,
    fatal: Mutex<Option<Error>>,
    /// Set with the first fatal error and never cleared: records failing after it are not booked.
    failed: std::sync::atomic::AtomicBool,
}

impl KafkaLog {
    pub(crate) fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), recent: Mutex::default(), fatal: Mutex::new(None), failed: Default::default() }
    }

    /// Logs a retriable problem at warn level, unless the same text was logged within
    /// [`REPEAT_AFTER`]; then counts it and reports the count with the next log line.
    pub(crate) fn warn(&self, what: &str, detail: &str) {
        let text = format!("{what}: {detail}");
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, suppressed)) = recent.get_mut(&text)
            && at.elapsed() < REPEAT_AFTER
        {
            *suppressed += 1;
            return;
        }
        if recent.len() >= REMEMBERED {
            recent.clear();
        }
        let suppressed = recent.get(&text).map_or(0, |(_, n)| *n);
        tracing::warn!(pipeline = %self.name, suppressed_repeats = suppressed, "{text} (retrying)");
        recent.insert(text, (Instant::now(), 0));
    }

    /// Handles an error reported by a client: fatal ones are kept for the poll loop to stop on.
    pub(crate) fn error(&self, error: KafkaError, reason: &str) {
        if refuses_connection(&error, reason) {
            tracing::error!(pipeline = %self.name, %error, reason, "the cluster refused this client; stopping");
            self.keep(Error::Refused { reason: reason.to_owned() });
        } else if is_fatal(&error) {
            tracing::error!(pipeline = %self.name, %error, reason, "fatal Kafka error");
            self.keep(Error::Kafka(error));
        } else {
            self.warn("Kafka client error", &format!("{error} ({reason})"));
        }
    }

    /// Stops the pipeline with `error` (the poll loop takes it): a refusal no retry can get past,
    /// such as a produce the ACLs do not allow.
    pub(crate) fn stop_with(&self, error: Error) {
        tracing::error!(pipeline = %self.name, %error, "stopping");
        self.keep(error);
    }

    /// Stops the pipeline when `e` is a produce to `topic` that the ACLs refuse (`what`: "output
    /// topic", "DLQ topic"); returns whether it did.
    pub(crate) fn stop_if_refused(&self, what: &str, topic: &str, e: &crate::EmitError) -> bool {
        let refused = match e {
            crate::EmitError::NotAcknowledged { source, .. } => {
                crate::kafka::errors::write_refused(what, topic, source)
            }
            _ => None,
        };
        refused.map(|error| self.stop_with(error)).is_some()
    }

    fn keep(&self, error: Error) {
        self.failed.store(true, std::sync::atomic::Ordering::Release);
        self.fatal.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(error);
    }

    /// Whether a fatal error was reported: the pipeline is stopping, and a record that fails now is
    /// left unfinished (redelivered after the restart) rather than retried or dead-lettered.
    pub(crate) fn failed(&self) -> bool {
        self.failed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Takes the fatal error, if one was reported.
    pub(crate) fn take_fatal(&self) -> Option<Error> {
        self.fatal.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    pub(crate) fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", fac, "{message}")
            }
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", fac, "{message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => tracing::info!(target: "librdkafka", fac, "{message}"),
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", fac, "{message}"),
        }
    }
}

/// The producer's context: the same throttled logging as the consumer's.
pub(crate) struct ProducerHooks(pub(crate) std::sync::Arc<KafkaLog>);

impl ClientContext for ProducerHooks {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        self.0.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.0.error(error, reason);
    }
}

/// The producer type used throughout the runtime.
pub(crate) type Producer = rdkafka::producer::FutureProducer<ProducerHooks>;

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::RDKafkaErrorCode;

    #[test]
    fn fatal_errors_are_kept_for_the_poll_loop() {
        let log = KafkaLog::new("t");
        log.error(KafkaError::Global(RDKafkaErrorCode::AllBrokersDown), "down");
        assert!(log.take_fatal().is_none(), "an outage is retried, not fatal");
        log.error(KafkaError::Global(RDKafkaErrorCode::GroupAuthorizationFailed), "denied");
        assert!(log.take_fatal().is_some());
        log.error(KafkaError::Global(RDKafkaErrorCode::SSL), "SSL handshake failed: Disconnected");
        assert!(log.take_fatal().is_none(), "a handshake cut short is retried");
        let reason = "SSL handshake failed: certificate verify failed: broker certificate could not be verified";
        log.error(KafkaError::Global(RDKafkaErrorCode::SSL), reason);
        let refused = log.take_fatal().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("certificate verify failed"), "{refused}");
    }

    #[test]
    fn repeats_are_suppressed_and_counted() {
        let log = KafkaLog::new("t");
        for _ in 0..5 {
            log.warn("x", "same");
        }
        log.warn("y", "other");
        log.warn("x", "same");
        let recent = log.recent.lock().unwrap();
        assert_eq!(recent.get("x: same").map(|(_, n)| *n), Some(5), "interleaving does not reset throttling");
    }
}
