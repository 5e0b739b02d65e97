//! Standard Webhooks signatures.
//!
//! `webhook-signature: v1,<base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}"))>`, where the
//! key is the base64 part of the `whsec_…` secret. During a secret rotation the header
//! carries one space-separated entry per active secret, so a receiver that knows either
//! secret verifies the request. The id is the Delivery id (stable across retries, the
//! receiver's dedupe key); the timestamp is fresh on every Attempt and is covered by the
//! signature, which is what lets receivers refuse replays of old requests.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::secrets::SIGNING_SECRET_PREFIX;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("signing secret is not whsec_ followed by base64")]
pub struct BadSecret;

/// A decoded signing key.
#[derive(Clone)]
pub struct SigningKey(Vec<u8>);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(..)")
    }
}

impl SigningKey {
    pub fn parse(secret: &str) -> Result<Self, BadSecret> {
        let raw = secret.strip_prefix(SIGNING_SECRET_PREFIX).unwrap_or(secret);
        STANDARD.decode(raw).map(Self).map_err(|_| BadSecret)
    }

    /// `v1,<base64 signature>` of one message.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        // HMAC accepts keys of any length, so this cannot fail.
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!());
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

/// The `webhook-signature` header value: one entry per active key, space-separated.
pub fn signature_header(keys: &[SigningKey], id: &str, timestamp: i64, body: &[u8]) -> String {
    keys.iter()
        .map(|k| k.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_webhooks_public_vector() {
        let key = SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("key");
        let sig = key.sign(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn rotation_signs_with_every_active_key() {
        let a = SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("a");
        let b = SigningKey::parse(&crate::secrets::generate_signing_secret()).expect("b");
        let header = signature_header(&[a.clone(), b.clone()], "id", 1, b"{}");
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts, vec![a.sign("id", 1, b"{}"), b.sign("id", 1, b"{}")]);
        assert!(SigningKey::parse("whsec_not base64!").is_err());
    }

    proptest::proptest! {
        /// Any change to id, timestamp or body changes the signature.
        #[test]
        fn signature_covers_every_part(id in "[a-z0-9_]{1,30}", ts in 0i64..4_000_000_000, body in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let key = SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("key");
            let sig = key.sign(&id, ts, &body);
            proptest::prop_assert_ne!(&sig, &key.sign(&format!("{id}x"), ts, &body));
            proptest::prop_assert_ne!(&sig, &key.sign(&id, ts + 1, &body));
            let mut other = body.clone();
            other.push(b'!');
            proptest::prop_assert_ne!(&sig, &key.sign(&id, ts, &other));
        }
    }
}
