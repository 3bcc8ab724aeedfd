//! Statistics of a tensor's values for its histogram (docs/tree.md#histograms).
//!
//! Two passes over the values, each in windows of bounded size: [`Moments`] counts them
//! (finite values, NaN, ±Inf, zeros) and finds min, max, mean and standard deviation; bin
//! edges then come from the exact min and max ([`Bins::new`]) and [`Bins::add`] counts the
//! finite values per bin. Two passes rather than a fixed range rebinned later, because the
//! edges are then exactly NumPy's for the same range and the counts exactly
//! `numpy.histogram(values, bins=edges)`'s: value `v` is in bin `i` when `edges[i] <= v <
//! edges[i + 1]`, the last bin closed. The second pass reads the same pages, which the first
//! brought into memory. [`QuantTally`] adds, for quantized values, how many sit at the ends
//! of the integer range (clipped) and which scales cover only zeros (dead channels).
//!
//! Invariants: memory is the window plus the bins plus two bits per scale; the order of
//! windows does not change any count, min or max, and changes mean and deviation only by
//! rounding.

/// Bins of every histogram.
pub const BINS: usize = 64;

/// Counts, extremes and moments of a stream of values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moments {
    /// Every value seen.
    pub total: u64,
    /// Finite values (those the histogram counts).
    pub finite: u64,
    pub nan: u64,
    pub pos_inf: u64,
    pub neg_inf: u64,
    /// Values equal to zero (either sign).
    pub zero: u64,
    /// Smallest and largest finite value (meaningless while `finite` is 0).
    pub min: f64,
    pub max: f64,
    /// Mean of the finite values, and the sum of squared deviations from it (Welford).
    pub mean: f64,
    m2: f64,
}

impl Default for Moments {
    fn default() -> Self {
        Moments {
            total: 0,
            finite: 0,
            nan: 0,
            pos_inf: 0,
            neg_inf: 0,
            zero: 0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            mean: 0.0,
            m2: 0.0,
        }
    }
}

impl Moments {
    pub fn observe(&mut self, values: &[f64]) {
        // The window's own count, mean and squared deviations, merged in one step (Chan et
        // al.), so the running mean is updated once per window, not once per value.
        let (mut n, mut mean, mut m2) = (0u64, 0f64, 0f64);
        for &v in values {
            if v.is_finite() {
                n += 1;
                let d = v - mean;
                mean += d / n as f64;
                m2 += d * (v - mean);
                self.min = self.min.min(v);
                self.max = self.max.max(v);
                self.zero += u64::from(v == 0.0);
            } else if v.is_nan() {
                self.nan += 1;
            } else if v > 0.0 {
                self.pos_inf += 1;
            } else {
                self.neg_inf += 1;
            }
        }
        self.total += values.len() as u64;
        if n == 0 {
            return;
        }
        let (na, nb) = (self.finite as f64, n as f64);
        let total = na + nb;
        let delta = mean - self.mean;
        self.mean += delta * nb / total;
        self.m2 += m2 + delta * delta * na * nb / total;
        self.finite += n;
    }

    /// The population standard deviation of the finite values (NumPy's `std()`).
    pub fn std(&self) -> f64 {
        if self.finite == 0 {
            0.0
        } else {
            (self.m2 / self.finite as f64).max(0.0).sqrt()
        }
    }
}

/// A histogram being counted: `BINS` bins between fixed edges.
#[derive(Debug, Clone, PartialEq)]
pub struct Bins {
    /// `BINS + 1` increasing edges; the first is the min and the last the max.
    pub edges: Vec<f64>,
    pub counts: Vec<u64>,
    step: f64,
}

impl Bins {
    /// Equal bins over `[min, max]` of the finite values `m` saw; NumPy's range for a single
    /// value (`v ± 0.5`) when min equals max, and `[0, 1]` when there is none.
    pub fn new(m: &Moments) -> Bins {
        let (lo, hi) = if m.finite == 0 {
            (0.0, 1.0)
        } else if m.min == m.max {
            (m.min - 0.5, m.max + 0.5)
        } else {
            (m.min, m.max)
        };
        // hi / n - lo / n, not (hi - lo) / n: the difference of two huge values overflows.
        let n = BINS as f64;
        let step = hi / n - lo / n;
        let mut edges: Vec<f64> = (0..=BINS).map(|i| lo + step * i as f64).collect();
        edges[BINS] = hi;
        // Rounding never makes an inner edge pass the last one.
        for i in (0..BINS).rev() {
            edges[i] = edges[i].min(edges[i + 1]);
        }
        Bins {
            edges,
            counts: vec![0; BINS],
            step,
        }
    }

    /// Counts the finite values of `values` that lie between the first and last edge.
    pub fn add(&mut self, values: &[f64]) {
        let (lo, hi) = (self.edges[0], self.edges[BINS]);
        for &v in values {
            if !(v >= lo && v <= hi) {
                continue;
            }
            // A guess from the step, then moved to the bin whose edges hold `v` exactly.
            let mut i = (((v - lo) / self.step) as usize).min(BINS - 1);
            while i > 0 && v < self.edges[i] {
                i -= 1;
            }
            while i + 1 < BINS && v >= self.edges[i + 1] {
                i += 1;
            }
            self.counts[i] += 1;
        }
    }
}

/// What a quantized tensor's values say about its quantization: values at the ends of the
/// integer range, and scales whose elements are all zero.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantTally {
    /// The lowest and highest integer (minus zero point), when clipping means something.
    pub levels: Option<(i64, i64)>,
    pub at_low: u64,
    pub at_high: u64,
    /// Smallest and largest scale that some element uses.
    pub scale_min: f32,
    pub scale_max: f32,
    /// Scales that are not positive (or not finite) among those used.
    pub bad_scales: u64,
    used: Vec<u64>,
    nonzero: Vec<u64>,
}

impl QuantTally {
    /// A tally for `scales` scale indices; `levels` as [`crate::backend::view::Grid`] has.
    pub fn new(levels: Option<(i64, i64)>, scales: usize) -> QuantTally {
        let words = scales.div_ceil(64);
        QuantTally {
            levels,
            at_low: 0,
            at_high: 0,
            scale_min: f32::INFINITY,
            scale_max: f32::NEG_INFINITY,
            bad_scales: 0,
            used: vec![0; words],
            nonzero: vec![0; words],
        }
    }

    /// Elements `values`, all using scale `index` whose value is `scale`.
    pub fn run(&mut self, index: usize, scale: f32, values: &[f32]) {
        let (w, bit) = (index / 64, 1u64 << (index % 64));
        let Some(used) = self.used.get_mut(w) else {
            return;
        };
        if *used & bit == 0 {
            *used |= bit;
            if scale.is_finite() && scale > 0.0 {
                self.scale_min = self.scale_min.min(scale);
                self.scale_max = self.scale_max.max(scale);
            } else {
                self.bad_scales += 1;
            }
        }
        if values.iter().any(|&v| v != 0.0) {
            self.nonzero[w] |= bit;
        }
        if let (Some((lo, hi)), true) = (self.levels, scale.is_finite() && scale > 0.0) {
            let s = f64::from(scale);
            for &v in values {
                // v = q × scale rounded to f32: v / scale is within 2^-23 of q.
                let q = (f64::from(v) / s).round();
                self.at_low += u64::from(q <= lo as f64);
                self.at_high += u64::from(q >= hi as f64);
            }
        }
    }

    /// Scales some element uses.
    pub fn used(&self) -> u64 {
        self.used.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    /// Used scales whose every element is zero (dead channels or groups).
    pub fn dead(&self) -> u64 {
        self.used
            .iter()
            .zip(&self.nonzero)
            .map(|(u, n)| u64::from((u & !n).count_ones()))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(values: &[f64], window: usize) -> (Moments, Bins) {
        let mut m = Moments::default();
        for w in values.chunks(window.max(1)) {
            m.observe(w);
        }
        let mut b = Bins::new(&m);
        for w in values.chunks(window.max(1)) {
            b.add(w);
        }
        (m, b)
    }

    #[test]
    fn counts_by_exact_edges_and_moments() {
        let values: Vec<f64> = (0..1000)
            .map(|i| ((i * 37) % 101) as f64 * 0.25 - 3.0)
            .collect();
        let (m, b) = histogram(&values, 7);
        assert_eq!(m.finite, 1000);
        assert_eq!((m.min, m.max), (-3.0, 22.0));
        assert_eq!(b.counts.iter().sum::<u64>(), 1000);
        // Every value is in the bin whose edges hold it.
        for &v in &values {
            let i = b.edges.partition_point(|&e| e <= v).clamp(1, BINS) - 1;
            assert!(b.edges[i] <= v && (v < b.edges[i + 1] || i == BINS - 1));
        }
        let mean = values.iter().sum::<f64>() / 1000.0;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 1000.0;
        assert!((m.mean - mean).abs() < 1e-12);
        assert!((m.std() - var.sqrt()).abs() < 1e-12);
        // Windows of any size give the same counts.
        let (m1, b1) = histogram(&values, 1000);
        assert_eq!((m1.min, m1.max, m1.zero), (m.min, m.max, m.zero));
        assert_eq!(b1, b);
    }

    #[test]
    fn special_values_and_degenerate_ranges() {
        let values = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 2.0];
        let (m, b) = histogram(&values, 4);
        assert_eq!(
            (m.total, m.finite, m.nan, m.pos_inf, m.neg_inf, m.zero),
            (6, 3, 1, 1, 1, 2)
        );
        assert_eq!(b.counts.iter().sum::<u64>(), 3);
        let (m, b) = histogram(&[5.0; 10], 3);
        assert_eq!((b.edges[0], b.edges[BINS]), (4.5, 5.5));
        assert_eq!(b.counts.iter().sum::<u64>(), 10);
        assert_eq!(m.std(), 0.0);
        let (_, b) = histogram(&[f64::NAN], 1);
        assert_eq!((b.edges[0], b.edges[BINS]), (0.0, 1.0));
        let (_, b) = histogram(&[-f64::MAX, f64::MAX], 2);
        assert!(b.edges.iter().all(|e| e.is_finite()));
        assert_eq!(b.counts[0] + b.counts[BINS - 1], 2);
    }

    #[test]
    fn tallies_clipping_and_dead_scales() {
        let mut t = QuantTally::new(Some((-8, 7)), 4);
        t.run(0, 0.5, &[-4.0, 3.5, 0.0]);
        t.run(1, 0.25, &[0.0, 0.0]);
        t.run(0, 0.5, &[1.0]);
        assert_eq!((t.at_low, t.at_high), (1, 1));
        assert_eq!((t.used(), t.dead()), (2, 1));
        assert_eq!((t.scale_min, t.scale_max), (0.25, 0.5));
    }
}
