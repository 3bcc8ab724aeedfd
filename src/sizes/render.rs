//! `sizes.txt` and `sizes.json` (docs/commands.md#info---sizes): the accounting of
//! `Sizes` as a summary that fits a screen, and as JSON with every row.
//!
//! Invariants: the text is bounded whatever the model holds (at most [`ROWS_SHOWN`] rows
//! per table and segments per file, the rest summed into one line); the JSON has every
//! file, segment, delegate and kind, the largest tensors up to `LARGEST_LISTED` and every
//! duplicate; both depend only on the files' contents and names, and end with a newline.
//! The JSON's fields are documented in docs/commands.md and change only with
//! [`JSON_VERSION`].

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::{ByClass, Class, Sizes};

/// The version of the JSON layout.
pub const JSON_VERSION: u64 = 1;
/// Rows of a table in the text.
pub const ROWS_SHOWN: usize = 12;
/// Largest tensors and duplicates in the text.
pub const LARGEST_SHOWN: usize = 10;

/// `1.5 KiB (1536 B)`: a byte count for people, exact in parentheses.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {} ({n} B)", UNITS[u])
    }
}

/// `x%` of `of`, one decimal.
fn percent(x: u64, of: u64) -> String {
    if of == 0 {
        return "-".to_string();
    }
    format!("{:.1}%", x as f64 * 100.0 / of as f64)
}

/// `weights 1.0 KiB (1024 B), padding 12 B`: the classes that have bytes.
fn classes_text(b: &ByClass) -> String {
    let parts: Vec<String> = Class::ALL
        .into_iter()
        .filter(|&c| b.get(c) > 0)
        .map(|c| format!("{} {}", c.label(), human(b.get(c))))
        .collect();
    if parts.is_empty() {
        "empty".to_string()
    } else {
        parts.join(", ")
    }
}

fn classes_json(b: &ByClass) -> Value {
    let mut m = serde_json::Map::new();
    for c in Class::ALL {
        m.insert(c.as_str().to_string(), json!(b.get(c)));
    }
    Value::Object(m)
}

impl Sizes {
    /// The summary (`sizes.txt`).
    pub fn text(&self) -> String {
        let mut s = String::new();
        let total = self.total.total();
        let names: Vec<&str> = self.files.iter().map(|f| f.name.as_str()).collect();
        let _ = writeln!(
            s,
            "{}: {} in {} file{}",
            names.join(" + "),
            human(total),
            self.files.len(),
            if self.files.len() == 1 { "" } else { "s" }
        );
        for c in Class::ALL {
            let n = self.total.get(c);
            if n > 0 || matches!(c, Class::Weights | Class::Program) {
                let _ = writeln!(
                    s,
                    "  {:<16} {:>7}  {}",
                    c.label(),
                    percent(n, total),
                    human(n)
                );
            }
        }
        s.push_str("by file and segment:\n");
        for f in &self.files {
            let _ = writeln!(
                s,
                "  {}: {}: {}",
                f.name,
                human(f.size),
                classes_text(&f.bytes)
            );
            for seg in f.segments.iter().take(ROWS_SHOWN) {
                let _ = writeln!(
                    s,
                    "    segment {} ({}), at {}: {}",
                    seg.index,
                    seg.role,
                    seg.range.start(),
                    classes_text(&seg.bytes)
                );
            }
            if f.segments.len() > ROWS_SHOWN {
                let mut rest = ByClass::default();
                for seg in &f.segments[ROWS_SHOWN..] {
                    rest.add_all(&seg.bytes);
                }
                let _ = writeln!(
                    s,
                    "    … {} more segments: {}",
                    f.segments.len() - ROWS_SHOWN,
                    classes_text(&rest)
                );
            }
        }
        if !self.delegates.is_empty() {
            s.push_str("by delegate:\n");
            for d in self.delegates.iter().take(ROWS_SHOWN) {
                let payload = d.payload.map_or("not located".to_string(), human);
                let mut line = format!("  {}/{} {}: payload {payload}", d.plan, d.index, d.id);
                if d.decoded {
                    let _ = write!(
                        line,
                        ", {} constant{}: {} in the payload, {} of named data",
                        d.constants,
                        if d.constants == 1 { "" } else { "s" },
                        human(d.inline_weights),
                        human(d.named_bytes)
                    );
                } else {
                    line.push_str(", not decoded");
                }
                let _ = writeln!(s, "{line}");
            }
            if self.delegates.len() > ROWS_SHOWN {
                let _ = writeln!(
                    s,
                    "  … {} more delegates",
                    self.delegates.len() - ROWS_SHOWN
                );
            }
        }
        if !self.kinds.is_empty() {
            let _ = writeln!(
                s,
                "by dtype and scheme ({} tensors; distinct bytes, of which scales):",
                self.tensors
            );
            let width = self
                .kinds
                .iter()
                .take(ROWS_SHOWN)
                .map(|k| k.label.chars().count())
                .max()
                .unwrap_or(0);
            for k in self.kinds.iter().take(ROWS_SHOWN) {
                let mut line = format!(
                    "  {:<width$} {:>6}  {}",
                    k.label,
                    k.tensors,
                    human(k.data + k.scales)
                );
                if k.scales > 0 {
                    let _ = write!(line, ", scales {}", human(k.scales));
                }
                let _ = writeln!(s, "{line}");
            }
            if self.kinds.len() > ROWS_SHOWN {
                let rest = &self.kinds[ROWS_SHOWN..];
                let _ = writeln!(
                    s,
                    "  … {} more kinds: {} tensors, {}",
                    rest.len(),
                    rest.iter().map(|k| k.tensors).sum::<usize>(),
                    human(rest.iter().map(|k| k.data + k.scales).sum())
                );
            }
        }
        if !self.largest.is_empty() {
            s.push_str("largest tensors:\n");
            for t in self.largest.iter().take(LARGEST_SHOWN) {
                let _ = writeln!(s, "  {} {}: {}", t.path, t.describe, human(t.nbytes));
            }
        }
        if !self.duplicates_looked_for {
            s.push_str("stored more than once: not looked for (the bytes of a remote file are fetched only when read)\n");
        } else if self.duplicates.is_empty() {
            s.push_str("stored more than once: nothing\n");
        } else {
            let _ = writeln!(
                s,
                "stored more than once: {} contents in {} copies, {} beyond one copy each:",
                self.duplicates.len(),
                self.duplicates
                    .iter()
                    .map(|d| d.copies.len())
                    .sum::<usize>(),
                human(self.duplicate_bytes())
            );
            for d in self.duplicates.iter().take(LARGEST_SHOWN) {
                let _ = writeln!(
                    s,
                    "  {} x{}: {}",
                    human(d.nbytes),
                    d.copies.len(),
                    d.copies.join(", ")
                );
            }
            if self.duplicates.len() > LARGEST_SHOWN {
                let _ = writeln!(s, "  … {} more", self.duplicates.len() - LARGEST_SHOWN);
            }
        }
        if !self.data_use.is_empty() {
            s.push_str("what the program reads of its data files:\n");
            for u in &self.data_use {
                let _ = writeln!(
                    s,
                    "  {}: {} of {} keys, {} of {} ({})",
                    u.name,
                    u.used_keys,
                    u.keys,
                    human(u.used_bytes),
                    human(u.bytes),
                    percent(u.used_bytes, u.bytes)
                );
            }
            if self.undecoded > 0 {
                let _ = writeln!(
                    s,
                    "  ({} delegate payloads are not decoded: the keys they read are not counted)",
                    self.undecoded
                );
            }
        }
        s
    }

    /// The JSON (`sizes.json`).
    pub fn json(&self) -> Value {
        json!({
            "version": JSON_VERSION,
            "total": self.total.total(),
            "classes": classes_json(&self.total),
            "files": self.files.iter().map(|f| json!({
                "name": f.name,
                "size": f.size,
                "classes": classes_json(&f.bytes),
                "segments": f.segments.iter().map(|seg| json!({
                    "index": seg.index,
                    "offset": seg.range.start(),
                    "size": seg.range.len(),
                    "role": seg.role,
                    "classes": classes_json(&seg.bytes),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "delegates": self.delegates.iter().map(|d| json!({
                "plan": d.plan,
                "index": d.index,
                "id": d.id,
                "payload": d.payload,
                "decoded": d.decoded,
                "constants": d.constants,
                "inline_weights": d.inline_weights,
                "named_data": d.named_bytes,
            })).collect::<Vec<_>>(),
            "undecoded_delegates": self.undecoded,
            "tensors": self.tensors,
            "kinds": self.kinds.iter().map(|k| json!({
                "label": k.label,
                "tensors": k.tensors,
                "data": k.data,
                "scales": k.scales,
            })).collect::<Vec<_>>(),
            "largest": self.largest.iter().map(|t| json!({
                "path": t.path,
                "name": t.name,
                "describe": t.describe,
                "nbytes": t.nbytes,
            })).collect::<Vec<_>>(),
            "duplicates": {
                "looked_for": self.duplicates_looked_for,
                "bytes_beyond_one_copy": self.duplicate_bytes(),
                "groups": self.duplicates.iter().map(|d| json!({
                    "nbytes": d.nbytes,
                    "copies": d.copies,
                })).collect::<Vec<_>>(),
            },
            "data_use": self.data_use.iter().map(|u| json!({
                "name": u.name,
                "keys": u.keys,
                "bytes": u.bytes,
                "used_keys": u.used_keys,
                "used_bytes": u.used_bytes,
            })).collect::<Vec<_>>(),
        })
    }

    /// The JSON as text, pretty, ending with a newline.
    pub fn json_text(&self) -> String {
        let mut s = serde_json::to_string_pretty(&self.json()).expect("JSON of plain values");
        s.push('\n');
        s
    }
}
