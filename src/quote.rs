//! How names that come from files and uploads (keys, tensor names, plan names) appear in
//! messages and listings (docs/commands.md#names-in-output).
//!
//! Invariants: what these functions return never holds a control character (so a name
//! cannot add lines to a log or send escape sequences to a terminal), and a name quoted in a
//! message takes at most about `2 × SHOWN` bytes of it, whatever its length (so a refusal
//! that quotes twenty 5 MB names stays small). Quoting is JSON's, as `serde_json` writes a
//! string, so a quoted name can be read back with any JSON reader.

use std::borrow::Cow;

/// Bytes of a long name kept at each end when it is shortened.
pub const SHOWN: usize = 60;

/// `name` as a JSON string literal, as `serde_json` writes it (`"a\nb"`), with C1 controls
/// and DEL escaped too (`\u009b`): `serde_json` leaves those as they are, and a terminal may
/// act on them.
pub fn json(name: &str) -> String {
    let quoted = serde_json::Value::from(name).to_string();
    if !quoted.chars().any(is_control) {
        return quoted;
    }
    let mut out = String::with_capacity(quoted.len() + 8);
    for c in quoted.chars() {
        if is_control(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// `name` for a message: a JSON string literal, or, when longer than `2 × SHOWN` bytes, its
/// start and its end as two literals around an ellipsis, then its length:
/// `"aaaa…"…"…zzzz" (4900000 bytes)`.
pub fn name(name: &str) -> String {
    match ends(name) {
        None => json(name),
        Some((head, tail)) => format!("{}…{} ({} bytes)", json(head), json(tail), name.len()),
    }
}

/// `name` without its length: its JSON literal, or its two ends around an ellipsis (for
/// messages that give the length themselves).
pub fn abbreviated(name: &str) -> String {
    match ends(name) {
        None => json(name),
        Some((head, tail)) => format!("{}…{}", json(head), json(tail)),
    }
}

/// Bytes of a long message (a parser's own, which may quote what it read) kept at each end.
pub const MESSAGE_SHOWN: usize = 512;

/// `text` (a message made by a library, which may quote input) with its middle left out
/// when it is longer than `2 × MESSAGE_SHOWN` bytes: `start … end (N bytes)`.
pub fn clipped(text: &str) -> Cow<'_, str> {
    match ends_of(text, MESSAGE_SHOWN) {
        None => Cow::Borrowed(text),
        Some((head, tail)) => Cow::Owned(format!("{head} … {tail} ({} bytes)", text.len())),
    }
}

/// The first and last `SHOWN` bytes of a long name (cut at character boundaries); None when
/// it is short enough to show whole.
fn ends(name: &str) -> Option<(&str, &str)> {
    ends_of(name, SHOWN)
}

/// The first and last `shown` bytes of `name`, when it is longer than twice that.
fn ends_of(name: &str, shown: usize) -> Option<(&str, &str)> {
    if name.len() <= 2 * shown {
        return None;
    }
    let mut head = shown;
    while !name.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = name.len() - shown;
    while !name.is_char_boundary(tail) {
        tail += 1;
    }
    Some((&name[..head], &name[tail..]))
}

/// Whether `c` would change what a terminal or a log shows: C0 and C1 controls and DEL.
fn is_control(c: char) -> bool {
    c.is_control()
}

/// `name` for a listing (`ptefs ls`, `ptefs apply`): as it is, unless it holds a control
/// character or starts with a double quote, in which case as a JSON string literal. A name
/// without such characters thus reads as before, and one with them reads unambiguously.
pub fn listed(name: &str) -> Cow<'_, str> {
    if name.starts_with('"') || name.chars().any(is_control) {
        Cow::Owned(json(name))
    } else {
        Cow::Borrowed(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_json_literals() {
        assert_eq!(name("w"), "\"w\"");
        assert_eq!(name("a\nb\u{1b}[31m"), "\"a\\nb\\u001b[31m\"");
        assert_eq!(name("x\"y\\"), "\"x\\\"y\\\\\"");
    }

    #[test]
    fn long_names_keep_their_ends_and_length() {
        let long = format!(
            "{}{}{}",
            "a".repeat(100),
            "m".repeat(4_900_000),
            "z".repeat(100)
        );
        let shown = name(&long);
        assert_eq!(
            shown,
            format!(
                "\"{}\"…\"{}\" ({} bytes)",
                "a".repeat(SHOWN),
                "z".repeat(SHOWN),
                long.len()
            )
        );
        // Multi-byte characters are never cut.
        let wide = "é".repeat(200);
        let shown = name(&wide);
        assert!(shown.ends_with("(400 bytes)"), "{shown}");
        assert!(shown.len() < 2 * SHOWN + 40, "{shown}");
    }

    #[test]
    fn long_messages_are_clipped() {
        assert_eq!(clipped("short"), "short");
        let long = format!("invalid type: string \"{}\"", "x".repeat(10_000));
        let c = clipped(&long);
        assert!(c.len() < 2 * MESSAGE_SHOWN + 40, "{}", c.len());
        assert!(
            c.starts_with("invalid type: string \"xxx")
                && c.ends_with(&format!("({} bytes)", long.len()))
        );
    }

    #[test]
    fn listings_escape_only_what_needs_it() {
        assert_eq!(
            listed("plans/forward/values/0.bin"),
            "plans/forward/values/0.bin"
        );
        assert_eq!(listed("é ü"), "é ü");
        assert_eq!(listed("a\nb"), "\"a\\nb\"");
        assert_eq!(listed("\u{1b}[2J"), "\"\\u001b[2J\"");
        assert_eq!(listed("c1\u{9b}x\u{7f}"), "\"c1\\u009bx\\u007f\"");
        assert_eq!(listed("\"quoted\""), "\"\\\"quoted\\\"\"");
        for s in ["a\nb", "\u{1b}", "\u{9b}", "\u{7f}"] {
            assert!(!listed(s).chars().any(char::is_control), "{s:?}");
            assert!(!name(s).chars().any(char::is_control), "{s:?}");
        }
    }
}
