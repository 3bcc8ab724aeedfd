//! The hostile and edge-case uploads of `tests/corpus/` (written by its `generate.py`, each
//! described in the README of its folder), read by ptefs's parsers and by the reference
//! readers: NumPy's `np.load` for `.npy`, the `safetensors` package (`safe_open`,
//! `deserialize`) for safetensors.
//!
//! What ptefs does with each file is fixed in a table here and checked on every run. With a
//! `python3` that has NumPy and safetensors, every file is also read by the reference, and
//! the two must agree: when both accept, on the dtype (as NumPy names it, byte order
//! included), the shape and the data (the bytes ptefs would write, against the array's
//! bytes in C order); a file the reference refuses ptefs refuses too. Where the reference
//! accepts and ptefs refuses, the table says why, and the reference must really accept it.
//! Without such a `python3` the test fails, unless `PTEFS_TESTS_WITHOUT_PYTHON` is set.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ptefs::format::{npy, safetensors};
use serde_json::Value;

/// What ptefs does with a corpus file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Accepted, as the reference reads it.
    Accept,
    /// Refused, as the reference refuses it.
    Refuse,
    /// Refused, though the reference accepts it: why its reading is not taken.
    Stricter(&'static str),
}

use Verdict::{Accept, Refuse, Stricter};

const TWICE: &str = "a key given twice: the reference keeps the last, an ambiguity no writer makes";
const SYNTAX: &str = "Python syntax no .npy writer uses, read by rules ptefs does not follow";
const NOT_A_TENSOR: &str = "a dtype no tensor has, or not in the form a writer writes";

const NPY: &[(&str, Verdict)] = &[
    ("big_endian_f4.npy", Accept),
    ("bool.npy", Accept),
    ("bool_dim.npy", Refuse),
    ("c_order_f4.npy", Accept),
    ("comment.npy", Stricter(SYNTAX)),
    ("complex_c16.npy", Accept),
    ("concatenated_key.npy", Stricter(SYNTAX)),
    ("data_short.npy", Refuse),
    ("descr_escape.npy", Stricter(SYNTAX)),
    ("descr_in_another_string.npy", Stricter(NOT_A_TENSOR)),
    ("descr_leading_zero.npy", Stricter(NOT_A_TENSOR)),
    ("descr_name.npy", Stricter(NOT_A_TENSOR)),
    ("descr_not_a_type.npy", Refuse),
    ("descr_twice.npy", Stricter(TWICE)),
    ("double_quotes.npy", Accept),
    ("equals_f4.npy", Accept),
    ("extra_key.npy", Refuse),
    (
        "fortran_matrix.npy",
        Stricter("Fortran order of two dimensions above 1: the data would have to be transposed"),
    ),
    ("fortran_not_bool.npy", Refuse),
    ("fortran_twice.npy", Stricter(TWICE)),
    ("fortran_vector.npy", Accept),
    ("header_cut.npy", Refuse),
    ("header_too_long.npy", Refuse),
    ("indented_after.npy", Stricter(SYNTAX)),
    ("int_not_tuple.npy", Refuse),
    ("keys_reordered.npy", Accept),
    ("leading_newline.npy", Stricter(SYNTAX)),
    ("leading_zero_dim.npy", Refuse),
    ("longdouble.npy", Stricter(NOT_A_TENSOR)),
    ("minor_version.npy", Refuse),
    ("missing_shape.npy", Refuse),
    ("newlines.npy", Accept),
    ("no_order_f4.npy", Accept),
    ("nul_padding.npy", Refuse),
    ("parenthesized_bool.npy", Stricter(SYNTAX)),
    ("pipe_f4.npy", Accept),
    ("prefixed_key.npy", Stricter(SYNTAX)),
    ("python2_long.npy", Accept),
    ("raw_v2.npy", Accept),
    ("scalar_f8.npy", Accept),
    ("shape_twice.npy", Stricter(TWICE)),
    ("structured.npy", Stricter(NOT_A_TENSOR)),
    ("subarray_descr.npy", Refuse),
    (
        "trailing_data.npy",
        Stricter("bytes after the data: the reference ignores them, ptefs takes all it is given"),
    ),
    ("u1_big_marker.npy", Accept),
    ("unpadded.npy", Accept),
    ("version2.npy", Accept),
    ("version3.npy", Accept),
    ("version3_long.npy", Refuse),
    ("version4.npy", Refuse),
    ("zero_zero_dim.npy", Stricter(SYNTAX)),
];

const SAFETENSORS: &[(&str, Verdict)] = &[
    ("array_entry.safetensors", Accept),
    ("bf16.safetensors", Accept),
    ("bom.safetensors", Refuse),
    ("deep_extra.safetensors", Refuse),
    ("e8m0.safetensors", Accept),
    ("empty_tensors.safetensors", Accept),
    ("end_before_begin.safetensors", Refuse),
    ("enum_object_dtype.safetensors", Accept),
    ("escaped_names.safetensors", Accept),
    ("extra_field.safetensors", Accept),
    ("f4_odd.safetensors", Refuse),
    ("f4_packed.safetensors", Accept),
    ("field_twice.safetensors", Refuse),
    ("float_dim.safetensors", Refuse),
    ("gap.safetensors", Refuse),
    ("huge_number_extra.safetensors", Refuse),
    ("length_over_limit.safetensors", Refuse),
    ("length_past_end.safetensors", Refuse),
    ("lowercase_dtype.safetensors", Refuse),
    ("metadata_key_twice.safetensors", Accept),
    ("metadata_number.safetensors", Refuse),
    ("metadata_twice.safetensors", Refuse),
    ("missing_field.safetensors", Refuse),
    ("name_twice.safetensors", Stricter(TWICE)),
    ("negative_dim.safetensors", Refuse),
    ("negative_zero.safetensors", Refuse),
    ("no_tensors.safetensors", Accept),
    ("not_utf8.safetensors", Refuse),
    ("nul_padding.safetensors", Refuse),
    ("null_metadata.safetensors", Accept),
    ("offsets_twice.safetensors", Refuse),
    ("out_of_order.safetensors", Accept),
    ("overlap.safetensors", Refuse),
    ("plain.safetensors", Accept),
    ("short_data.safetensors", Refuse),
    ("size_mismatch.safetensors", Refuse),
    ("size_overflow.safetensors", Refuse),
    ("surrogate_extra.safetensors", Refuse),
    ("text.safetensors", Refuse),
    ("three_offsets.safetensors", Refuse),
    ("too_short.safetensors", Refuse),
    ("top_array.safetensors", Refuse),
    ("trailing_data.safetensors", Refuse),
    ("unknown_dtype.safetensors", Refuse),
    ("whitespace.safetensors", Accept),
    ("with_metadata.safetensors", Accept),
];

/// What a reader made of a file: its tensors by name as (dtype, shape, data), or why it
/// refused it. A `.npy` is one tensor named "".
type Reading = Result<BTreeMap<String, (String, Vec<u64>, Vec<u8>)>, String>;

fn corpus(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(kind)
}

/// The `.npy` as ptefs takes it for a tensor: a header NumPy reads the same way, data in C
/// order, exactly as many bytes as the header declares.
fn ptefs_npy(bytes: &[u8]) -> Reading {
    let h = npy::parse_header(bytes).map_err(|e| e.to_string())?;
    if !h.is_c_order() {
        return Err("Fortran order".into());
    }
    let data = &bytes[h.data_offset..];
    if h.nbytes() != Some(data.len() as u64) {
        return Err(format!("{} bytes of data for {:?}", data.len(), h.nbytes()));
    }
    Ok(BTreeMap::from([(
        String::new(),
        (h.descr, h.shape, data.to_vec()),
    )]))
}

fn ptefs_safetensors(bytes: &[u8]) -> Reading {
    let h = safetensors::parse(bytes, bytes.len() as u64).map_err(|e| e.to_string())?;
    Ok(h.tensors
        .into_iter()
        .map(|t| {
            let at = (h.data_start + t.begin) as usize..(h.data_start + t.end) as usize;
            (t.name, (t.dtype.to_string(), t.shape, bytes[at].to_vec()))
        })
        .collect())
}

/// Reads every file of a corpus folder with NumPy (`npy`) or safetensors, printing one JSON
/// object: file name to {"ok": true, "tensors": {name: [dtype, shape, hex data]}} or
/// {"ok": false, "error": ...}.
const REFERENCE: &str = r#"
import sys, json, os, warnings
kind, folder = sys.argv[1], sys.argv[2]
out = {}
for name in sorted(os.listdir(folder)):
    if name == "README.md":
        continue
    path = os.path.join(folder, name)
    try:
        if kind == "npy":
            import numpy as np
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                a = np.load(path, allow_pickle=False)
            tensors = {"": [a.dtype.str, list(a.shape), a.tobytes(order="C").hex()]}
        else:
            from safetensors import safe_open, deserialize
            tensors = {}
            with safe_open(path, "np") as f:
                for k in f.keys():
                    s = f.get_slice(k)
                    tensors[k] = [s.get_dtype(), list(s.get_shape()), None]
            with open(path, "rb") as f:
                for k, t in deserialize(f.read()):
                    tensors[k][2] = bytes(t["data"]).hex()
        out[name] = {"ok": True, "tensors": tensors}
    except Exception as e:
        out[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
print(json.dumps(out))
"#;

/// A `python3` with NumPy and safetensors, if there is one.
fn reference_python() -> Option<&'static str> {
    ["python3", "/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|cand| {
            Command::new(cand)
                .args(["-c", "import numpy, safetensors"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

/// The reference's reading of every file of the `kind` corpus.
fn reference(python: &str, kind: &str) -> BTreeMap<String, Reading> {
    let out = Command::new(python)
        .arg("-c")
        .arg(REFERENCE)
        .arg(kind)
        .arg(corpus(kind))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: BTreeMap<String, Value> = serde_json::from_slice(&out.stdout).unwrap();
    all.into_iter()
        .map(|(file, v)| {
            let reading = if v["ok"].as_bool().unwrap() {
                let tensors = v["tensors"].as_object().unwrap();
                Ok(tensors
                    .iter()
                    .map(|(name, t)| {
                        let shape = t[1].as_array().unwrap();
                        let hex = t[2].as_str().unwrap();
                        let data = (0..hex.len())
                            .step_by(2)
                            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                            .collect();
                        (
                            name.clone(),
                            (
                                t[0].as_str().unwrap().to_string(),
                                shape.iter().map(|d| d.as_u64().unwrap()).collect(),
                                data,
                            ),
                        )
                    })
                    .collect())
            } else {
                Err(v["error"].as_str().unwrap().to_string())
            };
            (file, reading)
        })
        .collect()
}

/// Every file of the `kind` corpus, by name, and the names its README describes.
fn files(kind: &str) -> (BTreeMap<String, Vec<u8>>, Vec<String>) {
    let dir = corpus(kind);
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if name != "README.md" {
            let bytes = std::fs::read(dir.join(&name)).unwrap();
            files.insert(name, bytes);
        }
    }
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    let mut described: Vec<String> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("- `")?.split('`').next())
        .map(str::to_string)
        .collect();
    described.sort();
    (files, described)
}

fn check(kind: &str, table: &[(&str, Verdict)], read: fn(&[u8]) -> Reading) {
    let (files, described) = files(kind);
    let listed: Vec<&str> = table.iter().map(|(f, _)| *f).collect();
    let on_disk: Vec<&str> = files.keys().map(String::as_str).collect();
    assert_eq!(listed, on_disk, "the table and tests/corpus/{kind} differ");
    assert_eq!(
        described, on_disk,
        "the README and tests/corpus/{kind} differ"
    );

    let ours: BTreeMap<&str, Reading> = files
        .iter()
        .map(|(name, bytes)| (name.as_str(), read(bytes)))
        .collect();
    for (file, verdict) in table {
        match (&ours[file], verdict) {
            (Ok(_), Accept) | (Err(_), Refuse | Stricter(_)) => {}
            (got, _) => panic!("{kind}/{file}: expected {verdict:?}, ptefs read {got:?}"),
        }
    }

    let Some(python) = reference_python() else {
        if std::env::var_os("PTEFS_TESTS_WITHOUT_PYTHON").is_some() {
            eprintln!("skipped the reference readers: no python3 with numpy and safetensors, and PTEFS_TESTS_WITHOUT_PYTHON is set");
            return;
        }
        panic!("no python3 with numpy and safetensors found: install them (see .ci/run), or set PTEFS_TESTS_WITHOUT_PYTHON=1 to skip the comparison");
    };
    let theirs = reference(python, kind);
    for (file, verdict) in table {
        let (ours, theirs) = (&ours[file], &theirs[*file]);
        match (ours, theirs, verdict) {
            (Ok(a), Ok(b), _) => assert_eq!(a, b, "{kind}/{file}: ptefs and the reference read it differently"),
            (Err(_), Err(_), Refuse | Accept) => {}
            (Err(e), Ok(_), Stricter(_)) => eprintln!("{kind}/{file}: the reference accepts it; ptefs refuses it: {e}"),
            (Err(_), Err(e), Stricter(why)) => panic!(
                "{kind}/{file}: listed as refused though the reference accepts it ({why}), but the reference refuses it too: {e}"
            ),
            (Err(e), Ok(_), _) => panic!("{kind}/{file}: the reference accepts it, ptefs refuses it: {e}"),
            (Ok(_), Err(e), _) => panic!("{kind}/{file}: ptefs accepts it, the reference refuses it: {e}"),
        }
    }
}

#[test]
fn npy_corpus_agrees_with_numpy() {
    check("npy", NPY, ptefs_npy);
}

#[test]
fn safetensors_corpus_agrees_with_the_safetensors_package() {
    check("safetensors", SAFETENSORS, ptefs_safetensors);
}
