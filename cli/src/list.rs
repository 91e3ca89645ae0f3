//! `millrace dlq list`: the records of a DLQ topic, one block (or one JSON object) per record.

use crate::args::{Format, ListArgs};
use crate::read::{DlqRecord, TopicScan};
use crate::show::{bytes_json, cell, headers_cell, headers_json};
use crate::time::format_ms;
use anyhow::Result;
use millrace::dlq::user_headers;
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::io::Write as _;

/// Longest key, value or header text shown in the table format (JSON shows everything).
const MAX_CELL: usize = 200;

/// The record as a JSON object: DLQ coordinates, key, value, the Millrace information (`null`
/// without Millrace headers) and the user headers.
pub fn record_json(dlq: &DlqRecord) -> Value {
    let r = &dlq.record;
    let mut obj = serde_json::Map::new();
    obj.insert("partition".into(), json!(r.partition));
    obj.insert("offset".into(), json!(r.offset));
    obj.insert("timestamp".into(), json!(r.timestamp));
    bytes_json(&mut obj, "key", r.key.as_deref());
    bytes_json(&mut obj, "value", r.value.as_deref());
    let millrace = dlq.info.as_ref().map(|i| {
        json!({
            "original_topic": i.original_topic,
            "original_partition": i.original_partition,
            "original_offset": i.original_offset,
            "original_timestamp": i.original_timestamp,
            "group": i.group,
            "processor": i.processor,
            "error_kind": i.kind.as_str(),
            "error_message": i.message,
            "attempts": i.attempts,
            "first_failure_ms": i.first_failure_ms,
            "first_failure": format_ms(i.first_failure_ms),
            "last_failure_ms": i.last_failure_ms,
            "last_failure": format_ms(i.last_failure_ms),
            "replay_count": i.replay_count,
        })
    });
    obj.insert("millrace".into(), millrace.unwrap_or(Value::Null));
    obj.insert("headers".into(), headers_json(&user_headers(&r.headers)));
    Value::Object(obj)
}

/// The record as a block of text lines.
pub fn record_block(dlq: &DlqRecord) -> String {
    let r = &dlq.record;
    let mut out = String::new();
    let value_kind = match r.value.as_deref() {
        None => "null".to_owned(),
        Some(v) if crate::show::printable(v).is_some() => format!("{} bytes, text", v.len()),
        Some(v) => format!("{} bytes, hex", v.len()),
    };
    let _ =
        writeln!(out, "DLQ partition {} offset {}  key {}", r.partition, r.offset, cell(r.key.as_deref(), MAX_CELL));
    match &dlq.info {
        Some(i) => {
            let ts = i.original_timestamp.map(|t| format!(" at {}", format_ms(t))).unwrap_or_default();
            let _ = writeln!(
                out,
                "  original  {} partition {} offset {}{ts}",
                i.original_topic, i.original_partition, i.original_offset
            );
            let _ = writeln!(
                out,
                "  failure   {} after {} attempt{}, first {}, last {}, replayed {} time{}",
                i.kind,
                i.attempts,
                if i.attempts == 1 { "" } else { "s" },
                format_ms(i.first_failure_ms),
                format_ms(i.last_failure_ms),
                i.replay_count,
                if i.replay_count == 1 { "" } else { "s" }
            );
            let _ = writeln!(out, "  where     group {}, processor {}", i.group, i.processor);
            let _ = writeln!(out, "  error     {}", cell(Some(i.message.as_bytes()), MAX_CELL));
        }
        None => {
            let _ = writeln!(out, "  (no Millrace headers)");
        }
    }
    let user = user_headers(&r.headers);
    if !user.is_empty() {
        let _ = writeln!(out, "  headers   {}", headers_cell(&user, MAX_CELL));
    }
    let _ = writeln!(out, "  value     ({value_kind}) {}", cell(r.value.as_deref(), MAX_CELL));
    out
}

/// Runs `millrace dlq list`.
pub async fn run(bootstrap: &str, args: &ListArgs) -> Result<()> {
    let filter = args.filter.to_filter()?;
    let mut scan = TopicScan::open(bootstrap, &args.topic, None)?;
    let mut shown = 0u64;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    while args.limit.is_none_or(|limit| shown < limit) {
        let Some(record) = scan.next().await? else { break };
        if !filter.matches(&record) {
            continue;
        }
        let written = match args.format {
            Format::Json => writeln!(out, "{}", record_json(&record)),
            Format::Table if shown == 0 => write!(out, "{}", record_block(&record)),
            Format::Table => write!(out, "\n{}", record_block(&record)),
        };
        if let Err(e) = written {
            // A closed pipe (`| head`) ends the listing quietly.
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(e.into());
        }
        shown += 1;
    }
    if args.format == Format::Table && shown == 0 {
        writeln!(out, "no matching records in {}", args.topic)?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace::dlq::{DlqErrorKind, Failure, dead_letter};
    use millrace::record::{Headers, Record};

    fn dlq_record(value: Vec<u8>) -> DlqRecord {
        let mut headers = Headers::default();
        headers.push("idempotency-key", "order-7");
        let original = Record {
            topic: "orders".into(),
            partition: 1,
            offset: 42,
            timestamp: Some(0),
            key: Some(b"k".to_vec()),
            value: Some(value),
            headers,
        };
        let failure = Failure {
            kind: DlqErrorKind::Decode,
            message: "bad\nbytes".into(),
            attempts: 1,
            first_failure_ms: 0,
            last_failure_ms: 0,
        };
        DlqRecord::written(dead_letter(&original, "orders.dlq", "billing", "Charge", &failure), 0, 9)
    }

    #[test]
    fn json_has_coordinates_info_and_user_headers_only() {
        let v = record_json(&dlq_record(vec![0xff, 0x00, 0x01]));
        assert_eq!((v["partition"].as_i64(), v["offset"].as_i64()), (Some(0), Some(9)));
        assert_eq!(v["key"], "k");
        assert_eq!(v["value"], "ff0001");
        assert_eq!(v["value_encoding"], "hex");
        assert_eq!(v["value_bytes"], 3);
        assert_eq!(v["millrace"]["original_offset"], 42);
        assert_eq!(v["millrace"]["error_kind"], "decode");
        assert_eq!(v["headers"].as_array().map(Vec::len), Some(1), "millrace.* headers are not repeated");
        assert_eq!(v["headers"][0]["name"], "idempotency-key");
    }

    #[test]
    fn block_shows_text_or_hex() {
        let text = record_block(&dlq_record(b"{\"amount\":12}".to_vec()));
        assert!(text.contains("(13 bytes, text) {\"amount\":12}"), "{text}");
        assert!(text.contains("orders partition 1 offset 42"), "{text}");
        assert!(text.contains("error     bad\\nbytes"), "{text}");
        assert!(text.contains("idempotency-key=order-7"), "{text}");
        let bin = record_block(&dlq_record(vec![0xff, 0xad]));
        assert!(bin.contains("(2 bytes, hex) 0xffad"), "{bin}");
    }
}
