//! The RetryHint: what the worker's retry scheduler publishes for a due Delivery it claimed.
//! It carries the scheduler's token, which the consumer swaps for its own
//! (worker/src/claim.rs, `swap_batch`).
//!
//! Versions, as for the Announcement: this release writes version 1 and reads every
//! version; `v`, `delivery_id`, `endpoint_id` and `token` keep their meaning in every
//! version, so a hint from a newer scheduler in a rolling deploy is swapped like any other
//! (the swap needs the exact token, so nothing is guessed).

use serde_json::json;
use uuid::Uuid;

use crate::ids::{DeliveryId, EndpointId};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryHint {
    pub delivery_id: DeliveryId,
    pub endpoint_id: EndpointId,
    /// The scheduler's Claim token: the swap succeeds only while the row still carries it.
    pub token: Uuid,
}

impl RetryHint {
    pub fn encode(&self) -> Vec<u8> {
        json!({"v": 1, "delivery_id": self.delivery_id, "endpoint_id": self.endpoint_id, "token": self.token})
            .to_string()
            .into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        if v["v"].as_u64().is_none_or(|version| version < 1) {
            return None;
        }
        Some(Self {
            delivery_id: DeliveryId::from_trusted(v["delivery_id"].as_str()?.to_owned()),
            endpoint_id: EndpointId::from_trusted(v["endpoint_id"].as_str()?.to_owned()),
            token: v["token"].as_str()?.parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let h = RetryHint {
            delivery_id: DeliveryId::from_trusted("dlv_1".into()),
            endpoint_id: EndpointId::from_trusted("ep_1".into()),
            token: Uuid::new_v4(),
        };
        assert_eq!(RetryHint::decode(&h.encode()), Some(h.clone()));
        assert_eq!(RetryHint::decode(b"{\"v\":2}"), None);
        let newer = format!(
            r#"{{"v": 2, "delivery_id": "dlv_1", "endpoint_id": "ep_1", "token": "{}", "extra": [1]}}"#,
            h.token
        );
        assert_eq!(RetryHint::decode(newer.as_bytes()), Some(h.clone()));
        assert_eq!(RetryHint::decode(b"{\"v\":0,\"delivery_id\":\"d\"}"), None);
        assert_eq!(RetryHint::decode(b"nonsense"), None);
    }
}
