//! Talking to Kafka below the record's path: creating the topics the pipeline writes to on its own
//! (DLQ, dedup changelog).

pub(crate) mod topic;
