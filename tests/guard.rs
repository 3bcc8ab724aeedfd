//! A model file truncated by another process while mapped: touching the lost pages must not
//! kill the process, and reads must fail with EIO instead of serving zeros.

mod common;

use ptefs::format::ModelFile;

#[test]
fn sigbus_on_a_truncated_mapping_is_survived_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.pte");
    // A real fixture followed by many pages of padding, so pages past the cut exist.
    let mut bytes = common::fixture_bytes("linear.pte");
    bytes.resize(bytes.len() + (1 << 20), 0xab);
    std::fs::write(&path, &bytes).unwrap();
    let file = ModelFile::open(&path).unwrap();
    assert!(!file.poisoned());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    // Touch every page of the mapping from user space, as a copy would.
    let mapped = file.mapped().unwrap();
    let mut sum = 0u64;
    for i in (0..mapped.len()).step_by(4096) {
        sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(&mapped[i]) } as u64);
    }
    assert!(file.poisoned(), "the lost pages were noticed (sum {sum})");
}
