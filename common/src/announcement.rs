//! The Announcement: what the relay publishes to Kafka for each Outbox row.
//!
//! It is a *hint*, not a command: "Delivery `dlv_…` of endpoint `ep_…` may be ready". The
//! worker reads the Delivery row and its Claim decides; a duplicate Announcement (the relay
//! republishes after a crash, Kafka redelivers) therefore costs one failed Claim and nothing
//! else. The Kafka key is the endpoint id, so all of an endpoint's work lands on one
//! partition. The value is versioned JSON so old and new processes can overlap in a deploy.
//!
//! Versions and rolling deploys: this release writes version 1 and reads every version.
//! Two fields are fixed for every version, now and later: `v` and `delivery_id`. Since the
//! message is only a hint and the Claim reads everything else from the Delivery row, a
//! reader that meets a version newer than its own claims the Delivery it names
//! ([`Announcement::delivery_of_any_version`]) instead of dropping it: a deploy that
//! changes the format loses nothing and waits for nothing, whichever worker reads the
//! message. A change that would alter what `delivery_id` means is a new topic, not a new
//! version.

use serde::{Deserialize, Serialize};

use crate::ids::{DeliveryId, EndpointId, ProjectId};
use crate::status::OutboxReason;

pub const ANNOUNCEMENT_VERSION: u8 = 1;

/// What every version of an Announcement carries.
#[derive(Deserialize)]
struct AnyVersion {
    v: u8,
    #[serde(deserialize_with = "DeliveryId::deserialize_trusted")]
    delivery_id: DeliveryId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announcement {
    /// Schema version of this message ([`ANNOUNCEMENT_VERSION`]).
    pub v: u8,
    #[serde(deserialize_with = "DeliveryId::deserialize_trusted")]
    pub delivery_id: DeliveryId,
    #[serde(deserialize_with = "EndpointId::deserialize_trusted")]
    pub endpoint_id: EndpointId,
    #[serde(deserialize_with = "ProjectId::deserialize_trusted")]
    pub project_id: ProjectId,
    /// Why the Outbox row was written. A reason this release does not know fails
    /// [`Announcement::decode`]; the worker then claims by [`Announcement::delivery_of_any_version`],
    /// as for a newer version, so nothing is dropped.
    pub reason: OutboxReason,
    pub outbox_id: i64,
    /// The commit LSN of the transaction that inserted the Outbox row, as `X/Y`.
    pub commit_lsn: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AnnouncementError {
    #[error("announcement is not valid JSON of the expected shape")]
    Malformed(#[source] serde_json::Error),
    #[error("announcement version {0} is not understood")]
    UnknownVersion(u8),
}

impl Announcement {
    /// The Kafka message key: all of an endpoint's work on one partition.
    pub fn key(&self) -> &str {
        self.endpoint_id.as_str()
    }

    pub fn encode(&self) -> Vec<u8> {
        // Serialising a struct of strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The version and the Delivery of an Announcement of any version (see the module doc).
    pub fn delivery_of_any_version(bytes: &[u8]) -> Result<(u8, DeliveryId), AnnouncementError> {
        let a: AnyVersion = serde_json::from_slice(bytes).map_err(AnnouncementError::Malformed)?;
        Ok((a.v, a.delivery_id))
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, AnnouncementError> {
        // The version first: a newer one may change any other field's shape.
        #[derive(Deserialize)]
        struct Version {
            v: u8,
        }
        let Version { v } = serde_json::from_slice(bytes).map_err(AnnouncementError::Malformed)?;
        if v != ANNOUNCEMENT_VERSION {
            return Err(AnnouncementError::UnknownVersion(v));
        }
        serde_json::from_slice(bytes).map_err(AnnouncementError::Malformed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_unknown_versions() {
        let a = Announcement {
            v: ANNOUNCEMENT_VERSION,
            delivery_id: DeliveryId::from_trusted("dlv_1".into()),
            endpoint_id: EndpointId::from_trusted("ep_1".into()),
            project_id: ProjectId::from_trusted("proj_1".into()),
            reason: OutboxReason::Created,
            outbox_id: 7,
            commit_lsn: "0/16B3748".into(),
        };
        assert_eq!(Announcement::decode(&a.encode()).expect("decode"), a);
        let mut future = a.clone();
        future.v = 9;
        assert!(matches!(
            Announcement::decode(&future.encode()),
            Err(AnnouncementError::UnknownVersion(9))
        ));
        assert!(Announcement::decode(b"{").is_err());
    }

    #[test]
    fn a_newer_version_still_names_its_delivery() {
        let newer =
            br#"{"v": 2, "delivery_id": "dlv_9", "shard": 4, "reason": {"kind": "CREATED"}}"#;
        assert!(matches!(
            Announcement::decode(newer),
            Err(AnnouncementError::UnknownVersion(2))
        ));
        assert_eq!(
            Announcement::delivery_of_any_version(newer).expect("any version"),
            (2, DeliveryId::from_trusted("dlv_9".to_owned()))
        );
        assert!(Announcement::delivery_of_any_version(br#"{"v": 3}"#).is_err());
    }
}
