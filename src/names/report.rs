//! The human-readable report of a name map (docs/names.md#the-report): a summary line, then
//! each checkpoint tensor with where it is stored, how, and how clearly; then what was not
//! named, on either side.
//!
//! Invariant: the report is made from the map alone, so `ptefs names` and
//! `ptefs names --map` print the same lines for the same map.

use std::fmt::Write;

use super::map::{MapNear, MapStored, MapTarget, NameMap, Status};
use super::matching::Quality;

fn dims(shape: &[u64]) -> String {
    let d: Vec<String> = shape.iter().map(u64::to_string).collect();
    format!("[{}]", d.join(","))
}

/// Three significant digits: `0.0213`, `2.98`, `26.7`, and `1.40e6` outside 0.001..10000.
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        return "inf".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    let mag = x.abs();
    if !(1e-3..1e4).contains(&mag) {
        return format!("{x:.2e}");
    }
    let decimals = (2 - mag.log10().floor() as i32).max(0) as usize;
    format!("{x:.decimals$}")
}

fn quality(q: &Quality) -> String {
    if q.max_error == 0.0 {
        "exact".into()
    } else {
        format!(
            "max error {}, rms {} step",
            num(q.max_error),
            num(q.rms_steps)
        )
    }
}

fn near(what: &str, n: &MapNear) -> String {
    format!(
        "{what} {} ({}): max error {}, rms {} steps on {} sampled elements",
        n.path,
        n.transform,
        num(n.quality.max_error),
        num(n.quality.rms_steps),
        n.quality.elements
    )
}

fn target(out: &mut String, mark: &str, t: &MapTarget) {
    let _ = writeln!(
        out,
        "    {mark} {}  {}  {}  {}",
        t.stored.path,
        t.stored.what,
        t.transform,
        quality(&t.quality)
    );
    for also in &t.stored.also {
        let _ = writeln!(out, "      also {also}");
    }
}

fn stored_line(s: &MapStored) -> String {
    let mut line = format!("  {}  {}", s.path, s.what);
    if !s.also.is_empty() {
        let _ = write!(line, "  (also {})", s.also.join(", "));
    }
    line
}

/// The report of `map`.
pub fn render(map: &NameMap) -> String {
    let mut out = String::new();
    let files: Vec<&str> = map.files.iter().map(|f| f.name.as_str()).collect();
    let _ = writeln!(out, "model: {}", files.join(" + "));
    for c in &map.checkpoints {
        let mut line = format!(
            "checkpoint: {} ({}, {} tensor(s)",
            c.path,
            c.kind.as_str(),
            c.tensors
        );
        if c.files.len() > 1 {
            let _ = write!(line, " in {} files", c.files.len());
        }
        if let Some(a) = &c.adapter {
            let _ = write!(
                line,
                "; LoRA rank {}, alpha {}{}",
                a.rank,
                a.alpha,
                if a.rslora { ", rsLoRA" } else { "" }
            );
        }
        let _ = writeln!(out, "{line})");
    }
    let count = |s: &str| map.names.iter().filter(|n| n.status.as_str() == s).count();
    let twice = map
        .names
        .iter()
        .filter(|n| matches!(&n.status, Status::Matched { targets, .. } if targets.len() > 1))
        .count();
    let _ = writeln!(
        out,
        "{} of {} checkpoint tensors matched{}, {} ambiguous, {} folded, {} unmatched{}; {} stored tensor(s) unnamed",
        map.matched(),
        map.names.len(),
        if twice > 0 {
            format!(" ({twice} stored more than once)")
        } else {
            String::new()
        },
        count("ambiguous"),
        count("folded"),
        count("unmatched"),
        match count("not_compared") {
            0 => String::new(),
            n => format!(", {n} not compared"),
        },
        map.unnamed.len()
    );
    for (title, status) in [
        ("matched", "matched"),
        (
            "ambiguous (not named: another name or transform is as close)",
            "ambiguous",
        ),
        (
            "folded (stored scaled per output channel, as a folded BatchNorm is: not named)",
            "folded",
        ),
        ("unmatched (no stored tensor within noise)", "unmatched"),
        ("not compared", "not_compared"),
    ] {
        let names: Vec<_> = map
            .names
            .iter()
            .filter(|n| n.status.as_str() == status)
            .collect();
        if names.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n{title}:");
        for n in names {
            let _ = writeln!(out, "  {}  {}{}", n.name, n.dtype, dims(&n.shape));
            match &n.status {
                Status::Matched { targets, runner_up } => {
                    for t in targets {
                        target(&mut out, "=", t);
                    }
                    if let Some(r) = runner_up {
                        let _ = writeln!(out, "      {}", near("runner-up", r));
                    }
                }
                Status::Ambiguous { candidates, with } => {
                    for t in candidates {
                        target(&mut out, "?", t);
                    }
                    if with.is_empty() {
                        let _ = writeln!(
                            out,
                            "      several transforms match one stored tensor: which layout it has is not known"
                        );
                    } else {
                        let _ = writeln!(out, "      as close to: {}", with.join(", "));
                    }
                }
                Status::Folded {
                    target,
                    transform,
                    factors,
                    rms_steps,
                } => {
                    let _ = writeln!(
                        out,
                        "    ~ {}  {}  {transform}  factors {} to {}, rms {} step after scaling",
                        target.path,
                        target.what,
                        num(factors.0),
                        num(factors.1),
                        num(*rms_steps)
                    );
                }
                Status::Unmatched { closest } => match closest {
                    Some(c) => {
                        let _ = writeln!(out, "      {}", near("closest", c));
                    }
                    None => {
                        let _ = writeln!(out, "      no stored tensor has as many elements");
                    }
                },
                Status::NotCompared { why } => {
                    let _ = writeln!(out, "      {why}");
                }
            }
        }
    }
    if !map.unnamed.is_empty() {
        let _ = writeln!(out, "\nstored tensors no name matched:");
        for s in &map.unnamed {
            let _ = writeln!(out, "{}", stored_line(s));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::num;

    #[test]
    fn numbers_keep_three_digits() {
        assert_eq!(num(0.0), "0");
        assert_eq!(num(0.021253), "0.0213");
        assert_eq!(num(0.28859), "0.289");
        assert_eq!(num(2.977), "2.98");
        assert_eq!(num(26.7), "26.7");
        assert_eq!(num(1403500.3), "1.40e6");
        assert_eq!(num(0.0001234), "1.23e-4");
        assert_eq!(num(f64::INFINITY), "inf");
    }
}
