//! What the relay has done, as counters a caller reads and as `metrics` (Prometheus names).
//!
//! | metric | kind | meaning |
//! |---|---|---|
//! | `millrace_outbox_rows_published_total` | counter | rows committed to Kafka and deleted |
//! | `millrace_outbox_batches_total` | counter | Kafka transactions committed |
//! | `millrace_outbox_errors_total` | counter | sessions ended by an error (then reconnected) |
//! | `millrace_outbox_active` | gauge | 1 while this relay holds the outbox lock |
//! | `millrace_outbox_oldest_row_age_seconds` | gauge | age of the oldest row at the last read |
//! | `millrace_outbox_publish_latency_seconds` | histogram | a row's `created_at` to its commit |

use crate::row::Row;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// Counters of one relay.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Rows published (committed to Kafka) and deleted.
    pub published: AtomicU64,
    /// Transactions committed.
    pub batches: AtomicU64,
    /// Sessions ended by an error.
    pub errors: AtomicU64,
    active: AtomicBool,
    last_error: Mutex<Option<String>>,
}

impl RelayStats {
    /// Whether this relay is the active one (holds the lock).
    pub fn is_active(&self) -> bool {
        self.active.load(Relaxed)
    }

    /// The error that ended the last session, if one did (kept after the relay reconnects).
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn record_error(&self, error: &crate::Error) {
        self.set_active(false);
        self.errors.fetch_add(1, Relaxed);
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error.to_string());
        metrics::counter!("millrace_outbox_errors_total").increment(1);
    }

    pub(crate) fn set_active(&self, active: bool) {
        self.active.store(active, Relaxed);
        metrics::gauge!("millrace_outbox_active").set(if active { 1.0 } else { 0.0 });
    }

    pub(crate) fn record_batch(&self, rows: &[Row]) {
        self.published.fetch_add(rows.len() as u64, Relaxed);
        self.batches.fetch_add(1, Relaxed);
        metrics::counter!("millrace_outbox_rows_published_total").increment(rows.len() as u64);
        metrics::counter!("millrace_outbox_batches_total").increment(1);
        let latency = metrics::histogram!("millrace_outbox_publish_latency_seconds");
        for row in rows {
            latency.record(row.age().as_secs_f64());
        }
    }
}
