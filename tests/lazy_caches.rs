//! Lazy directories and the kernel's caches: what a mount invalidates must cover every inode
//! and name the kernel was told of, in any snapshot since its caches were last emptied.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::{copy_files, read_all, replace, Copied};
use ptefs::commands::{names, NamesRequest};
use ptefs::format::Model;
use ptefs::fs::{Fs, Invalidator, Options};
use ptefs::names::NameMap;
use ptefs::tree::{Ino, Tree, ROOT};

#[derive(Default)]
struct Recorded {
    inodes: Mutex<Vec<Ino>>,
    entries: Mutex<Vec<(Ino, String)>>,
}

impl Invalidator for Recorded {
    fn inodes(&self, inodes: Vec<Ino>, _wait: bool) {
        self.inodes.lock().unwrap().extend(inodes);
    }
    fn entry(&self, parent: Ino, name: &str) {
        self.entries
            .lock()
            .unwrap()
            .push((parent, name.to_string()));
    }
}

impl Recorded {
    fn clear(&self) {
        self.inodes.lock().unwrap().clear();
        self.entries.lock().unwrap().clear();
    }
}

fn extra(name: &str) -> PathBuf {
    common::fixtures_dir().join("extra").join(name)
}

fn learn_map(c: &Copied, from: &Path) -> NameMap {
    let req = NamesRequest {
        file: c.model.clone(),
        data: c.data.clone(),
        from: vec![from.to_path_buf()],
        output: Some(c.root.join("names.json")),
        ..Default::default()
    };
    names(&req, &mut Vec::new()).unwrap()
}

/// Looks `path` up one name at a time, as the kernel does.
fn lookup(fs: &Fs, path: &str) -> (Ino, Ino) {
    let mut parent = ROOT;
    let mut ino = ROOT;
    for name in path.split('/') {
        parent = ino;
        ino = fs.lookup(parent, name).unwrap().ino;
    }
    (parent, ino)
}

const EMBEDDING: &str = "data/names_llama/named_data/tok_embeddings.weight.bin";
const VALUE: &str = "plans/forward/values/0.bin";

fn names_mount() -> (Copied, Fs, Arc<Recorded>) {
    let (file, data) = common::fixture_files(&extra("names_llama.pte.json"));
    let c = copy_files(&file, &data);
    let map = learn_map(&c, &extra("checkpoints").join("names_llama/hf"));
    let model = Arc::new(Model::open_writable(&c.model, &c.data).unwrap());
    let tree = Tree::build_named(model, u64::MAX, Some(map)).unwrap();
    let rec = Arc::new(Recorded::default());
    let fs = Fs::with_invalidator(tree, Options { read_only: false }, rec.clone());
    (c, fs, rec)
}

/// Two in-place commits of the embedding through a mount with named views: the plan value
/// that shows the same bytes, which the kernel looked up and read before the first, has
/// stale pages after each of them.
#[test]
fn every_commit_invalidates_a_value_the_kernel_read_before_an_earlier_commit() {
    let (_c, fs, rec) = names_mount();
    let (_, value) = lookup(&fs, VALUE);
    let (_, emb) = lookup(&fs, EMBEDDING);
    let before = read_all(&fs, value, 1 << 20).unwrap();
    let mut bytes = read_all(&fs, emb, 1 << 20).unwrap();
    assert_eq!(before, bytes, "{VALUE} shows the embedding's bytes");

    bytes[0] ^= 1;
    replace(&fs, EMBEDDING, &bytes).unwrap();
    assert!(
        rec.inodes.lock().unwrap().contains(&value),
        "first commit invalidates {VALUE}"
    );
    rec.clear();
    // The kernel still holds VALUE (name and pages, for an hour): it asks nothing more.
    bytes[0] ^= 1;
    replace(&fs, EMBEDDING, &bytes).unwrap();
    assert!(
        rec.inodes.lock().unwrap().contains(&value),
        "second commit invalidates {VALUE} too (inode {value}): got {} inodes",
        rec.inodes.lock().unwrap().len()
    );
}

/// After a commit of a mount with named views, a change behind the mount must make the
/// kernel forget every name it was told, including those in directories the new snapshot
/// has not built.
#[test]
fn a_change_behind_the_mount_after_a_commit_forgets_every_name_the_kernel_holds() {
    let (_c, fs, rec) = names_mount();
    let (values, value) = lookup(&fs, VALUE);
    let (_, emb) = lookup(&fs, EMBEDDING);
    read_all(&fs, value, 1 << 20).unwrap();
    let mut bytes = read_all(&fs, emb, 1 << 20).unwrap();
    bytes[0] ^= 1;
    replace(&fs, EMBEDDING, &bytes).unwrap();
    rec.clear();
    // Someone else changes a byte of the embedding in the data file, in place.
    let loc = fs.tree().reads(emb)[0];
    let file = fs.tree().model.files[loc.file].path.clone();
    let mut data = std::fs::read(&file).unwrap();
    data[loc.range.start() as usize] ^= 2;
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&file, &data).unwrap();
    let _ = fs.check_files(true);
    let entries = rec.entries.lock().unwrap().clone();
    assert!(!entries.is_empty(), "the change was seen");
    assert!(
        rec.inodes.lock().unwrap().contains(&value),
        "the inode of {VALUE} ({value}) is invalidated ({} inodes)",
        rec.inodes.lock().unwrap().len()
    );
    assert!(
        entries.contains(&(values, "0.bin".to_string())),
        "{VALUE} is forgotten ({} names forgotten)",
        entries.len()
    );
}

/// Reading one value's `.json` builds only what it needs, not every lazy directory.
#[test]
fn reading_one_value_json_does_not_build_every_lazy_directory() {
    let (file, data) = common::fixture_files(&extra("names_llama.pte.json"));
    let tree = Tree::build(Arc::new(Model::open(&file, &data).unwrap()));
    let json = tree.find("plans/forward/values/0.json").unwrap();
    let after_find = tree.built_nodes().count();
    tree.text(json).unwrap();
    let after_read = tree.built_nodes().count();
    assert_eq!(
        after_read,
        after_find,
        "reading one .json built {} more nodes (of {} in all)",
        after_read - after_find,
        tree.node_count()
    );
}

/// `stat` of one value's `.json` (what `ls -l values/` asks of each file) builds only what it
/// needs, not every lazy directory.
#[test]
fn stat_of_one_value_json_does_not_build_every_lazy_directory() {
    let (file, data) = common::fixture_files(&extra("names_llama.pte.json"));
    let tree = Tree::build(Arc::new(Model::open(&file, &data).unwrap()));
    let json = tree.find("plans/forward/values/0.json").unwrap();
    let after_find = tree.built_nodes().count();
    assert!(tree.size(json) > 0);
    let after_stat = tree.built_nodes().count();
    assert_eq!(
        after_stat,
        after_find,
        "stat of one .json built {} more nodes: {after_stat} of {} in all are built",
        after_stat - after_find,
        tree.node_count()
    );
}
