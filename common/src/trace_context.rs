//! W3C Trace Context (`traceparent`, `tracestate`) carried from the API call that created an
//! Event to the receiver's request, through the commit, the Outbox, the relay and Kafka.
//!
//! Only an outbox-and-CDC design can keep one trace across that path without a tracing
//! backend in between: the trace context is stored with the Event and in its Outbox row in
//! the same transaction, so it survives any crash or retry that the Event survives.
//!
//! - ingest: a valid `traceparent` on the request becomes the parent of the request's span;
//!   without one, Railhook starts a trace. What is stored is the request span's own context
//!   (the sender's trace id, the ingest span as parent), so the next hops are its children.
//! - relay: the publish of an Outbox row is a span under the stored context; its own
//!   context travels as the Kafka message's `traceparent` header.
//! - worker: each Attempt is a span under the stored context (the Delivery row decides the
//!   Attempt, not the Kafka message, and retries have no message of the relay), and the
//!   receiver gets `traceparent` with the same trace id and the Attempt span as its parent,
//!   with the stored `tracestate`.
//!
//! Without an OTLP exporter the spans have no OpenTelemetry ids; the trace id still passes
//! through unchanged and each hop draws a fresh parent id, so a receiver's trace still joins
//! the sender's.

use std::fmt;

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// A parsed `traceparent` (version 00 layout; later versions are read by their first four
/// fields, as the W3C specification asks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    pub flags: u8,
}

fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != N * 2
        || !s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[i * 2..i * 2 + 2], 16).ok()?;
    }
    Some(out)
}

impl TraceParent {
    /// Parses a header value; `None` for anything the specification says to ignore
    /// (wrong lengths, upper-case hex, version `ff`, all-zero ids, extra fields on 00).
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        let mut parts = value.split('-');
        let version = parts.next()?;
        let (trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?);
        let rest = parts.next();
        let version: [u8; 1] = hex(version)?;
        if version[0] == 0xff || (version[0] == 0 && rest.is_some()) {
            return None;
        }
        let trace_id: [u8; 16] = hex(trace)?;
        let parent_id: [u8; 8] = hex(parent)?;
        let [flags] = hex::<1>(flags)?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// A new trace: random ids, sampled.
    pub fn start() -> Self {
        Self {
            trace_id: nonzero(),
            parent_id: nonzero(),
            flags: 1,
        }
    }

    /// The same trace with `parent_id` replaced: what the next hop sends.
    pub fn child(&self, parent_id: [u8; 8]) -> Self {
        Self { parent_id, ..*self }
    }

    pub fn trace_id_hex(&self) -> String {
        self.trace_id.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn span_context(&self, tracestate: Option<&str>) -> SpanContext {
        let state = tracestate
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.parent_id),
            TraceFlags::new(self.flags),
            true,
            state,
        )
    }
}

fn nonzero<const N: usize>() -> [u8; N] {
    loop {
        let ids: [u8; N] = rand::random();
        if ids != [0; N] {
            return ids;
        }
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        for b in self.trace_id {
            write!(f, "{b:02x}")?;
        }
        f.write_str("-")?;
        for b in self.parent_id {
            write!(f, "{b:02x}")?;
        }
        write!(f, "-{:02x}", self.flags)
    }
}

/// A `tracestate` worth carrying: printable ASCII, at most 512 bytes (the specification's
/// limit for what a hop must propagate); anything else is dropped, not rejected.
pub fn tracestate(value: &str) -> Option<String> {
    let v = value.trim();
    (!v.is_empty() && v.len() <= 512 && v.bytes().all(|b| (0x20..0x7f).contains(&b)))
        .then(|| v.to_owned())
}

/// Makes `parent` (a remote context) the parent of `span`. Call before the span is entered.
pub fn adopt(span: &tracing::Span, parent: &TraceParent, tracestate: Option<&str>) {
    let cx =
        opentelemetry::Context::new().with_remote_span_context(parent.span_context(tracestate));
    let _ = span.set_parent(cx);
}

/// The context `span` hands to the next hop: its own OpenTelemetry ids when spans are
/// exported; otherwise `parent`'s trace (or a new one) with a fresh parent id.
pub fn handed_on(span: &tracing::Span, parent: Option<&TraceParent>) -> TraceParent {
    let cx = span.context();
    let own = cx.span().span_context().clone();
    if own.is_valid() {
        return TraceParent {
            trace_id: own.trace_id().to_bytes(),
            parent_id: own.span_id().to_bytes(),
            flags: own.trace_flags().to_u8(),
        };
    }
    match parent {
        Some(p) => p.child(nonzero()),
        None => TraceParent::start(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_prints_the_specification_example() {
        let tp = TraceParent::parse(EXAMPLE).expect("valid");
        assert_eq!(tp.to_string(), EXAMPLE);
        assert_eq!(tp.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let child = tp.child([1; 8]);
        assert_eq!(child.trace_id, tp.trace_id);
        assert_eq!(
            child.to_string(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0101010101010101-01"
        );
    }

    #[test]
    fn refuses_what_the_specification_says_to_ignore() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
        // A later version may add fields: its first four are still read.
        assert!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz")
                .is_some()
        );
    }

    #[test]
    fn without_an_exporter_a_hop_keeps_the_trace_and_draws_a_new_parent() {
        let tp = TraceParent::parse(EXAMPLE).expect("valid");
        let next = handed_on(&tracing::Span::none(), Some(&tp));
        assert_eq!(next.trace_id, tp.trace_id);
        assert_ne!(next.parent_id, tp.parent_id);
        let fresh = handed_on(&tracing::Span::none(), None);
        assert_ne!(fresh.trace_id, [0; 16]);
    }

    #[test]
    fn tracestate_is_carried_only_when_sane() {
        assert_eq!(
            tracestate(" congo=t61rcWkgMzE "),
            Some("congo=t61rcWkgMzE".into())
        );
        assert_eq!(tracestate(&"a".repeat(513)), None);
        assert_eq!(tracestate("a=\u{1}"), None);
        assert_eq!(tracestate(""), None);
    }
}
