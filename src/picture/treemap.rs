//! The SVG treemap of where a model's bytes go (`sizes.svg`, docs/tree.md#sizessvg).
//!
//! A pure function of a tree of [`Block`]s, whatever computed them: each block is a
//! rectangle whose area is its share of its parent's bytes (squarified: rectangles as close
//! to squares as the order allows), nested blocks inside their parent under its title,
//! leaves coloured by their key (a dtype, a quantization) with a legend of the bytes per key.
//!
//! Invariants: output depends only on the blocks (children laid out by bytes, ties in their
//! given order; colours given to keys by their total bytes, ties by name); the picture is
//! bounded whatever the model: a parent draws at most [`CHILDREN_DRAWN`] children (the
//! smallest others become one "N more" block), rectangles too small to see are not drawn,
//! and the legend lists at most [`LEGEND_KEYS`] keys.

use std::collections::BTreeMap;
use std::fmt::Write;

/// Children a block draws before the rest are merged into one.
pub const CHILDREN_DRAWN: usize = 200;
/// Keys the legend lists (the others share one grey).
pub const LEGEND_KEYS: usize = 16;

const WIDTH: f64 = 1024.0;
const MAP_Y: f64 = 40.0;
const MAP_H: f64 = 600.0;
const HEADER: f64 = 14.0;
const PAD: f64 = 2.0;

/// Colours of keys, in the order of their total bytes.
const PALETTE: [&str; LEGEND_KEYS] = [
    "#42a5f5", "#ef5350", "#66bb6a", "#ffa726", "#ab47bc", "#26c6da", "#d4e157", "#8d6e63",
    "#ec407a", "#5c6bc0", "#26a69a", "#ffca28", "#7e57c2", "#9ccc65", "#29b6f6", "#ff7043",
];
const OTHER: &str = "#bdbdbd";

/// A part of a model: its bytes, a label, the key that colours it (for leaves), and parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub label: String,
    pub bytes: u64,
    pub key: String,
    pub children: Vec<Block>,
}

impl Block {
    pub fn leaf(label: impl Into<String>, bytes: u64, key: impl Into<String>) -> Block {
        Block {
            label: label.into(),
            bytes,
            key: key.into(),
            children: Vec::new(),
        }
    }

    pub fn group(label: impl Into<String>, children: Vec<Block>) -> Block {
        let bytes = children.iter().map(|c| c.bytes).sum();
        Block {
            label: label.into(),
            bytes,
            key: String::new(),
            children,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Rect {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

/// Bytes as people read them: `512 B`, `1.5 KiB`, `3.2 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// The worst aspect ratio of a row of `areas` laid along a side of length `side`.
fn worst(sum: f64, min: f64, max: f64, side: f64) -> f64 {
    let s2 = side * side;
    (s2 * max / (sum * sum)).max(sum * sum / (s2 * min))
}

/// Squarified layout of `areas` (decreasing, positive, summing to `r`'s area) in `r`.
fn squarify(areas: &[f64], mut r: Rect) -> Vec<Rect> {
    let mut out = Vec::with_capacity(areas.len());
    let mut i = 0;
    while i < areas.len() {
        let side = r.w.min(r.h).max(f64::MIN_POSITIVE);
        let (mut sum, mut min, mut max) = (areas[i], areas[i], areas[i]);
        let mut j = i + 1;
        let mut best = worst(sum, min, max, side);
        while j < areas.len() {
            let a = areas[j];
            let w = worst(sum + a, min.min(a), max.max(a), side);
            if w > best {
                break;
            }
            (sum, min, max, best) = (sum + a, min.min(a), max.max(a), w);
            j += 1;
        }
        if r.w >= r.h {
            let cw = if r.h > 0.0 { sum / r.h } else { 0.0 };
            let mut y = r.y;
            for &a in &areas[i..j] {
                let h = if cw > 0.0 { a / cw } else { 0.0 };
                out.push(Rect {
                    x: r.x,
                    y,
                    w: cw,
                    h,
                });
                y += h;
            }
            r.x += cw;
            r.w = (r.w - cw).max(0.0);
        } else {
            let rh = if r.w > 0.0 { sum / r.w } else { 0.0 };
            let mut x = r.x;
            for &a in &areas[i..j] {
                let w = if rh > 0.0 { a / rh } else { 0.0 };
                out.push(Rect {
                    x,
                    y: r.y,
                    w,
                    h: rh,
                });
                x += w;
            }
            r.y += rh;
            r.h = (r.h - rh).max(0.0);
        }
        i = j;
    }
    out
}

/// Total bytes of the leaves under `b`, per key.
fn key_totals(b: &Block, totals: &mut BTreeMap<String, u64>) {
    if b.children.is_empty() {
        *totals.entry(b.key.clone()).or_default() += b.bytes;
    }
    for c in &b.children {
        key_totals(c, totals);
    }
}

struct Painter<'a> {
    out: String,
    colours: &'a BTreeMap<String, &'static str>,
}

impl Painter<'_> {
    fn colour(&self, key: &str) -> &'static str {
        self.colours.get(key).copied().unwrap_or(OTHER)
    }

    /// `label` cut to what fits in `w` pixels at font size 10.
    fn fit(label: &str, w: f64) -> Option<String> {
        let n = ((w - 4.0) / 6.0).floor();
        if n < 3.0 {
            return None;
        }
        let n = n as usize;
        let count = label.chars().count();
        Some(if count <= n {
            label.to_string()
        } else {
            let head: String = label.chars().take(n - 1).collect();
            format!("{head}…")
        })
    }

    fn rect(&mut self, r: Rect, fill: &str, stroke: &str, tip: &str) {
        let _ = write!(
            self.out,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{fill}\" stroke=\"{stroke}\" stroke-width=\"0.6\"><title>",
            r.x, r.y, r.w, r.h
        );
        super::escape_xml(tip, &mut self.out);
        self.out.push_str("</title></rect>\n");
    }

    fn label(&mut self, x: f64, y: f64, s: &str, bold: bool) {
        let _ = write!(
            self.out,
            "<text x=\"{x:.1}\" y=\"{y:.1}\" font-size=\"10\"{}>",
            if bold { " font-weight=\"bold\"" } else { "" }
        );
        super::escape_xml(s, &mut self.out);
        self.out.push_str("</text>\n");
    }

    fn block(&mut self, b: &Block, r: Rect) {
        if r.w < 1.0 || r.h < 1.0 {
            return;
        }
        let tip = format!("{}: {} ({} B)", b.label, human(b.bytes), b.bytes);
        if b.children.is_empty() {
            self.rect(r, self.colour(&b.key), "#ffffff", &tip);
            if r.h >= 12.0 {
                if let Some(l) = Self::fit(&b.label, r.w) {
                    self.label(r.x + 2.0, r.y + 10.0, &l, false);
                }
            }
            if r.h >= 24.0 {
                if let Some(l) = Self::fit(&human(b.bytes), r.w) {
                    self.label(r.x + 2.0, r.y + 21.0, &l, false);
                }
            }
            return;
        }
        self.rect(r, "#f5f5f5", "#607d8b", &tip);
        let header = if r.h >= HEADER + 4.0 * PAD {
            HEADER
        } else {
            0.0
        };
        if header > 0.0 {
            if let Some(l) = Self::fit(&format!("{} · {}", b.label, human(b.bytes)), r.w) {
                self.label(r.x + 2.0, r.y + 11.0, &l, true);
            }
        }
        let inner = Rect {
            x: r.x + PAD,
            y: r.y + header + PAD,
            w: (r.w - 2.0 * PAD).max(0.0),
            h: (r.h - header - 2.0 * PAD).max(0.0),
        };
        let children = drawn_children(b);
        let total: u64 = children.iter().map(|c| c.bytes).sum();
        if total == 0 || inner.w < 1.0 || inner.h < 1.0 {
            return;
        }
        let area = inner.w * inner.h;
        let areas: Vec<f64> = children
            .iter()
            .map(|c| area * c.bytes as f64 / total as f64)
            .collect();
        for (c, cr) in children.iter().zip(squarify(&areas, inner)) {
            self.block(c, cr);
        }
    }
}

/// The children of `b` to draw, largest first (ties in their order): those with bytes, at
/// most `CHILDREN_DRAWN`, the rest merged into one block.
fn drawn_children(b: &Block) -> Vec<Block> {
    let mut order: Vec<&Block> = b.children.iter().filter(|c| c.bytes > 0).collect();
    order.sort_by_key(|c| std::cmp::Reverse(c.bytes));
    if order.len() <= CHILDREN_DRAWN {
        return order.into_iter().cloned().collect();
    }
    let rest = &order[CHILDREN_DRAWN - 1..];
    let bytes = rest.iter().map(|c| c.bytes).sum();
    let mut out: Vec<Block> = order[..CHILDREN_DRAWN - 1]
        .iter()
        .map(|c| (*c).clone())
        .collect();
    out.push(Block::leaf(format!("{} more", rest.len()), bytes, ""));
    out
}

/// The treemap of `root`, titled `title`.
pub fn svg(title: &str, root: &Block) -> String {
    let mut totals = BTreeMap::new();
    key_totals(root, &mut totals);
    let mut keys: Vec<(&String, &u64)> = totals.iter().filter(|(k, _)| !k.is_empty()).collect();
    keys.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let colours: BTreeMap<String, &'static str> = keys
        .iter()
        .zip(PALETTE)
        .map(|((k, _), c)| ((*k).clone(), c))
        .collect();
    let legend_rows = keys.len().min(LEGEND_KEYS).div_ceil(4) + 1;
    let height = MAP_Y + MAP_H + 12.0 + 18.0 * legend_rows as f64;
    let mut p = Painter {
        out: String::new(),
        colours: &colours,
    };
    let _ = writeln!(
        p.out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\" font-family=\"sans-serif\">"
    );
    p.out
        .push_str("<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
    let _ = write!(
        p.out,
        "<text x=\"8\" y=\"24\" font-size=\"15\" font-weight=\"bold\">"
    );
    super::escape_xml(&format!("{title}: {}", human(root.bytes)), &mut p.out);
    p.out.push_str("</text>\n");
    p.block(
        root,
        Rect {
            x: 8.0,
            y: MAP_Y,
            w: WIDTH - 16.0,
            h: MAP_H,
        },
    );
    // The legend: each key's colour and bytes, four to a row.
    let mut y = MAP_Y + MAP_H + 12.0;
    let mut shown = 0u64;
    for (n, (k, bytes)) in keys.iter().take(LEGEND_KEYS).enumerate() {
        let x = 8.0 + (n % 4) as f64 * (WIDTH - 16.0) / 4.0;
        if n > 0 && n % 4 == 0 {
            y += 18.0;
        }
        let _ = writeln!(
            p.out,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"12\" height=\"12\" fill=\"{}\"/>",
            p.colour(k)
        );
        let label = format!("{k}: {}", human(**bytes));
        p.label(x + 16.0, y + 10.0, &label, false);
        shown += **bytes;
    }
    let rest = totals.values().sum::<u64>() - shown;
    if rest > 0 {
        y += 18.0;
        let _ = writeln!(
            p.out,
            "<rect x=\"8\" y=\"{y:.1}\" width=\"12\" height=\"12\" fill=\"{OTHER}\"/>"
        );
        p.label(24.0, y + 10.0, &format!("other: {}", human(rest)), false);
    }
    p.out.push_str("</svg>\n");
    p.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squarified_rectangles_tile_the_area() {
        let areas = [6.0, 6.0, 4.0, 3.0, 2.0, 2.0, 1.0];
        let r = Rect {
            x: 0.0,
            y: 0.0,
            w: 6.0,
            h: 4.0,
        };
        let rects = squarify(&areas, r);
        for (a, r) in areas.iter().zip(&rects) {
            assert!((r.w * r.h - a).abs() < 1e-9);
            assert!(
                r.x >= -1e-9 && r.y >= -1e-9 && r.x + r.w <= 6.0 + 1e-9 && r.y + r.h <= 4.0 + 1e-9
            );
        }
    }

    #[test]
    fn bounded_and_deterministic() {
        let leaves: Vec<Block> = (0..5000)
            .map(|i| Block::leaf(format!("t{i}"), 1 + i % 7, format!("k{}", i % 40)))
            .collect();
        let root = Block::group("m", vec![Block::group("segment 0", leaves)]);
        let a = svg("m.pte", &root);
        assert_eq!(a, svg("m.pte", &root));
        assert!(a.matches("<rect").count() < CHILDREN_DRAWN + LEGEND_KEYS + 10);
        assert!(a.contains("other: "));
        assert!(a.contains("199 more") || a.contains("4801 more"));
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(12), "12 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}
