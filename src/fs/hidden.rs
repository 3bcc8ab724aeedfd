//! Names of writable files hidden by `unlink`, so that tools that replace a file by deleting it
//! and creating it again (`mv` from another filesystem, `install`, `cp --remove-destination`)
//! work on a tree whose files cannot be deleted
//! (docs/writes.md#editors-scratch-files-and-deletes).
//!
//! An unlink of a writable file changes nothing in the model: it hides the name (lookups
//! find nothing, listings omit it). A create of that name in that directory opens a
//! truncating writer of the same file and shows the name again; the writer's commit
//! replaces the file and is validated like any write, so a refused one leaves the file as
//! it was. Until that writer is released the file takes any mode and owner without
//! complaint and keeps the model's, as scratch files do: `install` and `mv` set the new
//! file's mode (`install` first to 0600) before they close it. A name nobody creates again comes back when the process that unlinked it has
//! exited, or `GRACE` after the unlink when that process cannot be followed or lives on:
//! files of the model cannot be deleted, and a tree that went on hiding one would
//! misdescribe the model to everyone else.
//!
//! Invariants: only writable files of the tree are hidden, by their tree path (inode numbers
//! may name other nodes after a re-layout); while a name is hidden the kernel is told to
//! cache neither its negative entry nor its directory's listing, so the name coming back
//! reaches every lookup without a notice, and what the kernel cached before is invalidated
//! when it comes back.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use std::ffi::OsStr;

use super::{utf8, Fs};
use crate::tree::{Ino, Tree};

/// How long an unlinked name stays hidden at most. `mv` and `install` create the name again
/// within milliseconds; a longer wait would hide a file of the model from everyone for as
/// long as a long-lived program that deleted it runs (a file manager, a REPL).
pub const GRACE: Duration = Duration::from_secs(30);

/// A process, told apart from a later one that reuses its pid by its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    pid: u32,
    /// Field 22 of `/proc/<pid>/stat`: clock ticks after boot.
    start: u64,
}

/// The fields of `/proc/<pid>/stat` from the third (the state) on. The command name (the
/// second) is in parentheses and may hold spaces and parentheses itself, so fields are
/// counted after the last `)`.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(stat[stat.rfind(')')? + 1..].split_whitespace().collect())
}

/// The state (`R`, `S`, `Z`, …) and start time (field 22) in `/proc/<pid>/stat`.
fn state_and_start(stat: &str) -> Option<(String, u64)> {
    let f = stat_fields(stat)?;
    Some((f.first()?.to_string(), f.get(19)?.parse().ok()?))
}

fn read_stat(pid: u32) -> Option<(String, u64)> {
    state_and_start(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The thread group (process) of thread `tid`: FUSE requests carry the thread's id.
fn thread_group(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}

impl Process {
    /// The process thread `tid` belongs to, while it runs; `None` for pid 0 (a request from
    /// a process in another PID namespace) or when `/proc` does not show it.
    pub fn of(tid: u32) -> Option<Process> {
        if tid == 0 {
            return None;
        }
        let pid = thread_group(tid)?;
        let (_, start) = read_stat(pid)?;
        Some(Process { pid, start })
    }

    /// Whether the process still runs (a zombie counts as exited: it can create nothing).
    pub fn alive(&self) -> bool {
        read_stat(self.pid).is_some_and(|(state, start)| state != "Z" && start == self.start)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }
}

struct HiddenName {
    by: Option<Process>,
    since: Instant,
}

impl HiddenName {
    fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.since) >= GRACE || self.by.is_some_and(|p| !p.alive())
    }
}

/// The hidden names of a mount, by tree path, and the writers that create them again.
#[derive(Default)]
pub(super) struct Hidden {
    names: Mutex<HashMap<String, HiddenName>>,
    /// Handles opened by a create of a hidden name, and the file each writes.
    writers: Mutex<HashMap<u64, Ino>>,
}

/// The directory part and the last name of a tree path.
fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

impl Hidden {
    fn names(&self) -> MutexGuard<'_, HashMap<String, HiddenName>> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_empty(&self) -> bool {
        self.names().is_empty()
    }

    /// Hides `path`, unlinked by `by` at `now`.
    pub fn hide(&self, path: String, by: Option<Process>, now: Instant) {
        self.names().insert(path, HiddenName { by, since: now });
    }

    pub fn contains(&self, path: &str) -> bool {
        let names = self.names();
        !names.is_empty() && names.contains_key(path)
    }

    /// Shows `path` again; whether it was hidden.
    pub fn show(&self, path: &str) -> bool {
        self.names().remove(path).is_some()
    }

    /// The hidden names in directory `dir` (a tree path).
    pub fn in_dir(&self, dir: &str) -> Vec<String> {
        self.names()
            .keys()
            .filter(|p| split(p).0 == dir)
            .map(|p| split(p).1.to_string())
            .collect()
    }

    /// Records that handle `fh` creates file `ino` again.
    pub fn writing(&self, fh: u64, ino: Ino) {
        self.writers().insert(fh, ino);
    }

    /// Forgets handle `fh`, released.
    pub fn released(&self, fh: u64) {
        self.writers().remove(&fh);
    }

    /// Whether a handle that creates file `ino` again is open.
    pub fn being_created(&self, ino: Ino) -> bool {
        self.writers().values().any(|&i| i == ino)
    }

    fn writers(&self) -> MutexGuard<'_, HashMap<u64, Ino>> {
        self.writers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Shows again every name whose process exited or whose grace ran out at `now`;
    /// returns their paths.
    pub fn expire(&self, now: Instant) -> Vec<String> {
        let mut names = self.names();
        if names.is_empty() {
            return Vec::new();
        }
        let gone: Vec<String> = names
            .iter()
            .filter(|(_, h)| h.expired(now))
            .map(|(p, _)| p.clone())
            .collect();
        for p in &gone {
            names.remove(p);
        }
        gone
    }
}

impl Fs {
    /// Whether tree file `ino` is hidden.
    pub(super) fn hidden_ino(&self, tree: &Tree, ino: Ino) -> bool {
        !self.hidden.is_empty() && self.hidden.contains(&tree.path(ino))
    }

    /// The tree file named `name` in directory `parent`, if an unlink hid it.
    pub(super) fn hidden_file(&self, parent: Ino, name: &OsStr) -> Option<Ino> {
        if self.hidden.is_empty() {
            return None;
        }
        let tree = self.tree();
        tree.lookup(parent, utf8(name)?)
            .filter(|&ino| self.hidden_ino(&tree, ino))
    }

    /// Hides tree file `ino`, unlinked by `by`.
    pub(super) fn hide(&self, tree: &Tree, ino: Ino, by: Option<Process>) {
        let path = tree.path(ino);
        let until = match by {
            Some(p) => format!("process {} exits", p.pid()),
            None => "the unlinking process cannot be followed".to_string(),
        };
        log::info!(
            "{path}: unlinked, so hidden until it is created again (as mv and install do); \
             files of the model cannot be deleted, so it comes back once {until}, {} s at most",
            GRACE.as_secs()
        );
        self.hidden.hide(path, by, Instant::now());
    }

    /// Shows again the names nobody created again in time, says so, and makes the kernel
    /// forget what it may have cached of them and their directories meanwhile.
    pub(super) fn show_expired(&self) {
        let back = self.hidden.expire(Instant::now());
        if back.is_empty() {
            return;
        }
        let tree = self.tree();
        for path in back {
            log::warn!(
                "{path}: unlinked and not created again, so it is back: files of the model cannot be deleted"
            );
            if let Some(node) = tree.find(&path).and_then(|ino| tree.node(ino)) {
                self.invalidator.entry(node.parent, &node.name);
                self.invalidator.inodes(vec![node.parent], false);
            }
        }
    }

    /// The names hidden in directory `ino`.
    pub(super) fn hidden_in(&self, tree: &Tree, ino: Ino) -> Vec<String> {
        if self.hidden.is_empty() {
            return Vec::new();
        }
        self.hidden.in_dir(&tree.path(ino))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_counted_after_the_command_name() {
        let stat = "42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000";
        assert_eq!(state_and_start(stat), Some(("S".to_string(), 987654)));
        assert_eq!(state_and_start("42 (a"), None);
        assert_eq!(state_and_start("42 (a) S 1 2"), None);
    }

    #[test]
    fn a_name_stays_hidden_while_its_process_runs_and_within_the_grace() {
        let h = Hidden::default();
        let now = Instant::now();
        let me = Process::of(std::process::id()).expect("this process is in /proc");
        assert!(me.alive());
        h.hide("plans/forward/values/0.bin".into(), Some(me), now);
        assert!(h.expire(now + GRACE / 2).is_empty());
        assert!(h.contains("plans/forward/values/0.bin"));
        assert_eq!(h.in_dir("plans/forward/values"), vec!["0.bin".to_string()]);
        assert!(h.in_dir("plans/forward").is_empty());
        assert_eq!(h.expire(now + GRACE), vec!["plans/forward/values/0.bin"]);
        assert!(h.is_empty());
    }

    #[test]
    fn a_name_comes_back_when_its_process_exited() {
        let h = Hidden::default();
        let now = Instant::now();
        let mut child = std::process::Command::new("cat")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let other = Process::of(child.id()).expect("a running child is in /proc");
        // The same pid with another start time: a process that had it earlier.
        let me = Process::of(std::process::id()).unwrap();
        let earlier = Process {
            start: me.start.wrapping_sub(1),
            ..me
        };
        assert!(!earlier.alive());
        h.hide("segments/0".into(), None, now);
        h.hide("named_data/a.bin".into(), Some(earlier), now);
        h.hide("named_data/b.bin".into(), Some(other), now);
        assert_eq!(h.expire(now), vec!["named_data/a.bin"]);
        drop(child.stdin.take());
        child.wait().unwrap();
        assert!(!other.alive());
        assert_eq!(h.expire(now), vec!["named_data/b.bin"]);
        // Nobody to follow: only the grace brings it back.
        assert!(h.contains("segments/0"));
        assert_eq!(h.expire(now + GRACE), vec!["segments/0"]);
        assert_eq!(Process::of(0), None);
    }
}
