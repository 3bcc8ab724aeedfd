//! `ptefs check`: every defect of the files (`crate::check`), interrupted commits beside
//! them, names the tree shows shortened, and the `.ptd` files beside the model that hold
//! what it lacks; one a line, or as JSON (docs/commands.md#check---json).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::catalog::names::{Names, Part, NAME_MAX};
use crate::check::Defect;
use crate::edit::recovery::interrupted_commits;
use crate::format::Model;
use crate::quote;
use crate::tree::DEFAULT_MAX_NODES;

/// Every defect of the files, one a line; empty when the files are sound.
pub fn check(file: &Path, data: &[PathBuf]) -> Vec<String> {
    check_limited(file, data, DEFAULT_MAX_NODES)
}

/// `check`, refusing (with one line saying so) files whose tree would have more than
/// `max_nodes` nodes, as `ls`, `cat`, `info` and `mount` do.
pub fn check_limited(file: &Path, data: &[PathBuf], max_nodes: u64) -> Vec<String> {
    check_report(file, data, max_nodes)
        .defects
        .into_iter()
        .map(|d| d.message)
        .collect()
}

/// The version of `check --json`'s layout.
pub const JSON_VERSION: u64 = 1;

/// What `ptefs check` found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Empty when the files are sound.
    pub defects: Vec<Defect>,
    /// How to fix some of them, one a line: `.ptd` files beside the model that hold keys
    /// it lacks (`check::data_beside`).
    pub advice: Vec<String>,
}

/// The defects of the files, and advice, as `check_limited` finds them.
pub fn check_report(file: &Path, data: &[PathBuf], max_nodes: u64) -> CheckReport {
    let mut report = CheckReport::default();
    let out = &mut report.defects;
    for path in std::iter::once(file).chain(data.iter().map(PathBuf::as_path)) {
        for journal in interrupted_commits(path, &[]) {
            let mut d = Defect::new("interrupted_commit", journal);
            d.file = Some(path.display().to_string());
            out.push(d);
        }
    }
    match Model::open(file, data) {
        Err(e) => out.push(Defect::new("unreadable", e.to_string())),
        Ok(model) => {
            let nodes = crate::tree::node_count(&model);
            if nodes > max_nodes {
                let refusal = crate::tree::build::too_many_nodes(&model, nodes, max_nodes);
                out.push(Defect::new("too_many_nodes", refusal.to_string()).in_file(&model, 0));
            } else {
                let payloads = crate::catalog::Payloads::decode(&model);
                out.extend(crate::check::found_with(&model, &payloads));
                out.extend(crate::check::value_defects(&model, &payloads));
                out.extend(shortened(&model));
                report.advice.extend(crate::check::data_beside(&model));
            }
        }
    }
    report
}

impl CheckReport {
    /// `check --json`: `ok`, every defect with its kind, file and tree path, and the advice.
    pub fn json(&self, file: &Path) -> Value {
        json!({
            "version": JSON_VERSION,
            "file": file.display().to_string(),
            "ok": self.defects.is_empty(),
            "defects": self.defects.iter().map(|d| json!({
                "kind": d.kind,
                "file": d.file,
                "path": d.path,
                "message": d.message,
            })).collect::<Vec<_>>(),
            "advice": self.advice,
        })
    }
}

/// Adds to `out` the names the tree cannot show verbatim (longer than a file name can be): the runtime has no
/// problem with them, but `ls` shows a shortened name, so a script looking for the key by
/// name does not find it.
pub fn shortened_names(model: &Model, out: &mut Vec<String>) {
    out.extend(shortened(model).into_iter().map(|d| d.message));
}

/// `shortened_names`, as defects with their place.
pub fn shortened(model: &Model) -> Vec<Defect> {
    let names = Names::of(model);
    let mut out = Vec::new();
    for s in &names.shortened {
        let (what, shown, file) = match s.part {
            Part::Plan(p) => (format!("plan {p} name"), format!("plans/{}/", s.shown), 0),
            Part::DataFile(f) => (
                format!("data file {} stem", model.files[f].path.display()),
                format!("data/{}/", s.shown),
                f,
            ),
            Part::NamedData(f, k) => (
                format!("{}: named_data[{k}] key", model.files[f].path.display()),
                format!("{}named_data/{}.json", names.file_prefix(f), s.shown),
                f,
            ),
        };
        let message = format!(
            "{what} {} ({} bytes) is longer than a file name can be ({NAME_MAX} bytes with its extension): the tree shows it as {shown}",
            quote::abbreviated(&s.full),
            s.full.len(),
        );
        out.push(
            Defect::new("shortened_name", message)
                .in_file(model, file)
                .at(shown),
        );
    }
    out
}
