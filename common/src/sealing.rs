//! Secrets at rest: endpoint signing secrets, Source secrets and the values of endpoints'
//! custom headers (where users put receivers' credentials; review #34 item 4) are stored sealed
//! (AES-256-GCM) under a key from `RAILHOOK_ENCRYPTION_KEYS`, so a database dump, a backup
//! or a replica read by the wrong person holds no usable secret.
//!
//! A sealed value reads `rhenc1:<key id>:<base64(nonce ‖ ciphertext ‖ tag)>`. The key id is
//! the first 4 bytes (8 hex characters) of the key's SHA-256: it picks the key that opens
//! the value and reveals nothing of it. The row's id is the additional authenticated data,
//! so a sealed secret copied onto another row does not open there.
//!
//! The [`Keyring`] holds every configured key: the first seals, all open, so a key rotates
//! without downtime (configure `new,old`, run `railhook secrets rotate-key`, then drop
//! `old`). A value without the prefix is a plaintext secret written before keys were
//! configured: it is read as it is and sealed by the next `rotate-key`. Without any key the
//! keyring seals nothing (and every process warns at start).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use sha2::{Digest, Sha256};

/// What a sealed value starts with.
pub const SEALED_PREFIX: &str = "rhenc1:";

/// A configuration value that is not a list of 32-byte hex keys.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("key {0} is not 64 hexadecimal characters (32 bytes)")]
    NotHex32(usize),
    #[error("two keys are the same")]
    Repeated,
}

/// A stored value that cannot be opened with the configured keys.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("sealed with key {0}, which is not configured (RAILHOOK_ENCRYPTION_KEYS)")]
    UnknownKey(String),
    #[error("sealed value is damaged or belongs to another row")]
    Damaged,
}

struct Key {
    id: String,
    aead: LessSafeKey,
}

/// The configured keys; the first one seals.
#[derive(Clone, Default)]
pub struct Keyring {
    keys: std::sync::Arc<Vec<Key>>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Key ids only: they identify keys and reveal nothing of them.
        let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("Keyring").field("key_ids", &ids).finish()
    }
}

impl Keyring {
    /// Parses `RAILHOOK_ENCRYPTION_KEYS`: comma-separated keys of 64 hex characters. An
    /// empty string is no key.
    pub fn parse(raw: &str) -> Result<Self, KeyError> {
        let mut keys: Vec<Key> = Vec::new();
        for (n, part) in raw
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .enumerate()
        {
            let bytes = decode_hex32(part).ok_or(KeyError::NotHex32(n + 1))?;
            let id = hex8(&Sha256::digest(bytes));
            if keys.iter().any(|k| k.id == id) {
                return Err(KeyError::Repeated);
            }
            let unbound = UnboundKey::new(&AES_256_GCM, &bytes)
                .unwrap_or_else(|_| unreachable!("32 bytes is an AES-256 key"));
            keys.push(Key {
                id,
                aead: LessSafeKey::new(unbound),
            });
        }
        Ok(Self {
            keys: std::sync::Arc::new(keys),
        })
    }

    /// Whether any key is configured (else values are stored in plaintext).
    pub fn is_enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The id of the sealing key, if any.
    pub fn sealing_key_id(&self) -> Option<&str> {
        self.keys.first().map(|k| k.id.as_str())
    }

    /// `secret` sealed for the row `row_id` with the first key; unchanged without keys.
    pub fn seal(&self, row_id: &str, secret: &str) -> String {
        let Some(key) = self.keys.first() else {
            return secret.to_owned();
        };
        let nonce_bytes: [u8; NONCE_LEN] = rand::random();
        let mut buf = secret.as_bytes().to_vec();
        key.aead
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce_bytes),
                Aad::from(row_id.as_bytes()),
                &mut buf,
            )
            .unwrap_or_else(|_| unreachable!("a secret is far below AES-GCM's length limit"));
        let mut out = nonce_bytes.to_vec();
        out.extend_from_slice(&buf);
        format!("{SEALED_PREFIX}{}:{}", key.id, STANDARD.encode(out))
    }

    /// The secret stored for row `row_id`: opened if sealed, as it is if plaintext.
    pub fn open(&self, row_id: &str, stored: &str) -> Result<String, OpenError> {
        let Some(rest) = stored.strip_prefix(SEALED_PREFIX) else {
            return Ok(stored.to_owned());
        };
        let (id, body) = rest.split_once(':').ok_or(OpenError::Damaged)?;
        let key = self
            .keys
            .iter()
            .find(|k| k.id == id)
            .ok_or_else(|| OpenError::UnknownKey(id.to_owned()))?;
        let mut bytes = STANDARD.decode(body).map_err(|_| OpenError::Damaged)?;
        if bytes.len() < NONCE_LEN {
            return Err(OpenError::Damaged);
        }
        let mut sealed = bytes.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&bytes).map_err(|_| OpenError::Damaged)?;
        let plain = key
            .aead
            .open_in_place(nonce, Aad::from(row_id.as_bytes()), &mut sealed)
            .map_err(|_| OpenError::Damaged)?;
        String::from_utf8(plain.to_vec()).map_err(|_| OpenError::Damaged)
    }

    /// An endpoint's current secret and, during a rotation, its previous one, opened.
    pub fn open_pair(
        &self,
        row_id: &str,
        current: &str,
        previous: Option<&str>,
    ) -> Result<(String, Option<String>), OpenError> {
        let previous = previous.map(|p| self.open(row_id, p)).transpose()?;
        Ok((self.open(row_id, current)?, previous))
    }

    /// `stored` opened and sealed again with the first key (rotation, or a plaintext secret
    /// written before any key was configured).
    pub fn reseal(&self, row_id: &str, stored: &str) -> Result<String, OpenError> {
        Ok(self.seal(row_id, &self.open(row_id, stored)?))
    }

    /// Whether `stored` should be sealed again: plaintext while a key is configured, or
    /// sealed with a key that is not the first.
    pub fn needs_reseal(&self, stored: &str) -> bool {
        match (self.sealing_key_id(), stored.strip_prefix(SEALED_PREFIX)) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(first), Some(rest)) => !rest.starts_with(&format!("{first}:")),
        }
    }
}

/// The additional authenticated data of one custom header's value: the endpoint row and the
/// header's name, so a sealed value opens neither on another endpoint nor under another name.
fn header_aad(row_id: &str, name: &str) -> String {
    format!("{row_id}/header/{name}")
}

impl Keyring {
    /// An endpoint's custom headers (a JSON object of strings) with every value sealed.
    /// Anything that is not a string value is kept as it is.
    pub fn seal_headers(&self, row_id: &str, headers: &serde_json::Value) -> serde_json::Value {
        self.map_headers(headers, |name, value| {
            Ok(self.seal(&header_aad(row_id, name), value))
        })
        .unwrap_or_else(|e: OpenError| unreachable!("sealing cannot fail: {e}"))
    }

    /// An endpoint's custom headers as stored, with every value opened (plaintext values,
    /// written before keys were configured, come back as they are).
    pub fn open_headers(
        &self,
        row_id: &str,
        headers: &serde_json::Value,
    ) -> Result<serde_json::Value, OpenError> {
        self.map_headers(headers, |name, value| {
            self.open(&header_aad(row_id, name), value)
        })
    }

    /// Stored headers sealed again with the first key; `None` when none needs it.
    pub fn reseal_headers(
        &self,
        row_id: &str,
        headers: &serde_json::Value,
    ) -> Result<Option<serde_json::Value>, OpenError> {
        let stale = headers.as_object().is_some_and(|m| {
            m.values()
                .filter_map(|v| v.as_str())
                .any(|v| self.needs_reseal(v))
        });
        if !stale {
            return Ok(None);
        }
        self.map_headers(headers, |name, value| {
            self.reseal(&header_aad(row_id, name), value)
        })
        .map(Some)
    }

    fn map_headers(
        &self,
        headers: &serde_json::Value,
        f: impl Fn(&str, &str) -> Result<String, OpenError>,
    ) -> Result<serde_json::Value, OpenError> {
        let Some(map) = headers.as_object() else {
            return Ok(headers.clone());
        };
        let mut out = serde_json::Map::with_capacity(map.len());
        for (name, value) in map {
            let mapped = match value.as_str() {
                Some(v) => serde_json::Value::String(f(name, v)?),
                None => value.clone(),
            };
            out.insert(name.clone(), mapped);
        }
        Ok(serde_json::Value::Object(out))
    }
}

fn decode_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn hex8(digest: &[u8]) -> String {
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const B: &str = "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff000102030405060708090a0b0c0d0e0f";

    #[test]
    fn header_values_are_sealed_one_by_one_for_their_endpoint_and_name() {
        let ring = Keyring::parse(A).expect("key");
        let plain = serde_json::json!({"Authorization": "Bearer s3cret", "X-Team": "blue"});
        let sealed = ring.seal_headers("ep_1", &plain);
        let text = sealed.to_string();
        assert!(!text.contains("s3cret") && !text.contains("blue"), "{text}");
        assert!(
            text.contains("Authorization"),
            "names stay readable: {text}"
        );
        assert_eq!(ring.open_headers("ep_1", &sealed), Ok(plain.clone()));
        assert_eq!(
            ring.open_headers("ep_2", &sealed),
            Err(OpenError::Damaged),
            "another endpoint's row"
        );
        // A value moved under another header's name does not open.
        let swapped = serde_json::json!({
            "Authorization": sealed["X-Team"], "X-Team": sealed["Authorization"]});
        assert_eq!(ring.open_headers("ep_1", &swapped), Err(OpenError::Damaged));
        // Plaintext written before keys existed is read, and sealed by a rotation.
        assert_eq!(ring.open_headers("ep_1", &plain), Ok(plain.clone()));
        let resealed = ring
            .reseal_headers("ep_1", &plain)
            .expect("reseal")
            .expect("stale");
        assert_eq!(ring.open_headers("ep_1", &resealed), Ok(plain.clone()));
        assert_eq!(ring.reseal_headers("ep_1", &resealed), Ok(None));
        // No key: nothing sealed.
        let none = Keyring::default();
        assert_eq!(none.seal_headers("ep_1", &plain), plain);
    }

    #[test]
    fn a_sealed_secret_opens_only_for_its_row_and_only_with_its_key() {
        let ring = Keyring::parse(A).expect("key");
        let sealed = ring.seal("ep_1", "whsec_abc");
        assert!(sealed.starts_with(SEALED_PREFIX));
        assert!(!sealed.contains("whsec_abc"));
        assert_eq!(ring.open("ep_1", &sealed), Ok("whsec_abc".to_owned()));
        assert_eq!(ring.open("ep_2", &sealed), Err(OpenError::Damaged));
        let other = Keyring::parse(B).expect("key");
        assert!(matches!(
            other.open("ep_1", &sealed),
            Err(OpenError::UnknownKey(_))
        ));
        // Two seals of one secret differ (fresh nonce each time).
        assert_ne!(ring.seal("ep_1", "whsec_abc"), sealed);
    }

    #[test]
    fn rotation_opens_old_values_and_seals_with_the_first_key() {
        let old = Keyring::parse(A).expect("key");
        let sealed_old = old.seal("ep_1", "whsec_x");
        let both = Keyring::parse(&format!("{B}, {A}")).expect("keys");
        assert_eq!(both.open("ep_1", &sealed_old), Ok("whsec_x".to_owned()));
        assert!(both.needs_reseal(&sealed_old));
        let sealed_new = both.seal("ep_1", "whsec_x");
        assert!(!both.needs_reseal(&sealed_new));
        assert!(both.needs_reseal("whsec_plain"));
        assert_eq!(
            both.open("ep_1", "whsec_plain"),
            Ok("whsec_plain".to_owned())
        );
        assert!(!Keyring::default().needs_reseal("whsec_plain"));
        assert_eq!(Keyring::default().seal("ep_1", "whsec_p"), "whsec_p");
    }

    #[test]
    fn bad_keys_are_refused_by_position() {
        assert_eq!(Keyring::parse("abc").err(), Some(KeyError::NotHex32(1)));
        assert_eq!(
            Keyring::parse(&format!("{A},{}", &B[..62])).err(),
            Some(KeyError::NotHex32(2))
        );
        assert_eq!(
            Keyring::parse(&format!("{A},{A}")).err(),
            Some(KeyError::Repeated)
        );
        assert!(!Keyring::parse(" ").expect("empty").is_enabled());
    }
}
