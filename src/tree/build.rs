//! Builds a `Model` from files on disk and the `Tree` that shows it (DESIGN.md §2.1, §2.2).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use super::{names, npy, Content, Ino, Model, Node, TextKind, Tree, WriteTarget, ROOT};
use crate::format::layout::{resolve_ptd, resolve_pte, FileIndex, Location, TensorShape};
use crate::format::{scalar_type, FormatError, Kind, ModelFile};

impl Model {
    /// Opens the mounted file and its attached `.ptd` files and resolves every byte range.
    pub fn open(path: &Path, data: &[impl AsRef<Path>]) -> Result<Model, FormatError> {
        let mut files = vec![ModelFile::open(path)?];
        for d in data {
            files.push(ModelFile::open(d.as_ref())?);
        }
        Model::from_files(files)
    }

    pub fn from_files(files: Vec<ModelFile>) -> Result<Model, FormatError> {
        if files.len() > 1 {
            if let Kind::Ptd(_) = files[0].kind {
                return Err(FormatError::new(format!(
                    "{}: --data attaches .ptd files to a .pte, but this file is a .ptd",
                    files[0].path.display()
                )));
            }
        }
        for f in &files[1..] {
            if let Kind::Pte(_) = f.kind {
                return Err(FormatError::mismatch(
                    "--data file",
                    f.path.display(),
                    "a .ptd (identifier FT01)",
                    "a .pte (identifier ET12)",
                ));
            }
        }
        let ptd_blobs: Vec<_> = files
            .iter()
            .enumerate()
            .map(|(i, f)| match &f.kind {
                Kind::Ptd(p) => Some(resolve_ptd(p, i)),
                Kind::Pte(_) => None,
            })
            .collect();
        let pte_layout = match &files[0].kind {
            Kind::Pte(pte) => {
                let data: Vec<_> = files[1..]
                    .iter()
                    .filter_map(|f| match &f.kind {
                        Kind::Ptd(p) => Some(&**p),
                        Kind::Pte(_) => None,
                    })
                    .collect();
                Some(resolve_pte(pte, &data))
            }
            Kind::Ptd(_) => None,
        };
        Ok(Model {
            files,
            pte_layout,
            ptd_blobs,
            aliases: OnceLock::new(),
            plan_names: OnceLock::new(),
        })
    }

    /// Paths that show each byte range, for the `aliases` of the JSON files.
    pub fn aliases(&self) -> &HashMap<Location, Vec<String>> {
        self.aliases.get_or_init(|| collect_aliases(self))
    }

    /// Names of the plans' directories, deduplicated. Computed once: every value's JSON
    /// names its own path.
    pub fn plan_names(&self) -> &[String] {
        self.plan_names.get_or_init(|| {
            let plans = self
                .pte()
                .and_then(|p| p.program.execution_plan.as_ref())
                .map(|v| v.as_slice())
                .unwrap_or_default();
            names::dedupe(
                plans
                    .iter()
                    .map(|p| names::encode(p.name.as_deref().unwrap_or(""))),
            )
        })
    }

    /// Names of the `data/` subdirectories, deduplicated.
    pub fn data_names(&self) -> Vec<String> {
        names::dedupe(self.files[1..].iter().map(|f| names::encode(&f.stem())))
    }

    /// Base names (without extension) of the named blobs of file `file`.
    pub fn named_data_names(&self, file: FileIndex) -> Vec<String> {
        let keys: Vec<String> = match &self.files[file].kind {
            Kind::Pte(p) => p
                .program
                .named_data
                .iter()
                .flatten()
                .map(|n| n.key.clone().unwrap_or_default())
                .collect(),
            Kind::Ptd(_) => self.ptd_blobs[file]
                .iter()
                .flatten()
                .map(|b| b.key.clone())
                .collect(),
        };
        names::dedupe(keys.iter().map(|k| names::encode(k)))
    }

    /// The prefix of a file's subtree: "" for the mounted file, "data/<stem>/" for a `.ptd`.
    pub fn file_prefix(&self, file: FileIndex) -> String {
        if file == 0 {
            String::new()
        } else {
            format!("data/{}/", self.data_names()[file - 1])
        }
    }
}

fn collect_aliases(model: &Model) -> HashMap<Location, Vec<String>> {
    let mut map: HashMap<Location, Vec<String>> = HashMap::new();
    if let Some(layout) = &model.pte_layout {
        let plan_names = model.plan_names();
        for (p, plan) in layout.plans.iter().enumerate() {
            for (i, t) in plan.tensors.iter().enumerate() {
                if let Some(loc) = t.as_ref().and_then(|t| t.location) {
                    map.entry(loc)
                        .or_default()
                        .push(format!("plans/{}/values/{i}", plan_names[p]));
                }
            }
        }
    }
    for (file, blobs) in model.ptd_blobs.iter().enumerate() {
        let names = match blobs {
            Some(_) => model.named_data_names(file),
            None => continue,
        };
        let prefix = model.file_prefix(file);
        for (k, b) in blobs.iter().flatten().enumerate() {
            if let Ok(loc) = b.location {
                map.entry(loc)
                    .or_default()
                    .push(format!("{prefix}named_data/{}", names[k]));
            }
        }
    }
    map
}

struct Builder {
    nodes: Vec<Node>,
}

impl Builder {
    fn push(&mut self, parent: Ino, name: String, content: Content) -> Ino {
        self.nodes.push(Node {
            name,
            parent,
            content,
            write: None,
        });
        let ino = self.nodes.len() as Ino;
        if let Content::Dir(children) = &mut self.nodes[(parent - 1) as usize].content {
            children.push(ino);
        }
        ino
    }

    fn dir(&mut self, parent: Ino, name: &str) -> Ino {
        self.push(parent, name.to_string(), Content::Dir(Vec::new()))
    }

    fn text(&mut self, parent: Ino, name: &str, kind: TextKind) -> Ino {
        self.push(
            parent,
            name.to_string(),
            Content::Text {
                kind,
                rendered: OnceLock::new(),
            },
        )
    }

    fn node_mut(&mut self, ino: Ino) -> &mut Node {
        &mut self.nodes[(ino - 1) as usize]
    }

    fn finish(mut self, model: Arc<Model>) -> Tree {
        let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        for node in &mut self.nodes {
            if let Content::Dir(children) = &mut node.content {
                children.sort_by(|a, b| names[(*a - 1) as usize].cmp(&names[(*b - 1) as usize]));
            }
        }
        Tree {
            model,
            nodes: self.nodes,
        }
    }
}

/// Adds `<base>.bin` and, when NumPy can describe it, `<base>.npy` for a tensor's bytes.
fn add_tensor_files(b: &mut Builder, dir: Ino, base: &str, loc: Location, shape: &TensorShape) {
    let bin = b.push(dir, format!("{base}.bin"), Content::Range(loc));
    let node = b.node_mut(bin);
    node.write = Some(WriteTarget::TensorBin {
        location: loc,
        shape: shape.clone(),
    });
    if let (Some(descr), Some(physical)) = (
        scalar_type::numpy_descr(shape.scalar_type),
        shape.physical_shape(),
    ) {
        let npy = b.push(
            dir,
            format!("{base}.npy"),
            Content::Npy {
                header: npy::header(&descr, &physical),
                location: loc,
            },
        );
        let node = b.node_mut(npy);
        node.write = Some(WriteTarget::TensorNpy {
            location: loc,
            shape: shape.clone(),
        });
    }
}

fn add_segments(
    b: &mut Builder,
    parent: Ino,
    file: FileIndex,
    segments: &[crate::format::range::ByteRange],
) {
    let dir = b.dir(parent, "segments");
    for (n, r) in segments.iter().enumerate() {
        let loc = Location { file, range: *r };
        let ino = b.push(dir, n.to_string(), Content::Range(loc));
        let node = b.node_mut(ino);
        node.write = Some(WriteTarget::Segment {
            file,
            index: n,
            location: loc,
        });
    }
}

fn add_ptd(b: &mut Builder, model: &Model, root: Ino, file: FileIndex) {
    let ptd = model.ptd(file).expect("a .ptd");
    b.text(root, "header.json", TextKind::HeaderJson(file));
    b.text(root, "flat_tensor.json", TextKind::FlatTensorJson(file));
    let nd_dir = b.dir(root, "named_data");
    let names = model.named_data_names(file);
    for (k, blob) in model.ptd_blobs[file].iter().flatten().enumerate() {
        let base = &names[k];
        b.text(
            nd_dir,
            &format!("{base}.json"),
            TextKind::NamedDataJson(file, k),
        );
        let Ok(loc) = blob.location else { continue };
        match &blob.tensor {
            Some(shape) => add_tensor_files(b, nd_dir, base, loc, shape),
            None => {
                let ino = b.push(nd_dir, format!("{base}.bin"), Content::Range(loc));
                let node = b.node_mut(ino);
                node.write = Some(WriteTarget::Blob {
                    file,
                    named_index: k,
                });
            }
        }
    }
    add_segments(b, root, file, &ptd.segments);
}

fn add_pte(b: &mut Builder, model: &Model, root: Ino) {
    let pte = model.pte().expect("a .pte");
    let layout = model.pte_layout.as_ref().expect("a resolved .pte");
    b.text(root, "header.json", TextKind::HeaderJson(0));
    b.text(root, "program.json", TextKind::ProgramJson);
    let plans_dir = b.dir(root, "plans");
    for (p, name) in model.plan_names().iter().enumerate() {
        let plan_dir = b.dir(plans_dir, name);
        b.text(plan_dir, "plan.json", TextKind::PlanJson(p));
        b.text(plan_dir, "operators.txt", TextKind::Operators(p));
        b.text(plan_dir, "instructions.txt", TextKind::Instructions(p));
        let values = b.dir(plan_dir, "values");
        for (i, t) in layout.plans[p].tensors.iter().enumerate() {
            b.text(values, &format!("{i}.json"), TextKind::ValueJson(p, i));
            if let Some((t, loc)) = t.as_ref().and_then(|t| t.location.map(|l| (t, l))) {
                add_tensor_files(b, values, &i.to_string(), loc, &t.shape);
            }
        }
        let delegates = b.dir(plan_dir, "delegates");
        for (j, loc) in layout.plans[p].delegates.iter().enumerate() {
            let d = b.dir(delegates, &j.to_string());
            b.text(d, "delegate.json", TextKind::DelegateJson(p, j));
            if let Ok(loc) = loc {
                let ino = b.push(d, "processed.bin".to_string(), Content::Range(*loc));
                let node = b.node_mut(ino);
                node.write = Some(WriteTarget::DelegatePayload {
                    plan: p,
                    delegate: j,
                });
            }
        }
    }
    let nd_dir = b.dir(root, "named_data");
    let names = model.named_data_names(0);
    for (k, loc) in layout.named_data.iter().enumerate() {
        b.text(
            nd_dir,
            &format!("{}.json", names[k]),
            TextKind::NamedDataJson(0, k),
        );
        if let Ok(loc) = loc {
            let ino = b.push(nd_dir, format!("{}.bin", names[k]), Content::Range(*loc));
            let node = b.node_mut(ino);
            node.write = Some(WriteTarget::Blob {
                file: 0,
                named_index: k,
            });
        }
    }
    add_segments(b, root, 0, &pte.segments);
    if model.files.len() > 1 {
        let data = b.dir(root, "data");
        for (k, name) in model.data_names().iter().enumerate() {
            let sub = b.dir(data, name);
            add_ptd(b, model, sub, k + 1);
        }
    }
}

impl Tree {
    pub fn build(model: Arc<Model>) -> Tree {
        let mut b = Builder {
            nodes: vec![Node {
                name: String::new(),
                parent: ROOT,
                content: Content::Dir(Vec::new()),
                write: None,
            }],
        };
        match &model.files[0].kind {
            Kind::Pte(_) => add_pte(&mut b, &model, ROOT),
            Kind::Ptd(_) => add_ptd(&mut b, &model, ROOT, 0),
        }
        b.finish(model)
    }
}
