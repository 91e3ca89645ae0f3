//! W3C Trace Context (`traceparent`, `tracestate`) carried through a pipeline.
//!
//! A record whose headers hold a valid `traceparent` is processed as a span of that trace: a span id
//! of its own is drawn (with the `otel` feature and its layer, the id of the span exported over OTLP,
//! see `millrace::otel`), and every output the processor emits ([`Context::emit`](crate::Context::emit))
//! gets `traceparent` = the same trace id with this span as parent, and the input's `tracestate`,
//! unless the processor set those headers itself. A record without one starts no trace (Millrace
//! continues traces; it does not invent them). DLQ records keep every input header untouched, the
//! `traceparent` included, so a replay continues the original trace.
//!
//! ```
//! use millrace::trace::TraceContext;
//!
//! let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
//! let ctx = TraceContext::parse(incoming.as_bytes()).unwrap();
//! assert_eq!(ctx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
//! let outgoing = ctx.traceparent();
//! assert!(outgoing.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
//! assert_ne!(outgoing, incoming, "our span is the parent of what we emit");
//! assert!(TraceContext::parse(b"00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
//! ```

use crate::record::Headers;

/// The `traceparent` header.
pub const TRACEPARENT: &str = "traceparent";
/// The `tracestate` header.
pub const TRACESTATE: &str = "tracestate";

/// A record's place in a distributed trace: the trace it belongs to, its parent span (from the
/// input's `traceparent`) and the span Millrace opened for processing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: String,
    parent_id: String,
    span_id: String,
    flags: String,
    state: Option<Vec<u8>>,
}

impl TraceContext {
    /// Parses a `traceparent` value (version `00`, or a later version read as `00` as the W3C
    /// recommendation says); `None` when it is malformed or an id is all zeros.
    pub fn parse(value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?.trim();
        let mut parts = text.split('-');
        let (version, trace_id, parent_id, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let lower_hex =
            |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let ok = lower_hex(version, 2)
            && version != "ff"
            && (version != "00" || parts.next().is_none())
            && lower_hex(trace_id, 32)
            && lower_hex(parent_id, 16)
            && lower_hex(flags, 2)
            && trace_id.bytes().any(|b| b != b'0')
            && parent_id.bytes().any(|b| b != b'0');
        ok.then(|| Self {
            trace_id: trace_id.to_owned(),
            parent_id: parent_id.to_owned(),
            span_id: format!("{:016x}", rand::random_range(1..=u64::MAX)),
            flags: flags.to_owned(),
            state: None,
        })
    }

    /// The trace context of a record's headers, if they carry a valid `traceparent`.
    pub fn of(headers: &Headers) -> Option<Self> {
        let mut ctx = Self::parse(headers.get(TRACEPARENT)?)?;
        ctx.state = headers.get(TRACESTATE).map(<[u8]>::to_vec);
        Some(ctx)
    }

    /// The trace id (32 lowercase hex digits).
    pub fn trace_id(&self) -> &str {
        &self.trace_id
    }

    /// The span that produced the input (16 hex digits).
    pub fn parent_id(&self) -> &str {
        &self.parent_id
    }

    /// The span of this record's processing (16 hex digits): the parent of every output.
    pub fn span_id(&self) -> &str {
        &self.span_id
    }

    /// The `traceparent` for outputs: this trace, with this record's span as parent.
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-{}", self.trace_id, self.span_id, self.flags)
    }

    /// The trace flags (2 hex digits).
    pub fn flags(&self) -> &str {
        &self.flags
    }

    /// The input's `tracestate`, if it had one.
    pub fn state(&self) -> Option<&[u8]> {
        self.state.as_deref()
    }

    /// The same trace context with another span id for this record's processing (the id the
    /// `otel` feature's exporter gave the attempt's span).
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    pub(crate) fn with_span_id(&self, span_id: String) -> Self {
        Self { span_id, ..self.clone() }
    }

    /// Adds `traceparent` (and `tracestate`) to `headers` unless they hold a `traceparent` already.
    pub fn inject(&self, headers: &mut Headers) {
        if headers.get(TRACEPARENT).is_some() {
            return;
        }
        headers.push(TRACEPARENT, self.traceparent());
        if let Some(state) = &self.state {
            headers.push(TRACESTATE, state.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_traceparents_are_ignored() {
        for bad in [
            &b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"[..],
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"\xff\xfe",
        ] {
            assert!(TraceContext::parse(bad).is_none(), "{:?}", String::from_utf8_lossy(bad));
        }
        let later = TraceContext::parse(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future").unwrap();
        assert!(later.traceparent().starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
    }

    #[test]
    fn inject_keeps_the_state_and_a_processor_set_traceparent() {
        let mut input = Headers::default();
        input.push(TRACEPARENT, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        input.push(TRACESTATE, "vendor=abc");
        let ctx = TraceContext::of(&input).unwrap();
        let mut out = Headers::default();
        ctx.inject(&mut out);
        assert_eq!(out.get(TRACEPARENT), Some(ctx.traceparent().as_bytes()));
        assert_eq!(out.get(TRACESTATE), Some(&b"vendor=abc"[..]));
        let mut own = Headers::default();
        own.push(TRACEPARENT, "mine");
        ctx.inject(&mut own);
        assert_eq!(own.get(TRACEPARENT), Some(&b"mine"[..]), "the processor's own header wins");
    }
}
