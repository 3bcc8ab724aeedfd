//! How a checkpoint tensor's elements are laid out where the model stores them
//! (docs/names.md#transforms): `stored = T(checkpoint)`, always a reordering of elements.
//!
//! - `Identity`: the same elements in the same order (shapes may differ by dims of 1).
//! - `Axes { order }`: `stored = checkpoint.transpose(order)`, then shaped as stored. The
//!   order applies to the checkpoint's dims when both shapes have the same rank, else to its
//!   dims without those of size 1. A transpose is `[1, 0]`; a convolution filter stored
//!   channels-last is OIHW → OHWI, `[0, 2, 3, 1]`; XNNPACK's depthwise filter
//!   `[1, H, W, O]` of an `[O, 1, H, W]` one is `[1, 2, 3, 0]`.
//! - `Rotary { direction, heads }`: rows reordered within each of `heads` blocks, as Hugging
//!   Face's Llama conversion does for q and k: `permute(w, n) = w.view(n, d1 // n // 2, 2,
//!   d2).transpose(1, 2).reshape(d1, d2)` takes Meta's order to Hugging Face's
//!   (`MetaToHf`: the checkpoint is Meta's, the model stores Hugging Face's), its inverse
//!   `w.view(n, 2, d1 // n // 2, d2).transpose(1, 2).reshape(d1, d2)` Hugging Face's to
//!   Meta's (`HfToMeta`). d2 is the product of the other dims (1 for a bias).
//!
//! Invariants: [`candidates`] lists each distinct reordering once (two transforms that move
//! every element alike are one candidate), the plain identity first; an [`IndexMap`] is
//! built only for shapes its transform turns one into the other, and maps every index
//! below the element count to one below it, both ways, as a bijection.

use std::fmt;

use serde_json::{json, Value};

/// Axes are reordered up to this rank (every order is tried: 5! = 120 at most).
const MAX_AXES: usize = 5;

/// Which way rotary rows are reordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// The checkpoint is in Hugging Face's order, the model stores Meta's.
    HfToMeta,
    /// The checkpoint is in Meta's order, the model stores Hugging Face's.
    MetaToHf,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::HfToMeta => "hf_to_meta",
            Direction::MetaToHf => "meta_to_hf",
        }
    }
}

/// A reordering of a checkpoint tensor's elements into a stored tensor's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Transform {
    Identity,
    Axes { order: Vec<usize> },
    Rotary { direction: Direction, heads: u64 },
}

impl fmt::Display for Transform {
    /// `identity`, `transpose`, `OIHW->OHWI`, `axes [1,2,0]`, `rotary hf_to_meta, 4 heads`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transform::Identity => f.write_str("identity"),
            Transform::Axes { order } if order[..] == [1, 0] => f.write_str("transpose"),
            Transform::Axes { order } if order.len() == 4 => {
                let letters: String = order.iter().map(|&d| b"OIHW"[d] as char).collect();
                write!(f, "OIHW->{letters}")
            }
            Transform::Axes { order } => {
                let o: Vec<String> = order.iter().map(usize::to_string).collect();
                write!(f, "axes [{}]", o.join(","))
            }
            Transform::Rotary { direction, heads } => write!(
                f,
                "rotary {}, {heads} head{}",
                direction.as_str(),
                if *heads == 1 { "" } else { "s" }
            ),
        }
    }
}

impl Transform {
    /// The map's JSON of the transform (docs/names.md#transforms).
    pub fn to_json(&self) -> Value {
        match self {
            Transform::Identity => json!({ "kind": "identity" }),
            Transform::Axes { order } => json!({ "kind": "axes", "order": order }),
            Transform::Rotary { direction, heads } => {
                json!({ "kind": "rotary", "direction": direction.as_str(), "heads": heads })
            }
        }
    }

    /// The transform a map's JSON describes, or what is wrong with it.
    pub fn from_json(v: &Value) -> std::result::Result<Transform, String> {
        let kind = v.get("kind").and_then(Value::as_str);
        match kind {
            Some("identity") => Ok(Transform::Identity),
            Some("axes") => {
                let order: Option<Vec<usize>> = v
                    .get("order")
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect());
                let order = order.ok_or("an axes transform needs \"order\", a list of dims")?;
                let mut seen = order.clone();
                seen.sort_unstable();
                if order.is_empty()
                    || order.len() > MAX_AXES
                    || seen.iter().enumerate().any(|(i, &d)| i != d)
                {
                    return Err(format!("axes order {order:?} is not a permutation of 0..n"));
                }
                Ok(Transform::Axes { order })
            }
            Some("rotary") => {
                let direction = match v.get("direction").and_then(Value::as_str) {
                    Some("hf_to_meta") => Direction::HfToMeta,
                    Some("meta_to_hf") => Direction::MetaToHf,
                    _ => return Err(
                        "a rotary transform needs \"direction\": \"hf_to_meta\" or \"meta_to_hf\""
                            .into(),
                    ),
                };
                let heads = v
                    .get("heads")
                    .and_then(Value::as_u64)
                    .filter(|&h| h > 0)
                    .ok_or("a rotary transform needs \"heads\", a positive integer")?;
                Ok(Transform::Rotary { direction, heads })
            }
            _ => Err(format!(
                "unknown transform {v}: expected kind identity, axes or rotary"
            )),
        }
    }
}

/// `shape` without its dims of size 1.
fn squeezed(shape: &[u64]) -> Vec<u64> {
    shape.iter().copied().filter(|&d| d != 1).collect()
}

/// The dims an axes order applies to for these shapes: the checkpoint's own when the ranks
/// agree, else the checkpoint's without dims of 1 (then the stored shape's must agree too).
fn axes_dims(ckpt: &[u64], stored: &[u64]) -> (Vec<u64>, Vec<u64>) {
    if ckpt.len() == stored.len() {
        (ckpt.to_vec(), stored.to_vec())
    } else {
        (squeezed(ckpt), squeezed(stored))
    }
}

/// The order restricted to dims of more than one element, renumbered: two orders with
/// equal reductions move every element alike.
fn reduced(order: &[usize], dims: &[u64]) -> Vec<usize> {
    let kept: Vec<usize> = order.iter().copied().filter(|&d| dims[d] != 1).collect();
    let mut sorted = kept.clone();
    sorted.sort_unstable();
    kept.iter()
        .map(|d| sorted.binary_search(d).expect("from the same list"))
        .collect()
}

/// Every order of `dims` that gives `target`, smallest first.
fn orders(dims: &[u64], target: &[u64]) -> Vec<Vec<usize>> {
    fn walk(
        dims: &[u64], target: &[u64], used: &mut Vec<bool>, cur: &mut Vec<usize>,
        out: &mut Vec<Vec<usize>>,
    ) {
        if cur.len() == dims.len() {
            out.push(cur.clone());
            return;
        }
        let want = target[cur.len()];
        for d in 0..dims.len() {
            if !used[d] && dims[d] == want {
                used[d] = true;
                cur.push(d);
                walk(dims, target, used, cur, out);
                cur.pop();
                used[d] = false;
            }
        }
    }
    let mut out = Vec::new();
    if dims.len() == target.len() && dims.len() <= MAX_AXES {
        walk(
            dims,
            target,
            &mut vec![false; dims.len()],
            &mut Vec::new(),
            &mut out,
        );
    }
    out
}

/// The rows and the elements per row of a tensor rotary reordering applies to.
fn rows(shape: &[u64]) -> (u64, u64) {
    match shape.split_first() {
        Some((&d1, rest)) => (d1, rest.iter().product()),
        None => (1, 1),
    }
}

/// Every transform that turns a tensor of shape `ckpt` into one of shape `stored`, each
/// distinct reordering once: the identity first, then axes orders, then rotary reorderings
/// by head count.
pub fn candidates(ckpt: &[u64], stored: &[u64]) -> Vec<Transform> {
    let numel = |s: &[u64]| s.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
    if numel(ckpt).is_none() || numel(ckpt) != numel(stored) {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut seen: Vec<Vec<usize>> = Vec::new();
    if squeezed(ckpt) == squeezed(stored) {
        out.push(Transform::Identity);
        seen.push((0..squeezed(ckpt).len()).collect());
    }
    let (dims, target) = axes_dims(ckpt, stored);
    for order in orders(&dims, &target) {
        let r = reduced(&order, &dims);
        if !seen.contains(&r) {
            seen.push(r);
            out.push(Transform::Axes { order });
        } else if r.iter().enumerate().all(|(i, &d)| i == d)
            && ckpt != stored
            && ckpt.len() == stored.len()
            && ckpt.len() == 4
            && out.first() == Some(&Transform::Identity)
        {
            // A 1×1 filter stored OHWI: the same bytes, but its layout is worth naming.
            out[0] = Transform::Axes { order };
        }
    }
    if ckpt == stored && ckpt.len() <= 2 {
        let (d1, _) = rows(ckpt);
        let mut heads = 1;
        while heads * 4 <= d1 {
            if d1 % (2 * heads) == 0 {
                out.push(Transform::Rotary {
                    direction: Direction::HfToMeta,
                    heads,
                });
                // With two rows a head pair, both directions swap the same rows.
                if d1 / (2 * heads) > 2 {
                    out.push(Transform::Rotary {
                        direction: Direction::MetaToHf,
                        heads,
                    });
                }
            }
            heads += 1;
        }
    }
    out
}

/// A transform for two shapes: the checkpoint index of every stored index, and back.
#[derive(Debug, Clone)]
pub struct IndexMap {
    numel: u64,
    kind: MapKind,
}

#[derive(Debug, Clone)]
enum MapKind {
    Identity,
    /// Stored dims (mixed radix, last fastest) and, for each, the checkpoint stride it
    /// walks; and the checkpoint dims with the stored stride of each.
    Axes {
        stored_dims: Vec<u64>,
        ckpt_strides: Vec<u64>,
        ckpt_dims: Vec<u64>,
        stored_strides: Vec<u64>,
    },
    Rotary {
        direction: Direction,
        /// Rows per head (2h), and h.
        block: u64,
        half: u64,
        row_len: u64,
    },
}

fn strides(dims: &[u64]) -> Vec<u64> {
    let mut s = vec![1u64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

impl IndexMap {
    /// The map of `t` between a checkpoint tensor of shape `ckpt` and a stored one of shape
    /// `stored`; None when `t` does not turn one shape into the other.
    pub fn new(t: &Transform, ckpt: &[u64], stored: &[u64]) -> Option<IndexMap> {
        let numel = ckpt.iter().try_fold(1u64, |n, &d| n.checked_mul(d))?;
        if stored.iter().try_fold(1u64, |n, &d| n.checked_mul(d))? != numel {
            return None;
        }
        let kind = match t {
            Transform::Identity => {
                if squeezed(ckpt) != squeezed(stored) {
                    return None;
                }
                MapKind::Identity
            }
            Transform::Axes { order } => {
                let (dims, target) = axes_dims(ckpt, stored);
                if order.len() != dims.len()
                    || order.iter().any(|&d| d >= dims.len())
                    || order.iter().map(|&d| dims[d]).ne(target.iter().copied())
                {
                    return None;
                }
                let mut sorted = order.clone();
                sorted.sort_unstable();
                if sorted.iter().enumerate().any(|(i, &d)| i != d) {
                    return None;
                }
                let cs = strides(&dims);
                let ss = strides(&target);
                let mut stored_strides = vec![0; dims.len()];
                for (j, &d) in order.iter().enumerate() {
                    stored_strides[d] = ss[j];
                }
                MapKind::Axes {
                    stored_dims: target,
                    ckpt_strides: order.iter().map(|&d| cs[d]).collect(),
                    ckpt_dims: dims,
                    stored_strides,
                }
            }
            Transform::Rotary { direction, heads } => {
                if ckpt != stored || ckpt.len() > 2 {
                    return None;
                }
                let (d1, row_len) = rows(ckpt);
                let block = d1.checked_div(*heads)?;
                if block * heads != d1 || block % 2 != 0 || block < 2 {
                    return None;
                }
                MapKind::Rotary {
                    direction: *direction,
                    block,
                    half: block / 2,
                    row_len,
                }
            }
        };
        Some(IndexMap { numel, kind })
    }

    pub fn numel(&self) -> u64 {
        self.numel
    }

    /// Whether every element stays where it is.
    pub fn is_identity(&self) -> bool {
        matches!(self.kind, MapKind::Identity)
    }

    /// The checkpoint index of stored element `s` (< numel).
    #[inline]
    pub fn source(&self, s: u64) -> u64 {
        self.map_index(s, false)
    }

    /// Calls `f(first, stride, len)` for every run of the stored order, in that order: the
    /// next `len` stored elements are checkpoint elements `first + k × stride` (k < len).
    /// The runs are as long as the layout allows (the whole tensor for the identity, a row
    /// for a rotary reordering, the last stored dim for axes), so a caller moves values a
    /// run at a time instead of mapping each index (`source`).
    pub fn runs<E>(&self, mut f: impl FnMut(u64, u64, u64) -> Result<(), E>) -> Result<(), E> {
        if self.numel == 0 {
            return Ok(());
        }
        match &self.kind {
            MapKind::Identity => f(0, 1, self.numel),
            MapKind::Axes {
                stored_dims,
                ckpt_strides,
                ..
            } => {
                let (inner, stride) = match (stored_dims.last(), ckpt_strides.last()) {
                    (Some(&d), Some(&s)) => (d, s),
                    _ => (1, 1),
                };
                // The last digit of a stored index below `inner` adds `k × stride`.
                for o in 0..self.numel / inner {
                    f(self.source(o * inner), stride, inner)?;
                }
                Ok(())
            }
            MapKind::Rotary {
                direction,
                block,
                half,
                row_len,
            } => {
                for row in 0..self.numel / row_len {
                    let from = rotary_row(*direction, *block, *half, row, false);
                    f(from * row_len, 1, *row_len)?;
                }
                Ok(())
            }
        }
    }

    /// The stored index of checkpoint element `c` (< numel).
    #[inline]
    pub fn stored(&self, c: u64) -> u64 {
        self.map_index(c, true)
    }

    /// `source` of `i`, or with `inverse` `stored` of it: one walk of the index's digits
    /// from the last axis, over the dims of the side it counts in and the other side's
    /// strides.
    #[inline]
    fn map_index(&self, i: u64, inverse: bool) -> u64 {
        match &self.kind {
            MapKind::Identity => i,
            MapKind::Axes {
                stored_dims,
                ckpt_strides,
                ckpt_dims,
                stored_strides,
            } => {
                let (dims, strides) = if inverse {
                    (ckpt_dims, stored_strides)
                } else {
                    (stored_dims, ckpt_strides)
                };
                let mut rest = i;
                let mut at = 0;
                for d in (0..dims.len()).rev() {
                    at += (rest % dims[d]) * strides[d];
                    rest /= dims[d];
                }
                at
            }
            MapKind::Rotary {
                direction,
                block,
                half,
                row_len,
            } => {
                let (row, col) = (i / row_len, i % row_len);
                rotary_row(*direction, *block, *half, row, inverse) * row_len + col
            }
        }
    }
}

/// The row a rotary reordering reads for stored row `row` (or, `inverse`, the stored row
/// of checkpoint row `row`). Meta's order within a head is (i, j) as `i × 2 + j`,
/// Hugging Face's `j × h + i` (i < h, j < 2).
#[inline]
fn rotary_row(direction: Direction, block: u64, half: u64, row: u64, inverse: bool) -> u64 {
    let (head, within) = (row / block, row % block);
    // Which order `within` counts in: the stored one, or the checkpoint's when inverted.
    let meta_side = matches!(direction, Direction::HfToMeta) != inverse;
    let (i, j) = if meta_side {
        (within / 2, within % 2)
    } else {
        (within % half, within / half)
    };
    let other = if meta_side { j * half + i } else { i * 2 + j };
    head * block + other
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `stored[s] = ckpt[map.source(s)]` for a small tensor, in NumPy's terms.
    fn apply(t: &Transform, ckpt_shape: &[u64], stored_shape: &[u64], ckpt: &[u32]) -> Vec<u32> {
        let map = IndexMap::new(t, ckpt_shape, stored_shape).expect("shapes fit");
        let out: Vec<u32> = (0..map.numel())
            .map(|s| ckpt[map.source(s) as usize])
            .collect();
        for c in 0..map.numel() {
            assert_eq!(map.source(map.stored(c)), c, "{t}: not a bijection at {c}");
        }
        out
    }

    /// The runs of a map, expanded: the checkpoint index of every stored index in order.
    fn by_runs(map: &IndexMap) -> Vec<u64> {
        let mut out = Vec::new();
        map.runs(|first, stride, len| {
            out.extend((0..len).map(|k| first + k * stride));
            Ok::<(), ()>(())
        })
        .unwrap();
        out
    }

    #[test]
    fn runs_cover_the_stored_order() {
        let cases: [(Transform, &[u64], &[u64]); 6] = [
            (Transform::Identity, &[4, 6], &[1, 4, 6]),
            (Transform::Axes { order: vec![1, 0] }, &[4, 6], &[6, 4]),
            (
                Transform::Axes {
                    order: vec![0, 2, 3, 1],
                },
                &[2, 3, 2, 2],
                &[2, 2, 2, 3],
            ),
            (
                Transform::Axes {
                    order: vec![1, 2, 3, 0],
                },
                &[8, 1, 3, 3],
                &[1, 3, 3, 8],
            ),
            (
                Transform::Rotary {
                    direction: Direction::HfToMeta,
                    heads: 2,
                },
                &[12, 5],
                &[12, 5],
            ),
            (
                Transform::Rotary {
                    direction: Direction::MetaToHf,
                    heads: 1,
                },
                &[8],
                &[8],
            ),
        ];
        for (t, ckpt, stored) in cases {
            let map = IndexMap::new(&t, ckpt, stored).expect("shapes fit");
            let each: Vec<u64> = (0..map.numel()).map(|s| map.source(s)).collect();
            assert_eq!(by_runs(&map), each, "{t}");
        }
    }

    #[test]
    fn transpose_and_conv_layouts() {
        let w: Vec<u32> = (0..6).collect(); // [[0,1,2],[3,4,5]]
        let t = Transform::Axes { order: vec![1, 0] };
        assert_eq!(apply(&t, &[2, 3], &[3, 2], &w), [0, 3, 1, 4, 2, 5]);
        assert_eq!(t.to_string(), "transpose");
        // OIHW [2,3,1,2] -> OHWI [2,1,2,3]: element (o,h,w,i) = ckpt (o,i,h,w).
        let w: Vec<u32> = (0..12).collect();
        let t = Transform::Axes {
            order: vec![0, 2, 3, 1],
        };
        let s = apply(&t, &[2, 3, 1, 2], &[2, 1, 2, 3], &w);
        assert_eq!(s, [0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11]);
        assert_eq!(t.to_string(), "OIHW->OHWI");
    }

    #[test]
    fn rotary_matches_the_conversion_formulas() {
        // 2 heads of 6 rows (h = 3), one column: rows are their own indices.
        let w: Vec<u32> = (0..12).collect();
        // permute(w, 2) = w.view(2, 3, 2, 1).transpose(1, 2): head 0 reads rows 0,2,4,1,3,5.
        let to_hf = Transform::Rotary {
            direction: Direction::MetaToHf,
            heads: 2,
        };
        let hf = apply(&to_hf, &[12], &[12], &w);
        assert_eq!(hf, [0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11]);
        // The inverse: w.view(2, 2, 3, 1).transpose(1, 2): head 0 reads rows 0,3,1,4,2,5.
        let to_meta = Transform::Rotary {
            direction: Direction::HfToMeta,
            heads: 2,
        };
        assert_eq!(
            apply(&to_meta, &[12], &[12], &w),
            [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11]
        );
        let back: Vec<u32> = apply(&to_meta, &[12], &[12], &hf);
        assert_eq!(back, w);
        // Columns move with their rows.
        let w: Vec<u32> = (0..24).collect();
        let s = apply(&to_meta, &[12, 2], &[12, 2], &w);
        assert_eq!(&s[..4], &[0, 1, 6, 7]);
    }

    #[test]
    fn candidates_are_distinct_reorderings() {
        assert_eq!(candidates(&[3, 4], &[5, 2]), Vec::<Transform>::new());
        // A square matrix: identity, transpose and rotary reorderings of 8 rows (1 head of
        // 8, 2 heads of 4 rows, both ways; 2 rows a head would be a no-op for 4 heads and
        // is left out, as is the second direction of 2-row pairs).
        let c = candidates(&[8, 8], &[8, 8]);
        assert_eq!(c[0], Transform::Identity);
        assert_eq!(c[1], Transform::Axes { order: vec![1, 0] });
        let rotary: Vec<String> = c[2..].iter().map(Transform::to_string).collect();
        assert_eq!(
            rotary,
            [
                "rotary hf_to_meta, 1 head",
                "rotary meta_to_hf, 1 head",
                "rotary hf_to_meta, 2 heads"
            ]
        );
        // A bias vector gets rotary candidates too, a conv filter its layouts.
        assert!(candidates(&[8], &[8]).len() > 1);
        let conv = candidates(&[4, 3, 2, 2], &[4, 2, 2, 3]);
        assert_eq!(
            conv,
            [
                Transform::Axes {
                    order: vec![0, 2, 3, 1]
                },
                Transform::Axes {
                    order: vec![0, 3, 2, 1]
                }
            ]
        );
        // A 1×1 filter: its bytes do not move, and it is named by its layout.
        assert_eq!(
            candidates(&[4, 8, 1, 1], &[4, 1, 1, 8]),
            [Transform::Axes {
                order: vec![0, 2, 3, 1]
            }]
        );
        // Depthwise: [O,1,H,W] stored [1,H,W,O].
        let dw = candidates(&[8, 1, 3, 3], &[1, 3, 3, 8]);
        assert!(dw.contains(&Transform::Axes {
            order: vec![1, 2, 3, 0]
        }));
        // A vector stored as a row: the identity.
        assert_eq!(candidates(&[64], &[1, 64]), [Transform::Identity]);
    }

    #[test]
    fn json_round_trips_and_refuses_nonsense() {
        for t in [
            Transform::Identity,
            Transform::Axes {
                order: vec![0, 2, 3, 1],
            },
            Transform::Rotary {
                direction: Direction::HfToMeta,
                heads: 8,
            },
        ] {
            assert_eq!(Transform::from_json(&t.to_json()).unwrap(), t);
        }
        for bad in [
            json!({"kind": "axes", "order": [0, 0]}),
            json!({"kind": "axes", "order": [2, 1]}),
            json!({"kind": "rotary", "direction": "up", "heads": 2}),
            json!({"kind": "rotary", "direction": "hf_to_meta", "heads": 0}),
            json!({"kind": "shuffle"}),
        ] {
            assert!(Transform::from_json(&bad).is_err(), "{bad}");
        }
        // A map that does not fit the shapes is refused, not built.
        let t = Transform::Rotary {
            direction: Direction::HfToMeta,
            heads: 3,
        };
        assert!(IndexMap::new(&t, &[8, 2], &[8, 2]).is_none());
        assert!(IndexMap::new(&Transform::Axes { order: vec![1, 0] }, &[2, 3], &[2, 3]).is_none());
    }
}
