//! Delegate payloads of fixture files, read the plain way (the layout, no tree): what the
//! backend decoder tests compare with the manifests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ptefs::backend::BlobRef;
use ptefs::format::layout::{locate_ptd, locate_pte};
use ptefs::format::{Kind, ModelFile};

/// One delegate of a `.pte`: where it is, its backend id and its payload's bytes.
pub struct Delegate {
    pub plan: usize,
    pub index: usize,
    pub backend: String,
    pub payload: Vec<u8>,
}

/// The `.pte` files of `dirs`, sorted.
pub fn pte_files(dirs: &[&str]) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|d| std::fs::read_dir(d).unwrap().flatten().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pte"))
        .collect();
    v.sort();
    v
}

/// Every delegate of the `.pte` at `path`.
pub fn delegates(path: &Path) -> Vec<Delegate> {
    let model = ModelFile::open(path).unwrap();
    let Kind::Pte(pte) = &model.kind else {
        panic!("{} is not a .pte", path.display())
    };
    let layout = locate_pte(pte, &[]);
    let mut out = Vec::new();
    for (p, plan) in pte.program.execution_plan.iter().flatten().enumerate() {
        for (j, d) in plan.delegates.iter().flatten().enumerate() {
            let loc = layout.plans[p].delegates[j].clone().unwrap();
            out.push(Delegate {
                plan: p,
                index: j,
                backend: d.id.clone().unwrap_or_default(),
                payload: model.read(loc.range).unwrap().to_vec(),
            });
        }
    }
    out
}

/// The delegates of the `.pte` at `path` whose backend id is `backend`.
pub fn delegates_of(path: &Path, backend: &str) -> Vec<Delegate> {
    delegates(path)
        .into_iter()
        .filter(|d| d.backend == backend)
        .collect()
}

/// The manifest beside a fixture (`<file>.json`).
pub fn manifest_of(pte: &Path) -> PathBuf {
    let mut name = pte.as_os_str().to_owned();
    name.push(".json");
    PathBuf::from(name)
}

/// Every named blob of the `.pte` and of the `.ptd` files its manifest attaches, by key.
pub fn named_blobs(pte_path: &Path) -> HashMap<String, Vec<u8>> {
    let mut blobs = HashMap::new();
    let model = ModelFile::open(pte_path).unwrap();
    let Kind::Pte(pte) = &model.kind else {
        panic!()
    };
    let layout = locate_pte(pte, &[]);
    for (nd, loc) in pte
        .program
        .named_data
        .iter()
        .flatten()
        .zip(&layout.named_data)
    {
        let loc = loc.clone().unwrap();
        blobs.insert(
            nd.key.clone().unwrap(),
            model.read(loc.range).unwrap().to_vec(),
        );
    }
    let manifest = super::load_json(&manifest_of(pte_path));
    for name in manifest["data_files"].as_array().into_iter().flatten() {
        let path = pte_path.with_file_name(name.as_str().unwrap());
        let data = ModelFile::open(&path).unwrap();
        let Kind::Ptd(ptd) = &data.kind else { panic!() };
        for blob in locate_ptd(ptd, 1) {
            let loc = blob.location.unwrap();
            blobs.insert(blob.key, data.read(loc.range).unwrap().to_vec());
        }
    }
    blobs
}

/// The bytes `r` names: a named blob, or a range of the payload.
pub fn bytes_of<'a>(
    payload: &'a [u8], blobs: &'a HashMap<String, Vec<u8>>, r: &BlobRef,
) -> &'a [u8] {
    match r {
        BlobRef::Named { key, .. } => &blobs[key],
        BlobRef::Payload { offset, size } => &payload[*offset as usize..(*offset + *size) as usize],
    }
}
