//! How bytes are shown to an operator: as text when they are printable UTF-8, else as hex.

use millrace::record::Headers;
use serde_json::{Value, json};

/// The bytes as text when they are valid UTF-8 without control characters (tab, newline and carriage
/// return allowed); `None` otherwise.
pub fn printable(bytes: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(bytes).ok()?;
    text.chars().all(|c| !c.is_control() || matches!(c, '\t' | '\n' | '\r')).then_some(text)
}

/// Lower-case hex of the bytes.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

/// One line of text for a table cell: printable text with newlines and tabs escaped, `0x…` hex
/// otherwise, `null` for a missing value; cut to `max` characters with a trailing `…`.
pub fn cell(bytes: Option<&[u8]>, max: usize) -> String {
    let full = match bytes {
        None => "null".to_owned(),
        Some(b) => match printable(b) {
            Some(text) => text.replace('\\', "\\\\").replace('\n', "\\n").replace('\r', "\\r").replace('\t', "\\t"),
            None => format!("0x{}", hex(b)),
        },
    };
    truncate(&full, max)
}

/// Cuts `s` to at most `max` characters, marking a cut with `…`.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// JSON fields for bytes under `name`: `name` (the text or hex, `null` when absent),
/// `name_encoding` (`text` or `hex`) and `name_bytes` (length).
pub fn bytes_json(obj: &mut serde_json::Map<String, Value>, name: &str, bytes: Option<&[u8]>) {
    let (value, encoding) = match bytes {
        None => (Value::Null, Value::Null),
        Some(b) => match printable(b) {
            Some(text) => (json!(text), json!("text")),
            None => (json!(hex(b)), json!("hex")),
        },
    };
    obj.insert(name.to_owned(), value);
    obj.insert(format!("{name}_encoding"), encoding);
    obj.insert(format!("{name}_bytes"), json!(bytes.map_or(0, <[u8]>::len)));
}

/// Headers as a JSON array of `{name, value, encoding}` (value `null` for a null header).
pub fn headers_json(headers: &Headers) -> Value {
    Value::Array(
        headers
            .iter()
            .map(|h| {
                let mut obj = serde_json::Map::new();
                obj.insert("name".into(), json!(h.name));
                bytes_json(&mut obj, "value", h.value.as_deref());
                obj.remove("value_bytes");
                let encoding = obj.remove("value_encoding").unwrap_or(Value::Null);
                obj.insert("encoding".into(), encoding);
                Value::Object(obj)
            })
            .collect(),
    )
}

/// Headers as `name=value` pairs separated by spaces, each value as a [`cell`].
pub fn headers_cell(headers: &Headers, max: usize) -> String {
    let all: Vec<String> =
        headers.iter().map(|h| format!("{}={}", h.name, cell(h.value.as_deref(), usize::MAX))).collect();
    truncate(&all.join(" "), max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_when_printable_else_hex() {
        assert_eq!(printable(b"{\"a\":1}\n"), Some("{\"a\":1}\n"));
        assert_eq!(printable("héllo".as_bytes()), Some("héllo"));
        assert_eq!(printable(b"a\0b"), None);
        assert_eq!(printable(&[0xff, 0xfe]), None);
        assert_eq!(hex(&[0x00, 0xab, 0xff]), "00abff");
        assert_eq!(cell(Some(&[0xff, 0x01]), 80), "0xff01");
        assert_eq!(cell(Some(b"a\nb"), 80), "a\\nb");
        assert_eq!(cell(None, 80), "null");
        assert_eq!(cell(Some(b"abcdef"), 4), "abc…");
    }

    #[test]
    fn json_shows_encoding_and_length() {
        let mut obj = serde_json::Map::new();
        bytes_json(&mut obj, "value", Some(&[0xff, 0x00]));
        bytes_json(&mut obj, "key", Some(b"k-1"));
        bytes_json(&mut obj, "none", None);
        let v = Value::Object(obj);
        assert_eq!(v["value"], "ff00");
        assert_eq!(v["value_encoding"], "hex");
        assert_eq!(v["value_bytes"], 2);
        assert_eq!(v["key"], "k-1");
        assert_eq!(v["key_encoding"], "text");
        assert_eq!(v["none"], Value::Null);
        let mut h = Headers::default();
        h.push("trace", "abc");
        assert_eq!(headers_json(&h), json!([{"name": "trace", "value": "abc", "encoding": "text"}]));
    }
}
