//! Standard Webhooks signatures, symmetric (v1) and asymmetric (v1a).
//!
//! v1: `webhook-signature: v1,<base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}"))>`, where
//! the key is the base64 part of the `whsec_…` secret.
//!
//! v1a: `webhook-signature: v1a,<base64(Ed25519(key, "{id}.{timestamp}.{body}"))>`, where the
//! endpoint's secret is `whsk_` + base64 of the 64-byte Ed25519 secret key (the 32-byte seed
//! followed by the 32-byte public key, libsodium's layout) and the receiver holds only
//! `whpk_` + base64 of the 32-byte public key: it can verify, never sign.
//!
//! During a secret rotation the header carries one space-separated entry per active secret
//! (a rotation keeps the endpoint's scheme), so a receiver that knows either verifies the
//! request. The id is the Delivery id (stable across retries, the receiver's dedupe key); the
//! timestamp is fresh on every Attempt and is covered by the signature, which is what lets
//! receivers refuse replays of old requests.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use ring::signature::{Ed25519KeyPair, KeyPair};
use sha2::Sha256;

use crate::keygen::{ED25519_PUBLIC_PREFIX, ED25519_SECRET_PREFIX, SIGNING_SECRET_PREFIX};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("signing secret is not whsec_ or whsk_ followed by base64 of a valid key")]
pub struct BadSecret;

/// A decoded signing key.
#[derive(Clone)]
pub enum SigningKey {
    /// v1: HMAC-SHA256 with the decoded `whsec_` secret.
    Hmac(Vec<u8>),
    /// v1a: Ed25519 with the `whsk_` secret key.
    Ed25519(Arc<Ed25519KeyPair>),
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(..)")
    }
}

impl SigningKey {
    /// A `whsk_…` secret is Ed25519; anything else is read as a `whsec_…` HMAC secret (the
    /// prefix is optional there, as the verifier libraries allow).
    pub fn parse(secret: &str) -> Result<Self, BadSecret> {
        if let Some(raw) = secret.strip_prefix(ED25519_SECRET_PREFIX) {
            let bytes = STANDARD.decode(raw).map_err(|_| BadSecret)?;
            if bytes.len() != 64 {
                return Err(BadSecret);
            }
            // ring checks that the public half belongs to the seed.
            let pair = Ed25519KeyPair::from_seed_and_public_key(&bytes[..32], &bytes[32..])
                .map_err(|_| BadSecret)?;
            return Ok(Self::Ed25519(Arc::new(pair)));
        }
        let raw = secret.strip_prefix(SIGNING_SECRET_PREFIX).unwrap_or(secret);
        STANDARD.decode(raw).map(Self::Hmac).map_err(|_| BadSecret)
    }

    /// `hmac-sha256` or `ed25519`: the endpoint's `signing` in the API.
    pub fn scheme(&self) -> &'static str {
        match self {
            Self::Hmac(_) => "hmac-sha256",
            Self::Ed25519(_) => "ed25519",
        }
    }

    /// `whpk_…`, what a receiver verifies v1a signatures with; `None` for HMAC.
    pub fn public_key(&self) -> Option<String> {
        match self {
            Self::Hmac(_) => None,
            Self::Ed25519(pair) => Some(format!(
                "{ED25519_PUBLIC_PREFIX}{}",
                STANDARD.encode(pair.public_key().as_ref())
            )),
        }
    }

    /// `v1,<base64 signature>` or `v1a,<base64 signature>` of one message.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let ts = timestamp.to_string();
        match self {
            Self::Hmac(key) => {
                // HMAC accepts keys of any length, so this cannot fail.
                let mut mac =
                    Hmac::<Sha256>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
                mac.update(id.as_bytes());
                mac.update(b".");
                mac.update(ts.as_bytes());
                mac.update(b".");
                mac.update(body);
                format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
            }
            Self::Ed25519(pair) => {
                let mut message = Vec::with_capacity(id.len() + ts.len() + body.len() + 2);
                message.extend_from_slice(id.as_bytes());
                message.push(b'.');
                message.extend_from_slice(ts.as_bytes());
                message.push(b'.');
                message.extend_from_slice(body);
                format!("v1a,{}", STANDARD.encode(pair.sign(&message).as_ref()))
            }
        }
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
        let b = SigningKey::parse(&crate::keygen::generate_signing_secret()).expect("b");
        let header = signature_header(&[a.clone(), b.clone()], "id", 1, b"{}");
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts, vec![a.sign("id", 1, b"{}"), b.sign("id", 1, b"{}")]);
        assert!(SigningKey::parse("whsec_not base64!").is_err());
    }

    #[test]
    fn ed25519_keys_sign_v1a_and_show_only_their_public_half() {
        let secret = crate::keygen::generate_ed25519_secret();
        let key = SigningKey::parse(&secret).expect("key");
        assert_eq!(key.scheme(), "ed25519");
        let public = key.public_key().expect("public");
        assert!(public.starts_with("whpk_"));
        assert_eq!(STANDARD.decode(&public[5..]).expect("b64").len(), 32);
        let sig = key.sign("msg_1", 1, b"{}");
        assert!(sig.starts_with("v1a,"));
        assert_eq!(STANDARD.decode(&sig[4..]).expect("b64").len(), 64);
        // Deterministic (Ed25519), and covering the message.
        assert_eq!(sig, key.sign("msg_1", 1, b"{}"));
        assert_ne!(sig, key.sign("msg_1", 2, b"{}"));
        // A secret whose public half does not match its seed is refused.
        let mut bytes = STANDARD.decode(&secret[5..]).expect("b64");
        bytes[40] ^= 1;
        assert!(SigningKey::parse(&format!("whsk_{}", STANDARD.encode(&bytes))).is_err());
        assert!(SigningKey::parse("whsk_c2hvcnQ=").is_err());
        assert_eq!(
            SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
                .expect("hmac")
                .public_key(),
            None
        );
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
