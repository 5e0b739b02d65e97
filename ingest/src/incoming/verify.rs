//! Provider signature checks, each exactly as its provider documents it, on the raw body,
//! before anything is stored. Every comparison of a signature is constant-time (`Mac::
//! verify_slice`), and every check returns why it refused, for the metric's `reason` label.
//!
//! | provider | header | what is signed | encoding |
//! | --- | --- | --- | --- |
//! | GitHub | `X-Hub-Signature-256: sha256=<hex>` | the body | hex HMAC-SHA256 |
//! | Stripe | `Stripe-Signature: t=<unix>,v1=<hex>[,v1=…]` | `"{t}.{body}"`; `t` within 5 min | hex HMAC-SHA256 |
//! | Shopify | `X-Shopify-Hmac-Sha256: <base64>` | the body | base64 HMAC-SHA256 |
//! | Standard Webhooks | `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<b64> …` | `"{id}.{timestamp}.{body}"`, key = base64 part of `whsec_…`; timestamp within 5 min | base64 HMAC-SHA256 |
//! | generic | `X-Signature: [sha256=]<hex>` | the body | hex HMAC-SHA256 |

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// How far a signed timestamp (Stripe, Standard Webhooks) may be from now, either way.
pub const TOLERANCE_SECONDS: i64 = 300;

/// Why a request was refused; also the `reason` label of the rejection metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The signature header (or a part the scheme needs) is absent.
    Missing,
    /// Present but not in the scheme's shape.
    Malformed,
    /// Well-formed, but no signature matches.
    Mismatch,
    /// Signed, but the signed timestamp is outside the tolerance (a replay, or a bad clock).
    Stale,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Malformed => "malformed",
            Refusal::Mismatch => "mismatch",
            Refusal::Stale => "stale",
        }
    }
}

fn mac(key: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length.
    Hmac::<Sha256>::new_from_slice(key).unwrap_or_else(|_| unreachable!())
}

fn check(key: &[u8], parts: &[&[u8]], signature: &[u8]) -> Result<(), Refusal> {
    let mut m = mac(key);
    for p in parts {
        m.update(p);
    }
    m.verify_slice(signature).map_err(|_| Refusal::Mismatch)
}

fn hex_sig(raw: &str) -> Result<Vec<u8>, Refusal> {
    let bytes = hex::decode(raw.trim()).map_err(|_| Refusal::Malformed)?;
    if bytes.len() != 32 {
        return Err(Refusal::Malformed);
    }
    Ok(bytes)
}

/// GitHub: `X-Hub-Signature-256: sha256=<hex HMAC of the body>` with the webhook's secret.
pub fn github(secret: &str, header: Option<&str>, body: &[u8]) -> Result<(), Refusal> {
    let header = header.ok_or(Refusal::Missing)?;
    let hex = header.strip_prefix("sha256=").ok_or(Refusal::Malformed)?;
    check(secret.as_bytes(), &[body], &hex_sig(hex)?)
}

/// Stripe: `Stripe-Signature: t=…,v1=…` (several `v1` during a secret roll); the HMAC is
/// over `"{t}.{body}"` with the endpoint's `whsec_…` secret used as-is, and `t` must be
/// within [`TOLERANCE_SECONDS`] of `now`.
pub fn stripe(secret: &str, header: Option<&str>, body: &[u8], now: i64) -> Result<(), Refusal> {
    let header = header.ok_or(Refusal::Missing)?;
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for item in header.split(',') {
        let (k, v) = item.trim().split_once('=').ok_or(Refusal::Malformed)?;
        match k {
            "t" => timestamp = Some(v.parse::<i64>().map_err(|_| Refusal::Malformed)?),
            "v1" => signatures.push(v),
            _ => {}
        }
    }
    let t = timestamp.ok_or(Refusal::Malformed)?;
    if signatures.is_empty() {
        return Err(Refusal::Missing);
    }
    let signed_t = t.to_string();
    let matched = signatures.iter().any(|s| {
        hex_sig(s)
            .and_then(|sig| check(secret.as_bytes(), &[signed_t.as_bytes(), b".", body], &sig))
            .is_ok()
    });
    if !matched {
        return Err(Refusal::Mismatch);
    }
    // Checked after the signature, so an attacker learns nothing from the clock answer.
    if (now - t).abs() > TOLERANCE_SECONDS {
        return Err(Refusal::Stale);
    }
    Ok(())
}

/// Shopify: `X-Shopify-Hmac-Sha256: <base64 HMAC of the body>` with the app's secret.
pub fn shopify(secret: &str, header: Option<&str>, body: &[u8]) -> Result<(), Refusal> {
    let header = header.ok_or(Refusal::Missing)?;
    let sig = STANDARD
        .decode(header.trim())
        .map_err(|_| Refusal::Malformed)?;
    check(secret.as_bytes(), &[body], &sig)
}

/// Standard Webhooks: `webhook-signature` holds space-separated `v1,<base64>` entries; any
/// one matching the HMAC (key: base64 part of `whsec_…`) over `"{id}.{timestamp}.{body}"`
/// passes, and the timestamp must be within [`TOLERANCE_SECONDS`] of `now`.
pub fn standard(
    secret: &str,
    id: Option<&str>,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now: i64,
) -> Result<(), Refusal> {
    let (id, ts, sigs) = match (id, timestamp, signature) {
        (Some(i), Some(t), Some(s)) => (i, t, s),
        _ => return Err(Refusal::Missing),
    };
    let t: i64 = ts.trim().parse().map_err(|_| Refusal::Malformed)?;
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap_or(secret))
        .map_err(|_| Refusal::Malformed)?;
    let matched = sigs.split(' ').any(|entry| {
        entry
            .strip_prefix("v1,")
            .and_then(|b64| STANDARD.decode(b64).ok())
            .is_some_and(|sig| {
                check(
                    &key,
                    &[id.as_bytes(), b".", ts.trim().as_bytes(), b".", body],
                    &sig,
                )
                .is_ok()
            })
    });
    if !matched {
        return Err(Refusal::Mismatch);
    }
    if (now - t).abs() > TOLERANCE_SECONDS {
        return Err(Refusal::Stale);
    }
    Ok(())
}

/// generic: `X-Signature: <hex HMAC of the body>`, optionally prefixed `sha256=`.
pub fn generic(secret: &str, header: Option<&str>, body: &[u8]) -> Result<(), Refusal> {
    let header = header.ok_or(Refusal::Missing)?;
    let hex = header.strip_prefix("sha256=").unwrap_or(header);
    check(secret.as_bytes(), &[body], &hex_sig(hex)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex_hmac(key: &[u8], parts: &[&[u8]]) -> String {
        let mut m = mac(key);
        for p in parts {
            m.update(p);
        }
        hex::encode(m.finalize().into_bytes())
    }

    // GitHub's documented example: secret "It's a Secret to Everybody", payload
    // "Hello, World!".
    #[test]
    fn github_documented_example() {
        let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(
            github("It's a Secret to Everybody", Some(sig), b"Hello, World!"),
            Ok(())
        );
        assert_eq!(
            github("It's a Secret to Everybody", Some(sig), b"Hello, World?"),
            Err(Refusal::Mismatch)
        );
        assert_eq!(github("s", None, b""), Err(Refusal::Missing));
        assert_eq!(github("s", Some("sha1=00"), b""), Err(Refusal::Malformed));
        assert_eq!(github("s", Some("sha256=zz"), b""), Err(Refusal::Malformed));
    }

    #[test]
    fn stripe_checks_signature_then_time() {
        let body = br#"{"id":"evt_1","type":"invoice.paid"}"#;
        let t = 1_700_000_000;
        let sig = hex_hmac(b"whsec_x", &[t.to_string().as_bytes(), b".", body]);
        let header = format!("t={t},v1={sig}");
        assert_eq!(stripe("whsec_x", Some(&header), body, t + 10), Ok(()));
        assert_eq!(
            stripe("whsec_x", Some(&header), body, t + TOLERANCE_SECONDS + 1),
            Err(Refusal::Stale)
        );
        assert_eq!(
            stripe("whsec_y", Some(&header), body, t),
            Err(Refusal::Mismatch)
        );
        // A roll: the second v1 matches.
        let rolled = format!("t={t},v1={},v1={sig}", "0".repeat(64));
        assert_eq!(stripe("whsec_x", Some(&rolled), body, t), Ok(()));
        assert_eq!(
            stripe("whsec_x", Some("v1=abc"), body, t),
            Err(Refusal::Malformed)
        );
        assert_eq!(
            stripe("whsec_x", Some(&format!("t={t}")), body, t),
            Err(Refusal::Missing)
        );
    }

    #[test]
    fn shopify_base64() {
        let body = br#"{"id":1}"#;
        let mut m = mac(b"shpss_secret");
        m.update(body);
        let sig = STANDARD.encode(m.finalize().into_bytes());
        assert_eq!(shopify("shpss_secret", Some(&sig), body), Ok(()));
        assert_eq!(shopify("other", Some(&sig), body), Err(Refusal::Mismatch));
        assert_eq!(
            shopify("s", Some("not base64!"), body),
            Err(Refusal::Malformed)
        );
    }

    #[test]
    fn standard_webhooks_round_trip_with_our_signer() {
        let secret = railhook_common::keygen::generate_signing_secret();
        let key = railhook_common::signing::SigningKey::parse(&secret).expect("key");
        let body = br#"{"type":"user.created"}"#;
        let t = 1_700_000_000;
        let sig = key.sign("msg_1", t, body);
        let header = format!("v1,AAAA {sig}");
        let ts = t.to_string();
        let ok = standard(&secret, Some("msg_1"), Some(&ts), Some(&header), body, t);
        assert_eq!(ok, Ok(()));
        let other_id = standard(&secret, Some("msg_2"), Some(&ts), Some(&sig), body, t);
        assert_eq!(other_id, Err(Refusal::Mismatch));
        let stale = standard(&secret, Some("msg_1"), Some(&ts), Some(&sig), body, t + 301);
        assert_eq!(stale, Err(Refusal::Stale));
        let missing = standard(&secret, None, Some(&ts), Some(&sig), body, t);
        assert_eq!(missing, Err(Refusal::Missing));
    }

    #[test]
    fn generic_hex_with_or_without_prefix() {
        let sig = hex_hmac(b"k", &[b"body"]);
        assert_eq!(generic("k", Some(&sig), b"body"), Ok(()));
        assert_eq!(
            generic("k", Some(&format!("sha256={sig}")), b"body"),
            Ok(())
        );
        assert_eq!(generic("j", Some(&sig), b"body"), Err(Refusal::Mismatch));
    }
}
