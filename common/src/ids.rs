//! Prefixed, time-sortable identifiers (`evt_01J…`, `dlv_01J…`).
//!
//! Every id is a type prefix plus a lowercase ULID. The ULID's leading timestamp makes ids
//! roughly creation-ordered, which is what cursor pagination relies on (`ORDER BY id DESC`).
//! The prefix makes a pasted id self-describing and lets [`parse`](EventId::parse) refuse an
//! endpoint id where an event id was expected.

use std::fmt;

/// A string that is not an id of the expected kind.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("not a valid {kind} id")]
pub struct IdError {
    pub kind: &'static str,
}

macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            /// A fresh id, sortable by creation time.
            pub fn generate() -> Self {
                Self(format!("{}{}", $prefix, ulid::Ulid::new().to_string().to_lowercase()))
            }

            /// An id whose time is `at`: what a row created then would have. The day
            /// partitions are keyed by it (common/src/retention/); tests and benchmarks
            /// use it to write into past days.
            pub fn generate_at(at: std::time::SystemTime) -> Self {
                Self(format!("{}{}", $prefix, ulid::Ulid::from_datetime(at).to_string().to_lowercase()))
            }

            /// Accepts only `<prefix><26-char ULID>`.
            pub fn parse(raw: &str) -> Result<Self, IdError> {
                let err = IdError { kind: $kind };
                let body = raw.strip_prefix($prefix).ok_or(err.clone())?;
                if body.len() != 26 {
                    return Err(err);
                }
                ulid::Ulid::from_string(&body.to_uppercase()).map_err(|_| err)?;
                Ok(Self(raw.to_owned()))
            }

            /// Wraps a value read back from our own database, where only valid ids are stored.
            pub fn from_trusted(raw: String) -> Self {
                Self(raw)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }

            /// For `#[serde(deserialize_with)]` on messages Railhook wrote itself from its
            /// own rows (the Announcement, the RetryHint): typed, not re-validated, so a
            /// row id of an older shape still names its row.
            pub fn deserialize_trusted<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                <String as serde::Deserialize>::deserialize(d).map(Self)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let raw = String::deserialize(d)?;
                Self::parse(&raw).map_err(serde::de::Error::custom)
            }
        }
    };
}

prefixed_id!(
    /// A tenant that owns projects and a monthly quota.
    OrganizationId, "org_", "organization");
prefixed_id!(
    /// A project: the scope of an API key and of everything it creates.
    ProjectId, "proj_", "project");
prefixed_id!(
    /// A project API key (the id, never the key itself).
    ApiKeyId, "key_", "api key");
prefixed_id!(
    /// One customer of the sending team: its Events reach only its own endpoints.
    ApplicationId, "app_", "application");
prefixed_id!(
    /// A customer's session in the portal (named in logs; the token itself never is).
    PortalSessionId, "psess_", "portal session");
prefixed_id!(
    /// An HTTP endpoint that receives webhooks.
    EndpointId, "ep_", "endpoint");
prefixed_id!(
    /// A subscription of an endpoint to event-type patterns.
    SubscriptionId, "sub_", "subscription");
prefixed_id!(
    /// Where one provider's webhooks arrive (`POST /in/{source_id}`).
    SourceId, "src_", "source");
prefixed_id!(
    /// What a sender announced. Sent to receivers as `X-Event-Id`; stable across replays.
    EventId, "evt_", "event");
prefixed_id!(
    /// The obligation to deliver one Event to one endpoint. Sent as `webhook-id`: stable
    /// across every retry of that Delivery, which is what receivers deduplicate on.
    DeliveryId, "dlv_", "delivery");
prefixed_id!(
    /// One row of the audit log: one change, who made it and when.
    AuditEntryId, "aud_", "audit entry");
prefixed_id!(
    /// A Replay (the Time Machine): one request to rebuild Deliveries from stored Events.
    ReplayId, "rpl_", "replay");

/// The smallest and largest of `ids`, for a statement's `id BETWEEN $lo AND $hi`.
///
/// Redundant as a filter, and there for the executor: the ids carry their time and `events`,
/// `deliveries` and `attempts` are partitioned by it, so a range known when the statement
/// starts lets PostgreSQL leave out every partition outside it before it opens them. A join
/// or `= ANY` on the ids alone is pruned only row by row, after every partition and its
/// indexes were opened: with a month of day partitions that opening cost more than the
/// rows' work (docs/BENCHMARKS-HISTORY.md, "Partitions a statement opens").
pub fn id_range(ids: &[String]) -> (&str, &str) {
    let lowest = ids.iter().min().map_or("", String::as_str);
    let highest = ids.iter().max().map_or("", String::as_str);
    (lowest, highest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_parse_back() {
        let id = EventId::generate();
        assert!(id.as_str().starts_with("evt_"));
        assert_eq!(EventId::parse(id.as_str()), Ok(id));
    }

    #[test]
    fn wrong_prefix_or_body_is_refused() {
        let ep = EndpointId::generate();
        assert!(EventId::parse(ep.as_str()).is_err());
        assert!(EventId::parse("evt_").is_err());
        assert!(EventId::parse("evt_uuuuuuuuuuuuuuuuuuuuuuuuuu").is_err());
        assert!(EventId::parse("evt_01arz3ndektsv4rrffq69g5fa").is_err());
        assert!(EventId::parse("evt_01arz3ndektsv4rrffq69g5fav").is_ok());
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(s in ".*") {
            let _ = DeliveryId::parse(&s);
        }
    }
}
