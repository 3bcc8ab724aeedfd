//! `ptefs diff`: two models, two data files, or a model and a safetensors checkpoint,
//! compared tensor by tensor and program by program (`crate::compare`), printed as a
//! summary or as JSON. Exit status as `diff`'s: 0 identical, 1 different, 2 trouble.

use std::io::Write;

use crate::compare::{self, Request};
use crate::edit::recovery::interrupted_commits;
use crate::error::{Error, Result};

use super::output;

/// What `ptefs diff` was asked.
#[derive(Debug, Clone, Default)]
pub struct DiffRequest {
    /// The sides, and `--names MAP|CHECKPOINT`.
    pub compare: Request,
    pub json: bool,
}

/// Compares, prints the report, and says whether the two sides are identical.
pub fn diff(req: &DiffRequest, out: &mut dyn Write) -> Result<bool> {
    let c = &req.compare;
    for (file, data) in [(&c.a, &c.data_a), (&c.b, &c.data_b)] {
        for warning in interrupted_commits(file, data) {
            log::warn!("{warning}");
            eprintln!("ptefs: warning: {warning}");
        }
    }
    let report = compare::run(c)?;
    if req.json {
        let mut text = serde_json::to_string_pretty(&report.json())
            .map_err(|e| Error::invalid(format!("cannot write JSON: {e}")))?;
        text.push('\n');
        out.write_all(text.as_bytes()).map_err(output)?;
    } else {
        out.write_all(report.text().as_bytes()).map_err(output)?;
    }
    Ok(report.identical())
}
