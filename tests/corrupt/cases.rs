//! The corpus: every fixture truncated, with bytes flipped, with absurd header fields and
//! with each structured edit, plus the regressions found by fuzzing.

use std::path::{Path, PathBuf};

use crate::common::{self, fixture_files, manifests, Rng};
use crate::edits::{ptd_edits, pte_edits, FLAGGED_PTD_EDITS, FLAGGED_PTE_EDITS};
use crate::mutate::{
    flat_tensor_of, has_eh00, is_ptd, program_of, rebuild_ptd, rebuild_pte, regions, Edit, HUGE,
};
use ptefs::format::Model;
use ptefs::format::{Kind, ModelFile};

/// One corrupted input: the files to open (index 0 is the model file, the rest attached
/// `.ptd` files) and, when the corruption must be refused, words one of which the refusal
/// names.
pub struct Case {
    pub name: String,
    pub files: Vec<(PathBuf, Vec<u8>)>,
    pub must_refuse: Option<&'static [&'static str]>,
    /// Whether it must be refused or opened with at least one defect from `check`.
    pub must_flag: bool,
}

impl Case {
    /// Writes the case's files into `dir` as `<prefix><k>-<file name>`; their paths, the
    /// model file first.
    pub fn write_to(&self, dir: &Path, prefix: &str) -> Vec<PathBuf> {
        self.files
            .iter()
            .enumerate()
            .map(|(k, (p, b))| {
                let name = p.file_name().unwrap().to_string_lossy();
                let to = dir.join(format!("{prefix}{k}-{name}"));
                std::fs::write(&to, b).unwrap();
                to
            })
            .collect()
    }
}

pub struct Fixture {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    /// The `.ptd` files it is opened with.
    pub data: Vec<(PathBuf, Vec<u8>)>,
    /// For a `.ptd`: a `.pte` that attaches it, and that `.pte`'s other data files.
    pub user: Option<(PathBuf, Vec<u8>)>,
}

pub fn fixtures() -> Vec<Fixture> {
    let read = |p: &Path| std::fs::read(p).unwrap();
    let pairs: Vec<(PathBuf, Vec<PathBuf>)> =
        manifests().iter().map(|m| fixture_files(m)).collect();
    pairs
        .iter()
        .map(|(path, data)| Fixture {
            path: path.clone(),
            bytes: read(path),
            data: data.iter().map(|d| (d.clone(), read(d))).collect(),
            user: pairs
                .iter()
                .find(|(_, d)| d.contains(path))
                .map(|(p, _)| (p.clone(), read(p))),
        })
        .collect()
}

/// A case of the fixture with `bytes` in place of the fixture's own; a corrupted `.ptd` is
/// also tried attached to a `.pte` that uses it.
pub fn cases_of(
    f: &Fixture, name: String, bytes: Vec<u8>, must_refuse: Option<&'static [&'static str]>,
) -> Vec<Case> {
    let mut files = vec![(f.path.clone(), bytes.clone())];
    files.extend(f.data.iter().cloned());
    let mut out = vec![Case {
        name: name.clone(),
        files,
        must_refuse,
        must_flag: false,
    }];
    if let Some((pte, pte_bytes)) = &f.user {
        out.push(Case {
            name: format!("{name} attached to {}", pte.display()),
            files: vec![(pte.clone(), pte_bytes.clone()), (f.path.clone(), bytes)],
            must_refuse,
            must_flag: false,
        });
    }
    out
}

pub fn truncations(f: &Fixture, out: &mut Vec<Case>) {
    let len = f.bytes.len();
    let stride = (len / 97).max(1);
    let mut cuts: Vec<usize> = (0..len.min(160)).collect();
    cuts.extend((160..len).step_by(stride));
    cuts.extend(len.saturating_sub(8)..len);
    cuts.sort_unstable();
    cuts.dedup();
    for cut in cuts {
        let name = format!("{} truncated to {cut}", f.path.display());
        // With eh00/FH01 the header says how long the file is: every cut must be refused.
        let refuse: Option<&'static [&'static str]> =
            (has_eh00(&f.bytes) || is_ptd(&f.bytes)).then_some(&[""]);
        out.extend(cases_of(f, name, f.bytes[..cut].to_vec(), refuse));
    }
}

pub fn flips(f: &Fixture, rng: &mut Rng, n: usize, out: &mut Vec<Case>) {
    let (program_end, _) = regions(&f.bytes);
    for k in 0..n {
        let mut b = f.bytes.clone();
        let flips = 1 + rng.below(4);
        let mut what = Vec::new();
        for _ in 0..flips {
            // Most flips in the flatbuffer, some in the fixed headers.
            let at = if rng.below(5) == 0 {
                rng.below(48.min(b.len() as u64)) as usize
            } else {
                8 + rng.below(program_end as u64 - 8) as usize
            };
            let v = match rng.below(4) {
                0 => 0xff,
                1 => 0x00,
                2 => b[at] ^ (1 << rng.below(8)),
                _ => rng.next() as u8,
            };
            b[at] = v;
            what.push(format!("{at}={v:#x}"));
        }
        let name = format!("{} flip #{k} [{}]", f.path.display(), what.join(" "));
        out.extend(cases_of(f, name, b, None));
    }
}

pub fn header_fields(f: &Fixture, out: &mut Vec<Case>) {
    let len = f.bytes.len() as u64;
    let (program_end, base) = regions(&f.bytes);
    let (program_end, base) = (program_end as u64, base as u64);
    let mut push = |name: String, b: Vec<u8>, refuse: Option<&'static [&'static str]>| {
        out.extend(cases_of(
            f,
            format!("{} {name}", f.path.display()),
            b,
            refuse,
        ));
    };
    let set32 = |at: usize, v: u32| {
        let mut b = f.bytes.clone();
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        b
    };
    let set64 = |at: usize, v: u64| {
        let mut b = f.bytes.clone();
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        b
    };
    const ROOT: &[&str] = &["root table offset"];
    for v in [
        0u32,
        4,
        7,
        len as u32,
        len as u32 - 3,
        u32::MAX,
        0x8000_0000,
    ] {
        push(format!("root offset {v}"), set32(0, v), Some(ROOT));
    }
    for v in [8u32, program_end as u32 - 4, program_end as u32 / 2 + 1] {
        push(format!("root offset {v}"), set32(0, v), None);
    }
    for id in [b"ET13", b"FT02", b"\0\0\0\0", b"et12"] {
        let mut b = f.bytes.clone();
        b[4..8].copy_from_slice(id);
        push(format!("identifier {id:?}"), b, Some(&["identifier"]));
    }
    let mut b = f.bytes.clone();
    b[4..8].copy_from_slice(if is_ptd(&f.bytes) { b"ET12" } else { b"FT01" });
    push("identifier of the other kind".into(), b, None);
    if is_ptd(&f.bytes) {
        const FH01: &[&str] = &["FH01"];
        for v in [0u32, 39, 41, 1000, len as u32, u32::MAX] {
            let refuse = (v < 40 || v as u64 + 8 > len).then_some(FH01);
            push(format!("FH01 length {v}"), set32(12, v), refuse);
        }
        let mut b = f.bytes.clone();
        b[8..12].copy_from_slice(b"FH02");
        push("FH01 magic".into(), b, Some(FH01));
        for (at, field) in [
            (16, "flatbuffer_offset"),
            (24, "flatbuffer_size"),
            (32, "segment_base_offset"),
            (40, "segment_data_size"),
        ] {
            for v in [len + 1, HUGE, u64::MAX, u64::MAX - 7] {
                push(format!("{field} {v}"), set64(at, v), Some(&["FH01"]));
            }
            for v in [0, 1, 48, program_end, base, len] {
                push(format!("{field} {v}"), set64(at, v), None);
            }
        }
        return;
    }
    if !has_eh00(&f.bytes) {
        // A bare flatbuffer: put an absurd eh00 in front of it.
        let mut b = f.bytes.clone();
        b[8..12].copy_from_slice(b"eh00");
        push("eh00 spliced over a bare flatbuffer".into(), b, None);
        return;
    }
    const LEN: &[&str] = &["eh00"];
    for v in [0u32, 1, 23] {
        push(
            format!("eh00 length {v}"),
            set32(12, v),
            Some(&["eh00 header length"]),
        );
    }
    for v in [len as u32, u32::MAX, 0x8000_0000] {
        push(format!("eh00 length {v}"), set32(12, v), Some(LEN));
    }
    for v in [24u32, 25, 31, 33, 40, 64] {
        push(format!("eh00 length {v}"), set32(12, v), None);
    }
    let mut b = f.bytes.clone();
    b[8..12].copy_from_slice(b"eh01");
    push("eh01 magic".into(), b, None);
    const PS: &[&str] = &["program_size", "root table offset"];
    for v in [len + 1, HUGE, u64::MAX, u64::MAX - 7, 0, 1, 39] {
        push(format!("program_size {v}"), set64(16, v), Some(PS));
    }
    for v in [40, 64, program_end - 1, program_end + 1, base, len] {
        push(format!("program_size {v}"), set64(16, v), None);
    }
    const SB: &[&str] = &["segment_base_offset", "segment data"];
    for v in [len + 1, HUGE, u64::MAX, u64::MAX - 7, 1, program_end - 1] {
        push(format!("segment_base_offset {v}"), set64(24, v), Some(SB));
    }
    for v in [0, program_end, base - 1, base + 1, len] {
        push(format!("segment_base_offset {v}"), set64(24, v), None);
    }
    const SD: &[&str] = &["segment_data_size"];
    for v in [len - base + 1, len, HUGE, u64::MAX, u64::MAX - base + 1] {
        push(format!("segment_data_size {v}"), set64(32, v), Some(SD));
    }
    for v in [0, 1, len - base - 1] {
        push(format!("segment_data_size {v}"), set64(32, v), None);
    }
}

/// The cases of one structured edit; `must_flag` when `check` has to report it.
pub fn edited_cases(f: &Fixture, name: &str, bytes: Vec<u8>, must_flag: bool) -> Vec<Case> {
    cases_of(f, format!("{} {name}", f.path.display()), bytes, None)
        .into_iter()
        .map(|c| Case { must_flag, ..c })
        .collect()
}

pub fn structured(f: &Fixture, out: &mut Vec<Case>) {
    if is_ptd(&f.bytes) {
        let ft = flat_tensor_of(&f.bytes);
        edited(f, ft, rebuild_ptd, ptd_edits(), FLAGGED_PTD_EDITS, out);
    } else {
        let program = program_of(&f.bytes);
        edited(f, program, rebuild_pte, pte_edits(), FLAGGED_PTE_EDITS, out);
    }
}

/// The fixture rebuilt from its unpacked root `table`, as it is and with each edit of
/// `edits` that applies; `flagged` names the edits `check` must report.
fn edited<T: Clone>(
    f: &Fixture, table: T, rebuild: fn(&[u8], &T) -> Vec<u8>, edits: Vec<(String, Edit<T>)>,
    flagged: &[&str], out: &mut Vec<Case>,
) {
    out.extend(cases_of(
        f,
        format!("{} rebuilt", f.path.display()),
        rebuild(&f.bytes, &table),
        None,
    ));
    for (name, edit) in edits {
        let mut t = table.clone();
        if edit(&mut t) {
            let flag = flagged.iter().any(|e| name.starts_with(e));
            out.extend(edited_cases(f, &name, rebuild(&f.bytes, &t), flag));
        }
    }
}

/// An input the fuzzer found crashing: a fixture, bytes written over it at offsets, and the
/// length it is cut to.
type Regression = (
    &'static str,
    &'static [(usize, &'static [u8])],
    Option<usize>,
);

const REGRESSIONS: &[Regression] = &[];

pub fn regressions(out: &mut Vec<Case>) {
    for (k, (name, patches, cut)) in REGRESSIONS.iter().enumerate() {
        let path = common::fixtures_dir().join(name);
        let mut bytes = std::fs::read(&path).unwrap();
        for (at, new) in patches.iter() {
            bytes[*at..*at + new.len()].copy_from_slice(new);
        }
        if let Some(cut) = cut {
            bytes.truncate(*cut);
        }
        out.push(Case {
            name: format!("regression {k} ({name})"),
            files: vec![(path, bytes)],
            must_refuse: None,
            must_flag: false,
        });
    }
}

pub fn corpus() -> Vec<Case> {
    // Seeded: the corpus is the same on every run.
    let mut rng = Rng::new(0x5eed_2026_0001);
    let mut out = Vec::new();
    for f in fixtures() {
        truncations(&f, &mut out);
        flips(&f, &mut rng, 150, &mut out);
        header_fields(&f, &mut out);
        structured(&f, &mut out);
    }
    crate::payloads::cases(&mut out);
    regressions(&mut out);
    out
}

/// The rebuilt fixtures used by the structured corruptions are sound before corruption.
#[test]
pub fn rebuilt_fixtures_are_sound() {
    for f in fixtures() {
        let b = if is_ptd(&f.bytes) {
            rebuild_ptd(&f.bytes, &flat_tensor_of(&f.bytes))
        } else {
            rebuild_pte(&f.bytes, &program_of(&f.bytes))
        };
        let mut files = vec![ModelFile::from_bytes(&f.path, b).unwrap()];
        for (p, d) in &f.data {
            files.push(ModelFile::from_bytes(p, d.clone()).unwrap());
        }
        let model = Model::from_files(files).unwrap();
        if let Kind::Pte(_) = model.files[0].kind {
            assert!(
                model.pte_layout.as_ref().unwrap().defects.is_empty(),
                "{}",
                f.path.display()
            );
        }
        let bare_add = !has_eh00(&f.bytes) && !is_ptd(&f.bytes);
        let defects = ptefs::check::defects(&model);
        assert!(
            defects.is_empty() || bare_add,
            "{}: {defects:?}",
            f.path.display()
        );
    }
}
