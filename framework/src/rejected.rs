//! Exactly-once mode: outputs the broker (or librdkafka) rejected for one record, and what becomes
//! of that record.
//!
//! In a transaction, one output that can never be produced (its topic does not exist, it is too
//! large for the topic, the topic name is invalid, writing to it is not authorised) fails the whole
//! transaction: it aborts, every partition it carried is rewound, and the same records run again.
//! Without this module that repeats forever (a livelock: nothing commits, nothing is dead-lettered).
//!
//! Every output produced in a transaction carries its input record as its delivery opaque
//! ([`Source`]). A rejection whose error code belongs to that one record ([`rejects_record`]) is
//! noted here by input record; the partition task looks the record up when it runs it again
//! ([`Rejections::verdict`]):
//! - the first time, the record runs again with its outputs marked to be produced *alone* (the
//!   poll thread waits for every earlier output's acknowledgement before them and for theirs before
//!   producing anything else), because some rejections (a batch too large for the topic) are
//!   reported for every record of a produce batch, and a record must not be dead-lettered for a
//!   neighbour's output;
//! - once rejected while alone, a permanent rejection dead-letters the record (kind `permanent`);
//!   an unknown topic or partition (which may yet be created) is retried under the retry policy,
//!   with its backoff, and dead-letters the record as `transient-exhausted` when the policy gives
//!   up — as at-least-once mode does with the same output;
//! - the DLQ record then goes into a transaction with the record's offset, and the rest of the
//!   partition commits. The decision holds (a rewind dead-letters the record again, without running
//!   it) until a committed transaction carries an offset past the record.
//!
//! A rejected DLQ record or dedup changelog entry cannot be mended by dead-lettering: it stops the
//! pipeline with an error naming the topic ([`Rejections::take_fatal`]) instead of looping.

use crate::clock::now_ms;
use crate::dlq::{DlqErrorKind, Failure};
use crate::kafka::errors::{Rejection, rejects_record};
use crate::record::Record;
use crate::retry::RetryPolicy;
use rdkafka::error::KafkaError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What an output in a transaction was produced for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Produced {
    /// An output the processor emitted.
    Output,
    /// The record's DLQ record.
    DeadLetter,
    /// A dedup changelog entry.
    Changelog,
}

/// The input record an output in a transaction belongs to: its delivery opaque.
#[derive(Debug)]
pub(crate) struct Source {
    pub(crate) topic: Arc<str>,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    /// Produced in a batch of its own (see the module documentation).
    pub(crate) alone: bool,
    pub(crate) what: Produced,
}

/// A record whose output was rejected.
#[derive(Debug)]
struct Noted {
    /// The output topic and the error, for the DLQ headers and the logs.
    message: String,
    rejection: Rejection,
    /// Whether the rejected output had been produced alone.
    alone: bool,
    /// A rejection not yet seen by the record's next run.
    fresh: bool,
    /// Runs of the record that found a fresh rejection of an output produced alone.
    times: u32,
    first_ms: i64,
    last_ms: i64,
    /// Decided: every run of the record until its offset commits dead-letters it (its DLQ record
    /// may be lost with an aborted transaction, and must then be written again).
    dead: Option<Failure>,
}

/// What the partition task does with a record before running it.
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict {
    /// Never rejected: run it as usual.
    Clean,
    /// Rejected before: wait `delay`, then run it with its outputs produced alone.
    Alone { delay: Duration },
    /// Dead-letter it without running it again.
    DeadLetter(Failure),
}

type Key = (Arc<str>, i32, i64);

/// The rejected records of one pipeline, by input record. Bounded by the number of poison records
/// (and their neighbours in a rejected batch): an entry goes once a transaction commits an offset
/// past its record.
#[derive(Debug, Default)]
pub(crate) struct Rejections {
    /// Whether `noted` may hold anything (the per-record path checks only this).
    any: AtomicBool,
    noted: Mutex<HashMap<Key, Noted>>,
    fatal: Mutex<Option<crate::Error>>,
}

impl Rejections {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Noted>> {
        self.noted.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An output of `source` was rejected with `e` (by `producer.send` or in its delivery report).
    /// Errors that do not belong to the record are ignored: the transaction's own calls report them.
    pub(crate) fn rejected(&self, source: &Source, output_topic: &str, e: &KafkaError) {
        let Some(rejection) = rejects_record(e) else { return };
        let what = match source.what {
            Produced::Output => "output topic",
            Produced::DeadLetter => "DLQ topic",
            Produced::Changelog => "dedup changelog topic",
        };
        if let Some(refused) = crate::kafka::errors::write_refused(what, output_topic, e) {
            // Not the record's fault: the ACLs refuse the topic. Stop; nothing is committed past it.
            self.fatal.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(refused);
            return;
        }
        if source.what != Produced::Output {
            let what = if source.what == Produced::DeadLetter { "DLQ record" } else { "dedup changelog entry" };
            let (topic, partition, offset) = (&source.topic, source.partition, source.offset);
            let text =
                format!("the {what} for {topic}/{partition} offset {offset} was rejected by {output_topic}: {e}");
            self.fatal.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(crate::Error::Runtime(text));
            return;
        }
        let now = now_ms();
        let mut noted = self.lock();
        let entry = noted.entry((source.topic.clone(), source.partition, source.offset)).or_insert(Noted {
            message: String::new(),
            rejection,
            alone: false,
            fresh: false,
            times: 0,
            first_ms: now,
            last_ms: now,
            dead: None,
        });
        entry.message = format!("output to {output_topic} rejected: {e}");
        entry.rejection = rejection;
        entry.alone = source.alone;
        entry.fresh = true;
        entry.last_ms = now;
        self.any.store(true, Relaxed);
    }

    /// A transaction committed `end` for this partition: its records below it are settled.
    pub(crate) fn committed(&self, topic: &str, partition: i32, end: i64) {
        if !self.any.load(Relaxed) {
            return;
        }
        let mut noted = self.lock();
        noted.retain(|(t, p, o), _| !(*p == partition && *o < end && &**t == topic));
        if noted.is_empty() {
            self.any.store(false, Relaxed);
        }
    }

    /// What to do with `record` before running it (again).
    pub(crate) fn verdict(&self, record: &Record, policy: &RetryPolicy) -> Verdict {
        if !self.any.load(Relaxed) {
            return Verdict::Clean;
        }
        let mut noted = self.lock();
        let key = (record.topic.clone(), record.partition, record.offset);
        let Some(entry) = noted.get_mut(&key) else { return Verdict::Clean };
        if let Some(failure) = &entry.dead {
            return Verdict::DeadLetter(failure.clone());
        }
        if !entry.fresh {
            // Rewound again (another partition's abort) without a new rejection: same as before.
            return Verdict::Alone { delay: Duration::ZERO };
        }
        entry.fresh = false;
        if !entry.alone {
            // Perhaps a neighbour's rejection: try it alone first.
            return Verdict::Alone { delay: Duration::ZERO };
        }
        entry.times += 1;
        let retry = match entry.rejection {
            Rejection::Permanent => None,
            Rejection::UnknownTopic => policy.delay_after(entry.times),
        };
        if let Some(delay) = retry {
            return Verdict::Alone { delay };
        }
        let failure = Failure {
            kind: match entry.rejection {
                Rejection::Permanent => DlqErrorKind::Permanent,
                Rejection::UnknownTopic => DlqErrorKind::TransientExhausted,
            },
            message: entry.message.clone(),
            attempts: entry.times,
            first_failure_ms: entry.first_ms,
            last_failure_ms: entry.last_ms,
        };
        entry.dead = Some(failure.clone());
        Verdict::DeadLetter(failure)
    }

    /// A rejected DLQ record or changelog entry: the pipeline stops with this message.
    pub(crate) fn take_fatal(&self) -> Option<crate::Error> {
        self.fatal.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::RDKafkaErrorCode;

    fn source(offset: i64, alone: bool, what: Produced) -> Source {
        Source { topic: "in".into(), partition: 0, offset, alone, what }
    }

    fn record(offset: i64) -> Record {
        Record {
            topic: "in".into(),
            partition: 0,
            offset,
            timestamp: None,
            key: None,
            value: None,
            headers: Default::default(),
        }
    }

    const POLICY: RetryPolicy =
        RetryPolicy { max_attempts: 3, base_delay: Duration::from_millis(10), max_delay: Duration::from_millis(40) };
    const UNKNOWN: KafkaError = KafkaError::MessageProduction(RDKafkaErrorCode::UnknownTopicOrPartition);
    const TOO_LARGE: KafkaError = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);

    #[test]
    fn a_permanent_rejection_dead_letters_only_once_seen_alone_until_committed() {
        let r = Rejections::default();
        assert_eq!(r.verdict(&record(5), &POLICY), Verdict::Clean);
        r.rejected(&source(5, false, Produced::Output), "out", &TOO_LARGE);
        assert_eq!(r.verdict(&record(5), &POLICY), Verdict::Alone { delay: Duration::ZERO }, "maybe a neighbour's");
        assert_eq!(r.verdict(&record(6), &POLICY), Verdict::Clean);
        r.rejected(&source(5, true, Produced::Output), "out", &TOO_LARGE);
        let Verdict::DeadLetter(f) = r.verdict(&record(5), &POLICY) else { panic!("not dead-lettered") };
        assert_eq!((f.kind, f.attempts), (DlqErrorKind::Permanent, 1));
        assert!(f.message.contains("out"), "{}", f.message);
        assert_eq!(r.verdict(&record(5), &POLICY), Verdict::DeadLetter(f), "again after an abort, until committed");
        r.committed("in", 1, 100);
        r.committed("other", 0, 100);
        assert!(matches!(r.verdict(&record(5), &POLICY), Verdict::DeadLetter(_)), "another partition's commit");
        r.committed("in", 0, 6);
        assert_eq!(r.verdict(&record(5), &POLICY), Verdict::Clean, "forgotten once committed past");
    }

    #[test]
    fn an_unknown_topic_is_retried_under_the_policy() {
        let r = Rejections::default();
        for _ in 1..POLICY.max_attempts {
            r.rejected(&source(1, true, Produced::Output), "missing", &UNKNOWN);
            assert!(matches!(r.verdict(&record(1), &POLICY), Verdict::Alone { delay } if delay <= POLICY.max_delay));
            let again = r.verdict(&record(1), &POLICY);
            assert_eq!(again, Verdict::Alone { delay: Duration::ZERO }, "no new rejection");
        }
        r.rejected(&source(1, true, Produced::Output), "missing", &UNKNOWN);
        let Verdict::DeadLetter(f) = r.verdict(&record(1), &POLICY) else { panic!("not dead-lettered") };
        assert_eq!((f.kind, f.attempts), (DlqErrorKind::TransientExhausted, POLICY.max_attempts));
    }

    #[test]
    fn only_the_records_own_errors_count_and_a_rejected_dlq_record_is_fatal() {
        let r = Rejections::default();
        let purged = KafkaError::MessageProduction(RDKafkaErrorCode::PurgeQueue);
        r.rejected(&source(2, false, Produced::Output), "out", &purged);
        assert_eq!(r.verdict(&record(2), &POLICY), Verdict::Clean, "a purge on abort is not a rejection");
        assert!(r.take_fatal().is_none());
        r.rejected(&source(3, false, Produced::DeadLetter), "in.dlq", &UNKNOWN);
        assert!(r.take_fatal().is_some_and(|m| m.to_string().contains("in.dlq")));
    }
}
