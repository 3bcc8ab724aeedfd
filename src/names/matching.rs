//! Learning names: every checkpoint tensor matched to the stored tensors by content
//! (docs/names.md#how-names-are-learned).
//!
//! For each checkpoint tensor, every stored tensor with as many elements is a candidate
//! under every transform that turns one shape into the other (`transform::candidates`).
//! A candidate is first compared on a fixed sample of its elements; those within twice the
//! noise bound there are confirmed on every element. The error of an element is measured
//! in its quantization steps (`Values::steps`: the scale of a quantized element, the
//! spacing of a float format), and a candidate matches when the root mean square of those
//! errors is at most half a step: what rounding to the stored format leaves, with room for
//! the few elements a quantizer with optimized scales clips.
//!
//! Then, never guessing: a stored tensor that two checkpoint tensors match (or one under
//! two transforms) names neither; a checkpoint tensor matching several stored tensors, none
//! of them contested, is stored that many times (tied embeddings, one weight in two
//! methods). A checkpoint tensor that matches nothing is compared once more with the stored
//! tensors nothing matched, allowing one factor per output channel: a convolution filter
//! with a BatchNorm folded in is reported as such, and not named.
//!
//! Invariants: memory beyond the model's and checkpoints' mappings is a fixed sample per
//! stored tensor and windows of `WINDOW` elements, and of the mappings only the tensors
//! being compared stay resident (each is released once read through); every stored tensor
//! is read through `Stored::values`, every checkpoint tensor through `Checkpoint::bytes`,
//! both bounded by what their headers say; the outcome depends only on the files' contents,
//! not on the order of evaluation (a candidate stops early only when it can be neither
//! confirmed nor the closest miss).

use std::collections::{BTreeMap, HashMap};

use super::checkpoint::{Checkpoint, Tensor};
use super::elem::{Elem, ElemRead};
use super::stored::{stored_tensors, Stored, Values};
use super::transform::{candidates, IndexMap, Transform};
use crate::catalog::Catalog;
use crate::error::{Error, Result};

/// Elements compared before a candidate is confirmed on all of them.
pub const SAMPLES: usize = 64;
/// A match: the root mean square error, in quantization steps, at most this.
pub const BOUND: f64 = 0.5;
/// Candidates within this on the sample are confirmed on every element.
pub const SCREEN: f64 = 2.0 * BOUND;
/// Elements read at a time when confirming.
const WINDOW: usize = 1 << 16;
/// Output channels, and elements of each, sampled when looking for a folded filter.
const FOLD_CHANNELS: u64 = 8;
const FOLD_PER_CHANNEL: u64 = 8;

/// How close a stored tensor is to a checkpoint tensor, over the elements compared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quality {
    /// The largest absolute difference.
    pub max_error: f64,
    /// The root mean square of the differences in quantization steps.
    pub rms_steps: f64,
    /// The largest difference in quantization steps.
    pub max_steps: f64,
    /// How many elements were compared.
    pub elements: u64,
}

/// A confirmed match of a checkpoint tensor: a stored tensor (index in `Learned::stored`)
/// and the transform that lays the checkpoint's elements out as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Match {
    pub stored: usize,
    pub transform: Transform,
    pub quality: Quality,
}

/// The closest candidate that did not match, on the sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Near {
    pub stored: usize,
    pub transform: Transform,
    pub quality: Quality,
}

/// What became of a checkpoint tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Named: stored once, or several times.
    Matched {
        targets: Vec<Match>,
        runner_up: Option<Near>,
    },
    /// Within noise of stored tensors that another checkpoint tensor (`with`) also
    /// matches, or of one stored tensor under two transforms: not named.
    Ambiguous {
        candidates: Vec<Match>,
        with: Vec<String>,
    },
    /// Stored scaled by one factor per output channel (a BatchNorm folded in): not named.
    Folded {
        stored: usize,
        transform: Transform,
        /// The smallest and largest factor.
        factors: (f64, f64),
        quality: Quality,
    },
    /// Within noise of nothing.
    Unmatched { closest: Option<Near> },
    /// Its dtype is not compared.
    NotCompared { why: String },
}

/// A checkpoint tensor and its outcome.
#[derive(Debug, Clone)]
pub struct NameResult {
    /// Which checkpoint (index in the list learned from).
    pub checkpoint: usize,
    pub tensor: Tensor,
    pub outcome: Outcome,
}

/// Everything learning found.
#[derive(Debug)]
pub struct Learned {
    pub stored: Vec<Stored>,
    pub names: Vec<NameResult>,
    /// Stored tensors that nothing named, matched ambiguously or found folded.
    pub unnamed: Vec<usize>,
    /// Stored tensors whose values could not be read, and why.
    pub unreadable: Vec<(usize, String)>,
}

impl Learned {
    /// How many checkpoint tensors were named.
    pub fn matched(&self) -> usize {
        self.names
            .iter()
            .filter(|n| matches!(n.outcome, Outcome::Matched { .. }))
            .count()
    }
}

/// `SAMPLES` element indices spread over `numel` (all of them when there are fewer): the
/// same for every tensor of that size, so one read of a checkpoint tensor serves every
/// candidate of a shape.
pub fn sample_positions(numel: u64) -> Vec<u64> {
    if numel <= SAMPLES as u64 {
        return (0..numel).collect();
    }
    // Golden-ratio steps: well spread, and never aligned with rows or columns.
    const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;
    (1..=SAMPLES as u64)
        .map(|k| ((u128::from(k.wrapping_mul(GOLDEN)) * u128::from(numel)) >> 64) as u64)
        .collect()
}

/// The difference of checkpoint value `x` and stored value `y` in steps of `step`.
#[inline]
fn in_steps(x: f64, y: f64, step: f64) -> f64 {
    if x == y || (x.is_nan() && y.is_nan()) {
        return 0.0;
    }
    let d = (x - y).abs();
    if step > 0.0 && d.is_finite() {
        d / step
    } else {
        f64::INFINITY
    }
}

/// The sum of squared errors (in steps) above which `n` elements are past the screen.
fn screen_sum(n: usize) -> f64 {
    SCREEN * SCREEN * n as f64
}

/// Accumulates a comparison.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    sum_sq: f64,
    max_steps: f64,
    max_error: f64,
    n: u64,
}

impl Tally {
    #[inline]
    fn add(&mut self, x: f64, y: f64, step: f64) {
        let r = in_steps(x, y, step);
        self.sum_sq += r * r;
        // `r` is never NaN; `d` is NaN only for a NaN value, which counts as infinitely far.
        if r > self.max_steps {
            self.max_steps = r;
        }
        let d = (x - y).abs();
        if d > self.max_error {
            self.max_error = d;
        } else if d.is_nan() {
            self.max_error = f64::INFINITY;
        }
        self.n += 1;
    }

    /// The tally of a window, in independent lanes (one long chain of additions and
    /// maxima would wait on itself at every element).
    fn of_window(xs: &[f64], ys: &[f32], steps: &[f32]) -> Tally {
        const LANES: usize = 4;
        let mut lanes = [Tally::default(); LANES];
        let n = xs.len().min(ys.len()).min(steps.len());
        let whole = n / LANES * LANES;
        for base in (0..whole).step_by(LANES) {
            for (l, lane) in lanes.iter_mut().enumerate() {
                let k = base + l;
                lane.add(xs[k], f64::from(ys[k]), f64::from(steps[k]));
            }
        }
        for k in whole..n {
            lanes[0].add(xs[k], f64::from(ys[k]), f64::from(steps[k]));
        }
        let mut out = Tally::default();
        for lane in &lanes {
            out.merge(lane);
        }
        out
    }

    fn merge(&mut self, other: &Tally) {
        self.sum_sq += other.sum_sq;
        self.max_steps = self.max_steps.max(other.max_steps);
        self.max_error = self.max_error.max(other.max_error);
        self.n += other.n;
    }

    fn rms(&self) -> f64 {
        if self.n == 0 {
            return 0.0;
        }
        (self.sum_sq / self.n as f64).sqrt()
    }

    fn quality(&self) -> Quality {
        Quality {
            max_error: self.max_error,
            rms_steps: self.rms(),
            max_steps: self.max_steps,
            elements: self.n,
        }
    }
}

/// A stored tensor's sample: its values and steps at `sample_positions`.
struct Sample {
    values: Vec<f32>,
    steps: Vec<f32>,
}

fn sample_of(values: &Values<'_>, positions: &[u64]) -> Result<Sample> {
    let mut out = Sample {
        values: vec![0.0; positions.len()],
        steps: vec![0.0; positions.len()],
    };
    for (k, &p) in positions.iter().enumerate() {
        values.read(p, &mut out.values[k..k + 1])?;
        values.steps(p, &mut out.steps[k..k + 1])?;
    }
    Ok(out)
}

/// A checkpoint tensor's values, readable by index.
struct CkptValues<'a> {
    bytes: &'a [u8],
    elem: Elem,
}

impl CkptValues<'_> {
    #[inline]
    fn get(&self, i: u64) -> f64 {
        self.elem.get(self.bytes, i as usize)
    }
}

/// The windows a comparison reads into, allocated once and reused for every tensor.
struct Windows {
    x: Vec<f64>,
    y: Vec<f32>,
    steps: Vec<f32>,
}

impl Windows {
    fn new() -> Windows {
        Windows {
            x: vec![0.0; WINDOW],
            y: vec![0.0; WINDOW],
            steps: vec![0.0; WINDOW],
        }
    }
}

/// `out[k] = get(bytes, map.source(first + k))`, the element type and the map's kind decided
/// once for the window rather than per element.
#[inline(always)]
fn gather_as(
    bytes: &[u8], map: &IndexMap, first: u64, out: &mut [f64], get: impl Fn(&[u8], usize) -> f64,
) {
    if map.is_identity() {
        let first = first as usize;
        for (k, o) in out.iter_mut().enumerate() {
            *o = get(bytes, first + k);
        }
    } else {
        for (k, o) in out.iter_mut().enumerate() {
            *o = get(bytes, map.source(first + k as u64) as usize);
        }
    }
}

impl CkptValues<'_> {
    /// The checkpoint elements of stored elements `first .. first + out.len()`.
    fn gather(&self, map: &IndexMap, first: u64, out: &mut [f64]) {
        let b = self.bytes;
        match self.elem {
            Elem::F32 if map.is_identity() => {
                let at = first as usize * 4;
                let bytes = &b[at..at + 4 * out.len()];
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                }
            }
            Elem::F32 => gather_as(b, map, first, out, |b, i| {
                f64::from(f32::from_le_bytes([
                    b[4 * i],
                    b[4 * i + 1],
                    b[4 * i + 2],
                    b[4 * i + 3],
                ]))
            }),
            Elem::BF16 => gather_as(b, map, first, out, |b, i| {
                f64::from(f32::from_bits(
                    u32::from(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])) << 16,
                ))
            }),
            elem => gather_as(b, map, first, out, |b, i| elem.get(b, i)),
        }
    }
}

/// Compares a checkpoint tensor with a stored one on every element; None as soon as it
/// cannot end within `BOUND`.
fn confirm(
    x: &CkptValues<'_>, map: &IndexMap, values: &Values<'_>, w: &mut Windows,
) -> Result<Option<Quality>> {
    let numel = map.numel();
    let limit = BOUND * BOUND * numel as f64;
    let mut tally = Tally::default();
    let mut first = 0u64;
    while first < numel {
        let n = (numel - first).min(WINDOW as u64) as usize;
        values.read(first, &mut w.y[..n])?;
        values.steps(first, &mut w.steps[..n])?;
        x.gather(map, first, &mut w.x[..n]);
        tally.merge(&Tally::of_window(&w.x[..n], &w.y[..n], &w.steps[..n]));
        if tally.sum_sq > limit {
            return Ok(None);
        }
        first += n as u64;
    }
    Ok(Some(tally.quality()))
}

/// A candidate compared on the sample: a stored tensor, and the transform (index in the
/// checkpoint tensor's list of them).
struct Scored {
    stored: usize,
    map: usize,
    sample: Tally,
}

/// Learns the names of `checkpoints`' tensors in the model `catalog` describes.
pub fn learn(catalog: &Catalog, checkpoints: &[Checkpoint]) -> Result<Learned> {
    let model = &*catalog.model;
    // A name is one tensor: a map keys its entries by name.
    let mut sources: HashMap<&str, &std::path::Path> = HashMap::new();
    for ck in checkpoints {
        for t in &ck.tensors {
            if let Some(other) = sources.insert(&t.name, &ck.source) {
                return Err(Error::invalid(format!(
                    "{:?} is a tensor of both {} and {}: give each name once",
                    t.name,
                    other.display(),
                    ck.source.display()
                )));
            }
        }
    }
    let stored = stored_tensors(catalog);
    // Each stored tensor's sample, read once; a tensor whose values cannot be read is set
    // aside with the reason.
    let mut samples: Vec<Option<Sample>> = Vec::with_capacity(stored.len());
    let mut unreadable = Vec::new();
    for (s, st) in stored.iter().enumerate() {
        match st
            .values(model)
            .and_then(|v| sample_of(&v, &sample_positions(st.numel())))
        {
            Ok(sample) => {
                st.release(model);
                samples.push(Some(sample));
            }
            Err(e) => {
                samples.push(None);
                unreadable.push((s, e.message().to_string()));
            }
        }
    }
    // Stored tensors by shape, in order of first appearance.
    let mut groups: Vec<(Vec<u64>, Vec<usize>)> = Vec::new();
    for (s, st) in stored.iter().enumerate() {
        if samples[s].is_none() {
            continue;
        }
        match groups.iter_mut().find(|(shape, _)| *shape == st.shape) {
            Some((_, members)) => members.push(s),
            None => groups.push((st.shape.clone(), vec![s])),
        }
    }

    // Every checkpoint tensor against every candidate: confirmed matches and the closest
    // miss.
    let mut windows = Windows::new();
    struct Found {
        checkpoint: usize,
        tensor: Tensor,
        matches: Vec<Match>,
        near: Option<Near>,
        skipped: Option<String>,
    }
    let mut found: Vec<Found> = Vec::new();
    for (c, ck) in checkpoints.iter().enumerate() {
        for t in &ck.tensors {
            let mut f = Found {
                checkpoint: c,
                tensor: t.clone(),
                matches: Vec::new(),
                near: None,
                skipped: None,
            };
            let Some(elem) = t.elem else {
                f.skipped = Some(format!("its dtype {} is not compared", t.dtype));
                found.push(f);
                continue;
            };
            if t.numel() == 0 {
                f.skipped = Some("it has no elements".into());
                found.push(f);
                continue;
            }
            let bytes = ck.bytes(t)?;
            let x = CkptValues {
                bytes: &bytes,
                elem,
            };
            // Every transform of every shape once, then every stored tensor of that shape
            // against the checkpoint's sample under it.
            let positions = sample_positions(t.numel());
            let mut maps: Vec<(Transform, IndexMap)> = Vec::new();
            let mut scored: Vec<Scored> = Vec::new();
            // The smallest sum of squared errors of a candidate the screen leaves out.
            let mut closest = f64::INFINITY;
            for (shape, members) in &groups {
                for transform in candidates(&t.shape, shape) {
                    let Some(map) = IndexMap::new(&transform, &t.shape, shape) else {
                        continue;
                    };
                    let xs: Vec<f64> = positions.iter().map(|&p| x.get(map.source(p))).collect();
                    for &s in members {
                        let sample = samples[s].as_ref().expect("grouped only when read");
                        // A candidate whose partial sum is past both the screen and the
                        // closest miss so far can be neither confirmed nor the runner-up:
                        // most stop after a few elements.
                        let stop = screen_sum(xs.len()).max(closest);
                        let mut tally = Tally::default();
                        for (k, &xv) in xs.iter().enumerate() {
                            tally.add(xv, f64::from(sample.values[k]), f64::from(sample.steps[k]));
                            if tally.sum_sq > stop {
                                break;
                            }
                        }
                        if tally.n < xs.len() as u64 {
                            continue;
                        }
                        if tally.rms() > SCREEN {
                            closest = closest.min(tally.sum_sq);
                        }
                        scored.push(Scored {
                            stored: s,
                            map: maps.len(),
                            sample: tally,
                        });
                    }
                    maps.push((transform, map));
                }
            }
            let mut confirmed = vec![false; scored.len()];
            for (i, sc) in scored.iter().enumerate() {
                if sc.sample.rms() > SCREEN {
                    continue;
                }
                let values = stored[sc.stored].values(model)?;
                let (transform, map) = &maps[sc.map];
                let confirmed_quality = confirm(&x, map, &values, &mut windows)?;
                drop(values);
                stored[sc.stored].release(model);
                if let Some(quality) = confirmed_quality {
                    confirmed[i] = true;
                    f.matches.push(Match {
                        stored: sc.stored,
                        transform: transform.clone(),
                        quality,
                    });
                }
            }
            f.near = scored
                .iter()
                .zip(&confirmed)
                .filter(|(_, &ok)| !ok)
                .map(|(sc, _)| sc)
                .min_by(|a, b| a.sample.rms().total_cmp(&b.sample.rms()))
                .map(|sc| Near {
                    stored: sc.stored,
                    transform: maps[sc.map].0.clone(),
                    quality: sc.sample.quality(),
                });
            drop(bytes);
            ck.release(t);
            found.push(f);
        }
    }

    // Which checkpoint tensors each stored tensor matched.
    let mut claims: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, f) in found.iter().enumerate() {
        for m in &f.matches {
            let by = claims.entry(m.stored).or_default();
            if !by.contains(&i) {
                by.push(i);
            }
        }
    }
    let mut names = Vec::with_capacity(found.len());
    let mut named = vec![false; stored.len()];
    for (i, f) in found.iter().enumerate() {
        let outcome = if let Some(why) = &f.skipped {
            Outcome::NotCompared { why: why.clone() }
        } else if f.matches.is_empty() {
            Outcome::Unmatched {
                closest: f.near.clone(),
            }
        } else {
            let mut with: Vec<String> = Vec::new();
            let mut twice = false;
            for (k, m) in f.matches.iter().enumerate() {
                twice |= f.matches[..k].iter().any(|o| o.stored == m.stored);
                for &other in &claims[&m.stored] {
                    let name = &found[other].tensor.name;
                    if other != i && !with.contains(name) {
                        with.push(name.clone());
                    }
                }
            }
            for m in &f.matches {
                named[m.stored] = true;
            }
            if with.is_empty() && !twice {
                Outcome::Matched {
                    targets: f.matches.clone(),
                    runner_up: f.near.clone(),
                }
            } else {
                Outcome::Ambiguous {
                    candidates: f.matches.clone(),
                    with,
                }
            }
        };
        names.push(NameResult {
            checkpoint: f.checkpoint,
            tensor: f.tensor.clone(),
            outcome,
        });
    }

    // Filters stored with a factor per output channel, among what nothing matched.
    for n in names.iter_mut() {
        if !matches!(n.outcome, Outcome::Unmatched { .. }) {
            continue;
        }
        let ck = &checkpoints[n.checkpoint];
        let Some(elem) = n.tensor.elem else { continue };
        let bytes = ck.bytes(&n.tensor)?;
        let x = CkptValues {
            bytes: &bytes,
            elem,
        };
        let mut hits = Vec::new();
        for (s, st) in stored.iter().enumerate() {
            if named[s] || samples[s].is_none() || st.numel() != n.tensor.numel() {
                continue;
            }
            let values = st.values(model)?;
            for transform in candidates(&n.tensor.shape, &st.shape) {
                if matches!(transform, Transform::Rotary { .. }) {
                    continue;
                }
                let Some(map) = IndexMap::new(&transform, &n.tensor.shape, &st.shape) else {
                    continue;
                };
                if let Some((factors, quality)) = folded(&x, &n.tensor.shape, &map, &values)? {
                    hits.push((s, transform, factors, quality));
                }
            }
            drop(values);
            st.release(model);
        }
        drop(bytes);
        ck.release(&n.tensor);
        if let [(s, transform, factors, quality)] = &hits[..] {
            named[*s] = true;
            n.outcome = Outcome::Folded {
                stored: *s,
                transform: transform.clone(),
                factors: *factors,
                quality: *quality,
            };
        }
    }

    let unnamed = (0..stored.len())
        .filter(|&s| !named[s] && samples[s].is_some())
        .collect();
    Ok(Learned {
        stored,
        names,
        unnamed,
        unreadable,
    })
}

/// Per output channel (the checkpoint's first dim): Σxy and Σxx over the elements given.
fn channel_sums(
    x: &CkptValues<'_>, inner: u64, channels: u64, pairs: impl Iterator<Item = (u64, f64)>,
) -> Vec<(f64, f64)> {
    let mut sums = vec![(0.0, 0.0); channels as usize];
    for (c_index, y) in pairs {
        let xv = x.get(c_index);
        let ch = (c_index / inner) as usize;
        sums[ch].0 += xv * y;
        sums[ch].1 += xv * xv;
    }
    sums
}

/// The factor of each channel (1 for a channel of zeros, which only zeros match).
fn factors(sums: &[(f64, f64)]) -> Vec<f64> {
    sums.iter()
        .map(|&(xy, xx)| if xx > 0.0 { xy / xx } else { 1.0 })
        .collect()
}

/// Whether the stored tensor is the checkpoint tensor with one factor per output channel
/// (not all of them 1): on a sample of `FOLD_CHANNELS` channels first, then on every
/// element. Returns the smallest and largest factor, and how close the scaled values are.
fn folded(
    x: &CkptValues<'_>, shape: &[u64], map: &IndexMap, values: &Values<'_>,
) -> Result<Option<((f64, f64), Quality)>> {
    let numel = map.numel();
    let (Some(&channels), true) = (shape.first(), shape.len() >= 2) else {
        return Ok(None);
    };
    if channels < 2 {
        return Ok(None);
    }
    let inner = numel / channels;
    // The sample: a few elements of a few channels, in checkpoint order.
    let picked = FOLD_CHANNELS.min(channels);
    let per = FOLD_PER_CHANNEL.min(inner);
    let mut sample: Vec<(u64, f64, f64)> = Vec::new();
    for i in 0..picked {
        let ch = i * channels / picked;
        for t in 0..per {
            let c_index = ch * inner + t * inner / per;
            let s = map.stored(c_index);
            let (mut y, mut step) = ([0f32], [0f32]);
            values.read(s, &mut y)?;
            values.steps(s, &mut step)?;
            sample.push((c_index, f64::from(y[0]), f64::from(step[0])));
        }
    }
    let sums = channel_sums(x, inner, channels, sample.iter().map(|&(c, y, _)| (c, y)));
    let f = factors(&sums);
    let mut tally = Tally::default();
    for &(c, y, step) in &sample {
        tally.add(f[(c / inner) as usize] * x.get(c), y, step);
    }
    if tally.rms() > SCREEN {
        return Ok(None);
    }
    // Every element: the factors first, then how well they explain the stored values.
    let mut y = vec![0f32; WINDOW.min(numel as usize)];
    let mut steps = vec![0f32; y.len()];
    let mut sums = vec![(0.0, 0.0); channels as usize];
    let mut first = 0u64;
    while first < numel {
        let n = (numel - first).min(WINDOW as u64) as usize;
        values.read(first, &mut y[..n])?;
        for (e, &yv) in y[..n].iter().enumerate() {
            let c = map.source(first + e as u64);
            let xv = x.get(c);
            let ch = (c / inner) as usize;
            sums[ch].0 += xv * f64::from(yv);
            sums[ch].1 += xv * xv;
        }
        first += n as u64;
    }
    let f = factors(&sums);
    let mut tally = Tally::default();
    let mut first = 0u64;
    while first < numel {
        let n = (numel - first).min(WINDOW as u64) as usize;
        values.read(first, &mut y[..n])?;
        values.steps(first, &mut steps[..n])?;
        for e in 0..n {
            let c = map.source(first + e as u64);
            let scaled = f[(c / inner) as usize] * x.get(c);
            tally.add(scaled, f64::from(y[e]), f64::from(steps[e]));
        }
        first += n as u64;
    }
    let quality = tally.quality();
    let lo = f.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = f.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    // All factors 1 would have been a match; a factor of 0 is a channel zeroed, not scaled.
    if quality.rms_steps > BOUND || (lo == 1.0 && hi == 1.0) || f.contains(&0.0) {
        return Ok(None);
    }
    Ok(Some(((lo, hi), quality)))
}
