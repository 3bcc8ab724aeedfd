//! Kills the daemon with SIGKILL at random moments of commits, many times, and checks that
//! the model holds entirely the old or entirely the new tensor (or, for a bulk update
//! through `weights.safetensors`, entirely the old or entirely the new set of tensors):
//! right after the kill (or, when the kill interrupted the write itself, a whole journal
//! waits beside it), and again after the remount that replays or discards the journal and
//! removes a new copy left unrenamed. The single tensor is written in place through the
//! journal; the bulk update, which rewrites the whole file, as a new copy renamed over it
//! (docs/writes.md#large-updates-as-a-new-copy). A bulk update through the root `weights.safetensors` of a program mounted with
//! two data files is one commit of three files: after the kill, and after `ptefs recover`
//! of one of them alone, every file holds all its old or all its new bytes, and all files
//! the same side.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ptefs::format::generated::pte_fb;
use ptefs::format::writer::{pack_program, pte_program_region};

mod common;

use common::safetensors::{self, layer_name, many_tensor_ptd};

const SIDE: i32 = 1024; // the tensor is FLOAT[1024, 1024]: 4 MiB
const WEIGHT: &str = "plans/forward/values/0.bin";

/// `linear.pte` with its weight grown to FLOAT[SIDE, SIDE], filled with `fill`.
fn big_model(path: &Path, fill: u8) -> (u64, u64) {
    let (orig, mut program, segments) = common::unpack_pte("linear.pte");
    let plan = &mut program.execution_plan.as_mut().unwrap()[0];
    let pte_fb::KernelTypesT::Tensor(t) = &mut plan.values.as_mut().unwrap()[0].val else {
        panic!()
    };
    t.sizes = Some(vec![SIDE, SIDE]);
    let nbytes = (SIDE * SIDE * 4) as u64;
    // Constants: [placeholder, weight, bias (12 bytes, padded to 16), scalar].
    let seg = segments[0];
    let old = &orig[seg.as_usize()];
    let mut data = vec![fill; nbytes as usize];
    data.extend_from_slice(&old[48..64]);
    data.extend_from_slice(&old[64..68]);
    // Bytes of no tensor after the constants: the weight is under half of the file, so its
    // commit stays in place, through the journal.
    data.resize(data.len() + 2 * nbytes as usize, 0x5a);
    program.constant_segment.as_mut().unwrap().offsets = Some(vec![0, 0, nbytes, nbytes + 16]);
    program.segments.as_mut().unwrap()[0].size = data.len() as u64;
    let fb = pack_program(&program, 16);
    let (head, base) = pte_program_region(&fb, 16, 128, data.len() as u64, true);
    let mut out = head;
    out.resize(base as usize, 0);
    out.extend_from_slice(&data);
    std::fs::write(path, &out).unwrap();
    (base, nbytes)
}

/// Whether `range` of the file is entirely `a` or entirely `b`.
fn uniform(bytes: &[u8], fill: u8) -> bool {
    bytes.iter().all(|&x| x == fill)
}

/// Mounts `model`, writes `data` to `path` of the mount from another thread, SIGKILLs the
/// daemon after `delay` and unmounts; returns the model file's bytes after the kill.
fn kill_during_write(
    model: &Path, mnt: &Path, path: &str, data: Vec<u8>, delay: Duration,
) -> Vec<u8> {
    let daemon = common::mount::mount_foreground(model, mnt);
    kill_while_writing(daemon, mnt, mnt.join(path), data, delay);
    std::fs::read(model).unwrap()
}

/// Writes `data` to `target` from another thread, SIGKILLs `daemon` after `delay` and
/// unmounts `mnt`.
fn kill_while_writing(
    mut daemon: std::process::Child, mnt: &Path, target: PathBuf, data: Vec<u8>, delay: Duration,
) {
    let writer = std::thread::spawn(move || {
        // Errors are expected: the daemon dies under the writer.
        let _ = std::fs::write(&target, &data);
    });
    std::thread::sleep(delay);
    // SAFETY: a signal to the daemon this test started.
    unsafe {
        libc::kill(daemon.id() as i32, libc::SIGKILL);
    }
    let _ = daemon.wait();
    common::force_unmount(mnt);
    writer.join().unwrap();
}

/// Mounts `model`, writes `data` to `path` of the mount and unmounts; returns how long the
/// write and its commit took. Kill delays are drawn from a multiple of this, so that kills
/// land before, during and after commits on a fast machine as on a slow one.
fn timed_write(model: &Path, mnt: &Path, path: &str, data: &[u8]) -> Duration {
    let mut child = common::mount::mount_foreground(model, mnt);
    let start = Instant::now();
    std::fs::write(mnt.join(path), data).unwrap();
    let took = start.elapsed();
    common::force_unmount(mnt);
    let _ = child.kill();
    let _ = child.wait();
    took
}

/// A kill delay for `round`: the first rounds kill at once and late, the rest at a random
/// point of up to 1.5 times `span`.
fn kill_delay(rng: &mut common::Rng, round: usize, span: Duration) -> Duration {
    let span = span.as_micros() as u64;
    match round {
        0 => Duration::ZERO,
        1 => Duration::from_micros(span * 2),
        _ => Duration::from_micros(rng.below(span * 3 / 2 + 1)),
    }
}

/// Mounts `model` again, which replays a whole journal and discards a torn one, and reads
/// `path` through it; returns what the mount showed and the model file's bytes after.
fn remount_and_read(model: &Path, mnt: &Path, path: &str, round: usize) -> (Vec<u8>, Vec<u8>) {
    let mut child = common::mount::mount_foreground(model, mnt);
    let seen = std::fs::read(mnt.join(path)).unwrap();
    common::force_unmount(mnt);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        !ptefs::edit::journal::journal_path(model).exists(),
        "round {round}: journal survived the remount"
    );
    let left = ptefs::edit::relayout::leftovers(model);
    assert!(
        left.is_empty(),
        "round {round}: {left:?} survived the remount"
    );
    (seen, std::fs::read(model).unwrap())
}

#[test]
fn sigkill_during_commits_leaves_old_or_new() {
    if common::fuse_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model: PathBuf = dir.path().join("big.pte");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let (base, nbytes) = big_model(&model, 0x11);
    let range = base as usize..(base + nbytes) as usize;
    let pristine = std::fs::read(&model).unwrap();
    let journal = ptefs::edit::journal::journal_path(&model);
    let mut rng = common::Rng::new(0x5eed_1234_abcd_ef01);
    let span = timed_write(&model, &mnt, WEIGHT, &vec![0x22; nbytes as usize]);
    let mut current = 0x22u8;
    let (mut saw_old, mut saw_new, mut saw_journal) = (0, 0, 0);
    for round in 0..40 {
        let next = if current == 0x11 { 0x22 } else { 0x11 };
        let delay = kill_delay(&mut rng, round, span);
        let after = kill_during_write(&model, &mnt, WEIGHT, vec![next; nbytes as usize], delay);
        assert_eq!(after.len(), pristine.len(), "round {round}: size changed");
        assert_eq!(
            &after[..range.start],
            &pristine[..range.start],
            "round {round}: bytes before the tensor changed"
        );
        assert_eq!(
            &after[range.end..],
            &pristine[range.end..],
            "round {round}: bytes after the tensor changed"
        );
        let tensor = &after[range.clone()];
        let whole = uniform(tensor, current) || uniform(tensor, next);
        if journal.exists() {
            saw_journal += 1;
        } else {
            assert!(
                whole,
                "round {round}: torn tensor with no journal to replay"
            );
        }

        let (seen, after) = remount_and_read(&model, &mnt, WEIGHT, round);
        let tensor = &after[range.clone()];
        assert_eq!(
            seen, tensor,
            "round {round}: the mount showed other bytes than the file"
        );
        if uniform(tensor, next) {
            saw_new += 1;
            current = next;
        } else {
            assert!(
                uniform(tensor, current),
                "round {round}: torn after remount"
            );
            saw_old += 1;
        }
    }
    eprintln!("old {saw_old}, new {saw_new}, interrupted with a journal {saw_journal}");
    assert!(
        saw_old > 0 && saw_new > 0,
        "kills should land both before and after commits"
    );
}

/// Tensors of the bulk model: `BULK_TENSORS` of FLOAT[256, 256] (256 KiB each).
const BULK_TENSORS: usize = 16;
const BULK_SIDE: i32 = 256;
const BULK_BYTES: usize = (BULK_SIDE * BULK_SIDE * 4) as usize;

/// A `.ptd` of `BULK_TENSORS` named tensors, each in its own segment, filled with `fill`;
/// returns where the segments start.
fn bulk_model(path: &Path, fill: u8) -> usize {
    many_tensor_ptd(path, BULK_TENSORS, BULK_SIDE, |_, chunk| chunk.fill(fill)) as usize
}

/// A safetensors file setting every tensor of the bulk model to `fill`.
fn bulk_update(fill: u8) -> Vec<u8> {
    let names: Vec<String> = (0..BULK_TENSORS).map(layer_name).collect();
    let shape = [BULK_SIDE as u64, BULK_SIDE as u64];
    let tensors: Vec<_> = names
        .iter()
        .map(|n| (n.as_str(), "F32", &shape[..], BULK_BYTES as u64))
        .collect();
    let mut out = safetensors::header(&tensors);
    out.resize(out.len() + BULK_TENSORS * BULK_BYTES, fill);
    out
}

/// Which fill every tensor of the bulk model has, when all have the same one.
fn bulk_state(bytes: &[u8], base: usize) -> Option<u8> {
    let data = &bytes[base..base + BULK_TENSORS * BULK_BYTES];
    let fill = data[0];
    uniform(data, fill).then_some(fill)
}

#[test]
fn sigkill_during_bulk_commits_leaves_all_old_or_all_new() {
    if common::fuse_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model: PathBuf = dir.path().join("bulk.ptd");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let base = bulk_model(&model, 0x11);
    let pristine = std::fs::read(&model).unwrap();
    let journal = ptefs::edit::journal::journal_path(&model);
    let mut rng = common::Rng::new(0xb01c_5eed_0000_0042);
    let weights = "weights.safetensors";
    let span = timed_write(&model, &mnt, weights, &bulk_update(0x22));
    let mut current = 0x22u8;
    let (mut saw_old, mut saw_new, mut saw_copy) = (0, 0, 0);
    for round in 0..30 {
        let next = if current == 0x11 { 0x22 } else { 0x11 };
        let delay = kill_delay(&mut rng, round, span);
        let after = kill_during_write(&model, &mnt, weights, bulk_update(next), delay);
        assert_eq!(after.len(), pristine.len(), "round {round}: size changed");
        assert_eq!(
            &after[..base],
            &pristine[..base],
            "round {round}: the header or flatbuffer changed"
        );
        // The update rewrites the whole file: a new copy, never a journal.
        assert!(!journal.exists(), "round {round}: a journal was written");
        if !ptefs::edit::relayout::leftovers(&model).is_empty() {
            saw_copy += 1;
        }
        let state = bulk_state(&after, base);
        assert!(
            state == Some(current) || state == Some(next),
            "round {round}: a mix of old and new tensors"
        );

        let layer = "named_data/layer07.weight.bin";
        let (seen, after) = remount_and_read(&model, &mnt, layer, round);
        let state = bulk_state(&after, base);
        assert_eq!(
            seen,
            &after[base + 7 * BULK_BYTES..base + 8 * BULK_BYTES],
            "round {round}: the mount showed other bytes than the file"
        );
        if state == Some(next) {
            saw_new += 1;
            current = next;
        } else {
            assert_eq!(state, Some(current), "round {round}: a mix after remount");
            saw_old += 1;
        }
    }
    eprintln!("old {saw_old}, new {saw_new}, a finished copy not yet renamed {saw_copy}");
    assert!(
        saw_old > 0 && saw_new > 0,
        "kills should land both before and after commits"
    );
}

/// The LoRA fixture's files (program, foundation and LoRA weights), mounted together on
/// `mnt`: what `weights.safetensors` at the root shows, read and unmounted.
fn read_root_weights(files: &[PathBuf], mnt: &Path) -> Vec<u8> {
    let mut child = common::mount::mount_foreground_with(&files[0], &files[1..], mnt);
    let seen = std::fs::read(mnt.join("weights.safetensors")).unwrap();
    common::force_unmount(mnt);
    let _ = child.kill();
    let _ = child.wait();
    seen
}

/// `weights` with every byte of its tensors' data flipped by `mask`: every tensor of every
/// file changes, and flipping twice gives the first again.
fn flipped(weights: &[u8], mask: u8) -> Vec<u8> {
    let n = u64::from_le_bytes(weights[..8].try_into().unwrap()) as usize;
    let mut out = weights.to_vec();
    for b in &mut out[8 + n..] {
        *b ^= mask;
    }
    out
}

/// Which of `sides` (each the bytes of every file) the files hold now, every file whole;
/// `None` for a mix.
fn side_of(files: &[PathBuf], sides: &[Vec<Vec<u8>>; 2]) -> Option<usize> {
    let now: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    (0..2).find(|&s| sides[s] == now)
}

#[test]
fn sigkill_during_multi_file_commits_leaves_every_file_all_old_or_all_new() {
    if common::fuse_missing() {
        return;
    }
    let copied = common::copy_fixture("llama_lora.pte");
    let files: Vec<PathBuf> = std::iter::once(copied.model.clone())
        .chain(copied.data.iter().cloned())
        .collect();
    assert_eq!(files.len(), 3);
    let mnt = copied.root.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let read_files =
        || -> Vec<Vec<u8>> { files.iter().map(|f| std::fs::read(f).unwrap()).collect() };
    let journals = || {
        files
            .iter()
            .filter(|f| ptefs::edit::journal::journal_path(f).exists())
            .count()
    };

    // Side 0: the fixture; side 1: every tensor of every file flipped, through the mount.
    let weights = [read_root_weights(&files, &mnt), Vec::new()];
    let weights = [weights[0].clone(), flipped(&weights[0], 0x5a)];
    let before = read_files();
    let mut child = common::mount::mount_foreground_with(&files[0], &files[1..], &mnt);
    let start = Instant::now();
    std::fs::write(mnt.join("weights.safetensors"), &weights[1]).unwrap();
    let span = start.elapsed();
    common::force_unmount(&mnt);
    let _ = child.kill();
    let _ = child.wait();
    let sides = [before, read_files()];
    for (k, f) in files.iter().enumerate() {
        assert_ne!(
            sides[0][k],
            sides[1][k],
            "{}: the update changed nothing",
            f.display()
        );
    }

    let mut rng = common::Rng::new(0x3f11_e5ee_d000_0007);
    let mut current = 1;
    let (mut saw_old, mut saw_new, mut saw_journal) = (0, 0, 0);
    for round in 0..24 {
        let next = 1 - current;
        let delay = kill_delay(&mut rng, round, span);
        let daemon = common::mount::mount_foreground_with(&files[0], &files[1..], &mnt);
        let target = mnt.join("weights.safetensors");
        kill_while_writing(daemon, &mnt, target, weights[next].clone(), delay);
        if journals() > 0 {
            saw_journal += 1;
        } else {
            assert!(
                side_of(&files, &sides).is_some(),
                "round {round}: a mix of old and new files with no journal to replay"
            );
        }

        // Every other round, one file alone is recovered first (by `ptefs recover`): it
        // finishes or discards the whole commit, never half of it.
        if round % 2 == 1 {
            let one = &files[1 + round / 2 % 2];
            let out = common::mount::run(Command::new(common::mount::BIN).arg("recover").arg(one));
            assert!(
                out.status.success(),
                "round {round}: ptefs recover {}: {}",
                one.display(),
                common::mount::text(&out.stderr)
            );
            assert!(
                side_of(&files, &sides).is_some(),
                "round {round}: a mix after recovering {} alone: {}",
                one.display(),
                common::mount::text(&out.stdout)
            );
        }
        let seen = read_root_weights(&files, &mnt);
        assert_eq!(
            journals(),
            0,
            "round {round}: a journal survived the remount"
        );
        let side = side_of(&files, &sides)
            .unwrap_or_else(|| panic!("round {round}: a mix after the remount"));
        assert_eq!(
            seen, weights[side],
            "round {round}: the mount showed other bytes than the files"
        );
        if side == next {
            saw_new += 1;
            current = next;
        } else {
            assert_eq!(side, current);
            saw_old += 1;
        }
    }
    eprintln!("old {saw_old}, new {saw_new}, interrupted with a journal {saw_journal}");
    assert!(
        saw_old > 0 && saw_new > 0,
        "kills should land both before and after commits"
    );
}
