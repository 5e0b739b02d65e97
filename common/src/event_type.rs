//! Event types (`order.paid`) and the subscription patterns that match them (`order.*`).
//!
//! An event type is one or more dot-separated segments of `[A-Za-z0-9_-]`, at most 255
//! bytes. A pattern has the same shape, except that a segment may be `*`, which matches
//! exactly one segment; the pattern `*` on its own matches every type. Matching is by
//! segment count, so `order.*` matches `order.paid` but not `order` or `order.paid.late`.

use std::fmt;

const MAX_LEN: usize = 255;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EventTypeError {
    #[error("must not be empty")]
    Empty,
    #[error("must be at most {MAX_LEN} bytes")]
    TooLong,
    #[error("segments are separated by single dots and use only A-Z, a-z, 0-9, '_' and '-'")]
    BadSegment,
}

fn valid_segment(seg: &str, allow_wildcard: bool) -> bool {
    (allow_wildcard && seg == "*")
        || (!seg.is_empty()
            && seg
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
}

fn validate(raw: &str, allow_wildcard: bool) -> Result<(), EventTypeError> {
    if raw.is_empty() {
        return Err(EventTypeError::Empty);
    }
    if raw.len() > MAX_LEN {
        return Err(EventTypeError::TooLong);
    }
    if raw.split('.').all(|seg| valid_segment(seg, allow_wildcard)) {
        Ok(())
    } else {
        Err(EventTypeError::BadSegment)
    }
}

/// A valid event type such as `order.paid`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct EventType(String);

impl EventType {
    pub fn parse(raw: &str) -> Result<Self, EventTypeError> {
        validate(raw, false).map(|()| Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A subscription pattern such as `order.*` or `*`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct EventTypePattern(String);

impl EventTypePattern {
    pub fn parse(raw: &str) -> Result<Self, EventTypeError> {
        validate(raw, true).map(|()| Self(raw.to_owned()))
    }

    /// Wraps a pattern read back from our own database, where only valid patterns are stored.
    pub fn from_trusted(raw: String) -> Self {
        Self(raw)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn matches(&self, event_type: &EventType) -> bool {
        if self.0 == "*" {
            return true;
        }
        let mut pattern = self.0.split('.');
        let mut actual = event_type.0.split('.');
        loop {
            match (pattern.next(), actual.next()) {
                (None, None) => return true,
                (Some(p), Some(a)) if p == "*" || p == a => continue,
                _ => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, ty: &str) -> bool {
        EventTypePattern::parse(pattern)
            .expect("pattern")
            .matches(&EventType::parse(ty).expect("type"))
    }

    #[test]
    fn wildcards_match_one_segment() {
        assert!(matches("order.*", "order.paid"));
        assert!(!matches("order.*", "order"));
        assert!(!matches("order.*", "order.paid.late"));
        assert!(matches("*.paid", "invoice.paid"));
        assert!(matches("*", "anything.at.all"));
        assert!(matches("order.paid", "order.paid"));
        assert!(!matches("order.paid", "order.refunded"));
    }

    #[test]
    fn bad_types_are_refused_with_a_reason() {
        assert_eq!(EventType::parse(""), Err(EventTypeError::Empty));
        assert_eq!(
            EventType::parse("order..paid"),
            Err(EventTypeError::BadSegment)
        );
        assert_eq!(EventType::parse("order.*"), Err(EventTypeError::BadSegment));
        assert_eq!(
            EventType::parse("ordér.paid"),
            Err(EventTypeError::BadSegment)
        );
        assert_eq!(
            EventType::parse(&"a".repeat(256)),
            Err(EventTypeError::TooLong)
        );
        assert!(EventType::parse("user_v2.sign-up").is_ok());
    }
}
