//! Everything that talks to librdkafka below the record's path: client settings
//! ([`config`]), librdkafka's logs ([`log`]), what each of its errors means ([`errors`]), producing an
//! [`OutputRecord`](crate::OutputRecord) and awaiting its acknowledgement ([`produce`]), exactly-once
//! mode's transactional producer ([`txn_producer`]) and its check of output topics
//! ([`output_topics`]), and the topics the pipeline creates on its own ([`topic`]).

pub(crate) mod config;
pub(crate) mod errors;
pub(crate) mod log;
pub(crate) mod output_topics;
pub(crate) mod produce;
pub(crate) mod topic;
pub(crate) mod txn_producer;
