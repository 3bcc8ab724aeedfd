//! Pictures of a model, as pure functions of what they show (docs/tree.md#pictures): Graphviz
//! text for graphs (`dot`), statistics of values (`stats`) and the SVG of their histogram
//! (`hist`), the SVG treemap of where bytes go (`treemap`).
//!
//! Nothing here reads a model: callers pass what to draw, so the same drawing serves a plan,
//! a backend payload or any source of numbers. Every picture is deterministic.

pub mod dot;
pub mod hist;
pub mod stats;
pub mod treemap;

/// Appends `s` to `out` as XML text or an attribute value: markup characters escaped, and
/// control characters, which XML 1.0 does not allow, as spaces.
pub fn escape_xml(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
}
