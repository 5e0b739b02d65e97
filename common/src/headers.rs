//! The headers of an Attempt's request: their names, which of them an endpoint may not set,
//! and the one function that lays them out. The worker's Runner sends what
//! [`request_headers`] returns; the dashboard shows what the same function returns with the
//! secrets left out, so the page cannot drift from the wire.
//!
//! Precedence, lowest first: a forwarded provider's headers (incoming webhooks: a fixed safe
//! subset chosen at receipt), then the endpoint's custom headers, then Railhook's own. The
//! API refuses a custom header named in [`RESERVED`], so only the provider's `content-type`
//! ever meets one of Railhook's names, and it is taken as the request's content type.

use serde_json::Value;

pub const WEBHOOK_ID: &str = "webhook-id";
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";
pub const EVENT_ID: &str = "x-event-id";
pub const EVENT_TYPE: &str = "x-event-type";
pub const SEQUENCE_NUMBER: &str = "x-sequence-number";
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";
pub const CONTENT_TYPE: &str = "content-type";
pub const USER_AGENT: &str = "user-agent";

/// The content type of an Event's payload when nothing else names one.
pub const DEFAULT_CONTENT_TYPE: &str = "application/json";
/// What every Attempt sends as `user-agent`.
pub const USER_AGENT_VALUE: &str = concat!("Railhook/", env!("CARGO_PKG_VERSION"));

/// Headers Railhook sets itself, or that the HTTP client owns: an endpoint's custom headers
/// may not name them (the API answers 422).
pub const RESERVED: &[&str] = &[
    "host",
    "content-length",
    CONTENT_TYPE,
    "transfer-encoding",
    "connection",
    USER_AGENT,
    WEBHOOK_ID,
    WEBHOOK_TIMESTAMP,
    WEBHOOK_SIGNATURE,
    EVENT_ID,
    EVENT_TYPE,
    SEQUENCE_NUMBER,
    TRACEPARENT,
    TRACESTATE,
];

/// Whether `name` (lowercase) is one of [`RESERVED`].
pub fn is_reserved(name: &str) -> bool {
    RESERVED.contains(&name)
}

/// A JSON object of string values (`endpoints.headers`, `events.forward_headers`) as pairs,
/// in the object's order; other values are skipped.
fn pairs(v: Option<&Value>) -> Vec<(String, String)> {
    v.and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// The headers a Delivery's requests carry besides Railhook's own: the forwarded provider
/// headers, then the endpoint's custom ones (later wins), and the content type the
/// provider's request had, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extra {
    pub content_type: Option<String>,
    pub headers: Vec<(String, String)>,
}

impl Extra {
    pub fn merge(forwarded: Option<&Value>, custom: Option<&Value>) -> Self {
        let mut headers = pairs(forwarded);
        let content_type = headers
            .iter()
            .position(|(k, _)| k == CONTENT_TYPE)
            .map(|i| headers.remove(i).1);
        // A custom header replaces a forwarded one of the same name, here, so the list has
        // each name once and every reader (the Runner's header map, the dashboard) sees the
        // same set.
        for (name, value) in pairs(custom) {
            headers.retain(|(k, _)| !k.eq_ignore_ascii_case(&name));
            headers.push((name, value));
        }
        Self {
            content_type,
            headers,
        }
    }
}

/// Everything a request's headers are made of.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub delivery_id: &'a str,
    pub event_id: &'a str,
    pub event_type: &'a str,
    /// Unix seconds of the Attempt's start (what the signature covers).
    pub timestamp: &'a str,
    pub signature: &'a str,
    pub sequence_number: Option<i64>,
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
    pub extra: &'a Extra,
}

/// The request's headers, each name once: [`Extra::merge`] leaves one per name, and the
/// API refuses an endpoint header named like one of Railhook's ([`RESERVED`]).
pub fn request_headers(r: &Request<'_>) -> Vec<(String, String)> {
    let mut h: Vec<(String, String)> = r.extra.headers.clone();
    let mut set = |name: &str, value: &str| h.push((name.to_owned(), value.to_owned()));
    set(WEBHOOK_ID, r.delivery_id);
    set(WEBHOOK_TIMESTAMP, r.timestamp);
    set(WEBHOOK_SIGNATURE, r.signature);
    set(EVENT_ID, r.event_id);
    set(EVENT_TYPE, r.event_type);
    if let Some(n) = r.sequence_number {
        set(SEQUENCE_NUMBER, &n.to_string());
    }
    if let Some(tp) = r.traceparent {
        set(TRACEPARENT, tp);
    }
    if let Some(ts) = r.tracestate {
        set(TRACESTATE, ts);
    }
    set(
        CONTENT_TYPE,
        r.extra
            .content_type
            .as_deref()
            .unwrap_or(DEFAULT_CONTENT_TYPE),
    );
    set(USER_AGENT, USER_AGENT_VALUE);
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_forwarded_content_type_is_the_requests_and_custom_headers_come_after_forwarded_ones() {
        let extra = Extra::merge(
            Some(
                &json!({"content-type": "application/x-www-form-urlencoded", "x-github-event": "push"}),
            ),
            Some(&json!({"x-team": "billing", "n": 3})),
        );
        assert_eq!(
            extra.content_type.as_deref(),
            Some("application/x-www-form-urlencoded")
        );
        assert_eq!(
            extra.headers,
            vec![
                ("x-github-event".to_owned(), "push".to_owned()),
                ("x-team".to_owned(), "billing".to_owned())
            ]
        );
        let h = request_headers(&Request {
            delivery_id: "dlv_1",
            event_id: "evt_1",
            event_type: "push",
            timestamp: "1700000000",
            signature: "v1,abc",
            sequence_number: Some(4),
            traceparent: None,
            tracestate: None,
            extra: &extra,
        });
        let get = |n: &str| {
            h.iter()
                .rev()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get(CONTENT_TYPE), Some("application/x-www-form-urlencoded"));
        assert_eq!(get(EVENT_ID), Some("evt_1"));
        assert_eq!(get(SEQUENCE_NUMBER), Some("4"));
        assert_eq!(get("x-team"), Some("billing"));
        assert_eq!(get(TRACEPARENT), None);
        // Nothing of Railhook's can be replaced by an endpoint: every name it sets is reserved.
        for (name, _) in h.iter().skip(extra.headers.len()) {
            assert!(
                is_reserved(name),
                "{name} is set by Railhook but not reserved"
            );
        }
    }

    #[test]
    fn an_endpoint_header_replaces_a_forwarded_one_of_the_same_name() {
        let extra = Extra::merge(
            Some(&json!({"x-github-event": "push", "x-team": "from-provider"})),
            Some(&json!({"X-Team": "billing"})),
        );
        assert_eq!(
            extra.headers,
            vec![
                ("x-github-event".to_owned(), "push".to_owned()),
                ("X-Team".to_owned(), "billing".to_owned())
            ]
        );
    }

    #[test]
    fn without_a_provider_the_payload_is_json() {
        let extra = Extra::merge(None, Some(&json!({})));
        let h = request_headers(&Request {
            delivery_id: "d",
            event_id: "e",
            event_type: "t",
            timestamp: "0",
            signature: "s",
            sequence_number: None,
            traceparent: Some("00-1-2-01"),
            tracestate: None,
            extra: &extra,
        });
        assert!(h.contains(&(CONTENT_TYPE.to_owned(), DEFAULT_CONTENT_TYPE.to_owned())));
        assert!(h.contains(&(TRACEPARENT.to_owned(), "00-1-2-01".to_owned())));
    }
}
