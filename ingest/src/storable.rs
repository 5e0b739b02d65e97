//! What Postgres' `jsonb` can store, checked before a document reaches a statement: an
//! Event's payload (routes/events.rs, the Svix-compatible message) and an event type's
//! schema (routes/event_types.rs). A document it cannot store would otherwise fail inside
//! the ingest statement or the catalogue's INSERT as a 500.

/// How deep a payload may nest. serde_json does not count depth inside a `RawValue`, and
/// Postgres would fail a very deep document inside the transaction, so it is refused here.
pub const MAX_PAYLOAD_DEPTH: usize = 128;

/// One pass over syntactically valid JSON: refuses what Postgres' jsonb cannot store — a
/// `\u0000` escape, a number outside `numeric`'s range ([`check_number`]) — and nesting
/// deeper than [`MAX_PAYLOAD_DEPTH`]. Each of these would otherwise fail inside the ingest
/// statement: a 500 for the sender, and under group commit a failed group written again
/// request by request (review #34 item 11). The error is a predicate; the caller names the
/// document (`payload`, an event type's `schema`).
pub fn check_storable(raw: &str) -> Result<(), &'static str> {
    let bytes = raw.as_bytes();
    let (mut depth, mut in_string, mut i) = (0usize, false, 0usize);
    while i < bytes.len() {
        match (in_string, bytes[i]) {
            (true, b'\\') => {
                if bytes.get(i + 1) == Some(&b'u') && bytes.get(i + 2..i + 6) == Some(b"0000") {
                    return Err("must not contain the \\u0000 character");
                }
                i += 1; // skip the escaped character
            }
            (true, b'"') | (false, b'"') => in_string = !in_string,
            (false, b'{' | b'[') => {
                depth += 1;
                if depth > MAX_PAYLOAD_DEPTH {
                    return Err("nests deeper than 128 levels");
                }
            }
            (false, b'}' | b']') => depth = depth.saturating_sub(1),
            (false, b'-' | b'0'..=b'9') => {
                let len = bytes[i..]
                    .iter()
                    .position(|b| !matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))
                    .unwrap_or(bytes.len() - i);
                check_number(&raw[i..i + len])?;
                i += len;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The largest decimal exponent of a number's leading digit that Postgres' `numeric` stores
/// (131,072 digits before the point), the most digits after the point (16,383), and the
/// largest written exponent it parses at all. Measured on PostgreSQL 15: `9e131071` and
/// `1e-16383` are stored; `10e131071`, `100e-16385` and `0e9999999999` are refused.
const NUMERIC_MAX_WEIGHT: i64 = 131_071;
const NUMERIC_MAX_SCALE: i64 = 16_383;
const NUMERIC_MAX_EXPONENT: i64 = 1_000_000_000;

/// One JSON number token (already valid JSON): whether `numeric` can hold it.
fn check_number(token: &str) -> Result<(), &'static str> {
    const OUT_OF_RANGE: &str = "holds a number outside the range Postgres can store \
                                (at most 131,072 digits before the point and 16,383 after)";
    let unsigned = token.strip_prefix('-').unwrap_or(token);
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], &unsigned[at + 1..]),
        None => (unsigned, "0"),
    };
    let exponent = exponent.strip_prefix('+').unwrap_or(exponent);
    // Parsed digit by digit, saturating: a thousand-digit exponent is just "too large".
    let (negative, digits) = match exponent.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, exponent),
    };
    let magnitude = digits.bytes().fold(0i64, |n, d| {
        n.saturating_mul(10).saturating_add(i64::from(d - b'0'))
    });
    if magnitude > NUMERIC_MAX_EXPONENT {
        return Err(OUT_OF_RANGE);
    }
    let exponent = if negative { -magnitude } else { magnitude };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let frac_len = i64::try_from(frac_part.len()).unwrap_or(i64::MAX);
    if frac_len.saturating_sub(exponent) > NUMERIC_MAX_SCALE {
        return Err(OUT_OF_RANGE);
    }
    // The decimal exponent of the first non-zero digit; a zero has none.
    let int_len = i64::try_from(int_part.len()).unwrap_or(i64::MAX);
    let leading = int_part
        .bytes()
        .chain(frac_part.bytes())
        .position(|d| d != b'0');
    if let Some(k) = leading {
        let k = i64::try_from(k).unwrap_or(i64::MAX);
        if int_len - 1 - k + exponent > NUMERIC_MAX_WEIGHT {
            return Err(OUT_OF_RANGE);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{MAX_PAYLOAD_DEPTH, check_storable};

    #[test]
    fn nul_escapes_are_found_but_escaped_backslashes_are_not() {
        assert!(check_storable(r#"{"a":"\u0000"}"#).is_err());
        assert!(check_storable(r#"{"a":"x\\\u0000"}"#).is_err());
        assert!(check_storable(r#"{"a":"\\u0000"}"#).is_ok());
        assert!(check_storable(r#"{"a":"\u0001"}"#).is_ok());
    }

    #[test]
    fn depth_counts_only_structure_outside_strings() {
        let nest = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(check_storable(&nest(MAX_PAYLOAD_DEPTH)).is_ok());
        assert!(check_storable(&nest(MAX_PAYLOAD_DEPTH + 1)).is_err());
        let brackets_in_string = format!(r#"{{"s":"{}\""}}"#, "[".repeat(500));
        assert!(check_storable(&brackets_in_string).is_ok());
    }

    /// Each case was run through `'{"a": N}'::jsonb` on PostgreSQL 15 first.
    #[test]
    fn numbers_are_refused_exactly_where_postgres_refuses_them() {
        let stored = [
            "0",
            "-0",
            "1e1000",
            "9e131071",
            "1e-16383",
            "1.0e-16382",
            "0.00000e-16378",
            "0e2000000",
            "1e308",
            "-12.5E+3",
            "0.0001e1001",
            "123456789012345678901234567890",
        ];
        for n in stored {
            assert!(check_storable(&format!(r#"{{"a":{n}}}"#)).is_ok(), "{n}");
        }
        let refused = [
            "1e131072",
            "10e131071",
            "1e999999999",
            "1e9999999999",
            "0e9999999999",
            "0e-16384",
            "0.1e-16383",
            "100e-16385",
            "-1e131072",
        ];
        for n in refused {
            assert!(check_storable(&format!(r#"{{"a":[{n}]}}"#)).is_err(), "{n}");
        }
        // Digits inside a string are not numbers.
        assert!(check_storable(r#"{"a":"1e999999999"}"#).is_ok());
    }
}
