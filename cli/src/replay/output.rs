//! What a replay reports: a line per notable record while it runs, and the summary at the end.

use crate::args::Format;
use crate::read::DlqRecord;
use crate::show::cell;
use anyhow::Result;
use millrace::dlq::replay_count;
use serde::Serialize;
use serde_json::json;

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Records produced and acknowledged (with `--dry-run`: records that would be produced).
    pub replayed: u64,
    /// Records not produced because they reached `--max-replays` (exhausted).
    pub exhausted: u64,
    /// Records without Millrace headers, not produced for lack of `--to`.
    pub skipped_no_headers: u64,
    /// Records not selected by the filters.
    pub filtered_out: u64,
    /// Records read from the DLQ.
    pub scanned: u64,
    /// Whether nothing was produced or committed.
    pub dry_run: bool,
    /// Whether a signal stopped the replay before the end.
    pub interrupted: bool,
    /// The consumer group holding the replay position.
    pub group: String,
}

impl Summary {
    /// The machine-readable summary line:
    /// `replayed N, exhausted N, skipped-no-headers N, filtered-out N` (a dry run: `would replay N,
    /// …`).
    pub fn line(&self) -> String {
        format!(
            "{} {}, exhausted {}, skipped-no-headers {}, filtered-out {}",
            if self.dry_run { "would replay" } else { "replayed" },
            self.replayed,
            self.exhausted,
            self.skipped_no_headers,
            self.filtered_out
        )
    }
}

/// The line reporting `event` for `record`: a table row with `detail`, or a JSON object with
/// `extra`'s fields added.
pub(super) fn event_line(
    format: Format,
    event: &str,
    record: &DlqRecord,
    detail: &str,
    extra: serde_json::Value,
) -> String {
    match format {
        Format::Table => {
            let original = record
                .info
                .as_ref()
                .map(|i| {
                    format!(
                        "  original {} partition {} offset {}",
                        i.original_topic, i.original_partition, i.original_offset
                    )
                })
                .unwrap_or_default();
            format!(
                "{event:<12}  DLQ partition {} offset {}{original}  key {}  {detail}",
                record.record.partition,
                record.record.offset,
                cell(record.record.key.as_deref(), 80)
            )
        }
        Format::Json => {
            let mut obj = json!({
                "event": event,
                "dlq_partition": record.record.partition,
                "dlq_offset": record.record.offset,
                "original_topic": record.info.as_ref().map(|i| &i.original_topic),
                "original_partition": record.info.as_ref().map(|i| i.original_partition),
                "original_offset": record.info.as_ref().map(|i| i.original_offset),
                "replay_count": replay_count(&record.record.headers),
            });
            let mut key = serde_json::Map::new();
            crate::show::bytes_json(&mut key, "key", record.record.key.as_deref());
            if let (Some(obj), serde_json::Value::Object(extra)) = (obj.as_object_mut(), extra) {
                obj.extend(key);
                obj.extend(extra);
            }
            obj.to_string()
        }
    }
}

/// Prints the summary: the summary line (or a JSON object) on stdout.
pub fn print_summary(summary: &Summary, format: Format) -> Result<()> {
    if summary.dry_run {
        eprintln!("dry run: nothing was produced or committed");
    }
    if summary.interrupted {
        eprintln!("interrupted: the next replay with group {} resumes from here", summary.group);
    }
    match format {
        Format::Table => println!("{}", summary.line()),
        Format::Json => println!("{}", serde_json::to_string(summary)?),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_line_is_stable() {
        let s = Summary { replayed: 4, exhausted: 1, skipped_no_headers: 2, filtered_out: 3, ..Summary::default() };
        assert_eq!(s.line(), "replayed 4, exhausted 1, skipped-no-headers 2, filtered-out 3");
        let dry = Summary { dry_run: true, ..s };
        assert_eq!(dry.line(), "would replay 4, exhausted 1, skipped-no-headers 2, filtered-out 3");
    }
}
