//! The requests of the FUSE adapter, answered by the core (`fs::Fs`) without a mount: what
//! each one decides (entries and their TTLs, listings by cookie, open flags, `statfs`,
//! `access`, extended attributes, unsupported operations, names that are not UTF-8), and
//! how an unlink of a writable file hides its name until a create replaces the file.

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{copy_fixture, open, pattern, Copied};
use ptefs::fs::access::Caller;
use ptefs::fs::{Fs, Lookup, RenameMode, Unsupported, R_OK, W_OK, X_OK};
use ptefs::tree::{Content, Ino};

const WEIGHT: &str = "plans/forward/values/0.bin";

/// A writable copy of `linear.pte` through the core, its bytes before any change, and the
/// inodes of `plans/forward/values` and of the weight `0.bin` in it.
fn linear() -> (Copied, Fs, Vec<u8>, Ino, Ino) {
    let c = copy_fixture("linear.pte");
    let fs = open(&c, false);
    let before = std::fs::read(&c.model).unwrap();
    let (values, bin) = (find(&fs, "plans/forward/values"), find(&fs, WEIGHT));
    (c, fs, before, values, bin)
}

fn find(fs: &Fs, path: &str) -> Ino {
    fs.tree().find(path).unwrap_or_else(|| panic!("{path}"))
}

/// The names `Fs::list` gives directory `path`, without `.` and `..`.
fn names(fs: &Fs, path: &str) -> Vec<String> {
    let list = fs.list(find(fs, path)).unwrap();
    list.into_iter().skip(2).map(|e| e.name).collect()
}

fn errno<T: std::fmt::Debug>(r: Result<T, ptefs::error::Error>) -> i32 {
    r.unwrap_err().errno()
}

/// A name that is not UTF-8.
fn not_utf8() -> &'static OsStr {
    OsStr::from_bytes(b"0\xff.bin")
}

/// A process that runs until its stdin closes.
fn waiting_process() -> Child {
    Command::new("cat").stdin(Stdio::piped()).spawn().unwrap()
}

fn caller(pid: u32) -> Caller {
    Caller {
        pid,
        ..Caller::root()
    }
}

#[test]
fn lookup_entry_gives_attributes_or_a_negative_entry_with_a_ttl() {
    let (_c, fs, _, values, bin) = linear();
    let Lookup::Found(e) = fs.lookup_entry(values, "0.bin").unwrap() else {
        panic!("0.bin not found")
    };
    assert_eq!(e.attr.ino, bin);
    assert_eq!(e.attr.size, 48);
    assert!(e.ttl > Duration::ZERO);
    for missing in [OsStr::new("nope.bin"), not_utf8()] {
        let Lookup::Missing { ttl } = fs.lookup_entry(values, missing).unwrap() else {
            panic!("{missing:?} found")
        };
        assert!(
            ttl > Duration::ZERO,
            "{missing:?}: the negative entry is cached"
        );
    }
    assert_eq!(errno(fs.lookup_entry(bin, "x")), libc::ENOTDIR);
}

#[test]
fn statfs_counts_the_model_files_bytes_and_the_tree_nodes() {
    let c = copy_fixture("linear_ext.pte");
    let fs = open(&c, true);
    let s = fs.statfs();
    let bytes =
        std::fs::metadata(&c.model).unwrap().len() + std::fs::metadata(&c.data[0]).unwrap().len();
    assert_eq!(s.blocks, bytes.div_ceil(u64::from(s.frsize)));
    assert_eq!(s.files, fs.tree().node_count());
    assert_eq!((s.bfree, s.bavail, s.ffree), (0, 0, 0));
    assert_eq!(s.namelen, 255);
}

#[test]
fn access_says_what_the_modes_allow() {
    let c = copy_fixture("linear.pte");
    let fs = open(&c, false);
    let root = Caller::root();
    let (bin, json) = (find(&fs, WEIGHT), find(&fs, "plans/forward/values/0.json"));
    fs.access_as(&root, bin, R_OK | W_OK).unwrap();
    fs.access_as(&root, json, R_OK).unwrap();
    assert_eq!(errno(fs.access_as(&root, json, W_OK)), libc::EACCES);
    assert_eq!(errno(fs.access_as(&root, bin, X_OK)), libc::EACCES);
    fs.access_as(&root, find(&fs, "plans"), R_OK | X_OK)
        .unwrap();
    let ro = open(&c, true);
    assert_eq!(
        errno(ro.access_as(&root, find(&ro, WEIGHT), W_OK)),
        libc::EROFS
    );
}

#[test]
fn xattrs_of_the_model_cannot_be_set_or_removed_and_no_others_exist() {
    let c = copy_fixture("linear.pte");
    let fs = open(&c, false);
    let bin = find(&fs, WEIGHT);
    assert_eq!(fs.getxattr(bin, "user.ptefs.dtype").unwrap(), b"FLOAT");
    assert_eq!(errno(fs.setxattr(bin, "user.ptefs.dtype")), libc::EPERM);
    assert_eq!(errno(fs.removexattr(bin, "user.ptefs.dtype")), libc::EPERM);
    assert_eq!(errno(fs.setxattr(bin, "user.mine")), libc::ENOTSUP);
    assert_eq!(
        errno(fs.setxattr(bin, "system.posix_acl_access")),
        libc::ENOTSUP
    );
    assert_eq!(errno(fs.removexattr(bin, "user.mine")), libc::ENODATA);
    assert_eq!(errno(fs.getxattr(bin, "user.mine")), libc::ENODATA);
    assert_eq!(errno(fs.getxattr(bin, "security.selinux")), libc::ENOTSUP);
    // A name that is not UTF-8 names no attribute, even after a `user.ptefs.` prefix.
    let odd = OsStr::from_bytes(b"user.ptefs.\xff");
    assert_eq!(errno(fs.getxattr(bin, odd)), libc::ENODATA);
    assert_eq!(errno(fs.removexattr(bin, odd)), libc::ENODATA);
    assert_eq!(errno(fs.setxattr(bin, odd)), libc::ENOTSUP);
    assert_eq!(errno(fs.setxattr(1 << 40, "user.x")), libc::ENOENT);
    let ro = open(&c, true);
    let bin = find(&ro, WEIGHT);
    assert_eq!(errno(ro.setxattr(bin, "user.mine")), libc::EROFS);
    assert_eq!(errno(ro.removexattr(bin, "user.ptefs.dtype")), libc::EROFS);
}

#[test]
fn readdir_serves_one_listing_from_any_cookie() {
    let (_c, fs, _, values, bin) = linear();
    let dir = fs.opendir(values).unwrap();
    let page = fs.readdir(dir.fh, 0).unwrap();
    let all: Vec<(u64, String)> = page.entries().map(|(k, e)| (k, e.name.clone())).collect();
    assert_eq!(all[0], (1, ".".to_string()));
    assert_eq!(all[1], (2, "..".to_string()));
    assert_eq!(all.len(), fs.list(values).unwrap().len());
    assert!(all.iter().enumerate().all(|(i, (k, _))| *k == i as u64 + 1));
    // A new name after the first read does not shift the cookies of this listing.
    let (_, scratch) = fs.create(values, ".new", libc::O_WRONLY).unwrap();
    fs.release(scratch.fh).unwrap();
    for from in [3, all.len() as u64 - 1] {
        let rest: Vec<(u64, String)> = fs
            .readdir(dir.fh, from)
            .unwrap()
            .entries()
            .map(|(k, e)| (k, e.name.clone()))
            .collect();
        assert_eq!(rest, all[from as usize..], "from cookie {from}");
    }
    assert_eq!(
        fs.readdir(dir.fh, all.len() as u64)
            .unwrap()
            .entries()
            .count(),
        0
    );
    assert_eq!(fs.readdir(dir.fh, u64::MAX).unwrap().entries().count(), 0);
    // Offset 0 (rewinddir) takes the listing again.
    let again = fs.readdir(dir.fh, 0).unwrap();
    assert!(again.entries().any(|(_, e)| e.name == ".new"));
    assert!(again.ttl > Duration::ZERO);
    fs.releasedir(dir.fh);
    assert_eq!(errno(fs.readdir(dir.fh, 0)), libc::EBADF);
    assert_eq!(errno(fs.opendir(bin)), libc::ENOTDIR);
}

#[test]
fn open_flags_say_how_the_kernel_may_cache() {
    let c = copy_fixture("linear.pte");
    let fs = open(&c, false);
    let bin = find(&fs, WEIGHT);
    let reader = fs.open(bin, libc::O_RDONLY).unwrap();
    assert!(reader.keep_cache && !reader.direct_io && !reader.cache_dir);
    let writer = fs.open(bin, libc::O_WRONLY).unwrap();
    assert!(
        !writer.keep_cache && writer.direct_io,
        "a writer's bytes bypass the cache"
    );
    let values = find(&fs, "plans/forward/values");
    let (_, scratch) = fs.create(values, ".swp", libc::O_RDWR).unwrap();
    assert!(!scratch.keep_cache && !scratch.direct_io);
    let dir = fs.opendir(values).unwrap();
    assert!(dir.keep_cache && dir.cache_dir);
    for o in [reader, writer, scratch] {
        fs.release(o.fh).unwrap();
    }
    fs.releasedir(dir.fh);
    // While a name is hidden the kernel may not cache the directory's listing.
    fs.unlink(values, "0.bin").unwrap();
    let dir = fs.opendir(values).unwrap();
    assert!(!dir.keep_cache && !dir.cache_dir);
    assert!(fs.opendir(find(&fs, "plans")).unwrap().cache_dir);
}

#[test]
fn operations_the_tree_has_no_use_for_are_refused_as_the_core_says() {
    let c = copy_fixture("linear.pte");
    let fs = open(&c, false);
    for op in [Unsupported::Mkdir, Unsupported::Link, Unsupported::Rmdir] {
        assert_eq!(fs.unsupported(op).errno(), libc::EPERM, "{op:?}");
        assert!(fs.unsupported(op).message().contains(op.name()));
    }
    assert_eq!(fs.unsupported(Unsupported::Ioctl).errno(), libc::ENOTTY);
    // `cp` asks for FICLONE on every copy: a probe, not worth more than a debug line.
    assert_eq!(
        fs.unsupported(Unsupported::Ioctl).level(),
        log::Level::Debug
    );
    for op in [
        Unsupported::Lseek,
        Unsupported::Fsyncdir,
        Unsupported::CopyFileRange,
    ] {
        assert_eq!(fs.unsupported(op).errno(), libc::ENOSYS, "{op:?}");
    }
    let ro = open(&c, true);
    assert_eq!(ro.unsupported(Unsupported::Mknod).errno(), libc::EROFS);
}

#[test]
fn names_that_are_not_utf8_name_nothing_and_cannot_be_created() {
    let (_c, fs, _, values, _) = linear();
    assert_eq!(errno(fs.lookup(values, not_utf8())), libc::ENOENT);
    assert_eq!(errno(fs.unlink(values, not_utf8())), libc::ENOENT);
    assert_eq!(
        errno(fs.create(values, not_utf8(), libc::O_WRONLY)),
        libc::EINVAL
    );
    let (_, o) = fs.create(values, ".swp", libc::O_WRONLY).unwrap();
    fs.release(o.fh).unwrap();
    let mode = RenameMode::Replace;
    assert_eq!(
        errno(fs.rename(values, not_utf8(), values, "x", mode)),
        libc::ENOENT
    );
    assert_eq!(
        errno(fs.rename(values, ".swp", values, not_utf8(), mode)),
        libc::EINVAL
    );
}

#[test]
fn an_unlinked_writable_file_is_hidden_until_a_create_replaces_it() {
    let (c, fs, before, values, bin) = linear();
    assert_eq!(errno(fs.unlink(values, "0.json")), libc::EPERM);
    assert_eq!(
        errno(fs.unlink(find(&fs, "plans/forward"), "values")),
        libc::EPERM
    );

    fs.unlink(values, "0.bin").unwrap();
    assert_eq!(
        std::fs::read(&c.model).unwrap(),
        before,
        "an unlink changes nothing"
    );
    assert_eq!(errno(fs.lookup(values, "0.bin")), libc::ENOENT);
    let Lookup::Missing { ttl } = fs.lookup_entry(values, "0.bin").unwrap() else {
        panic!("a hidden name was found")
    };
    assert_eq!(ttl, Duration::ZERO, "the name comes back without a notice");
    assert!(!names(&fs, "plans/forward/values").contains(&"0.bin".to_string()));
    assert!(names(&fs, "plans/forward/values").contains(&"0.npy".to_string()));
    assert_eq!(errno(fs.unlink(values, "0.bin")), libc::ENOENT);
    assert_eq!(
        errno(fs.rename(values, "0.bin", values, "x", RenameMode::Replace)),
        libc::ENOENT
    );
    // The file itself is still there for whoever holds it.
    assert_eq!(fs.getattr(bin).unwrap().size, 48);

    // `mv` and `install`: O_CREAT|O_EXCL of the name, then writes, then close.
    let (attr, o) = fs
        .create(
            values,
            "0.bin",
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        )
        .unwrap();
    assert_eq!(attr.ino, bin, "the same file, not a new one");
    assert!(o.direct_io);
    assert_eq!(
        fs.lookup(values, "0.bin").unwrap().ino,
        bin,
        "visible again at once"
    );
    let new = pattern(48, 9);
    fs.write(o.fh, 0, &new).unwrap();
    fs.flush(o.fh).unwrap();
    fs.release(o.fh).unwrap();
    assert_eq!(common::read_all(&fs, bin, 1 << 20).unwrap(), new);
    assert_ne!(std::fs::read(&c.model).unwrap(), before);
    assert_eq!(
        errno(fs.create(values, "0.bin", libc::O_WRONLY)),
        libc::EEXIST
    );
}

#[test]
fn a_refused_replacement_leaves_the_file_as_it_was_and_its_name_visible() {
    let (c, fs, before, values, bin) = linear();
    let old = common::read_all(&fs, bin, 1 << 20).unwrap();
    fs.unlink(values, "0.bin").unwrap();
    let (_, o) = fs
        .create(values, "0.bin", libc::O_WRONLY | libc::O_EXCL)
        .unwrap();
    fs.write(o.fh, 0, &pattern(40, 3)).unwrap();
    let e = fs.flush(o.fh).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(e.message().contains("needs 48 bytes"), "{}", e.message());
    fs.release(o.fh).unwrap();
    assert_eq!(std::fs::read(&c.model).unwrap(), before);
    assert_eq!(fs.lookup(values, "0.bin").unwrap().ino, bin);
    assert_eq!(common::read_all(&fs, bin, 1 << 20).unwrap(), old);
}

#[test]
fn an_editor_rename_onto_a_hidden_name_replaces_the_file_and_shows_it() {
    let (_c, fs, _, values, _) = linear();
    fs.unlink(values, "0.bin").unwrap();
    let (_, o) = fs.create(values, ".0.bin.tmp", libc::O_WRONLY).unwrap();
    let new = pattern(48, 4);
    fs.write(o.fh, 0, &new).unwrap();
    fs.release(o.fh).unwrap();
    fs.rename(values, ".0.bin.tmp", values, "0.bin", RenameMode::NoReplace)
        .unwrap();
    let bin = fs.lookup(values, "0.bin").unwrap().ino;
    assert_eq!(common::read_all(&fs, bin, 1 << 20).unwrap(), new);
}

#[test]
fn a_hidden_name_comes_back_when_the_process_that_unlinked_it_exits() {
    let (c, fs, before, values, bin) = linear();
    let mut rm = waiting_process();
    fs.unlink_as(&caller(rm.id()), values, OsStr::new("0.bin"))
        .unwrap();
    assert_eq!(errno(fs.lookup(values, "0.bin")), libc::ENOENT);
    assert!(!names(&fs, "plans/forward/values").contains(&"0.bin".to_string()));
    drop(rm.stdin.take());
    rm.wait().unwrap();
    assert_eq!(fs.lookup(values, "0.bin").unwrap().ino, bin);
    assert!(names(&fs, "plans/forward/values").contains(&"0.bin".to_string()));
    assert!(fs.opendir(values).unwrap().cache_dir);
    assert_eq!(std::fs::read(&c.model).unwrap(), before);
}

/// In `linear_ext.pte`, `plans/forward/values/0.bin` is an EXTERNAL weight: its directory
/// is the `.pte`'s, its bytes are the `.ptd`'s. A user who may write the `.pte` and its
/// directory but not the `.ptd` may create scratch files there, but neither hide the
/// weight's name nor create it again.
#[test]
fn hiding_or_replacing_a_file_needs_write_permission_on_what_it_shows() {
    let c = copy_fixture("linear_ext.pte");
    let user = Caller {
        uid: 54321,
        gid: 54321,
        groups: Vec::new(),
        pid: 0,
    };
    for p in [&c.root, &c.model] {
        std::os::unix::fs::chown(p, Some(user.uid), Some(user.gid)).unwrap();
    }
    let fs = open(&c, false);
    let values = find(&fs, "plans/forward/values");
    let name = OsStr::new("0.bin");
    let (_, o) = fs
        .create_as(&user, values, OsStr::new(".swp"), libc::O_WRONLY)
        .unwrap();
    fs.release(o.fh).unwrap();
    assert_eq!(errno(fs.unlink_as(&user, values, name)), libc::EACCES);
    assert_eq!(fs.lookup(values, name).unwrap().ino, find(&fs, WEIGHT));
    fs.unlink_as(&Caller::root(), values, name).unwrap();
    assert_eq!(
        errno(fs.create_as(&user, values, name, libc::O_WRONLY)),
        libc::EACCES
    );
    assert_eq!(errno(fs.lookup(values, name)), libc::ENOENT, "still hidden");
}

/// `weights.safetensors` lists its tensors when first looked up, not at mount: for a large
/// model the listing costs more than the rest of the tree.
#[test]
fn weights_safetensors_is_listed_on_first_lookup() {
    let (_c, fs, _, _, _) = linear();
    let tree = fs.tree();
    let ino = find(&fs, "weights.safetensors");
    let Content::Weights { view } = &tree.node(ino).unwrap().content else {
        panic!("weights.safetensors is a weights file");
    };
    assert!(tree.catalog.weights_if_listed(*view).is_none());
    let attr = fs.lookup(ptefs::tree::ROOT, OsStr::new("weights.safetensors"));
    assert!(attr.is_ok());
    let built = tree
        .catalog
        .weights_if_listed(*view)
        .expect("listed by the lookup");
    assert_eq!(tree.size(ino), built.len);
    assert!(!built.entries.is_empty());
}
