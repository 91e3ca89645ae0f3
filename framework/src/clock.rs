//! Wall-clock time as Kafka and the DLQ headers write it.

/// Milliseconds since the epoch, now.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}
