//! Key generation: endpoint signing secrets and project API keys (sealing them at rest is
//! `sealing.rs`).
//!
//! Signing secrets follow Standard Webhooks: `whsec_` + base64 of 24 random bytes, so the
//! official verifier libraries accept them as they are; or, for endpoints signing with
//! Ed25519 (v1a), `whsk_` + base64 of the 64-byte secret key, whose `whpk_` public key is
//! all a receiver needs. API keys are `rh_` + a visible
//! 8-character prefix + `_` + 32 random characters; only their SHA-256 is stored, which is
//! enough for a key with ~190 bits of entropy (no password-style stretching needed), and
//! lookups stay a single indexed read.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rand::Rng;
use rand::distr::Alphanumeric;
use sha2::{Digest, Sha256};

pub const SIGNING_SECRET_PREFIX: &str = "whsec_";
/// An Ed25519 secret key (v1a): seed and public key, 64 bytes, base64.
pub const ED25519_SECRET_PREFIX: &str = "whsk_";
/// An Ed25519 public key (v1a): 32 bytes, base64. Safe to show and to share.
pub const ED25519_PUBLIC_PREFIX: &str = "whpk_";
pub const API_KEY_PREFIX: &str = "rh_";

/// A fresh `whsec_…` signing secret.
pub fn generate_signing_secret() -> String {
    let bytes: [u8; 24] = rand::rng().random();
    format!("{SIGNING_SECRET_PREFIX}{}", STANDARD.encode(bytes))
}

/// A fresh `whsk_…` Ed25519 secret key (seed then public key, libsodium's layout).
pub fn generate_ed25519_secret() -> String {
    let seed: [u8; 32] = rand::rng().random();
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed)
        .unwrap_or_else(|_| unreachable!("any 32 bytes are a seed"));
    let mut bytes = seed.to_vec();
    bytes.extend_from_slice(ring::signature::KeyPair::public_key(&pair).as_ref());
    format!("{ED25519_SECRET_PREFIX}{}", STANDARD.encode(bytes))
}

/// A fresh secret of the same scheme as `current` (a rotation keeps the endpoint's scheme).
pub fn generate_secret_like(current: &str) -> String {
    if current.starts_with(ED25519_SECRET_PREFIX) {
        generate_ed25519_secret()
    } else {
        generate_signing_secret()
    }
}

/// A freshly minted API key: shown to its owner once, then only its hash is kept.
pub struct NewApiKey {
    /// The whole key, to hand to the caller exactly once.
    pub plaintext: String,
    /// The visible part (`rh_ab12cd34`), safe to list and log.
    pub prefix: String,
    pub hash: Vec<u8>,
}

pub fn generate_api_key() -> NewApiKey {
    let mut rng = rand::rng();
    let visible: String = (&mut rng)
        .sample_iter(Alphanumeric)
        .take(8)
        .map(|c| char::from(c).to_ascii_lowercase())
        .collect();
    let hidden: String = (&mut rng)
        .sample_iter(Alphanumeric)
        .take(32)
        .map(char::from)
        .collect();
    let prefix = format!("{API_KEY_PREFIX}{visible}");
    let plaintext = format!("{prefix}_{hidden}");
    let hash = hash_api_key(&plaintext);
    NewApiKey {
        plaintext,
        prefix,
        hash,
    }
}

/// The stored form of an API key.
pub fn hash_api_key(plaintext: &str) -> Vec<u8> {
    Sha256::digest(plaintext.as_bytes()).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signing_secret_is_whsec_base64_of_24_bytes() {
        let s = generate_signing_secret();
        let raw = s.strip_prefix(SIGNING_SECRET_PREFIX).expect("prefix");
        assert_eq!(STANDARD.decode(raw).expect("base64").len(), 24);
        assert_ne!(s, generate_signing_secret());
    }

    #[test]
    fn api_key_hash_matches_and_prefix_is_visible_part() {
        let k = generate_api_key();
        assert!(k.plaintext.starts_with(&k.prefix));
        assert_eq!(k.prefix.len(), 11);
        assert_eq!(hash_api_key(&k.plaintext), k.hash);
        assert_ne!(hash_api_key(&generate_api_key().plaintext), k.hash);
    }
}
