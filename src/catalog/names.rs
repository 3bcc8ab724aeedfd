//! File names for keys and plan names that may hold any bytes
//! (docs/tree.md#names-and-percent-encoding).
//!
//! Invariants: `encode` never yields "", ".", "..", or a name containing '/' or NUL, and it is
//! injective, so distinct keys never collide (duplicate keys are suffixed by `dedupe`). A name
//! longer than a file name can be (255 bytes, with the longest extension it gets) is
//! `shorten`ed to a prefix, `~` and a hash of the whole name, the same on every mount; `dedupe`
//! keeps every name within the same bound.

use sha2::{Digest, Sha256};

use crate::format::layout::FileIndex;
use crate::format::Model;

/// The longest file name (`NAME_MAX`).
pub const NAME_MAX: usize = 255;

/// The longest extension given to a named-data base name (`.json`; `.bin` and `.npy` are
/// shorter).
pub const LONGEST_EXTENSION: usize = ".json".len();

/// Hex digits of the SHA-256 kept in a shortened name.
const HASH_DIGITS: usize = 16;

/// What a shortened name names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The directory of plan `p` (`plans/<name>`).
    Plan(usize),
    /// The directory of `--data` file `f` (`data/<stem>`).
    DataFile(FileIndex),
    /// The files of named-data entry `k` of file `f` (`named_data/<key>.*`).
    NamedData(FileIndex, usize),
}

/// A name the tree shows shortened, because the name in the file is too long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortened {
    pub part: Part,
    /// The name as it is in the file (plan name, key, file stem).
    pub full: String,
    /// The name shown (without extension).
    pub shown: String,
}

/// The names a tree gives the parts of its model, computed once per tree.
#[derive(Debug, Clone, Default)]
pub struct Names {
    /// Directory names of the plans, deduplicated.
    pub plans: Vec<String>,
    /// Names of the `data/` subdirectories, deduplicated.
    pub data: Vec<String>,
    /// Per file, the base names (without extension) of its named blobs.
    pub named_data: Vec<Vec<String>>,
    /// Every name shown shortened, in the order above.
    pub shortened: Vec<Shortened>,
}

impl Names {
    pub fn of(model: &Model) -> Names {
        let plans = model
            .pte()
            .and_then(|p| p.program.execution_plan.as_ref())
            .map(|v| v.as_slice())
            .unwrap_or_default();
        let mut shortened = Vec::new();
        let mut names = |full: Vec<String>, max: usize, part: &dyn Fn(usize) -> Part| {
            let shown = dedupe_within(full.iter().map(|n| file_name(n, max)), max);
            for (i, name) in full.into_iter().enumerate() {
                if encode(&name).len() > max {
                    shortened.push(Shortened {
                        part: part(i),
                        full: name,
                        shown: shown[i].clone(),
                    });
                }
            }
            shown
        };
        let plans = names(
            plans
                .iter()
                .map(|p| p.name.clone().unwrap_or_default())
                .collect(),
            NAME_MAX,
            &Part::Plan,
        );
        let data = names(
            model.files[1..].iter().map(|f| f.stem()).collect(),
            NAME_MAX,
            &|i| Part::DataFile(i + 1),
        );
        let named_data = (0..model.files.len())
            .map(|f| {
                let keys = model.named_data_keys(f);
                names(
                    keys.into_iter().map(str::to_string).collect(),
                    NAME_MAX - LONGEST_EXTENSION,
                    &|k| Part::NamedData(f, k),
                )
            })
            .collect();
        Names {
            plans,
            data,
            named_data,
            shortened,
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

/// The name shown for `name` (a key, plan name or file stem) where at most `max` bytes fit:
/// `encode(name)`, or when that is longer, `shorten`ed.
pub fn file_name(name: &str, max: usize) -> String {
    let encoded = encode(name);
    if encoded.len() <= max {
        encoded
    } else {
        shorten(&encoded, name, max)
    }
}

/// `<prefix>~<hash>`, at most `max` bytes: the longest prefix of `encoded` that fits, cut at
/// a character boundary and never inside a `%XX` escape, then `~` and the first 16 hex digits
/// of the SHA-256 of `full` (the name as stored in the file: `printf %s KEY | sha256sum`).
pub fn shorten(encoded: &str, full: &str, max: usize) -> String {
    let digest = Sha256::digest(full.as_bytes());
    let hash: String = digest
        .iter()
        .take(HASH_DIGITS / 2)
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut out = cut(encoded, max.saturating_sub(1 + HASH_DIGITS)).to_string();
    out.push('~');
    out.push_str(&hash);
    out
}

/// The longest prefix of `name` of at most `max` bytes that ends on a character boundary and
/// outside a `%XX` escape.
fn cut(name: &str, max: usize) -> &str {
    if name.len() <= max {
        return name;
    }
    let mut end = max;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    let bytes = name.as_bytes();
    for back in 1..=2 {
        if end >= back && bytes[end - back] == b'%' {
            end -= back;
            break;
        }
    }
    &name[..end]
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
    dedupe_within(names, usize::MAX)
}

/// `dedupe`, keeping every name within `max` bytes: where `<name>~<n>` would be longer, the
/// name is `cut` to make room for the suffix.
pub fn dedupe_within(names: impl IntoIterator<Item = String>, max: usize) -> Vec<String> {
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
                let suffix = format!("~{n}");
                let room = max.saturating_sub(suffix.len());
                candidate = format!("{}{suffix}", cut(&name, room));
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

    fn valid(name: &str, max: usize) -> bool {
        !name.is_empty()
            && name != "."
            && name != ".."
            && name.len() <= max
            && !name.contains('/')
            && !name.contains('\0')
    }

    #[test]
    fn long_names_are_shortened_stably() {
        let key = "k".repeat(5000);
        let name = file_name(&key, NAME_MAX - LONGEST_EXTENSION);
        assert_eq!(name.len(), NAME_MAX - LONGEST_EXTENSION);
        // printf %s "$(printf 'k%.0s' $(seq 5000))" | sha256sum | cut -c1-16
        let hash = &name[name.len() - 16..];
        assert_eq!(name, format!("{}~{hash}", "k".repeat(233)));
        assert_eq!(hash, "622b8b1d5094d382");
        assert_eq!(file_name(&key, 250), name);
        // Short names stay as they were.
        assert_eq!(file_name("lin.weight", 250), "lin.weight");
        // Cut at a character boundary, never inside an escape.
        let wide = "é".repeat(200);
        let name = file_name(&wide, 250);
        assert!(name.len() <= 250 && name.starts_with("éé"));
        let slashes = format!("{}{}", "a".repeat(230), "/".repeat(100));
        let name = file_name(&slashes, 250);
        assert!(
            name.starts_with(&format!("{}%2F~", "a".repeat(230))),
            "{name}"
        );
        let slashes = format!("{}{}", "a".repeat(231), "/".repeat(100));
        let name = file_name(&slashes, 250);
        assert!(name.starts_with(&format!("{}~", "a".repeat(231))), "{name}");
    }

    #[test]
    fn dedupe_stays_within_the_bound() {
        let long = "x".repeat(250);
        let got = dedupe_within([long.clone(), long.clone(), long], 250);
        assert_eq!(got[0].len(), 250);
        assert_eq!(got[1], format!("{}~1", "x".repeat(248)));
        assert_eq!(got[2], format!("{}~2", "x".repeat(248)));
    }

    /// Keys built from a few characters that stress the rules (escapes, `~`, multi-byte
    /// characters), long enough to be shortened, often sharing long prefixes.
    fn key() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let piece = prop_oneof![
            Just("a".to_string()),
            Just("/".to_string()),
            Just("%".to_string()),
            Just("\0".to_string()),
            Just("~".to_string()),
            Just("é".to_string()),
            Just(".".to_string()),
            Just("~1".to_string()),
            Just("a".repeat(240)),
            Just("%".repeat(90)),
            Just("😀".repeat(70)),
        ];
        prop_oneof![
            proptest::collection::vec(piece, 0..6).prop_map(|p| p.concat()),
            proptest::collection::vec(any::<u8>(), 0..400)
                .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        ]
    }

    proptest::proptest! {
        /// Any names, once shortened and deduplicated, are valid, distinct file names of at
        /// most 255 bytes with the longest extension, and the same every time.
        #[test]
        fn shortened_names_are_valid_and_distinct(
            keys in proptest::collection::vec(key(), 0..12),
            copy in proptest::prelude::any::<proptest::sample::Index>(),
        ) {
            let max = NAME_MAX - LONGEST_EXTENSION;
            let mut keys = keys;
            // A real key equal to the shortened form of another one.
            if !keys.is_empty() {
                let k = &keys[copy.index(keys.len())];
                keys.push(file_name(k, max));
            }
            let names = dedupe_within(keys.iter().map(|k| file_name(k, max)), max);
            let again = dedupe_within(keys.iter().map(|k| file_name(k, max)), max);
            proptest::prop_assert_eq!(&names, &again);
            let mut seen = std::collections::HashSet::new();
            for (k, n) in keys.iter().zip(&names) {
                proptest::prop_assert!(valid(n, max), "{:?} -> {:?}", k, n);
                proptest::prop_assert!(seen.insert(n.clone()), "{:?} twice", n);
                if encode(k).len() <= max && keys.iter().filter(|x| *x == k).count() == 1 {
                    // A unique short key is shown verbatim unless a shortened name took it.
                    proptest::prop_assert!(n == &encode(k) || n.contains('~'));
                }
            }
        }
    }
}
