//! Every fixture's tree, compared field by field with its manifest (computed by ExecuTorch's
//! own deserializer) through the core API: paths, bytes, JSON, `.npy`, xattrs, `check`.
//!
//! Fixtures are discovered from the `*.json` manifests in `tests/fixtures` and
//! `tests/fixtures/extra`; nothing about a particular fixture is written here.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use common::{fixture_files, load_json, manifests, read_all, sha256_hex, walk};
use ptefs::catalog::names::{dedupe, encode};
use ptefs::fs::{FileType, Fs};
use ptefs::tree::{Content, Ino, Tree};

/// One opened fixture and the mismatches found in it.
struct Ctx {
    name: String,
    manifest: Value,
    file: PathBuf,
    data: Vec<PathBuf>,
    fs: Fs,
    tree: Arc<Tree>,
    errors: Vec<String>,
}

impl Ctx {
    fn open(manifest_path: &Path) -> Ctx {
        let (file, data) = fixture_files(manifest_path);
        let fs = ptefs::commands::open_fs(&file, &data)
            .unwrap_or_else(|e| panic!("{}: cannot open: {e}", file.display()));
        let tree = fs.tree();
        Ctx {
            name: file.file_name().unwrap().to_string_lossy().into_owned(),
            manifest: load_json(manifest_path),
            file,
            data,
            fs,
            tree,
            errors: Vec::new(),
        }
    }

    fn err(&mut self, msg: String) {
        self.errors.push(format!("{}: {msg}", self.name));
    }

    fn eq<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, expected: T, found: T) {
        if expected != found {
            self.err(format!("{what}: expected {expected:?}, found {found:?}"));
        }
    }

    /// Compares JSON values, numbers by value (1 == 1.0).
    fn json_eq(&mut self, what: &str, expected: &Value, found: &Value) {
        if !same_json(expected, found) {
            self.err(format!("{what}: expected {expected}, found {found}"));
        }
    }

    /// Compares each field of an expected object with the same field found (a found object
    /// may have more); an expected non-object means the found value must be null.
    fn fields_eq(&mut self, what: &str, expected: &Value, found: &Value) {
        match expected.as_object() {
            None => self.json_eq(what, &Value::Null, found),
            Some(fields) => {
                for (k, v) in fields {
                    self.json_eq(&format!("{what}.{k}"), v, &found[k]);
                }
            }
        }
    }

    fn ino(&mut self, path: &str) -> Option<Ino> {
        let ino = self.tree.find(path);
        if ino.is_none() {
            self.err(format!("{path}: missing from the tree"));
        }
        ino
    }

    /// Reads a file of the tree; mismatches of the size in `getattr` are errors.
    fn read(&mut self, path: &str) -> Option<Vec<u8>> {
        let ino = self.ino(path)?;
        match read_all(&self.fs, ino, 1 << 20) {
            Ok(bytes) => {
                let size = self.fs.getattr(ino).map(|a| a.size).unwrap_or(u64::MAX);
                self.eq(&format!("{path}: getattr size"), bytes.len() as u64, size);
                Some(bytes)
            }
            Err(e) => {
                self.err(format!("{path}: read failed: {e}"));
                None
            }
        }
    }

    fn json(&mut self, path: &str) -> Option<Value> {
        let bytes = self.read(path)?;
        match serde_json::from_slice(&bytes) {
            Ok(v) => Some(v),
            Err(e) => {
                self.err(format!("{path}: not JSON: {e}"));
                None
            }
        }
    }

    /// A blob's `.bin`: its size and sha256.
    fn check_bin(&mut self, path: &str, nbytes: &Value, sha: &Value) -> Option<Vec<u8>> {
        let bytes = self.read(path)?;
        if let Some(n) = nbytes.as_u64() {
            self.eq(&format!("{path}: size"), n, bytes.len() as u64);
        }
        if let Some(sha) = sha.as_str() {
            self.eq(
                &format!("{path}: sha256"),
                sha.to_string(),
                sha256_hex(&bytes),
            );
        }
        Some(bytes)
    }

    /// A `.npy`: version 1.0 header padded to 64 bytes, the dtype and physical shape of the
    /// tensor, then exactly the bytes of the `.bin`.
    fn check_npy(
        &mut self, path: &str, scalar_type: &str, sizes: &[u64], order: &[u64], bin: &[u8],
    ) {
        let Some(npy) = self.read(path) else { return };
        if let Err(e) = check_npy_bytes(&npy, scalar_type, sizes, order, bin) {
            self.err(format!("{path}: {e}"));
        }
    }

    fn finish(self) -> Vec<String> {
        self.errors
    }
}

fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_json(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

/// NumPy descr of an ExecuTorch scalar type (docs/tree.md#tensor-bytes); raw `|V<n>` where
/// NumPy has none.
fn numpy_descr(scalar_type: &str) -> Option<&'static str> {
    Some(match scalar_type {
        "BYTE" | "QUINT8" => "|u1",
        "CHAR" | "QINT8" => "|i1",
        "SHORT" => "<i2",
        "INT" | "QINT32" => "<i4",
        "LONG" => "<i8",
        "HALF" => "<f2",
        "FLOAT" => "<f4",
        "DOUBLE" => "<f8",
        "COMPLEXHALF" => "|V4",
        "COMPLEXFLOAT" => "<c8",
        "COMPLEXDOUBLE" => "<c16",
        "BOOL" => "|b1",
        "BFLOAT16" | "BITS16" => "|V2",
        "QUINT4X2" | "QUINT2X4" | "BITS1X8" | "BITS2X4" | "BITS4X2" | "BITS8" => "|V1",
        "FLOAT8E5M2" | "FLOAT8E4M3FN" | "FLOAT8E5M2FNUZ" | "FLOAT8E4M3FNUZ" => "|V1",
        "UINT16" => "<u2",
        "UINT32" => "<u4",
        "UINT64" => "<u8",
        _ => return None,
    })
}

/// The text between the quotes after `'key':` in a NumPy header dict.
fn npy_field<'a>(dict: &'a str, key: &str) -> Option<&'a str> {
    let rest = &dict[dict.find(&format!("'{key}':"))? + key.len() + 3..];
    Some(rest.trim_start())
}

fn check_npy_bytes(
    npy: &[u8], scalar_type: &str, sizes: &[u64], order: &[u64], bin: &[u8],
) -> Result<(), String> {
    if npy.len() < 10 || &npy[..6] != b"\x93NUMPY" {
        return Err("no \\x93NUMPY magic".into());
    }
    if npy[6..8] != [1, 0] {
        return Err(format!("version {}.{}, expected 1.0", npy[6], npy[7]));
    }
    let hlen = u16::from_le_bytes([npy[8], npy[9]]) as usize;
    let data_at = 10 + hlen;
    if data_at > npy.len() {
        return Err(format!("header length {hlen} past the end"));
    }
    if data_at % 64 != 0 {
        return Err(format!("header ends at {data_at}, not a multiple of 64"));
    }
    if npy[data_at - 1] != b'\n' {
        return Err("header does not end with a newline".into());
    }
    let dict = std::str::from_utf8(&npy[10..data_at]).map_err(|_| "header is not UTF-8")?;
    let dict = dict.trim_end();
    if !dict.starts_with('{') || !dict.ends_with('}') {
        return Err(format!("header is not a dict: {dict:?}"));
    }
    let expected_descr =
        numpy_descr(scalar_type).ok_or_else(|| format!("no descr known for {scalar_type}"))?;
    let descr = npy_field(dict, "descr").ok_or("no descr")?;
    if !descr.starts_with(&format!("'{expected_descr}'")) {
        return Err(format!("descr {descr:?}, expected '{expected_descr}'"));
    }
    let fortran = npy_field(dict, "fortran_order").ok_or("no fortran_order")?;
    if !fortran.starts_with("False") {
        return Err(format!("fortran_order {fortran:?}, expected False"));
    }
    let shape_text = npy_field(dict, "shape").ok_or("no shape")?;
    let shape_text = &shape_text[..shape_text.find(')').ok_or("shape is not a tuple")? + 1];
    let shape: Vec<u64> = shape_text
        .trim_matches(|c| c == '(' || c == ')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| format!("shape {shape_text}")))
        .collect::<Result<_, _>>()?;
    let physical: Vec<u64> = order.iter().map(|&d| sizes[d as usize]).collect();
    if shape != physical {
        return Err(format!(
            "shape {shape:?}, expected {physical:?} (sizes {sizes:?} in dim_order {order:?})"
        ));
    }
    if sizes.len() == 1 && !shape_text.contains(",)") {
        return Err(format!("a 1-d shape is written (n,), found {shape_text}"));
    }
    if &npy[data_at..] != bin {
        return Err("data part differs from the .bin".into());
    }
    Ok(())
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn plan_dirs(m: &Value) -> Vec<String> {
    let plans = m["plans"].as_array().cloned().unwrap_or_default();
    dedupe(plans.iter().map(|p| encode(str_of(&p["name"]))))
}

fn named_data_bases(entries: &Value) -> Vec<String> {
    let entries = entries.as_array().cloned().unwrap_or_default();
    dedupe(entries.iter().map(|n| encode(str_of(&n["key"]))))
}

fn data_stems(data: &[PathBuf]) -> Vec<String> {
    dedupe(
        data.iter()
            .map(|d| encode(&d.file_stem().unwrap().to_string_lossy())),
    )
}

/// Manifests of the attached `.ptd` files, with their `data/<stem>/` prefixes.
fn attached(c: &Ctx) -> Vec<(String, PathBuf, Value)> {
    data_stems(&c.data)
        .into_iter()
        .zip(&c.data)
        .map(|(stem, d)| {
            let mut j = d.clone().into_os_string();
            j.push(".json");
            (format!("data/{stem}/"), d.clone(), load_json(Path::new(&j)))
        })
        .collect()
}

fn for_each_fixture(check: impl Fn(&mut Ctx)) {
    let all = manifests();
    assert!(!all.is_empty(), "no fixture manifests found");
    let mut errors = Vec::new();
    for m in &all {
        let mut c = Ctx::open(m);
        check(&mut c);
        errors.extend(c.finish());
    }
    assert!(
        errors.is_empty(),
        "{} mismatches:\n{}",
        errors.len(),
        errors.join("\n")
    );
}

/// Runs `check` on every plan of every fixture, with the plan's manifest entry and its
/// directory name under `plans/`.
fn for_each_plan(check: impl Fn(&mut Ctx, &Value, &str)) {
    for_each_fixture(|c| {
        let plans = c.manifest["plans"].as_array().cloned().unwrap_or_default();
        for (p, plan) in plans.iter().zip(plan_dirs(&c.manifest)) {
            check(c, p, &plan);
        }
    });
}

/// Whether `decode_payload` decodes Vulkan payloads (and so the tree shows `vulkan/`).
fn vulkan_payloads_decode() -> bool {
    !matches!(
        ptefs::backend::decode_payload(ptefs::backend::vulkan::BACKEND_ID, b"\0\0\0\0VK00"),
        Err(ptefs::backend::NotDecoded::NoDecoder)
    )
}

#[test]
fn tree_paths_equal_the_tree_lists() {
    for_each_fixture(|c| {
        let list = c.file.with_extension(format!(
            "{}.tree",
            c.file.extension().unwrap().to_string_lossy()
        ));
        let text =
            std::fs::read_to_string(&list).unwrap_or_else(|e| panic!("{}: {e}", list.display()));
        let mut expected: BTreeSet<String> = text.lines().map(str::to_string).collect();
        // The lists name the `vulkan/` directories of decoded Vulkan delegates. While the
        // dispatcher has no Vulkan decoder the tree shows none; once it has one, they count.
        if !vulkan_payloads_decode() {
            expected.retain(|p| !p.contains("/vulkan/"));
        }
        let found: BTreeSet<String> = walk(&c.fs).into_iter().map(|(p, _, _)| p).collect();
        for p in expected.difference(&found) {
            c.err(format!("{p}: listed in {} but missing", list.display()));
        }
        for p in found.difference(&expected) {
            c.err(format!("{p}: in the tree but not listed"));
        }
        // `ptefs ls -R` prints the same list.
        let mut out = Vec::new();
        ptefs::commands::ls(&c.fs, "", false, true, &mut out).unwrap();
        let ls: BTreeSet<String> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        c.eq("ls -R", &expected, &ls);
        // Read-only offline view: files 0444, directories 0555; sizes match reads.
        for (path, ino, kind) in walk(&c.fs) {
            let a = c.fs.getattr(ino).unwrap();
            let perm = if kind == FileType::Directory {
                0o555
            } else {
                0o444
            };
            c.eq(&format!("{path}: mode"), perm, a.perm);
            if kind == FileType::RegularFile {
                let n = read_all(&c.fs, ino, 1 << 20).unwrap().len() as u64;
                c.eq(&format!("{path}: size vs bytes read"), a.size, n);
            }
        }
    });
}

#[test]
fn header_json_matches_the_manifest() {
    for_each_fixture(|c| {
        let mut files = vec![(String::new(), c.file.clone(), c.manifest.clone())];
        files.extend(attached(c));
        for (prefix, path, m) in files {
            let Some(h) = c.json(&format!("{prefix}header.json")) else {
                continue;
            };
            let mh = &m["header"];
            c.json_eq(
                &format!("{prefix}header.json root_offset"),
                &mh["root_offset"],
                &h["root_offset"],
            );
            c.json_eq(
                &format!("{prefix}header.json identifier"),
                &mh["magic"],
                &h["identifier"],
            );
            c.json_eq(
                &format!("{prefix}header.json file_size"),
                &m["size"],
                &h["file_size"],
            );
            let size = std::fs::metadata(&path).unwrap().len();
            c.eq(
                &format!("{prefix}header.json file_size vs disk"),
                Some(size),
                h["file_size"].as_u64(),
            );
            c.fields_eq(
                &format!("{prefix}header.json extended_header"),
                &mh["extended"],
                &h["extended_header"],
            );
        }
    });
}

#[test]
fn segments_match_the_manifest() {
    for_each_fixture(|c| {
        let mut files = vec![(String::new(), c.manifest.clone())];
        files.extend(attached(c).into_iter().map(|(p, _, m)| (p, m)));
        for (prefix, m) in files {
            let segs = m["segments"].as_array().cloned().unwrap_or_default();
            for (n, s) in segs.iter().enumerate() {
                let path = format!("{prefix}segments/{n}");
                c.check_bin(&path, &s["size"], &s["sha256"]);
                if let Some(ino) = c.tree.find(&path) {
                    let off = xattr(&c.fs, ino, "user.ptefs.offset");
                    c.eq(
                        &format!("{path}: user.ptefs.offset"),
                        s["file_offset"].as_u64().map(|o| o.to_string()),
                        off,
                    );
                }
            }
        }
    });
}

/// Where the manifest says a tensor's bytes are: (file, absolute offset).
fn expected_location(c: &Ctx, v: &Value) -> Option<(PathBuf, u64)> {
    let m = &c.manifest;
    let segment_at = |m: &Value, sub: &Value, idx: u64| -> Option<u64> {
        let seg = &m["segments"][sub["segment_index"].as_u64()? as usize];
        Some(seg["file_offset"].as_u64()? + sub["offsets"][idx as usize].as_u64()?)
    };
    let idx = v["data_buffer_idx"].as_u64()?;
    match str_of(&v["data"]) {
        "constant" if m["constant_buffer_count"].as_u64().unwrap_or(0) == 0 => {
            Some((c.file.clone(), segment_at(m, &m["constant_segment"], idx)?))
        }
        "mutable_initial_state" => Some((
            c.file.clone(),
            segment_at(m, &m["mutable_data_segments"][0], idx)?,
        )),
        "external" => {
            let fqn = v["extra_tensor_info"]["fully_qualified_name"].as_str()?;
            attached(c).into_iter().find_map(|(_, path, pm)| {
                let nd = pm["named_data"]
                    .as_array()?
                    .iter()
                    .find(|n| n["key"].as_str() == Some(fqn))?
                    .clone();
                let seg = &pm["segments"][nd["segment_index"].as_u64()? as usize];
                Some((path, seg["file_offset"].as_u64()?))
            })
        }
        _ => None,
    }
}

/// The sha256 of a tensor's bytes: in the manifest, or for an EXTERNAL tensor in the
/// manifest of the attached `.ptd` that holds its key (of the first `nbytes` of that blob).
fn expected_sha256(c: &Ctx, v: &Value) -> Value {
    if !v["sha256"].is_null() || str_of(&v["data"]) != "external" {
        return v["sha256"].clone();
    }
    let Some(fqn) = v["extra_tensor_info"]["fully_qualified_name"].as_str() else {
        return Value::Null;
    };
    let Some(nbytes) = v["nbytes"].as_u64() else {
        return Value::Null;
    };
    for (_, path, pm) in attached(c) {
        let Some(nd) = pm["named_data"]
            .as_array()
            .and_then(|a| a.iter().find(|n| n["key"].as_str() == Some(fqn)))
        else {
            continue;
        };
        if nd["nbytes"].as_u64() == Some(nbytes) {
            return nd["sha256"].clone();
        }
        let seg = &pm["segments"][nd["segment_index"].as_u64().unwrap_or(u64::MAX) as usize];
        let Some(start) = seg["file_offset"].as_u64() else {
            return Value::Null;
        };
        let bytes = std::fs::read(&path).unwrap();
        let part = &bytes[start as usize..(start + nbytes) as usize];
        return Value::from(sha256_hex(part));
    }
    Value::Null
}

/// What `file` in the JSON names: the file's own name, without its directory.
fn file_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

fn check_tensor(c: &mut Ctx, dir: &str, i: usize, v: &Value, j: &Value) {
    let at = format!("{dir}/{i}.json");
    for key in [
        "scalar_type",
        "sizes",
        "dim_order",
        "shape_dynamism",
        "data_buffer_idx",
        "nbytes",
    ] {
        c.json_eq(&format!("{at} {key}"), &v[key], &j[key]);
    }
    c.fields_eq(
        &format!("{at} allocation_info"),
        &v["allocation_info"],
        &j["allocation_info"],
    );
    let data = match str_of(&v["data"]) {
        "mutable_initial_state" => "mutable",
        other => other,
    };
    c.eq(&format!("{at} data"), data, str_of(&j["data"]));
    let eti = &v["extra_tensor_info"];
    c.json_eq(
        &format!("{at} fully_qualified_name"),
        &eti.get("fully_qualified_name")
            .cloned()
            .unwrap_or(Value::Null),
        &j["fully_qualified_name"],
    );
    if let Some(e) = eti.as_object() {
        for (k, x) in e {
            c.json_eq(
                &format!("{at} extra_tensor_info.{k}"),
                x,
                &j["extra_tensor_info"][k],
            );
        }
    }
    let bin_path = format!("{dir}/{i}.bin");
    let sha = expected_sha256(c, v);
    if sha.is_null() {
        if c.tree.find(&bin_path).is_some() {
            c.err(format!(
                "{bin_path}: the manifest has no bytes for this tensor"
            ));
        }
        c.json_eq(
            &format!("{at} file_offset"),
            &Value::Null,
            &j["file_offset"],
        );
        return;
    }
    let Some(bin) = c.check_bin(&bin_path, &v["nbytes"], &sha) else {
        return;
    };
    let ino = c.tree.find(&bin_path).unwrap();
    if let Some((file, off)) = expected_location(c, v) {
        c.eq(
            &format!("{at} file_offset"),
            Some(off),
            j["file_offset"].as_u64(),
        );
        c.eq(
            &format!("{at} file"),
            Some(file_name(&file)),
            j["file"].as_str().map(str::to_string),
        );
        c.eq(
            &format!("{bin_path}: user.ptefs.offset"),
            Some(off.to_string()),
            xattr(&c.fs, ino, "user.ptefs.offset"),
        );
    }
    let st = str_of(&v["scalar_type"]).to_string();
    c.eq(
        &format!("{bin_path}: user.ptefs.dtype"),
        Some(st.clone()),
        xattr(&c.fs, ino, "user.ptefs.dtype"),
    );
    let shape =
        xattr(&c.fs, ino, "user.ptefs.shape").and_then(|s| serde_json::from_str::<Value>(&s).ok());
    c.json_eq(
        &format!("{bin_path}: user.ptefs.shape"),
        &v["sizes"],
        &shape.unwrap_or(Value::Null),
    );
    let order = xattr(&c.fs, ino, "user.ptefs.dim_order")
        .and_then(|s| serde_json::from_str::<Value>(&s).ok());
    c.json_eq(
        &format!("{bin_path}: user.ptefs.dim_order"),
        &v["dim_order"],
        &order.unwrap_or(Value::Null),
    );
    c.check_npy(
        &format!("{dir}/{i}.npy"),
        &st,
        &u64s(&v["sizes"]),
        &u64s(&v["dim_order"]),
        &bin,
    );
}

fn xattr(fs: &Fs, ino: Ino, name: &str) -> Option<String> {
    fs.getxattr(ino, name)
        .ok()
        .map(|v| String::from_utf8(v).expect("xattrs are text"))
}

#[test]
fn values_match_the_manifest() {
    for_each_plan(|c, p, plan| {
        let dir = format!("plans/{plan}/values");
        for (i, v) in p["values"].as_array().into_iter().flatten().enumerate() {
            c.json_eq(
                &format!("{dir}: manifest index"),
                &v["index"],
                &Value::from(i),
            );
            let Some(j) = c.json(&format!("{dir}/{i}.json")) else {
                continue;
            };
            let at = format!("{dir}/{i}.json");
            c.eq(&format!("{at} index"), Some(i as u64), j["index"].as_u64());
            c.json_eq(&format!("{at} type"), &v["kind"], &j["type"]);
            match str_of(&v["kind"]) {
                "Tensor" => check_tensor(c, &dir, i, v, &j),
                kind => {
                    for key in ["value", "items"] {
                        if let Some(x) = v.get(key) {
                            c.json_eq(&format!("{at} {key}"), x, &j[key]);
                        }
                    }
                    if kind == "IntList" {
                        let values = int_list_values(&p["values"], &v["items"]);
                        c.json_eq(&format!("{at} values"), &values, &j["values"]);
                    }
                }
            }
        }
    });
}

/// The integers an IntList's items stand for, from the manifest: the value of each Int
/// they index, null for an item that is not an Int.
fn int_list_values(values: &Value, items: &Value) -> Value {
    let items = items.as_array().cloned().unwrap_or_default();
    Value::from(
        items
            .iter()
            .map(|i| {
                let v = i.as_u64().map_or(&Value::Null, |i| &values[i as usize]);
                if v["kind"] == "Int" {
                    v["value"].clone()
                } else {
                    Value::Null
                }
            })
            .collect::<Vec<_>>(),
    )
}

/// What `plan.json`'s `signature` says of one input or output, from the manifest.
fn signature_entry(values: &Value, index: &Value) -> Value {
    let v = &values[index.as_u64().unwrap() as usize];
    let mut e = serde_json::json!({ "index": index, "type": v["kind"] });
    match str_of(&v["kind"]) {
        "Tensor" => {
            for k in ["scalar_type", "sizes", "dim_order", "shape_dynamism"] {
                e[k] = v[k].clone();
            }
        }
        "Int" | "Bool" | "Double" => e["value"] = v["value"].clone(),
        _ => {}
    }
    e
}

#[test]
fn plan_json_signature_matches_the_manifest() {
    for_each_plan(|c, p, plan| {
        let path = format!("plans/{plan}/plan.json");
        let Some(j) = c.json(&path) else { return };
        for side in ["inputs", "outputs"] {
            let indices = p[side].as_array().cloned().unwrap_or_default();
            let expected: Vec<Value> = indices
                .iter()
                .map(|i| signature_entry(&p["values"], i))
                .collect();
            c.json_eq(
                &format!("{path} signature.{side}"),
                &Value::from(expected),
                &j["signature"][side],
            );
            c.json_eq(
                &format!("{path} signature.{side}_total"),
                &Value::from(indices.len()),
                &j["signature"][format!("{side}_total")],
            );
        }
    });
    // The fixtures cover dynamic shapes and non-tensor outputs.
    let mut kinds = BTreeSet::new();
    for m in manifests() {
        let m = load_json(&m);
        for p in m["plans"].as_array().into_iter().flatten() {
            for i in p["inputs"].as_array().into_iter().flatten() {
                let v = &p["values"][i.as_u64().unwrap() as usize];
                kinds.insert(format!(
                    "{} {}",
                    str_of(&v["kind"]),
                    str_of(&v["shape_dynamism"])
                ));
            }
            for i in p["outputs"].as_array().into_iter().flatten() {
                let v = &p["values"][i.as_u64().unwrap() as usize];
                kinds.insert(str_of(&v["kind"]).to_string());
            }
        }
    }
    for k in ["Tensor DYNAMIC_BOUND", "Tensor STATIC", "Int", "Bool"] {
        assert!(
            kinds.contains(k),
            "no fixture has a signature entry {k}: {kinds:?}"
        );
    }
}

#[test]
fn plans_operators_and_instructions_match_the_manifest() {
    for_each_plan(|c, p, plan| {
        let dir = format!("plans/{plan}");
        let ops: Vec<String> = p["operators"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| match str_of(&o["overload"]) {
                "" => str_of(&o["name"]).to_string(),
                ov => format!("{}.{ov}", str_of(&o["name"])),
            })
            .collect();
        if let Some(text) = c.read(&format!("{dir}/operators.txt")) {
            let text = String::from_utf8(text).unwrap();
            let expected: Vec<String> = ops
                .iter()
                .enumerate()
                .map(|(i, o)| format!("{i}\t{o}"))
                .collect();
            c.eq(
                &format!("{dir}/operators.txt"),
                expected,
                text.lines().map(str::to_string).collect(),
            );
            if !text.is_empty() && !text.ends_with('\n') {
                c.err(format!("{dir}/operators.txt: no final newline"));
            }
        }
        let instrs = p["instructions"].as_array().cloned().unwrap_or_default();
        if let Some(text) = c.read(&format!("{dir}/instructions.txt")) {
            let text = String::from_utf8(text).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            c.eq(
                &format!("{dir}/instructions.txt lines"),
                instrs.len(),
                lines.len(),
            );
            let delegates = p["delegates"].as_array().cloned().unwrap_or_default();
            for (k, (ins, line)) in instrs.iter().zip(&lines).enumerate() {
                let at = format!("{dir}/instructions.txt line {k}");
                let values: Vec<String> = line
                    .split(|ch: char| !(ch == '%' || ch.is_ascii_digit()))
                    .filter(|t| t.starts_with('%'))
                    .map(str::to_string)
                    .collect();
                let args: Vec<String> =
                    u64s(&ins["args"]).iter().map(|a| format!("%{a}")).collect();
                let shows = match str_of(&ins["kind"]) {
                    "KernelCall" => ins["op_index"]
                        .as_u64()
                        .and_then(|o| ops.get(o as usize).cloned()),
                    "DelegateCall" => ins["delegate_index"]
                        .as_u64()
                        .and_then(|d| delegates.get(d as usize))
                        .map(|d| str_of(&d["id"]).to_string()),
                    _ => None,
                };
                if let Some(name) = shows {
                    if !line.contains(&name) {
                        c.err(format!("{at}: {line:?} does not name {name}"));
                    }
                    c.eq(&format!("{at} arguments"), args, values);
                }
            }
        }
        let Some(j) = c.json(&format!("{dir}/plan.json")) else {
            return;
        };
        for key in ["name", "inputs", "outputs", "non_const_buffer_sizes"] {
            c.json_eq(&format!("{dir}/plan.json {key}"), &p[key], &j[key]);
        }
        let counts = &j["counts"];
        let n = |v: &Value| Value::from(v.as_array().map_or(0, Vec::len));
        for k in ["values", "operators", "instructions", "delegates"] {
            c.json_eq(
                &format!("{dir}/plan.json counts.{k}"),
                &n(&p[k]),
                &counts[k],
            );
        }
    });
}

#[test]
fn delegates_match_the_manifest() {
    for_each_plan(|c, p, plan| {
        let segments = c.manifest["segments"].clone();
        for (k, d) in p["delegates"].as_array().into_iter().flatten().enumerate() {
            let dir = format!("plans/{plan}/delegates/{k}");
            c.check_bin(&format!("{dir}/processed.bin"), &d["nbytes"], &d["sha256"]);
            let Some(j) = c.json(&format!("{dir}/delegate.json")) else {
                continue;
            };
            c.eq(
                &format!("{dir}/delegate.json index"),
                Some(k as u64),
                j["index"].as_u64(),
            );
            c.json_eq(&format!("{dir}/delegate.json id"), &d["id"], &j["id"]);
            c.json_eq(
                &format!("{dir}/delegate.json processed.location"),
                &d["location"],
                &j["processed"]["location"],
            );
            c.json_eq(
                &format!("{dir}/delegate.json processed.index"),
                &d["index"],
                &j["processed"]["index"],
            );
            c.json_eq(
                &format!("{dir}/delegate.json nbytes"),
                &d["nbytes"],
                &j["nbytes"],
            );
            if let Some(specs) = d.get("compile_specs") {
                let n = |v: &Value| v.as_array().map_or(0, Vec::len);
                c.eq(
                    &format!("{dir}/delegate.json compile_specs"),
                    n(specs),
                    n(&j["compile_specs"]),
                );
            }
            if str_of(&d["location"]) == "SEGMENT" {
                let seg = d["index"].as_u64().map(|s| &segments[s as usize]);
                c.json_eq(
                    &format!("{dir}/delegate.json file_offset"),
                    &seg.map_or(Value::Null, |s| s["file_offset"].clone()),
                    &j["file_offset"],
                );
            }
        }
    });
}

/// `named_data/` of the model file, or of an attached `.ptd` under its prefix.
fn check_named_data(c: &mut Ctx, prefix: &str, m: &Value) {
    let bases = named_data_bases(&m["named_data"]);
    let is_ptd = m["kind"] == "ptd";
    for (nd, base) in m["named_data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .zip(bases)
    {
        let at = format!("{prefix}named_data/{base}");
        let bin = c.check_bin(&format!("{at}.bin"), &nd["nbytes"], &nd["sha256"]);
        if let Some(j) = c.json(&format!("{at}.json")) {
            c.json_eq(&format!("{at}.json key"), &nd["key"], &j["key"]);
            c.json_eq(
                &format!("{at}.json segment_index"),
                &nd["segment_index"],
                &j["segment_index"],
            );
            c.json_eq(&format!("{at}.json size"), &nd["nbytes"], &j["size"]);
            let seg = nd["segment_index"]
                .as_u64()
                .map(|s| m["segments"][s as usize]["file_offset"].clone());
            c.json_eq(
                &format!("{at}.json file_offset"),
                &seg.unwrap_or(Value::Null),
                &j["file_offset"],
            );
            if is_ptd {
                c.json_eq(
                    &format!("{at}.json tensor_layout"),
                    nd.get("tensor_layout").unwrap_or(&Value::Null),
                    &j["tensor_layout"],
                );
            }
        }
        let layout = &nd["tensor_layout"];
        match (bin, layout.is_object()) {
            (Some(bin), true) => c.check_npy(
                &format!("{at}.npy"),
                str_of(&layout["scalar_type"]),
                &u64s(&layout["sizes"]),
                &u64s(&layout["dim_order"]),
                &bin,
            ),
            (_, false) if c.tree.find(&format!("{at}.npy")).is_some() => {
                c.err(format!(
                    "{at}.npy: a blob without tensor_layout has no .npy"
                ));
            }
            _ => {}
        }
    }
}

#[test]
fn named_data_matches_the_manifest() {
    for_each_fixture(|c| {
        let m = c.manifest.clone();
        check_named_data(c, "", &m);
        for (prefix, _, pm) in attached(c) {
            check_named_data(c, &prefix, &pm);
        }
    });
}

#[test]
fn program_and_flat_tensor_json_match_the_manifest() {
    for_each_fixture(|c| {
        let m = c.manifest.clone();
        let mut files = vec![(String::new(), m)];
        files.extend(attached(c).into_iter().map(|(p, _, m)| (p, m)));
        for (prefix, m) in files {
            let is_ptd = m["kind"] == "ptd";
            let path = format!(
                "{prefix}{}",
                if is_ptd {
                    "flat_tensor.json"
                } else {
                    "program.json"
                }
            );
            let Some(j) = c.json(&path) else { continue };
            c.json_eq(&format!("{path} version"), &m["version"], &j["version"]);
            let segs: Vec<Value> = m["segments"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| serde_json::json!({ "offset": s["offset"], "size": s["size"] }))
                .collect();
            c.json_eq(
                &format!("{path} segments"),
                &Value::from(segs),
                &j["segments"],
            );
            let nd: Vec<Value> = m["named_data"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|n| {
                    let mut o =
                        serde_json::json!({ "key": n["key"], "segment_index": n["segment_index"] });
                    if is_ptd {
                        o["tensor_layout"] = n.get("tensor_layout").cloned().unwrap_or(Value::Null);
                    }
                    o
                })
                .collect();
            let ours = if j["named_data"].is_null() {
                Value::from(Vec::<Value>::new())
            } else {
                j["named_data"].clone()
            };
            c.json_eq(&format!("{path} named_data"), &Value::from(nd), &ours);
            if is_ptd {
                continue;
            }
            c.json_eq(
                &format!("{path} constant_segment"),
                &m["constant_segment"],
                &j["constant_segment"],
            );
            let ours = if j["mutable_data_segments"].is_null() {
                Value::from(Vec::<Value>::new())
            } else {
                j["mutable_data_segments"].clone()
            };
            c.json_eq(
                &format!("{path} mutable_data_segments"),
                &m["mutable_data_segments"],
                &ours,
            );
            let inline = j["constant_buffer"].as_array().map_or(0, Vec::len) as u64;
            c.eq(
                &format!("{path} constant_buffer count"),
                m["constant_buffer_count"].as_u64().unwrap_or(0),
                inline,
            );
            let plans = j["execution_plan"].as_array().map_or(0, Vec::len);
            c.eq(
                &format!("{path} execution_plan count"),
                m["plans"].as_array().map_or(0, Vec::len),
                plans,
            );
        }
    });
}

#[test]
fn check_finds_no_defects() {
    for_each_fixture(|c| {
        let d = ptefs::check::defects(&c.tree.model);
        c.eq("check::defects", Vec::<String>::new(), d);
        let d = ptefs::commands::check(&c.file, &c.data);
        c.eq("offline::check", Vec::<String>::new(), d);
        let mut out = Vec::new();
        match ptefs::commands::info(&c.fs, &mut out) {
            Ok(()) if !out.is_empty() && out.ends_with(b"\n") => {}
            Ok(()) => c.err("info: empty or unterminated output".into()),
            Err(e) => c.err(format!("info: {e}")),
        }
    });
}

/// The rows of each table of `ptefs info` (a line ending in `:` followed by indented
/// `<label> <count>  <bytes>` lines): label → (count, exact bytes).
fn info_tables(text: &str) -> HashMap<String, BTreeMap<String, (u64, u64)>> {
    let mut tables: HashMap<String, BTreeMap<String, (u64, u64)>> = HashMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if !line.starts_with(' ') {
            current = line
                .strip_suffix(':')
                .map(|t| t.split(" (").next().unwrap().to_string());
            continue;
        }
        let Some(title) = &current else { continue };
        let t: Vec<&str> = line.split_whitespace().collect();
        // `4 B` or `32.0 KiB (32768 B)`: the exact count is the number before the last `B`.
        let (bytes, width) = if t.last() == Some(&"B)") {
            (t[t.len() - 2].trim_start_matches('('), 4)
        } else {
            (t[t.len() - 2], 2)
        };
        let count = t[t.len() - width - 1].parse().unwrap();
        let label = t[..t.len() - width - 1].join(" ");
        tables
            .entry(title.clone())
            .or_default()
            .insert(label, (count, bytes.parse().unwrap()));
    }
    tables
}

/// Adds an item to an expected table: counted under `label`, its bytes once per `place`.
fn tally(
    table: &mut BTreeMap<String, (u64, u64)>, seen: &mut BTreeSet<String>, label: String,
    place: String, bytes: u64,
) {
    let row = table.entry(label).or_default();
    row.0 += 1;
    if seen.insert(place) {
        row.1 += bytes;
    }
}

/// A key's entry in the first file that has it (the program, then the data files in
/// order, as the runtime looks): (file index, its manifest entry).
fn key_entry<'a>(files: &'a [Value], key: &str) -> Option<(usize, &'a Value)> {
    files.iter().enumerate().find_map(|(f, m)| {
        m["named_data"]
            .as_array()?
            .iter()
            .find(|n| n["key"] == key)
            .map(|n| (f, n))
    })
}

fn short_datatype(v: &Value) -> String {
    str_of(&v["datatype"])
        .trim_start_matches("xnn_datatype_")
        .to_string()
}

/// `ptefs info` against the manifests: each method's signature, the tensors by dtype and
/// where their bytes are, named data by what it holds, XNNPACK constants by datatype (from
/// flatc's decoding of each payload), and a line per data file.
#[test]
fn info_summarises_signatures_data_files_and_xnnpack_constants() {
    use ptefs::commands::info::human;
    for_each_fixture(|c| {
        let mut out = Vec::new();
        ptefs::commands::info(&c.fs, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: BTreeSet<&str> = text.lines().collect();
        let tables = info_tables(&text);
        let m = c.manifest.clone();
        let attached = attached(c);
        let mut files = vec![m.clone()];
        files.extend(attached.iter().map(|a| a.2.clone()));
        let expect_line = |c: &mut Ctx, line: String| {
            if !lines.contains(line.as_str()) {
                c.err(format!("info lacks the line {line:?}:\n{text}"));
            }
        };
        let io = |v: &Value, i: &Value| -> String {
            let list = |x: &Value| {
                u64s(x)
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            match str_of(&v["kind"]) {
                "Tensor" => format!(
                    "%{i} {}[{}] dim_order [{}] {}",
                    str_of(&v["scalar_type"]),
                    list(&v["sizes"]),
                    list(&v["dim_order"]),
                    str_of(&v["shape_dynamism"])
                ),
                kind => format!("%{i} {kind} {}", v["value"]),
            }
        };
        let mut tensors = BTreeMap::new();
        let mut seen = BTreeSet::new();
        let mut xnn = BTreeMap::new();
        let mut xnn_seen = BTreeSet::new();
        let mut vk = BTreeMap::new();
        let mut vk_seen = BTreeSet::new();
        // Named keys the payloads read: key → label, for the first reader.
        let mut readers: BTreeMap<String, String> = BTreeMap::new();
        for (p, plan) in m["plans"].as_array().into_iter().flatten().enumerate() {
            let name = str_of(&plan["name"]);
            let values = &plan["values"];
            let inputs = plan["inputs"].as_array().cloned().unwrap_or_default();
            let outputs = plan["outputs"].as_array().cloned().unwrap_or_default();
            let at = |i: &Value| &values[i.as_u64().unwrap() as usize];
            let constant = plan["instructions"].as_array().is_none_or(Vec::is_empty)
                && inputs.is_empty()
                && !outputs.is_empty()
                && outputs.iter().all(|i| at(i)["kind"] != "Tensor");
            if constant {
                let shown: Vec<String> = outputs
                    .iter()
                    .enumerate()
                    .map(|(k, i)| format!("output {k}: {}", io(at(i), i)))
                    .collect();
                expect_line(
                    c,
                    format!("  {name}: constant method; {}", shown.join("; ")),
                );
            } else {
                for (k, i) in inputs.iter().enumerate() {
                    expect_line(c, format!("    input {k}: {}", io(at(i), i)));
                }
                for (k, i) in outputs.iter().enumerate() {
                    expect_line(c, format!("    output {k}: {}", io(at(i), i)));
                }
            }
            for v in values.as_array().into_iter().flatten() {
                let kind = match str_of(&v["data"]) {
                    "constant" => "constant",
                    "mutable_initial_state" => "initial state",
                    "external" => "external",
                    _ => continue,
                };
                let Some((file, offset)) = expected_location(c, v) else {
                    continue;
                };
                tally(
                    &mut tensors,
                    &mut seen,
                    format!("{} {kind}", str_of(&v["scalar_type"])),
                    format!("{}:{offset}", file.display()),
                    v["nbytes"].as_u64().unwrap(),
                );
            }
            for (j, d) in plan["delegates"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                if let Some(x) = d.get("vulkan") {
                    let data = x["constants"].as_array().cloned().unwrap_or_default();
                    for v in x["values"].as_array().into_iter().flatten() {
                        let Some(cid) = v["constant_id"].as_i64().filter(|&c| c >= 0) else {
                            continue;
                        };
                        let dt = str_of(&v["datatype"]).to_lowercase();
                        let e = &data[cid as usize];
                        let key = str_of(&e["named_key"]);
                        let (place, bytes) = match key_entry(&files, key) {
                            Some((f, n)) => (format!("{f}:{key}"), n["nbytes"].as_u64().unwrap()),
                            None => (
                                format!("{p}/{j}@{}", e["offset"]),
                                e["length"].as_u64().unwrap(),
                            ),
                        };
                        tally(&mut vk, &mut vk_seen, dt.clone(), place, bytes);
                        readers
                            .entry(key.to_string())
                            .or_insert(format!("Vulkan {dt}"));
                    }
                }
                let Some(x) = d.get("xnnpack") else { continue };
                let data = x["constant_data"].as_array().cloned().unwrap_or_default();
                for v in x["values"].as_array().into_iter().flatten() {
                    let dt = short_datatype(v);
                    let scale_idx = v["quant"]["scale_buffer_idx"].as_u64().unwrap_or(0);
                    let scales = if v["quant_type"] == "PerChannelGroupQuant" {
                        "bf16"
                    } else {
                        "fp32"
                    };
                    let refs = [
                        (
                            v["constant_buffer_idx"].as_u64().unwrap(),
                            dt.clone(),
                            format!("XNNPACK {dt}"),
                        ),
                        (
                            scale_idx,
                            format!("{dt} scales ({scales})"),
                            format!("XNNPACK {dt} scales"),
                        ),
                    ];
                    for (idx, label, named) in refs {
                        if idx == 0 {
                            continue;
                        }
                        let e = &data[idx as usize];
                        let key = str_of(&e["named_key"]);
                        let (place, bytes) = match key_entry(&files, key) {
                            Some((f, n)) => (format!("{f}:{key}"), n["nbytes"].as_u64().unwrap()),
                            None => (
                                format!("{p}/{j}@{}", e["offset"]),
                                e["size"].as_u64().unwrap(),
                            ),
                        };
                        tally(&mut xnn, &mut xnn_seen, label, place, bytes);
                        readers.entry(key.to_string()).or_insert(named);
                    }
                }
            }
        }
        let mut named = BTreeMap::new();
        let mut named_seen = BTreeSet::new();
        for (f, fm) in files.iter().enumerate() {
            for n in fm["named_data"].as_array().into_iter().flatten() {
                let key = str_of(&n["key"]);
                let read_here = key_entry(&files, key).is_some_and(|(g, _)| g == f);
                let label = match (&n["tensor_layout"]["scalar_type"], readers.get(key)) {
                    (Value::String(st), _) => st.clone(),
                    (_, Some(reader)) if read_here => reader.clone(),
                    _ => "(blob)".to_string(),
                };
                let place = format!("{f}:{}", n["segment_index"]);
                tally(
                    &mut named,
                    &mut named_seen,
                    label,
                    place,
                    n["nbytes"].as_u64().unwrap(),
                );
            }
        }
        let table = |t: &str| tables.get(t).cloned().unwrap_or_default();
        c.eq(
            "info tensor bytes by dtype",
            tensors,
            table("tensor bytes by dtype"),
        );
        c.eq(
            "info named data by dtype",
            named,
            table("named data by dtype"),
        );
        c.eq(
            "info XNNPACK constants",
            xnn,
            table("XNNPACK constants by datatype"),
        );
        c.eq(
            "info Vulkan constants",
            vk,
            table("Vulkan constants by datatype"),
        );
        for (stem_dir, path, pm) in &attached {
            let entries = pm["named_data"].as_array().cloned().unwrap_or_default();
            let tensors = entries
                .iter()
                .filter(|n| n["tensor_layout"].is_object())
                .count();
            let mut segs = BTreeSet::new();
            let bytes: u64 = entries
                .iter()
                .filter(|n| segs.insert(n["segment_index"].as_u64()))
                .map(|n| n["nbytes"].as_u64().unwrap())
                .sum();
            expect_line(
                c,
                format!(
                    "  {} ({stem_dir}): {}, {} keys ({tensors} tensors, {} blobs) holding {}, in {} segments",
                    file_name(path),
                    human(pm["size"].as_u64().unwrap()),
                    entries.len(),
                    entries.len() - tensors,
                    human(bytes),
                    pm["segments"].as_array().map_or(0, Vec::len),
                ),
            );
        }
        // One screen.
        if text.lines().count() > 40 {
            c.err(format!("info is {} lines:\n{text}", text.lines().count()));
        }
    });
}

/// Two copies of a fixture in different directories show the same tree with the same bytes
/// in every file (what `diff -r` of two mounts compares): no generated file names the
/// directory. Only `user.ptefs.file` differs, naming each copy by its absolute path.
#[test]
fn copies_in_different_directories_show_the_same_bytes() {
    for_each_fixture(|c| {
        let a = common::copy_files(&c.file, &c.data);
        let b = common::copy_files(&c.file, &c.data);
        let open = |k: &common::Copied| ptefs::commands::open_fs(&k.model, &k.data).unwrap();
        let (fa, fb) = (open(&a), open(&b));
        let (wa, wb) = (walk(&fa), walk(&fb));
        let paths =
            |w: &[(String, Ino, FileType)]| w.iter().map(|e| e.0.clone()).collect::<Vec<_>>();
        c.eq("paths of the two copies", paths(&wa), paths(&wb));
        for ((path, ia, kind), (_, ib, _)) in wa.iter().zip(&wb) {
            if *kind == FileType::Directory {
                continue;
            }
            let (ba, bb) = (
                read_all(&fa, *ia, 1 << 20).unwrap(),
                read_all(&fb, *ib, 1 << 20).unwrap(),
            );
            if ba != bb {
                c.err(format!(
                    "{path}: differs between copies in {} and {}",
                    a.root.display(),
                    b.root.display()
                ));
            }
            for (k, bytes) in [(&a, &ba), (&b, &bb)] {
                let dir = k.root.to_string_lossy();
                if bytes.windows(dir.len()).any(|w| w == dir.as_bytes()) {
                    c.err(format!("{path}: names the directory {dir}"));
                }
            }
            let names = fa.listxattr(*ia).unwrap();
            c.eq(
                &format!("{path}: xattr names"),
                &names,
                &fb.listxattr(*ib).unwrap(),
            );
            for n in &names {
                let (xa, xb) = (xattr(&fa, *ia, n), xattr(&fb, *ib, n));
                if n != "user.ptefs.file" {
                    c.eq(&format!("{path}: {n}"), &xa, &xb);
                    continue;
                }
                for (k, x) in [(&a, xa), (&b, xb)] {
                    let x = PathBuf::from(x.unwrap_or_default());
                    if x.parent() != Some(k.root.as_path()) {
                        c.err(format!(
                            "{path}: user.ptefs.file {} is not in {}",
                            x.display(),
                            k.root.display()
                        ));
                    }
                }
            }
        }
    });
}

/// Generated text: valid JSON for `.json`, a final newline, the same bytes when rendered
/// again and when the files are opened again.
#[test]
fn text_is_deterministic_and_ends_with_newline() {
    for_each_fixture(|c| {
        let again = ptefs::commands::open_fs(&c.file, &c.data).unwrap().tree();
        let mut texts = HashMap::new();
        for (path, ino, kind) in walk(&c.fs) {
            if kind == FileType::Directory {
                continue;
            }
            let Some(node) = c.tree.node(ino) else {
                continue;
            };
            let Content::Text { kind: tk, .. } = &node.content else {
                continue;
            };
            let first = c.tree.text(ino).unwrap().to_vec();
            let second = ptefs::tree::render::render_to_vec(&c.tree, ino, *tk);
            let third = ptefs::tree::render::render_to_vec(&c.tree, ino, *tk);
            if first != second || second != third {
                c.err(format!("{path}: renders differently on a second call"));
            }
            let other = again
                .find(&path)
                .and_then(|i| again.text(i))
                .map(|t| t.to_vec());
            if other.as_deref() != Some(&first[..]) {
                c.err(format!(
                    "{path}: renders differently after opening the files again"
                ));
            }
            if !first.is_empty() && !first.ends_with(b"\n") {
                c.err(format!("{path}: no final newline"));
            }
            if path.ends_with(".json") {
                if first.is_empty() {
                    c.err(format!("{path}: empty"));
                }
                if let Err(e) = serde_json::from_slice::<Value>(&first) {
                    c.err(format!("{path}: not JSON: {e}"));
                }
            }
            let read = read_all(&c.fs, ino, 7).unwrap();
            if read != first {
                c.err(format!("{path}: 7-byte reads differ from the text"));
            }
            texts.insert(path, first);
        }
        assert!(!texts.is_empty());
    });
}

/// `user.ptefs.offset` and `user.ptefs.file` of every byte-range file point at its bytes in
/// the backing file; `.bin`/`.npy` carry dtype, shape and dim order.
#[test]
fn xattrs_point_at_the_same_bytes_in_the_backing_file() {
    for_each_fixture(|c| {
        let mut backing: HashMap<String, Vec<u8>> = HashMap::new();
        for (path, ino, kind) in walk(&c.fs) {
            if kind == FileType::Directory {
                continue;
            }
            let node = c.tree.node(ino).unwrap();
            let header_len = match &node.content {
                Content::Range(_) => 0,
                Content::Npy { header, .. } => header.len(),
                _ => continue,
            };
            let names = c.fs.listxattr(ino).unwrap();
            let mut wanted = vec!["user.ptefs.file", "user.ptefs.offset"];
            if path.ends_with(".bin") || path.ends_with(".npy") {
                wanted.extend([
                    "user.ptefs.dtype",
                    "user.ptefs.shape",
                    "user.ptefs.dim_order",
                ]);
            }
            for w in &wanted {
                if !names.iter().any(|n| n == w) {
                    c.err(format!("{path}: no xattr {w} (has {names:?})"));
                }
            }
            let (Some(file), Some(offset)) = (
                xattr(&c.fs, ino, "user.ptefs.file"),
                xattr(&c.fs, ino, "user.ptefs.offset"),
            ) else {
                continue;
            };
            let Ok(offset) = offset.parse::<usize>() else {
                c.err(format!(
                    "{path}: user.ptefs.offset {offset:?} is not a number"
                ));
                continue;
            };
            let content = read_all(&c.fs, ino, 1 << 20).unwrap();
            let data = &content[header_len.min(content.len())..];
            let bytes = backing
                .entry(file.clone())
                .or_insert_with(|| std::fs::read(&file).unwrap_or_default());
            if bytes.get(offset..offset + data.len()) != Some(data) {
                c.err(format!(
                    "{path}: bytes at {file}:{offset} differ from the file's contents"
                ));
            }
            if c.fs
                .getxattr(ino, "user.ptefs.nonexistent")
                .map_err(|e| e.errno())
                != Err(libc::ENODATA)
            {
                c.err(format!("{path}: an unknown xattr is not ENODATA"));
            }
        }
    });
}

/// Reads at every offset and in odd sizes give slices of the whole file; reads past the end
/// are empty.
#[test]
fn partial_reads_are_slices_of_the_whole() {
    for_each_fixture(|c| {
        for (path, ino, kind) in walk(&c.fs) {
            if kind == FileType::Directory {
                let e = c.fs.read(ino, 0, 10).err().map(|e| e.errno());
                c.eq(
                    &format!("{path}: read of a directory"),
                    Some(libc::EISDIR),
                    e,
                );
                continue;
            }
            let whole = read_all(&c.fs, ino, 1 << 20).unwrap();
            for chunk in [1u32, 13, 64, 4096] {
                if chunk == 1 && whole.len() > 4096 {
                    continue;
                }
                let got = read_all(&c.fs, ino, chunk).unwrap();
                if got != whole {
                    c.err(format!("{path}: {chunk}-byte reads differ"));
                }
            }
            let len = whole.len() as u64;
            for off in [len, len + 1, u64::MAX - 1] {
                let n = c.fs.read(ino, off, 100).map(|d| d.bytes().len()).ok();
                c.eq(&format!("{path}: read at {off}"), Some(0), n);
            }
        }
    });
}

#[test]
fn every_manifest_names_its_files() {
    for m in manifests() {
        let (file, data) = fixture_files(&m);
        assert!(file.is_file(), "{}", file.display());
        for d in data {
            assert!(d.is_file(), "{} names {}", m.display(), d.display());
        }
    }
}

/// Every path of `tree` with its inode, walked depth first with each directory's children
/// in name order, or in reverse order.
fn inodes_by_path(tree: &Tree, reverse: bool) -> BTreeMap<String, Ino> {
    let mut out = BTreeMap::new();
    let mut stack = vec![(ptefs::tree::ROOT, String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let mut children = tree.children(dir).unwrap_or_default().to_vec();
        if reverse {
            children.reverse();
        }
        for ino in children {
            let path = format!("{prefix}{}", tree.node(ino).unwrap().name);
            if tree.node(ino).unwrap().is_dir() {
                stack.push((ino, format!("{path}/")));
            }
            out.insert(path, ino);
        }
    }
    out
}

/// The per-value directories are built when first used (docs/tree.md#size-limits), and
/// inode numbers do not depend on which was used first: a tree walked in name order and
/// another walked in reverse order give every path the same inode, and once every directory
/// is built the tree holds exactly the nodes the node limit counts.
#[test]
fn lazy_directories_number_their_nodes_the_same_whatever_is_listed_first() {
    for_each_fixture(|c| {
        let (file, data) = (c.file.clone(), c.data.clone());
        let open = || Tree::build(Arc::new(ptefs::format::Model::open(&file, &data).unwrap()));
        let tree = open();
        let lazy: Vec<Ino> = tree
            .built_nodes()
            .filter(|(_, n)| matches!(n.content, Content::LazyDir(_)))
            .map(|(ino, _)| ino)
            .collect();
        c.eq("lazy directories", true, !lazy.is_empty());
        for &d in &lazy {
            let built = tree.lazy_dir(d).unwrap().is_built();
            c.eq(&format!("{}: built before use", tree.path(d)), false, built);
        }
        let in_order = inodes_by_path(&tree, false);
        let reversed = inodes_by_path(&open(), true);
        c.eq("inodes by path", &in_order, &reversed);
        let built = tree.built_nodes().count() as u64;
        c.eq("nodes built after the walk", tree.node_count(), built);
        c.eq(
            "nodes counted",
            ptefs::tree::node_count(&tree.model),
            tree.node_count(),
        );
        c.eq("paths walked", tree.node_count() - 1, in_order.len() as u64);
    });
}
