//! File names for keys and plan names that may hold any bytes (DESIGN.md §2.6).
//!
//! Invariant: `encode` never yields "", ".", "..", or a name containing '/' or NUL, and it is
//! injective, so distinct keys never collide (duplicate keys are suffixed by the caller).

use crate::format::layout::FileIndex;
use crate::format::Model;

/// The names a tree gives the parts of its model, computed once per tree.
#[derive(Debug, Clone, Default)]
pub struct Names {
    /// Directory names of the plans, deduplicated.
    pub plans: Vec<String>,
    /// Names of the `data/` subdirectories, deduplicated.
    pub data: Vec<String>,
    /// Per file, the base names (without extension) of its named blobs.
    pub named_data: Vec<Vec<String>>,
}

impl Names {
    pub fn of(model: &Model) -> Names {
        let plans = model
            .pte()
            .and_then(|p| p.program.execution_plan.as_ref())
            .map(|v| v.as_slice())
            .unwrap_or_default();
        Names {
            plans: dedupe(
                plans
                    .iter()
                    .map(|p| encode(p.name.as_deref().unwrap_or(""))),
            ),
            data: dedupe(model.files[1..].iter().map(|f| encode(&f.stem()))),
            named_data: (0..model.files.len())
                .map(|f| dedupe(model.named_data_keys(f).into_iter().map(encode)))
                .collect(),
        }
    }

    /// The prefix of a file's subtree: "" for the mounted file, "data/<stem>/" for a `.ptd`.
    pub fn file_prefix(&self, file: FileIndex) -> String {
        if file == 0 {
            String::new()
        } else {
            format!("data/{}/", self.data[file - 1])
        }
    }
}

/// Percent-encodes `/`, `%` and NUL; `.` and `..` become `%2E` and `%2E%2E`.
pub fn encode(name: &str) -> String {
    match name {
        "." => return "%2E".to_string(),
        ".." => return "%2E%2E".to_string(),
        // "%" alone is never produced for a non-empty name, so this stays injective.
        "" => return "%".to_string(),
        _ => {}
    }
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '/' => out.push_str("%2F"),
            '%' => out.push_str("%25"),
            '\0' => out.push_str("%00"),
            c => out.push(c),
        }
    }
    out
}

/// `n` in decimal, written at the end of `buf`.
pub fn decimal(n: u64, buf: &mut [u8; 20]) -> &str {
    let mut at = buf.len();
    let mut n = n;
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[at..]).expect("ASCII digits")
}

/// Names for a list that may repeat: later duplicates get `~<n>` (n = 1, 2, …), the first
/// suffix not taken yet.
pub fn dedupe(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    // Per name, the suffix to try next: the ones below it are taken, and stay taken, so
    // many repeats of one name cost linear time, not quadratic.
    let mut next = std::collections::HashMap::new();
    let mut out = Vec::new();
    for name in names {
        let mut candidate = name.clone();
        if seen.contains(&candidate) {
            let n = next.entry(name.clone()).or_insert(1u64);
            loop {
                candidate = format!("{name}~{n}");
                *n += 1;
                if !seen.contains(&candidate) {
                    break;
                }
            }
        }
        seen.insert(candidate.clone());
        out.push(candidate);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_unsafe_names() {
        assert_eq!(encode("a/b"), "a%2Fb");
        assert_eq!(encode("50%"), "50%25");
        assert_eq!(encode("x\0y"), "x%00y");
        assert_eq!(encode("."), "%2E");
        assert_eq!(encode(".."), "%2E%2E");
        assert_eq!(encode("lin.weight"), "lin.weight");
        assert_eq!(encode(""), "%");
    }

    #[test]
    fn writes_decimals() {
        let mut buf = [0u8; 20];
        for n in [0, 7, 10, 99, 12345, u64::MAX] {
            assert_eq!(decimal(n, &mut buf), n.to_string());
        }
    }

    #[test]
    fn dedupes_with_suffix() {
        let got = dedupe([
            "f".to_string(),
            "f".to_string(),
            "g".to_string(),
            "f".to_string(),
        ]);
        assert_eq!(got, ["f", "f~1", "g", "f~2"]);
        let got = dedupe(["a~1", "a", "a", "a", "a~2~1", "a~2"].map(String::from));
        assert_eq!(got, ["a~1", "a", "a~2", "a~3", "a~2~1", "a~2~2"]);
        let many = dedupe(std::iter::repeat_n("k".to_string(), 100_000));
        assert_eq!(many[99_999], "k~99999");
    }
}
