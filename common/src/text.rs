//! Text cut to a size without splitting a character.

/// Cuts `text` to at most `max` bytes, at a character boundary; true if it cut anything.
pub fn truncate_at_char(text: &mut String, max: usize) -> bool {
    if text.len() <= max {
        return false;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_at_a_character_boundary() {
        let mut s = "héllo".to_owned();
        assert!(truncate_at_char(&mut s, 2));
        assert_eq!(s, "h");
        let mut s = "abc".to_owned();
        assert!(!truncate_at_char(&mut s, 3));
        assert_eq!(s, "abc");
    }
}
