//! A filter's cost bound (issue #53): a stored filter must cost at most a constant times the
//! size of the payload it reads, so what one project's filter costs is bounded by the payload
//! limit that project's own Events already pay for.
//!
//! Why a rule on the filter's shape and not a budget at run time: Postgres evaluates a
//! `jsonpath` with no budget of its own, inside the shared ingest statement, and keeps every
//! intermediate sequence until the statement ends. Two shapes make the work (and the memory)
//! grow with the *product* of two parts of the payload, and one tenant's filter
//! `exists($.a[*] ? (@ == $.b[*]))` on 12,000-item arrays grew an ingest backend to 6 GB
//! until the kernel killed it and Postgres restarted every connection:
//!
//! 1. **A comparison between two parts of the payload** (`$.a == $.b`, `@.x > $.min`): in
//!    lax mode each side is a sequence (arrays are unwrapped), and a comparison compares
//!    every item of one side with every item of the other. So one side of a comparison
//!    (`==`, `!=`, `<>`, `<`, `<=`, `>`, `>=`, `starts with`, `like_regex`) must be a
//!    literal: a path compared with a constant costs one pass over the path's items.
//! 2. **A `$` path inside a filter expression `?(…)`**: it is evaluated again for every
//!    item the filter visits, and each evaluation's sequence is kept. Inside a filter the
//!    item is `@`; a condition on the rest of the payload belongs outside it
//!    (`$.kind == "x" && exists($.a ? (@ > 1))`).
//!
//! And a `like_regex` pattern may not hold a back reference (`\1`), the one regular
//! expression feature whose matching time is not bounded by the text's length.
//!
//! The rule reads the canonical text Postgres printed for the filter (routes/filters.rs),
//! so it sees one spelling of each construct: strings in double quotes, keys as `."key"`,
//! a filter as `?(`, a variable as `$"name"`.

/// Why a filter's shape was refused, in the API's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Costly {
    PathComparedWithPath,
    RootInsideFilter,
    BackReference,
}

impl Costly {
    pub(crate) fn detail(&self) -> &'static str {
        match self {
            Costly::PathComparedWithPath => {
                "compares two parts of the payload; one side of each comparison must be a \
                 literal (its cost would grow with the product of the two parts' sizes)"
            }
            Costly::RootInsideFilter => {
                "uses a `$` path inside a filter expression `?(…)`; refer to the current item \
                 with `@` and put conditions on the rest of the payload outside the filter \
                 (it would be evaluated again for every item)"
            }
            Costly::BackReference => {
                "uses a back reference in a like_regex pattern, whose matching time is not \
                 bounded by the text's length"
            }
        }
    }
}

/// What a bracketed part of the filter is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The whole filter, or `(…)`: an expression whose comparisons are checked.
    Group,
    /// `?(…)`: a filter expression; checked as a group, and `$` is refused inside.
    Filter,
    /// `exists (…)` or `!(…)`: a boolean, checked as a group.
    Boolean,
    /// `[…]` subscripts or a method's `(…)` arguments: part of the path before it.
    Accessor,
}

#[derive(Debug)]
struct Frame {
    kind: Kind,
    /// A comparison operator was seen in the current `&&`/`||` segment.
    compared: bool,
    /// The current segment's left and right sides read the payload.
    left: bool,
    right: bool,
    /// Any part of this group read the payload (what a `(…)` gives its parent).
    any: bool,
}

impl Frame {
    fn new(kind: Kind) -> Self {
        Self {
            kind,
            compared: false,
            left: false,
            right: false,
            any: false,
        }
    }

    fn reads_payload(&mut self) {
        if self.compared {
            self.right = true;
        } else {
            self.left = true;
        }
        self.any = true;
    }

    /// Ends the current `&&`/`||` segment, refusing a comparison of two payload parts.
    fn end_segment(&mut self) -> Result<(), Costly> {
        let both = self.compared && self.left && self.right;
        self.compared = false;
        self.left = false;
        self.right = false;
        if both {
            Err(Costly::PathComparedWithPath)
        } else {
            Ok(())
        }
    }

    fn checks_comparisons(&self) -> bool {
        self.kind != Kind::Accessor
    }
}

/// Checks a filter's canonical text against the cost rule.
pub(crate) fn check(canonical: &str) -> Result<(), Costly> {
    let b = canonical.as_bytes();
    let mut stack = vec![Frame::new(Kind::Group)];
    let mut i = 0;
    let mut after_like_regex = false;
    while i < b.len() {
        let c = b[i];
        match c {
            b'"' => {
                let end = string_end(b, i);
                if after_like_regex && has_back_reference(&b[i + 1..end.saturating_sub(1)]) {
                    return Err(Costly::BackReference);
                }
                after_like_regex = false;
                i = end;
                continue;
            }
            b'$' => {
                // `$"name"` is a variable (a constant), `$` alone the payload's root.
                if b.get(i + 1) != Some(&b'"') {
                    if stack.iter().any(|f| f.kind == Kind::Filter) {
                        return Err(Costly::RootInsideFilter);
                    }
                    top(&mut stack).reads_payload();
                } else {
                    i = string_end(b, i + 1);
                    continue;
                }
            }
            b'@' => top(&mut stack).reads_payload(),
            b'?' if b.get(i + 1) == Some(&b'(') => {
                stack.push(Frame::new(Kind::Filter));
                i += 2;
                continue;
            }
            b'!' if b.get(i + 1) == Some(&b'(') => {
                stack.push(Frame::new(Kind::Boolean));
                i += 2;
                continue;
            }
            b'(' => {
                // A method's arguments follow its name directly (`.size()`); an `exists`
                // is a boolean; anything else is a group.
                let word = word_before(b, i);
                let kind = if word == b"exists" {
                    Kind::Boolean
                } else if !word.is_empty() && method_call(b, i - word.len()) {
                    Kind::Accessor
                } else {
                    Kind::Group
                };
                stack.push(Frame::new(kind));
            }
            b'[' => stack.push(Frame::new(Kind::Accessor)),
            b')' | b']' => close(&mut stack)?,
            b'&' | b'|' if b.get(i + 1) == Some(&c) => {
                let frame = top(&mut stack);
                if frame.checks_comparisons() {
                    frame.end_segment()?;
                }
                i += 2;
                continue;
            }
            b'=' | b'<' | b'>' => {
                top(&mut stack).compared = true;
                // Two-character operators (`==`, `<=`, `>=`, `<>`) are one comparison.
                if matches!(b.get(i + 1), Some(b'=' | b'>')) {
                    i += 1;
                }
            }
            b'!' if b.get(i + 1) == Some(&b'=') => {
                top(&mut stack).compared = true;
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                // A key or method after `.` is a name, not an operator.
                if start == 0 || b[start - 1] != b'.' {
                    after_like_regex |= operator_word(&b[start..i], top(&mut stack));
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    let mut last = stack.pop().unwrap_or_else(|| Frame::new(Kind::Group));
    last.end_segment()
}

/// Closes the innermost `(…)` or `[…]`: its last segment is checked, and a group that read
/// the payload makes its parent's current side read it too.
fn close(stack: &mut Vec<Frame>) -> Result<(), Costly> {
    let mut frame = stack.pop().unwrap_or_else(|| Frame::new(Kind::Group));
    if frame.checks_comparisons() {
        frame.end_segment()?;
    }
    if stack.is_empty() {
        stack.push(Frame::new(Kind::Group));
    }
    if frame.kind == Kind::Group && frame.any {
        top(stack).reads_payload();
    }
    Ok(())
}

/// A word that is a comparison (`like_regex`, `starts with`) marks the frame; `true` when
/// a `like_regex` pattern follows.
fn operator_word(word: &[u8], frame: &mut Frame) -> bool {
    match word {
        b"like_regex" => {
            frame.compared = true;
            true
        }
        b"starts" => {
            frame.compared = true;
            false
        }
        _ => false,
    }
}

fn top(stack: &mut [Frame]) -> &mut Frame {
    stack.last_mut().expect("the stack is never empty")
}

/// The index just past the string that starts at `open` (a `"`), honouring `\` escapes.
fn string_end(b: &[u8], open: usize) -> usize {
    let mut i = open + 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    b.len()
}

/// The identifier that ends right before `at`.
fn word_before(b: &[u8], at: usize) -> &[u8] {
    let mut start = at;
    while start > 0 && (b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_') {
        start -= 1;
    }
    // `exists (` has a space before its parenthesis in the canonical form.
    if start == at && at >= 7 && &b[at - 7..at] == b"exists " {
        return &b[at - 7..at - 1];
    }
    &b[start..at]
}

/// Whether the word starting at `start` is a method name (`.size(`).
fn method_call(b: &[u8], start: usize) -> bool {
    start > 0 && b[start - 1] == b'.'
}

/// A back reference in a pattern as the canonical text spells it: `\\1` (the string escape
/// of a backslash, then a digit).
fn has_back_reference(pattern: &[u8]) -> bool {
    pattern
        .windows(3)
        .any(|w| w[0] == b'\\' && w[1] == b'\\' && w[2].is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Canonical forms as PostgreSQL 15 prints them (`'…'::jsonpath::text`).
    #[test]
    fn filters_whose_cost_is_linear_in_the_payload_pass() {
        for ok in [
            r#"($."amount_cents" > 10000 && $."currency" == "EUR")"#,
            r#"($."items"[*]."sku" == "x" || $."tags"[*] == "vip")"#,
            r#"exists ($."items"[*]?(@."qty" > 2 && @."tags"[*] == "a"))"#,
            r#"($.** == 1)"#,
            r#"($."a".size() > 3)"#,
            r#"($."s" like_regex "^a.*b$" flag "i")"#,
            r#"($."a" starts with "x")"#,
            r#"!(exists ($."a"?(@.type() == "array")))"#,
            r#"($."a".keyvalue()."value" == 1)"#,
            r#"exists ($."a"[*]?(exists (@."b"[*]?(@ == 1))))"#,
            r#"($."a"[last] == 1)"#,
            r#"($."a"[1 to 3] == 1)"#,
            r#"($."a" == $"limit")"#,
            r#"($."a" + 1 == 2)"#,
            r#"($."a"?(@ like_regex "x") == "y")"#,
            r#"($."a".datetime("HH24:MI") < "12:00")"#,
            r#"($."a"."b" == "x" && ($."c" == 1 || $."d" != 2))"#,
            r#"($."s" like_regex "a\\d+" flag "i")"#,
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn filters_whose_cost_is_a_product_are_refused() {
        for (bad, why) in [
            (
                r#"exists ($."a"[*]?(@ == $."b"[*]))"#,
                Costly::RootInsideFilter,
            ),
            (r#"($."a"[*] == $."b"[*])"#, Costly::PathComparedWithPath),
            (r#"($."a" == $."b")"#, Costly::PathComparedWithPath),
            (
                r#"($."a"[*]?(@."x" > $."min") == 1)"#,
                Costly::RootInsideFilter,
            ),
            (
                r#"exists ($."a"[*]?(exists ($."b"[*]?(@ == 1))))"#,
                Costly::RootInsideFilter,
            ),
            (
                r#"exists ($."a"[*]?(@."x"[*] == @."y"[*]))"#,
                Costly::PathComparedWithPath,
            ),
            (r#"($."a" + 1 == $."b")"#, Costly::PathComparedWithPath),
            (
                r#"($."a"[1 to 3] == $."b"[0,1])"#,
                Costly::PathComparedWithPath,
            ),
            (
                r#"($."x" == 1 && ($."c" == 1 || $."a" != $."b"))"#,
                Costly::PathComparedWithPath,
            ),
            (r#"($."s" like_regex "(a+)\\1")"#, Costly::BackReference),
        ] {
            assert_eq!(check(bad), Err(why), "{bad}");
        }
    }
}
