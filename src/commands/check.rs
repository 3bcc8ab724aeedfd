//! `ptefs check`: every defect of the files (`crate::check`), interrupted commits beside
//! them, names the tree shows shortened, and the `.ptd` files beside the model that hold
//! what it lacks.

use std::path::{Path, PathBuf};

use crate::catalog::names::{Names, Part, NAME_MAX};
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
    check_report(file, data, max_nodes).defects
}

/// What `ptefs check` found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// One a line; empty when the files are sound.
    pub defects: Vec<String>,
    /// How to fix some of them, one a line: `.ptd` files beside the model that hold keys
    /// it lacks (`check::data_beside`).
    pub advice: Vec<String>,
}

/// The defects of the files, and advice, as `check_limited` finds them.
pub fn check_report(file: &Path, data: &[PathBuf], max_nodes: u64) -> CheckReport {
    let mut report = CheckReport {
        defects: interrupted_commits(file, data),
        advice: Vec::new(),
    };
    let out = &mut report.defects;
    match Model::open(file, data) {
        Err(e) => out.push(e.to_string()),
        Ok(model) => {
            let nodes = crate::tree::node_count(&model);
            if nodes > max_nodes {
                let refusal = crate::tree::build::too_many_nodes(&model, nodes, max_nodes);
                out.push(refusal.to_string());
            } else {
                let payloads = crate::catalog::Payloads::decode(&model);
                out.extend(crate::check::defects_with(&model, &payloads));
                out.extend(crate::check::value_defects(&model, &payloads));
                shortened_names(&model, out);
                report.advice.extend(crate::check::data_beside(&model));
            }
        }
    }
    report
}

/// Adds to `out` the names the tree cannot show verbatim (longer than a file name can be): the runtime has no
/// problem with them, but `ls` shows a shortened name, so a script looking for the key by
/// name does not find it.
pub fn shortened_names(model: &Model, out: &mut Vec<String>) {
    let names = Names::of(model);
    for s in &names.shortened {
        let (what, shown) = match s.part {
            Part::Plan(p) => (format!("plan {p} name"), format!("plans/{}/", s.shown)),
            Part::DataFile(f) => (
                format!("data file {} stem", model.files[f].path.display()),
                format!("data/{}/", s.shown),
            ),
            Part::NamedData(f, k) => (
                format!("{}: named_data[{k}] key", model.files[f].path.display()),
                format!("{}named_data/{}.json", names.file_prefix(f), s.shown),
            ),
        };
        out.push(format!(
            "{what} {} ({} bytes) is longer than a file name can be ({NAME_MAX} bytes with its extension): the tree shows it as {shown}",
            quote::abbreviated(&s.full),
            s.full.len(),
        ));
    }
}
