//! Plain names: what senders and endpoints name things with (uids, cursors, topics, queues,
//! exchanges): `[A-Za-z0-9_.-]`, never empty.

/// `raw` is 1 to `max` bytes of `[A-Za-z0-9_.-]`.
pub fn is_plain_name(raw: &str, max: usize) -> bool {
    (1..=max).contains(&raw.len())
        && raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}
