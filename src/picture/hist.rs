//! The SVG picture of a tensor's histogram (`<value>.hist.svg`, docs/tree.md#histograms).
//!
//! Invariants: every picture is exactly [`HIST_SVG_LEN`] bytes, whatever the values (every
//! number has a bounded width, the title is shortened, and the text is padded with a
//! comment), so `stat` knows the size without reading a single value; output depends only on
//! its inputs. The counts are drawn on a log scale (1 count is one step above 0), and the
//! exact edges and counts are in a `<metadata>` element as JSON (edges in shortest
//! round-trip form), for tools and tests.

use std::fmt::Write;

use super::stats::{Bins, Moments, QuantTally, BINS};

/// The size of every histogram picture.
pub const HIST_SVG_LEN: usize = 24 * 1024;

/// Characters of the title shown (the end of a longer one, after an ellipsis).
const TITLE_CHARS: usize = 96;
/// Characters of the description line.
const WHAT_CHARS: usize = 120;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 420.0;
const PLOT_X: f64 = 64.0;
const PLOT_Y: f64 = 56.0;
const PLOT_W: f64 = 640.0;
const PLOT_H: f64 = 220.0;
/// Grid levels drawn as ticks at most (a finer grid would be a grey band).
const GRID_TICKS: i64 = 64;

/// What a quantized tensor's histogram shows of its quantization.
#[derive(Debug, Clone, Copy)]
pub struct QuantInfo<'a> {
    pub tally: &'a QuantTally,
    /// What one scale covers (`"tensor"`, `"channel"`, `"group"`).
    pub unit: &'static str,
    pub zero_point: i64,
}

/// Everything a histogram picture shows.
#[derive(Debug, Clone, Copy)]
pub struct Histogram<'a> {
    /// The tree path of the tensor.
    pub title: &'a str,
    /// Its type and shape, and how the values were obtained.
    pub what: &'a str,
    pub moments: &'a Moments,
    pub bins: &'a Bins,
    pub quant: Option<QuantInfo<'a>>,
}

/// `s` shortened to its last `n` characters after an ellipsis, or its first `n` with
/// `keep_end` false.
fn shorten(s: &str, n: usize, keep_end: bool) -> String {
    let count = s.chars().count();
    if count <= n {
        return s.to_string();
    }
    if keep_end {
        let tail: String = s.chars().skip(count - (n - 1)).collect();
        format!("…{tail}")
    } else {
        let head: String = s.chars().take(n - 1).collect();
        format!("{head}…")
    }
}

/// A number for people: plain with 4 decimals between 1e-3 and 1e5, else 4 significant
/// digits with an exponent; at most 11 characters.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        "0".to_string()
    } else if !v.is_finite() {
        format!("{v}")
    } else if (1e-3..1e5).contains(&a) {
        let s = format!("{v:.4}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    } else {
        format!("{v:.3e}")
    }
}

fn text(out: &mut String, x: f64, y: f64, size: u32, anchor: &str, extra: &str, s: &str) {
    let _ = write!(
        out,
        "<text x=\"{x:.1}\" y=\"{y:.1}\" font-size=\"{size}\" text-anchor=\"{anchor}\"{extra}>"
    );
    super::escape_xml(s, out);
    out.push_str("</text>\n");
}

/// The x coordinate of value `v` on the plot (values outside are clamped to its edges).
fn x_of(bins: &Bins, v: f64) -> f64 {
    let (lo, hi) = (bins.edges[0], bins.edges[BINS]);
    let frac = (v / 2.0 - lo / 2.0) / (hi / 2.0 - lo / 2.0);
    PLOT_X + PLOT_W * frac.clamp(0.0, 1.0)
}

/// The picture, exactly [`HIST_SVG_LEN`] bytes.
pub fn svg(h: &Histogram<'_>) -> String {
    let mut out = String::with_capacity(HIST_SVG_LEN);
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\">"
    );
    out.push_str("<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
    text(
        &mut out,
        12.0,
        22.0,
        14,
        "start",
        " font-weight=\"bold\"",
        &shorten(h.title, TITLE_CHARS, true),
    );
    text(
        &mut out,
        12.0,
        40.0,
        11,
        "start",
        " fill=\"#37474f\"",
        &shorten(h.what, WHAT_CHARS, false),
    );
    let (m, bins) = (h.moments, h.bins);
    // The plot's frame and the log-count axis.
    let _ = writeln!(
        out,
        "<rect x=\"{PLOT_X}\" y=\"{PLOT_Y}\" width=\"{PLOT_W}\" height=\"{PLOT_H}\" fill=\"#fafafa\" stroke=\"#90a4ae\"/>"
    );
    let top = bins.counts.iter().copied().max().unwrap_or(0);
    let decades = if top <= 1 {
        1
    } else {
        (top as f64).log10().ceil() as u32
    };
    let height_of = |c: u64| -> f64 {
        if c == 0 {
            0.0
        } else {
            PLOT_H * ((c as f64).log10() + 1.0) / (f64::from(decades) + 1.0)
        }
    };
    for k in 0..=decades {
        let y = PLOT_Y + PLOT_H - PLOT_H * (f64::from(k) + 1.0) / (f64::from(decades) + 1.0);
        let _ = writeln!(
            out,
            "<line x1=\"{PLOT_X}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#eceff1\"/>",
            PLOT_X + PLOT_W
        );
        let label = if k < 5 {
            10u64.pow(k).to_string()
        } else {
            format!("1e{k}")
        };
        text(&mut out, PLOT_X - 4.0, y + 4.0, 10, "end", "", &label);
    }
    text(
        &mut out,
        16.0,
        PLOT_Y + PLOT_H / 2.0,
        10,
        "middle",
        &format!(
            " transform=\"rotate(-90 16 {:.1})\" fill=\"#546e7a\"",
            PLOT_Y + PLOT_H / 2.0
        ),
        "count (log)",
    );
    // Bars.
    let bar_w = PLOT_W / BINS as f64;
    for (i, &c) in bins.counts.iter().enumerate() {
        if c == 0 {
            continue;
        }
        let hgt = height_of(c);
        let _ = writeln!(
            out,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{hgt:.1}\" fill=\"#1e88e5\"><title>{c}</title></rect>",
            PLOT_X + bar_w * i as f64 + 0.5,
            PLOT_Y + PLOT_H - hgt,
            bar_w - 1.0,
        );
    }
    // The quantization grid of a per-tensor scale, when its levels are far enough apart;
    // the values at the ends of the integer range, in red.
    if let Some(q) = &h.quant {
        if let Some((lo, hi)) = q.tally.levels {
            let single = q.tally.used() == 1 && q.tally.bad_scales == 0;
            let scale = f64::from(q.tally.scale_max);
            if single && m.finite > 0 {
                let first = (bins.edges[0] / scale).ceil().max(lo as f64) as i64;
                let last = (bins.edges[BINS] / scale).floor().min(hi as f64) as i64;
                if last >= first && last - first <= GRID_TICKS {
                    for level in first..=last {
                        let x = x_of(bins, level as f64 * scale);
                        let _ = writeln!(
                            out,
                            "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#8d6e63\"/>",
                            PLOT_Y + PLOT_H,
                            PLOT_Y + PLOT_H + 5.0
                        );
                    }
                }
            }
            for (level, count) in [(lo, q.tally.at_low), (hi, q.tally.at_high)] {
                if single && count > 0 {
                    let x = x_of(bins, level as f64 * scale);
                    let _ = writeln!(
                        out,
                        "<line x1=\"{x:.1}\" y1=\"{PLOT_Y}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#c62828\" stroke-dasharray=\"4 2\"/>",
                        PLOT_Y + PLOT_H
                    );
                }
            }
        }
    }
    // Zero and the mean.
    if m.finite > 0 {
        if bins.edges[0] < 0.0 && bins.edges[BINS] > 0.0 {
            let x = x_of(bins, 0.0);
            let _ = writeln!(
                out,
                "<line x1=\"{x:.1}\" y1=\"{PLOT_Y}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#263238\" stroke-width=\"0.8\"/>",
                PLOT_Y + PLOT_H
            );
        }
        let x = x_of(bins, m.mean);
        let _ = writeln!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{PLOT_Y}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#ff6f00\" stroke-dasharray=\"2 2\"/>",
            PLOT_Y + PLOT_H
        );
    }
    // The value axis: five labels from the first edge to the last.
    for k in 0..=4 {
        let v = if k == 4 {
            bins.edges[BINS]
        } else {
            bins.edges[0] + (bins.edges[BINS] / 4.0 - bins.edges[0] / 4.0) * f64::from(k)
        };
        let x = PLOT_X + PLOT_W * f64::from(k) / 4.0;
        let anchor = match k {
            0 => "start",
            4 => "end",
            _ => "middle",
        };
        text(&mut out, x, PLOT_Y + PLOT_H + 18.0, 10, anchor, "", &num(v));
    }
    // The figures.
    let mut y = PLOT_Y + PLOT_H + 44.0;
    let mut line = |out: &mut String, s: &str, fill: &str| {
        text(out, 12.0, y, 12, "start", &format!(" fill=\"{fill}\""), s);
        y += 17.0;
    };
    let pct = |n: u64| {
        if m.total == 0 {
            0.0
        } else {
            100.0 * n as f64 / m.total as f64
        }
    };
    if m.finite > 0 {
        line(
            &mut out,
            &format!(
                "min {} · max {} · mean {} · std {}",
                num(m.min),
                num(m.max),
                num(m.mean),
                num(m.std())
            ),
            "#000000",
        );
    } else {
        line(&mut out, "no finite values", "#000000");
    }
    let special = m.nan + m.pos_inf + m.neg_inf;
    line(
        &mut out,
        &format!(
            "{} values: {} zero ({:.1}%), {} NaN, {} +Inf, {} -Inf",
            m.total,
            m.zero,
            pct(m.zero),
            m.nan,
            m.pos_inf,
            m.neg_inf
        ),
        if special > 0 { "#c62828" } else { "#000000" },
    );
    if let Some(q) = &h.quant {
        let t = q.tally;
        let used = t.used();
        let scales = if used == 0 {
            "no scale used".to_string()
        } else if used == 1 {
            format!("scale {}", num(f64::from(t.scale_max)))
        } else {
            format!(
                "{used} {} scales from {} to {}",
                q.unit,
                num(f64::from(t.scale_min)),
                num(f64::from(t.scale_max))
            )
        };
        let bad = if t.bad_scales > 0 {
            format!(", {} not positive", t.bad_scales)
        } else {
            String::new()
        };
        let grid = match t.levels {
            Some((lo, hi)) => format!("q in [{lo}, {hi}]"),
            None => "32-bit q".to_string(),
        };
        line(
            &mut out,
            &format!(
                "grid: value = q × scale, {grid} (zero point {}); {scales}{bad}",
                q.zero_point
            ),
            if t.bad_scales > 0 {
                "#c62828"
            } else {
                "#000000"
            },
        );
        let dead = t.dead();
        let clipped = match t.levels {
            Some((lo, hi)) => format!(
                "at the range's ends: {} at q = {lo} ({:.2}%), {} at q = {hi} ({:.2}%)",
                t.at_low,
                pct(t.at_low),
                t.at_high,
                pct(t.at_high)
            ),
            None => "no clipping at 32 bits".to_string(),
        };
        line(
            &mut out,
            &format!("{clipped}; all-zero {}s: {dead} of {used}", q.unit),
            if dead > 0 { "#c62828" } else { "#000000" },
        );
    }
    // The exact numbers, for tools.
    out.push_str("<metadata id=\"ptefs-histogram\">{\"edges\": [");
    for (i, e) in bins.edges.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{e:e}");
    }
    out.push_str("], \"counts\": [");
    for (i, c) in bins.counts.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{c}");
    }
    let _ = write!(
        out,
        "], \"total\": {}, \"finite\": {}, \"nan\": {}, \"pos_inf\": {}, \"neg_inf\": {}, \"zero\": {}",
        m.total, m.finite, m.nan, m.pos_inf, m.neg_inf, m.zero
    );
    if let Some(q) = &h.quant {
        let _ = write!(
            out,
            ", \"at_low\": {}, \"at_high\": {}, \"scales_used\": {}, \"scales_all_zero\": {}",
            q.tally.at_low,
            q.tally.at_high,
            q.tally.used(),
            q.tally.dead()
        );
    }
    out.push_str("}</metadata>\n");
    pad(out)
}

/// `svg` text padded with a comment to exactly [`HIST_SVG_LEN`] bytes.
fn pad(mut out: String) -> String {
    const END: &str = "</svg>\n";
    const OPEN: &str = "<!--";
    const CLOSE: &str = "-->\n";
    let fixed = out.len() + OPEN.len() + CLOSE.len() + END.len();
    assert!(
        fixed <= HIST_SVG_LEN,
        "a histogram picture is bounded by construction ({fixed} bytes)"
    );
    out.push_str(OPEN);
    out.extend(std::iter::repeat_n(' ', HIST_SVG_LEN - fixed));
    out.push_str(CLOSE);
    out.push_str(END);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest picture: every number as long as it gets, a long title of characters
    /// that escape to 5 bytes, every bar and grid tick drawn.
    #[test]
    fn every_picture_has_the_fixed_size() {
        let mut m = Moments::default();
        m.observe(&[-1.2345678901234567e-300, -f64::MAX, 7.0, f64::NAN]);
        let mut bins = Bins::new(&m);
        bins.counts = vec![u64::MAX; BINS];
        let mut tally = QuantTally::new(Some((i64::MIN, i64::MAX)), 1 << 20);
        tally.at_low = u64::MAX;
        tally.at_high = u64::MAX;
        tally.bad_scales = u64::MAX;
        let title = "&".repeat(10_000);
        let h = Histogram {
            title: &title,
            what: &"\"".repeat(10_000),
            moments: &m,
            bins: &bins,
            quant: Some(QuantInfo {
                tally: &tally,
                unit: "channel",
                zero_point: i64::MIN,
            }),
        };
        assert_eq!(svg(&h).len(), HIST_SVG_LEN);
        // A per-tensor grid with ticks.
        let mut m = Moments::default();
        m.observe(&[-1.0, 1.0]);
        let bins = Bins::new(&m);
        let mut tally = QuantTally::new(Some((-128, 127)), 1);
        tally.run(0, 1.0 / 32.0, &[-1.0, 1.0]);
        let h = Histogram {
            title: "t",
            what: "qint8[2]",
            moments: &m,
            bins: &bins,
            quant: Some(QuantInfo {
                tally: &tally,
                unit: "tensor",
                zero_point: 0,
            }),
        };
        let text = svg(&h);
        assert_eq!(text.len(), HIST_SVG_LEN);
        assert_eq!(text.matches("stroke=\"#8d6e63\"").count(), 65);
        assert!(text.ends_with("-->\n</svg>\n"));
    }

    #[test]
    fn numbers_are_short() {
        for v in [
            0.0,
            1.0,
            -0.5,
            12345.678,
            1e-9,
            -f64::MAX,
            f64::MIN_POSITIVE,
            99999.99999,
        ] {
            assert!(num(v).len() <= 11, "{v}: {}", num(v));
        }
        assert_eq!(num(0.25), "0.25");
        assert_eq!(num(1e-9), "1.000e-9");
    }
}
