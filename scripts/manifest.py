#!/usr/bin/env python3
"""Write the manifest (`<file>.json`) and tree list (`<file>.tree`) of a .pte or .ptd file.

The facts come from ExecuTorch's own Python readers, not from ptefs:

* .pte: the extended header via `_get_extended_header`, the Program via
  `_flatbuffer_to_program` (the parser behind `deserialize_pte_binary`), and the segment,
  constant, mutable and delegate bytes cross-checked against `deserialize_pte_binary`.
* .ptd: the FH01 header via `FlatTensorHeader`, the FlatTensor table via flatc
  (`_deserialize_to_flat_tensor`), the blobs cross-checked against
  `FlatTensorSerializer().deserialize`.
* `XnnpackBackend` delegates (a .pte's `plans[p].delegates[j].xnnpack`): the XH00 header as
  ExecuTorch's `XNNHeader.from_bytes` reads it (null for a bare flatbuffer), and the XNNGraph
  flatbuffer decoded by flatc (`--json --strict-json --defaults-json --raw-binary`) with the
  wheel's `backends/xnnpack/serialization/schema.fbs` (identifier XN01; `runtime_schema.fbs`
  for XN00). flatc is `$FLATC`, else `flatc` on PATH. A payload that does not decode (unknown
  identifier, flatc refuses it, an index out of range) gets no `xnnpack` key. Floats are
  exact: flatc decodes them as bits (its own float output keeps six decimals) and they are
  written as the float32 value, non-finite ones as the strings "inf", "-inf", "NaN".
* `VulkanBackend` delegates (`plans[p].delegates[j].vulkan`): the VH00 header as ExecuTorch's
  `VulkanDelegateHeader.from_bytes` reads it (null for a bare flatbuffer), and the VkGraph
  flatbuffer (identifier VK00) decoded by flatc with the wheel's
  `backends/vulkan/serialization/schema.fbs`, doubles bit-exact the same way. Values carry
  their union type and fields; a FLOAT16 constant, or a 4-bit weight packed for
  `et_vk.linear_q4gsw` / `et_vk.linear_dq8ca_q4gsw`, also gets `f32`: how it dequantizes and
  the sha256 of the float32 values NumPy computes for it (`vk_dequantized`). A payload that
  does not decode gets no `vulkan` key. The Python runtime has no Vulkan backend, so programs
  with such delegates get no `runtime_check`.

For a .pte, `runtime_check` runs the method in the ExecuTorch runtime
(`executorch.runtime.Runtime.get().load_program(pte, data_path=ptd)`) on random inputs
(seeded from the file's sha256, or taken from `--inputs-from`) and records the first output.
Programs whose state changes between calls (mutable buffers) get no `runtime_check`. A
`runtime_check` taken from `--inputs-from` keeps its `imports` (modules imported before the
program is loaded, e.g. to register custom kernels) and `atol`.

The tree list follows docs/tree.md: a mount of the .pte (with its .ptd files attached), or of
the .ptd, including the `xnnpack/` and `vulkan/` directories of decoded delegates (2.7), the
`weights.safetensors` at the root of each model tree (2.8), `sizes.txt` and `sizes.json` at
the root of the mount, and the pictures: `sizes.svg` at the root, `graph.dot` of every plan
and decoded payload, and a `.hist.svg` beside every tensor whose values are numbers
(`HIST_SCALAR_TYPES`, `XNN_HISTOGRAM`, `VK_HISTOGRAM`).

Usage (with the ExecuTorch virtualenv's python):

    manifest.py FILE.pte [--data FILE.ptd]... [--out-dir DIR] [--inputs-from OLD.json]
    manifest.py FILE.ptd [--out-dir DIR]
    manifest.py --check DIR     # regenerate every manifest in DIR into a temp dir and diff

Output JSON is `json.dumps(obj, indent=1)` without a trailing newline; the tree list has one
path per line, directories ending in `/`, sorted bytewise, with a final newline.
"""

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile

import etlib  # scripts/etlib.py, beside this file

_ELEM_SIZE = {
    0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 8: 4, 9: 8, 10: 16, 11: 1, 12: 1,
    13: 1, 14: 4, 15: 2, 16: 1, 17: 1, 18: 1, 19: 1, 20: 1, 21: 1, 22: 2, 23: 1, 24: 1,
    25: 1, 26: 1, 27: 2, 28: 4, 29: 8,
}

_SCALAR_NAMES = None


def scalar_type_names():
    """ScalarType names as declared (uncommented) in the wheel's schema/scalar_type.fbs."""
    global _SCALAR_NAMES
    if _SCALAR_NAMES is None:
        import executorch.exir

        root = os.path.dirname(os.path.dirname(executorch.exir.__file__))
        path = os.path.join(root, "schema", "scalar_type.fbs")
        names = {}
        with open(path) as f:
            for line in f:
                line = line.split("//", 1)[0]
                m = re.match(r"\s*([A-Za-z0-9_]+)\s*=\s*(-?\d+)\s*,?\s*$", line)
                if m:
                    names[int(m.group(2))] = m.group(1)
        _SCALAR_NAMES = names
    return _SCALAR_NAMES


def scalar_name(v):
    v = int(v)
    return scalar_type_names().get(v, v)


def enum_name(v):
    """An IntEnum's name, or the bare number for a value without a name."""
    name = getattr(v, "name", None)
    return name if name is not None else int(v)


def sha256(b):
    return hashlib.sha256(bytes(b)).hexdigest()


def numel(sizes):
    n = 1
    for s in sizes:
        n *= int(s)
    return n


def nbytes_of(scalar_type, sizes):
    return numel(sizes) * _ELEM_SIZE.get(int(scalar_type), 1)


def encode_name(name):
    """File name for a key or plan name (docs/tree.md#names-and-percent-encoding)."""
    if name == ".":
        return "%2E"
    if name == "..":
        return "%2E%2E"
    if name == "":
        return "%"
    return name.replace("%", "%25").replace("/", "%2F").replace("\0", "%00")


def dedupe(names):
    seen = set()
    out = []
    for name in names:
        cand, n = name, 1
        while cand in seen:
            cand = f"{name}~{n}"
            n += 1
        seen.add(cand)
        out.append(cand)
    return out


# ---------------------------------------------------------------------------------------------
# PTD


def read_ptd(path):
    from executorch.exir._serialize._cord import Cord
    from executorch.extension.flat_tensor.serialize.serialize import (
        FlatTensorHeader,
        FlatTensorSerializer,
        _deserialize_to_flat_tensor,
    )

    data = open(path, "rb").read()
    if data[4:8] != b"FT01":
        raise SystemExit(f"{path}: identifier {data[4:8]!r} is not FT01")
    header = FlatTensorHeader.from_bytes(data[8:])
    if not header.is_valid():
        raise SystemExit(f"{path}: invalid FH01 header")
    flat = _deserialize_to_flat_tensor(data[: header.flatbuffer_offset + header.flatbuffer_size])
    payload = FlatTensorSerializer().deserialize(Cord(data))
    base = header.segment_base_offset

    segments = []
    blobs = []
    for seg in flat.segments:
        b = data[base + seg.offset : base + seg.offset + seg.size]
        blobs.append(b)
        segments.append(
            {
                "offset": seg.offset,
                "size": seg.size,
                "file_offset": base + seg.offset,
                "sha256": sha256(b),
            }
        )
    named = []
    for nd in flat.named_data:
        b = blobs[nd.segment_index]
        # Cross-check with ExecuTorch's payload view of the same key.
        entry = payload.named_data[nd.key]
        assert bytes(payload.buffers[entry.buffer_index]) == b, nd.key
        item = {
            "key": nd.key,
            "segment_index": nd.segment_index,
            "nbytes": len(b),
            "sha256": sha256(b),
        }
        if nd.tensor_layout is not None:
            tl = nd.tensor_layout
            item["tensor_layout"] = {
                "scalar_type": scalar_name(tl.scalar_type),
                "sizes": [int(s) for s in tl.sizes],
                "dim_order": [int(d) for d in tl.dim_order],
            }
        named.append(item)

    manifest = {
        "file": os.path.basename(path),
        "kind": "ptd",
        "size": len(data),
        "sha256": sha256(data),
        "header": {
            "root_offset": int.from_bytes(data[0:4], "little"),
            "magic": data[4:8].decode("latin-1"),
            "extended": {
                "magic": header.magic.decode("latin-1"),
                "length": header.length,
                "flatbuffer_offset": header.flatbuffer_offset,
                "flatbuffer_size": header.flatbuffer_size,
                "segment_base_offset": header.segment_base_offset,
                "segment_data_size": header.segment_data_size,
            },
        },
        "version": flat.version,
        "segments": segments,
        "named_data": named,
    }
    return manifest


def ptd_named_blobs(path):
    """{key: bytes} of a .ptd's named data, as ExecuTorch's FlatTensorSerializer reads it."""
    from executorch.exir._serialize._cord import Cord
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    payload = FlatTensorSerializer().deserialize(Cord(open(path, "rb").read()))
    return {k: bytes(payload.buffers[e.buffer_index]) for k, e in payload.named_data.items()}


# Scalar types whose tensors get a `.hist.svg` beside their `.npy` (docs/tree.md#histograms):
# integers, bool, half, bfloat16, float and double.
HIST_SCALAR_TYPES = {
    "BYTE", "CHAR", "SHORT", "INT", "LONG", "HALF", "FLOAT", "DOUBLE", "BOOL", "BFLOAT16",
    "UINT16", "UINT32", "UINT64",
}


def ptd_tree(manifest, prefix=""):
    paths = [prefix + "flat_tensor.json", prefix + "header.json", prefix + "named_data/"]
    keys = dedupe([encode_name(nd["key"]) for nd in manifest["named_data"]])
    for name, nd in zip(keys, manifest["named_data"]):
        paths.append(f"{prefix}named_data/{name}.bin")
        paths.append(f"{prefix}named_data/{name}.json")
        if "tensor_layout" in nd:
            paths.append(f"{prefix}named_data/{name}.npy")
            if nd["tensor_layout"]["scalar_type"] in HIST_SCALAR_TYPES:
                paths.append(f"{prefix}named_data/{name}.hist.svg")
    paths.append(prefix + "segments/")
    for i in range(len(manifest["segments"])):
        paths.append(f"{prefix}segments/{i}")
    paths.append(prefix + "weights.safetensors")
    if not prefix:
        paths += ["sizes.json", "sizes.svg", "sizes.txt"]
    return paths


# ---------------------------------------------------------------------------------------------
# XNNPACK payloads (docs/tree.md#xnnpack-delegates, docs/formats.md#the-xh00-header,
# docs/formats.md#dequantization-rules)

UINT32_MAX = 0xFFFFFFFF
UINT64_MAX = 0xFFFFFFFFFFFFFFFF

# Datatypes whose constants get a dequantized `values/<id>.f32.npy` (quantized, fp16, bf16).
# The dynamically quantized types (qdint8, qpint8) are never constants: their parameters
# are computed at run time.
XNN_DEQUANTIZED = {
    "xnn_datatype_fp16",
    "xnn_datatype_bf16",
    "xnn_datatype_qint8",
    "xnn_datatype_quint8",
    "xnn_datatype_qint32",
    "xnn_datatype_qcint8",
    "xnn_datatype_qcint32",
    "xnn_datatype_qcint4",
    "xnn_datatype_qbint4",
}

# Datatypes whose constants get a `values/<id>.hist.svg`: those with a float32 view, and fp32.
XNN_HISTOGRAM = XNN_DEQUANTIZED | {"xnn_datatype_fp32"}

_XNN_SCHEMAS = {b"XN01": "schema.fbs", b"XN00": "runtime_schema.fbs"}


def xnn_schema(name):
    import executorch.backends.xnnpack.serialization as ser  # a namespace package

    return os.path.join(list(ser.__path__)[0], name)


_FLOAT_FIELD = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(\[\s*float\s*\]|float)\s*[;=(]", re.M)


def _bits_schema(schema, tmp):
    """A copy of the schema whose `float` fields are `uint`, and the names of those fields.

    flatc prints floats with six decimals (a scale 1.2345e-5 would come out as 0.000012), so
    the floats are decoded as their bit patterns and turned back into float32 here."""
    text = open(schema).read()
    names = {m.group(1) for m in _FLOAT_FIELD.finditer(text)}
    text = _FLOAT_FIELD.sub(lambda m: m.group(0).replace("float", "uint"), text)
    # Every field of that name must be a float, else the name-based conversion is ambiguous.
    for m in re.finditer(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*([^;]+);", text, re.M):
        assert m.group(1) not in names or "uint" in m.group(2), m.group(0)
    path = os.path.join(tmp, os.path.basename(schema))
    with open(path, "w") as f:
        f.write(text)
    return path, names


def _float_of_bits(bits):
    """float32 given as its bits → the JSON value: the float (widened exactly to a double),
    or for non-finite values the strings "inf", "-inf", "NaN" (as Rust's f64::to_string
    spells them), since JSON has no such numbers."""
    import math
    import struct

    f = struct.unpack("<f", struct.pack("<I", bits))[0]
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return f


def _restore_floats(obj, names):
    if isinstance(obj, dict):
        return {
            k: (
                [_float_of_bits(b) for b in v]
                if k in names and isinstance(v, list)
                else _float_of_bits(v)
                if k in names
                else _restore_floats(v, names)
            )
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [_restore_floats(v, names) for v in obj]
    return obj


def _flatc_decode(buf, schema, tmp):
    """flatc's JSON decoding of one flatbuffer with `schema`, in `tmp`; raises
    CalledProcessError if flatc refuses the bytes."""
    import subprocess

    flatc = os.environ.get("FLATC", "flatc")
    src = os.path.join(tmp, "graph.bin")
    with open(src, "wb") as f:
        f.write(buf)
    subprocess.run(
        [flatc, "--json", "--strict-json", "--defaults-json", "--raw-binary",
         "-o", tmp, schema, "--", src],
        check=True,
        capture_output=True,
    )
    with open(os.path.join(tmp, "graph.json")) as f:
        return json.load(f)


def flatc_json(buf, schema):
    """flatc's JSON decoding of one flatbuffer (floats bit-exact, see _bits_schema); raises
    CalledProcessError if flatc refuses the bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        bits_schema, names = _bits_schema(schema, tmp)
        return _restore_floats(_flatc_decode(buf, bits_schema, tmp), names)


def decode_xnnpack(blob):
    """The manifest's `xnnpack` object for one XnnpackBackend payload, or None when it does
    not decode: a bad XH00 header, an unknown flatbuffer identifier, flatc refusing the bytes,
    or an index (value id, constant_buffer_idx, scale_buffer_idx) out of range."""
    import subprocess

    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader

    blob = bytes(blob)
    header = None
    if blob[4:8] == XNNHeader.EXPECTED_MAGIC:
        try:
            h = XNNHeader.from_bytes(blob[: XNNHeader.EXPECTED_LENGTH])
        except ValueError:
            return None
        if not h.is_valid():
            return None
        header = {
            "header_length": int.from_bytes(blob[8:10], "little"),
            "flatbuffer_offset": h.flatbuffer_offset,
            "flatbuffer_size": h.flatbuffer_size,
            "constant_data_offset": h.constant_data_offset,
            "constant_data_size": h.constant_data_size,
        }
        if h.flatbuffer_offset + h.flatbuffer_size > len(blob):
            return None
        if h.constant_data_offset + h.constant_data_size > len(blob):
            return None
        fb = blob[h.flatbuffer_offset : h.flatbuffer_offset + h.flatbuffer_size]
    else:
        fb = blob
    schema = _XNN_SCHEMAS.get(fb[4:8])
    if schema is None:
        return None
    try:
        g = flatc_json(fb, xnn_schema(schema))
    except subprocess.CalledProcessError:
        return None

    nodes = []
    for n in g.get("xnodes", []):
        node = {
            "type": n.get("xnode_union_type", "NONE"),
            "fields": n.get("xnode_union", {}),
            "debug_handle": n.get("debug_handle", 0),
        }
        # Not in the shared fixtures (none has a fused activation); kept when flatc shows it.
        if "output_min_max" in n:
            node["output_min_max"] = n["output_min_max"]
        nodes.append(node)
    values = []
    for i, xv in enumerate(g.get("xvalues", [])):
        kind = xv.get("xvalue_union_type", "NONE")
        u = xv.get("xvalue_union", {})
        tv = u.get("tensor_value", {}) if kind == "XNNQuantizedTensorValue" else u
        v = {"id": i, "type": kind}
        for k, val in tv.items():
            if k == "num_dims":  # the length of dims
                continue
            v[k] = val
        v.setdefault("dims", [])
        if kind == "XNNQuantizedTensorValue":
            v["quant_type"] = u.get("quant_params_type", "NONE")
            v["quant"] = u.get("quant_params", {})
        values.append(v)
    constant_data = [
        {"offset": c.get("offset", 0), "size": c.get("size", 0), "named_key": c.get("named_key", "")}
        for c in g.get("constant_data", [])
    ]
    out = {
        "header": header,
        "version": g.get("version"),
        "nodes": nodes,
        "values": values,
        "constant_data": constant_data,
        "inputs": g.get("input_ids", []),
        "outputs": g.get("output_ids", []),
        "num_externs": g.get("num_externs", 0),
    }

    # Indices must be in range (the runtime would refuse the payload otherwise).
    nv, nc = len(values), len(constant_data)
    for v in values:
        cbi = v.get("constant_buffer_idx", 0)
        if cbi and cbi >= nc:
            return None
        sbi = (v.get("quant") or {}).get("scale_buffer_idx", 0)
        if sbi and sbi >= nc:
            return None
    for n in nodes:
        for k, val in n["fields"].items():
            if k.endswith("_id") and isinstance(val, int) and val != UINT32_MAX and val >= nv:
                return None
    if any(i >= nv for i in out["inputs"] + out["outputs"]):
        return None
    return out


def xnn_constant_present(xnn, value, keys):
    """Whether the value is a constant whose bytes the file (with its .ptd files) holds: named
    data of a key in `keys`, or a range inside the payload's constant-data region."""
    idx = value.get("constant_buffer_idx", 0)
    if not idx:
        return False
    c = xnn["constant_data"][idx]
    if c["named_key"]:
        return c["named_key"] in keys
    h = xnn["header"]
    if h is None or c["offset"] == UINT64_MAX:
        return False
    return c["offset"] + c["size"] <= h["constant_data_size"]


# ---------------------------------------------------------------------------------------------
# Vulkan payloads (VH00 header + VK00 flatbuffer; docs/formats/vulkan.md)

VK_HEADER_LENGTH = 30

# NumPy descriptors of the VkDataType names (UNSET and unnamed values have none).
VK_NUMPY = {
    "BOOL": "|b1", "UINT8": "|u1", "INT8": "|i1", "INT32": "<i4", "FLOAT16": "<f2",
    "FLOAT32": "<f4", "FLOAT64": "<f8", "INT64": "<i8",
}

# Vulkan constants with a `values/<id>.hist.svg`: those with a float32 view (`f32`), and
# FLOAT32 ones.
VK_HISTOGRAM = {"FLOAT32"}

# Operators whose arguments hold a 4-bit packed weight, its scales and the group size, by
# argument position (their signatures are in the wheel's backends/vulkan/custom_ops_lib.py).
VK_Q4GSW_OPS = {
    "et_vk.linear_q4gsw.default": (1, 2, 3),
    "et_vk.linear_dq8ca_q4gsw.default": (3, 5, 6),
}


def vk_schema():
    import executorch.backends.vulkan.serialization as ser  # a namespace package

    return os.path.join(list(ser.__path__)[0], "schema.fbs")


def _vk_bits_schema(schema, tmp):
    """A copy of the Vulkan schema whose `double` fields (Double.double_val, DoubleList.items)
    are `ulong`, so flatc's rounded double output is replaced by the exact bits."""
    text = open(schema).read()
    text, n = re.subn(r"(double_val\s*:\s*)double\b", r"\1ulong", text)
    assert n == 1, "Double.double_val"
    text, n = re.subn(r"(table DoubleList\s*\{\s*items\s*:\s*\[\s*)double\b", r"\1ulong", text)
    assert n == 1, "DoubleList.items"
    # No other double field, so nothing else needs restoring.
    assert not re.search(r"\bdouble\b", re.sub(r"//.*", "", text))
    path = os.path.join(tmp, "vulkan.fbs")
    with open(path, "w") as f:
        f.write(text)
    return path


def _double_of_bits(bits):
    """float64 given as its bits → the JSON value, non-finite ones as "inf", "-inf", "NaN"."""
    import math
    import struct

    d = struct.unpack("<d", struct.pack("<Q", bits))[0]
    if math.isnan(d):
        return "NaN"
    if math.isinf(d):
        return "inf" if d > 0 else "-inf"
    return d


def vk_region(vk, blob_len):
    """(start, size) of the payload's bytes region as the runtime reads it (a bytes_size of 0
    means the rest of the payload), or None without a header."""
    h = vk["header"]
    if h is None:
        return None
    size = h["bytes_size"]
    if size == 0 and blob_len > h["bytes_offset"]:
        size = blob_len - h["bytes_offset"]
    return h["bytes_offset"], size


def vk_is_named(c):
    return c["named_key"] is not None and c["offset"] == UINT64_MAX


def decode_vulkan(blob):
    """The manifest's `vulkan` object for one VulkanBackend payload, or None when it does not
    decode: a bad VH00 header (ExecuTorch's VulkanDelegateHeader reads it), an identifier other
    than VK00, flatc refusing the bytes, a value of no known type, an operator without a name,
    a value id or constant_id out of range, or bytes outside the payload's bytes region."""
    import subprocess

    from executorch.backends.vulkan.serialization.vulkan_graph_serialize import (
        VulkanDelegateHeader,
    )

    blob = bytes(blob)
    header = None
    if blob[4:8] == VulkanDelegateHeader.EXPECTED_MAGIC:
        if len(blob) < VK_HEADER_LENGTH:
            return None
        try:
            h = VulkanDelegateHeader.from_bytes(blob[:VK_HEADER_LENGTH])
        except ValueError:
            return None
        if not h.is_valid():
            return None
        header = {
            "header_length": int.from_bytes(blob[8:10], "little"),
            "flatbuffer_offset": h.flatbuffer_offset,
            "flatbuffer_size": h.flatbuffer_size,
            "bytes_offset": h.bytes_offset,
            "bytes_size": h.bytes_size,
        }
        if h.flatbuffer_offset < VK_HEADER_LENGTH:
            return None
        if h.flatbuffer_offset + h.flatbuffer_size > len(blob):
            return None
        if h.bytes_offset + h.bytes_size > len(blob):
            return None
        fb = blob[h.flatbuffer_offset : h.flatbuffer_offset + h.flatbuffer_size]
    else:
        fb = blob
    if fb[4:8] != b"VK00":
        return None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            g = _flatc_decode(fb, _vk_bits_schema(vk_schema(), tmp), tmp)
    except subprocess.CalledProcessError:
        return None

    values = []
    for i, vv in enumerate(g.get("values", [])):
        kind = vv.get("value_type", "NONE")
        if kind not in ("Null", "Int", "Double", "Bool", "VkTensor", "IntList", "DoubleList",
                        "BoolList", "ValueList", "String", "SymInt"):
            return None
        u = dict(vv.get("value", {}))
        if kind == "Double":
            u["double_val"] = _double_of_bits(u.get("double_val", 0))
        if kind == "DoubleList":
            u["items"] = [_double_of_bits(b) for b in u.get("items", [])]
        v = {"id": i, "type": kind}
        v.update(u)
        if kind == "VkTensor":
            v.setdefault("dims", [])
        values.append(v)
    chain = []
    for op in g.get("chain", []):
        if "name" not in op:
            return None
        chain.append({"node_id": op.get("node_id", 0), "name": op["name"], "args": op.get("args", [])})
    constants = [
        {"offset": c.get("offset", 0), "length": c.get("length", 0), "named_key": c.get("named_key")}
        for c in g.get("constants", [])
    ]
    out = {
        "header": header,
        "version": g.get("version"),
        "values": values,
        "constants": constants,
        "chain": chain,
        "inputs": g.get("input_ids", []),
        "outputs": g.get("output_ids", []),
        "shaders": [
            {"offset": c.get("offset", 0), "length": c.get("length", 0), "named_key": c.get("named_key")}
            for c in g.get("shaders", [])
        ],
        "storage_type_override": g.get("storage_type_override"),
        "memory_layout_override": g.get("memory_layout_override"),
    }

    # Ids and constant references must resolve (the runtime would refuse the payload otherwise).
    nv, nc = len(values), len(constants)
    region = vk_region(out, len(blob))
    ids = [a for op in chain for a in op["args"]] + out["inputs"] + out["outputs"]
    ids += [a for v in values if v["type"] == "ValueList" for a in v.get("items", [])]
    if any(not 0 <= a < nv for a in ids):
        return None
    for v in values:
        cid = v.get("constant_id", -1) if v["type"] == "VkTensor" else -1
        if cid < 0:
            continue
        if cid >= nc:
            return None
        c = constants[cid]
        if not vk_is_named(c) and (region is None or c["offset"] + c["length"] > region[1]):
            return None
    return out


def vk_constant_bytes(vk, value, blob, blobs):
    """The bytes of a constant tensor: named data of its key (None when no file at hand holds
    the key), or its range of the payload's bytes region."""
    cid = value.get("constant_id", -1) if value["type"] == "VkTensor" else -1
    if cid < 0:
        return None
    c = vk["constants"][cid]
    if vk_is_named(c):
        return blobs.get(c["named_key"])
    start = vk_region(vk, len(blob))[0] + c["offset"]
    return blob[start : start + c["length"]]


def _vk_floats(b, datatype):
    import numpy as np

    return np.frombuffer(b, {"FLOAT32": "<f4", "FLOAT16": "<f2"}[datatype]).astype(np.float32)


def vk_dequantized(vk, blob, blobs):
    """`f32` entries of the values that have a float32 view, by id: FLOAT16 constants (widened
    exactly) and 4-bit packed weights of the VK_Q4GSW_OPS (the first operator that reads one
    decides its scales), computed in NumPy from the packing documented with
    `pack_4bit_weight_tensor` in the wheel's backends/vulkan/patterns/weight_packing_utils.py:
    byte [n][j] holds element 2j in its low and 2j+1 in its high nibble, each stored + 8; the
    inner dimension K is padded to a multiple of 8; scales are [K / group_size, N] (N possibly
    padded): w[n][k] = (nibble - 8) × scales[k / group_size][n]."""
    import numpy as np

    out = {}
    for v in vk["values"]:
        if v["type"] != "VkTensor" or v.get("datatype") != "FLOAT16":
            continue
        b = vk_constant_bytes(vk, v, blob, blobs)
        if b is None or len(b) != 2 * numel(v["dims"]):
            continue
        f = _vk_floats(b, "FLOAT16")
        out[v["id"]] = {"packing": "float16", "shape": list(v["dims"]), "sha256": sha256(f.tobytes())}
    for op in vk["chain"]:
        pos = VK_Q4GSW_OPS.get(op["name"])
        if pos is None or len(op["args"]) <= max(pos):
            continue
        w, s, g = (vk["values"][op["args"][p]] for p in pos)
        if w["id"] in out or w["type"] != "VkTensor" or s["type"] != "VkTensor" or g["type"] != "Int":
            continue
        if w.get("datatype") != "UINT8" or s.get("datatype") not in ("FLOAT32", "FLOAT16"):
            continue
        if len(w["dims"]) != 2 or len(s["dims"]) != 2 or g.get("int_val", 0) <= 0:
            continue
        (n, half), (groups, ns), gs = w["dims"], s["dims"], g["int_val"]
        k = groups * gs
        if k > 2 * half or n > ns or k == 0:
            continue
        wb = vk_constant_bytes(vk, w, blob, blobs)
        sb = vk_constant_bytes(vk, s, blob, blobs)
        if wb is None or sb is None or len(wb) != n * half:
            continue
        if len(sb) != groups * ns * (4 if s["datatype"] == "FLOAT32" else 2):
            continue
        packed = np.frombuffer(wb, np.uint8).reshape(n, half)
        q = np.empty((n, 2 * half), np.int16)
        q[:, 0::2] = packed & 0xF
        q[:, 1::2] = packed >> 4
        q = (q - 8)[:, :k].astype(np.float32)
        scales = _vk_floats(sb, s["datatype"]).reshape(groups, ns)[:, :n].T
        f = (q * np.repeat(scales, gs, axis=1)).astype(np.float32)
        out[w["id"]] = {
            "packing": "q4gsw",
            "scales": s["id"],
            "group_size": gs,
            "shape": [n, k],
            "sha256": sha256(f.tobytes()),
        }
    return out


def vk_constant_present(vk, value, keys):
    """Whether the value is a constant tensor whose bytes the file (with its .ptd files) holds:
    named data of a key in `keys`, or a range of the payload's bytes region (decode_vulkan
    checked it)."""
    cid = value.get("constant_id", -1) if value["type"] == "VkTensor" else -1
    if cid < 0:
        return False
    c = vk["constants"][cid]
    return c["named_key"] in keys if vk_is_named(c) else True


# ---------------------------------------------------------------------------------------------
# PTE


def _value_json(index, evalue, constant_bytes, mutable_bytes):
    from executorch.exir import schema

    val = evalue.val
    kind = type(val).__name__
    out = {"index": index, "kind": kind}
    if isinstance(val, schema.Tensor):
        sizes = [int(s) for s in val.sizes]
        nb = nbytes_of(val.scalar_type, sizes)
        out["scalar_type"] = scalar_name(val.scalar_type)
        out["sizes"] = sizes
        out["dim_order"] = [int(d) for d in val.dim_order]
        out["shape_dynamism"] = enum_name(val.shape_dynamism)
        out["data_buffer_idx"] = val.data_buffer_idx
        out["nbytes"] = nb
        ai = val.allocation_info
        out["allocation_info"] = (
            None
            if ai is None
            else {
                "memory_id": ai.memory_id,
                "memory_offset": (ai.memory_offset_high << 32) | ai.memory_offset_low,
            }
        )
        eti = val.extra_tensor_info
        if eti is not None:
            out["extra_tensor_info"] = {
                "mutable_data_segments_idx": eti.mutable_data_segments_idx,
                "fully_qualified_name": eti.fully_qualified_name,
                "location": enum_name(eti.location),
            }
        external = eti is not None and int(eti.location) == int(schema.TensorDataLocation.EXTERNAL)
        if external:
            out["data"] = "external"
        elif val.data_buffer_idx > 0 and ai is None:
            out["data"] = "constant"
            out["sha256"] = sha256(constant_bytes(val.data_buffer_idx, nb))
        elif val.data_buffer_idx > 0:
            out["data"] = "mutable_initial_state"
            out["sha256"] = sha256(mutable_bytes(val.data_buffer_idx, nb))
        else:
            out["data"] = "none"
    elif isinstance(val, schema.Null):
        pass
    elif isinstance(val, schema.Int):
        out["value"] = val.int_val
    elif isinstance(val, schema.Bool):
        out["value"] = bool(val.bool_val)
    elif isinstance(val, schema.Double):
        out["value"] = float(val.double_val)
    elif isinstance(val, schema.String):
        out["value"] = val.string_val
    elif isinstance(val, (schema.DoubleList,)):
        out["items"] = [float(x) for x in val.items]
    elif isinstance(val, (schema.BoolList,)):
        out["items"] = [bool(x) for x in val.items]
    else:  # IntList, TensorList, OptionalTensorList
        out["items"] = [int(x) for x in val.items]
    return out


def _instruction_json(ins):
    args = ins.instr_args
    out = {"kind": type(args).__name__}
    for field in args.__dataclass_fields__:
        v = getattr(args, field)
        out[field] = [int(x) for x in v] if isinstance(v, list) else int(v)
    return out


def read_pte(path, ptd_blobs=None):
    from executorch.exir import schema
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import (
        _get_extended_header,
        deserialize_pte_binary,
    )

    data = open(path, "rb").read()
    if data[4:8] != b"ET12":
        raise SystemExit(f"{path}: identifier {data[4:8]!r} is not ET12")
    eh = _get_extended_header(data)
    program_size = len(data)
    base = 0
    if eh is not None:
        program_size = eh.program_size
        base = eh.segment_base_offset
    program = _flatbuffer_to_program(data[:program_size])
    restored = deserialize_pte_binary(data)

    seg_bytes = []
    segments = []
    for seg in program.segments or []:
        b = data[base + seg.offset : base + seg.offset + seg.size]
        seg_bytes.append(b)
        segments.append(
            {
                "offset": seg.offset,
                "size": seg.size,
                "file_offset": base + seg.offset,
                "sha256": sha256(b),
            }
        )

    cs = program.constant_segment
    const_offsets = list(cs.offsets) if cs is not None else []

    def constant_bytes(idx, nb):
        if const_offsets:
            seg = seg_bytes[cs.segment_index]
            b = seg[const_offsets[idx] : const_offsets[idx] + nb]
            # ExecuTorch's restored constant buffers start with the same bytes.
            rb = bytes(restored.program.constant_buffer[idx].storage)
            assert rb[:nb] == b, ("constant", idx)
        else:
            b = bytes(program.constant_buffer[idx].storage)[:nb]
        assert len(b) == nb, ("constant out of range", idx)
        return b

    mds = program.mutable_data_segments or []
    # Named data a delegate may read: the .pte's own, then the attached .ptd files'.
    blobs = dict(ptd_blobs or {})
    for nd in program.named_data or []:
        blobs[nd.key] = seg_bytes[nd.segment_index]

    def mutable_bytes(idx, nb):
        m = mds[0]
        seg = seg_bytes[m.segment_index]
        b = seg[m.offsets[idx] : m.offsets[idx] + nb]
        assert bytes(restored.mutable_data[idx].storage)[:nb] == b, ("mutable", idx)
        assert len(b) == nb, ("mutable out of range", idx)
        return b

    plans = []
    for plan in program.execution_plan:
        values = [
            _value_json(i, ev, constant_bytes, mutable_bytes) for i, ev in enumerate(plan.values)
        ]
        instructions = [_instruction_json(ins) for chain in plan.chains for ins in chain.instructions]
        delegates = []
        for d in plan.delegates:
            loc = d.processed.location
            if int(loc) == int(schema.DataLocation.INLINE):
                blob = bytes(program.backend_delegate_data[d.processed.index].data)
            else:
                blob = seg_bytes[d.processed.index]
            delegate = {
                "id": d.id,
                "location": enum_name(loc),
                "index": d.processed.index,
                "nbytes": len(blob),
                "sha256": sha256(blob),
                "compile_specs": [
                    {"key": c.key, "value": list(bytes(c.value))} for c in d.compile_specs
                ],
            }
            if d.id == "XnnpackBackend":
                xnn = decode_xnnpack(blob)
                if xnn is not None:
                    delegate["xnnpack"] = xnn
            if d.id == "VulkanBackend":
                vk = decode_vulkan(blob)
                if vk is not None:
                    views = vk_dequantized(vk, blob, blobs)
                    for v in vk["values"]:
                        if v["id"] in views:
                            v["f32"] = views[v["id"]]
                    delegate["vulkan"] = vk
            delegates.append(delegate)
        plans.append(
            {
                "name": plan.name,
                "inputs": [int(x) for x in plan.inputs],
                "outputs": [int(x) for x in plan.outputs],
                "operators": [{"name": o.name, "overload": o.overload} for o in plan.operators],
                "non_const_buffer_sizes": [int(x) for x in plan.non_const_buffer_sizes],
                "values": values,
                "instructions": instructions,
                "delegates": delegates,
            }
        )
    # Delegate blobs as ExecuTorch restores them (all inline afterwards), in the same order.
    rblobs = [
        bytes(restored.program.backend_delegate_data[d.processed.index].data)
        for plan in restored.program.execution_plan
        for d in plan.delegates
    ]
    assert [sha256(b) for b in rblobs] == [d["sha256"] for p in plans for d in p["delegates"]]

    named = []
    for nd in program.named_data or []:
        b = seg_bytes[nd.segment_index]
        named.append(
            {"key": nd.key, "segment_index": nd.segment_index, "nbytes": len(b), "sha256": sha256(b)}
        )

    manifest = {
        "file": os.path.basename(path),
        "kind": "pte",
        "size": len(data),
        "sha256": sha256(data),
        "header": {
            "root_offset": int.from_bytes(data[0:4], "little"),
            "magic": data[4:8].decode("latin-1"),
            "extended": None
            if eh is None
            else {
                "magic": eh.magic.decode("latin-1"),
                "length": eh.length,
                "program_size": eh.program_size,
                "segment_base_offset": eh.segment_base_offset,
            },
        },
        "version": program.version,
        "segments": segments,
        "constant_segment": None
        if cs is None
        else {"segment_index": cs.segment_index, "offsets": [int(x) for x in cs.offsets]},
        "constant_buffer_count": len(program.constant_buffer or []),
        "mutable_data_segments": [
            {"segment_index": m.segment_index, "offsets": [int(x) for x in m.offsets]} for m in mds
        ],
        "plans": plans,
        "named_data": named,
        "data_files": [],
    }
    return manifest


def pte_tree(manifest, ptd_manifests):
    """Every path of a mount of the .pte with the given .ptd manifests attached."""
    paths = []
    ptd_keys = set()
    if ptd_manifests:
        paths.append("data/")
        stems = dedupe([encode_name(os.path.splitext(m["file"])[0]) for m in ptd_manifests])
        for stem, m in zip(stems, ptd_manifests):
            paths.append(f"data/{stem}/")
            paths.extend(ptd_tree(m, prefix=f"data/{stem}/"))
            ptd_keys.update(nd["key"] for nd in m["named_data"])
    paths += ["header.json", "program.json", "named_data/", "weights.safetensors"]
    paths += ["sizes.json", "sizes.svg", "sizes.txt"]
    # XNNPACK reads named data from the attached .ptd files and the .pte's own named data.
    xnn_keys = ptd_keys | {nd["key"] for nd in manifest["named_data"]}
    keys = dedupe([encode_name(nd["key"]) for nd in manifest["named_data"]])
    for name in keys:
        paths.append(f"named_data/{name}.bin")
        paths.append(f"named_data/{name}.json")
    paths.append("plans/")
    plan_names = dedupe([encode_name(p["name"]) for p in manifest["plans"]])
    for name, plan in zip(plan_names, manifest["plans"]):
        d = f"plans/{name}/"
        paths += [
            d, d + "plan.json", d + "operators.txt", d + "instructions.txt", d + "graph.dot",
            d + "values/",
        ]
        for v in plan["values"]:
            paths.append(f"{d}values/{v['index']}.json")
            if v["kind"] != "Tensor":
                continue
            has_bytes = v["data"] in ("constant", "mutable_initial_state") or (
                v["data"] == "external"
                and (v.get("extra_tensor_info") or {}).get("fully_qualified_name") in ptd_keys
            )
            if has_bytes:
                paths.append(f"{d}values/{v['index']}.bin")
                paths.append(f"{d}values/{v['index']}.npy")
                if v["scalar_type"] in HIST_SCALAR_TYPES:
                    paths.append(f"{d}values/{v['index']}.hist.svg")
        paths.append(d + "delegates/")
        for j, dg in enumerate(plan["delegates"]):
            paths += [f"{d}delegates/{j}/", f"{d}delegates/{j}/delegate.json", f"{d}delegates/{j}/processed.bin"]
            xnn = dg.get("xnnpack")
            if xnn is not None:
                x = f"{d}delegates/{j}/xnnpack/"
                paths += [
                    x, x + "header.json", x + "graph.json", x + "graph.txt", x + "graph.dot",
                    x + "values/",
                ]
                for v in xnn["values"]:
                    paths.append(f"{x}values/{v['id']}.json")
                    if xnn_constant_present(xnn, v, xnn_keys):
                        paths.append(f"{x}values/{v['id']}.bin")
                        paths.append(f"{x}values/{v['id']}.npy")
                        if v.get("datatype") in XNN_DEQUANTIZED:
                            paths.append(f"{x}values/{v['id']}.f32.npy")
                        if v.get("datatype") in XNN_HISTOGRAM:
                            paths.append(f"{x}values/{v['id']}.hist.svg")
            vk = dg.get("vulkan")
            if vk is not None:
                x = f"{d}delegates/{j}/vulkan/"
                paths += [
                    x, x + "header.json", x + "graph.json", x + "graph.txt", x + "graph.dot",
                    x + "values/",
                ]
                for v in vk["values"]:
                    paths.append(f"{x}values/{v['id']}.json")
                    if vk_constant_present(vk, v, xnn_keys):
                        paths.append(f"{x}values/{v['id']}.bin")
                        if v.get("datatype") in VK_NUMPY:
                            paths.append(f"{x}values/{v['id']}.npy")
                        if "f32" in v:
                            paths.append(f"{x}values/{v['id']}.f32.npy")
                        if "f32" in v or v.get("datatype") in VK_HISTOGRAM:
                            paths.append(f"{x}values/{v['id']}.hist.svg")
    paths.append("segments/")
    for i in range(len(manifest["segments"])):
        paths.append(f"segments/{i}")
    return paths


# ---------------------------------------------------------------------------------------------
# Runtime check

_TORCH_DTYPES = {
    0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
    7: "float64", 11: "bool", 15: "bfloat16",
}
_SCALAR_BY_NAME = {
    "BYTE": 0, "CHAR": 1, "SHORT": 2, "INT": 3, "LONG": 4, "HALF": 5, "FLOAT": 6,
    "DOUBLE": 7, "BOOL": 11, "BFLOAT16": 15,
}


def tensor_values(t):
    import torch

    t = t.contiguous()
    if t.is_floating_point():
        return [float(x) for x in t.to(torch.float64).reshape(-1).tolist()]
    if t.dtype == torch.bool:
        return [bool(x) for x in t.reshape(-1).tolist()]
    return [int(x) for x in t.reshape(-1).tolist()]


def random_inputs(plan, seed):
    import torch

    gen = torch.Generator().manual_seed(seed)
    inputs = []
    for idx in plan["inputs"]:
        v = plan["values"][idx]
        if v["kind"] != "Tensor":
            return None
        st = v["scalar_type"] if isinstance(v["scalar_type"], int) else _SCALAR_BY_NAME.get(v["scalar_type"])
        if st not in _TORCH_DTYPES:
            return None
        dtype = getattr(torch, _TORCH_DTYPES[st])
        sizes = v["sizes"]
        if dtype.is_floating_point:
            t = torch.randn(sizes, generator=gen, dtype=torch.float32).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, sizes, generator=gen).bool()
        else:
            t = torch.randint(-8, 8, sizes, generator=gen).to(dtype)
        channels_last = len(sizes) == 4 and v["dim_order"] == [0, 2, 3, 1]
        inputs.append(
            {
                "dtype": str(dtype),
                "shape": list(sizes),
                "channels_last": channels_last,
                "values": tensor_values(t),
            }
        )
    return inputs


def runtime_check(path, manifest, ptd_paths, inputs_from=None):
    plans = manifest["plans"]
    if manifest["mutable_data_segments"] or not plans:
        return None
    # The wheel's runtime has no Vulkan backend: such methods load but cannot run.
    if any(d["id"] == "VulkanBackend" for p in plans for d in p["delegates"]):
        return None
    names = [p["name"] for p in plans]
    method = "forward" if "forward" in names else names[0]
    imports, atol = [], None
    if inputs_from is not None:
        method = inputs_from["method"]
        inputs = inputs_from["inputs"]
        imports = inputs_from.get("imports", [])
        atol = inputs_from.get("atol")
    else:
        plan = plans[names.index(method)]
        if any(o["name"] == "aten::copy_" for o in plan["operators"]):
            return None
        inputs = random_inputs(plan, int(manifest["sha256"][:8], 16))
        if inputs is None:
            return None
    if len(ptd_paths) > 1:
        return None
    outputs = etlib.run_method(path, ptd_paths[0] if ptd_paths else None, method, inputs, imports)
    out = outputs[0]
    import torch

    if isinstance(out, torch.Tensor):
        expected = {"shape": list(out.shape), "values": tensor_values(out)}
    else:
        expected = {"shape": [], "values": [out]}
    rc = {"method": method}
    if imports:
        rc["imports"] = list(imports)
    rc["inputs"] = inputs
    rc["expected"] = expected
    if atol is not None:
        rc["atol"] = atol
    return rc


# ---------------------------------------------------------------------------------------------


def write(path, manifest, tree, out_dir):
    out_dir = out_dir or os.path.dirname(os.path.abspath(path))
    base = os.path.join(out_dir, os.path.basename(path))
    with open(base + ".json", "w") as f:
        f.write(json.dumps(manifest, indent=1))
    with open(base + ".tree", "w") as f:
        f.write("".join(p + "\n" for p in sorted(tree)))
    return base


def kind_of(path):
    with open(path, "rb") as f:
        head = f.read(8)
    return {b"ET12": "pte", b"FT01": "ptd"}.get(head[4:8])


def make(path, data=(), out_dir=None, inputs_from=None, runtime=True):
    kind = kind_of(path)
    if kind == "ptd":
        m = read_ptd(path)
        return write(path, m, ptd_tree(m), out_dir)
    if kind != "pte":
        raise SystemExit(f"{path}: neither a .pte nor a .ptd")
    ptd_blobs = {}
    for p in data:
        ptd_blobs.update(ptd_named_blobs(p))
    m = read_pte(path, ptd_blobs)
    ptds = [read_ptd(p) for p in data]
    m["data_files"] = [os.path.basename(p) for p in data]
    if runtime:
        rc = runtime_check(path, m, list(data), inputs_from)
        if rc is not None:
            m["runtime_check"] = rc
    return write(path, m, pte_tree(m, ptds), out_dir)


def check_dir(d):
    """Regenerate the manifests in d (reusing their runtime inputs) and compare."""
    import subprocess

    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(os.listdir(d)):
            if not name.endswith((".pte", ".ptd")):
                continue
            path = os.path.join(d, name)
            old_path = path + ".json"
            if not os.path.exists(old_path):
                continue
            old = json.load(open(old_path))
            data = [os.path.join(d, f) for f in old.get("data_files", [])]
            make(path, data, tmp, old.get("runtime_check"))
            new = json.load(open(os.path.join(tmp, name + ".json")))
            problems = []
            # Expected values: the runtime must reproduce them (allclose, XNNPACK may differ in
            # the last bit), the rest must be identical.
            orc, nrc = old.get("runtime_check"), new.get("runtime_check")
            if orc is not None and nrc is not None:
                import torch

                a = torch.tensor(orc["expected"]["values"], dtype=torch.float64)
                b = torch.tensor(nrc["expected"]["values"], dtype=torch.float64)
                if orc["expected"]["shape"] != nrc["expected"]["shape"] or not torch.allclose(
                    a, b, rtol=1e-5, atol=1e-5
                ):
                    problems.append("runtime_check.expected differs")
                nrc["expected"] = orc["expected"]
            if old != new:
                problems.append("manifest differs")
                for k in old:
                    if old.get(k) != new.get(k):
                        problems.append(f"  key {k}")
            old_tree = open(path + ".tree").read()
            new_tree = open(os.path.join(tmp, name + ".tree")).read()
            if old_tree != new_tree:
                problems.append("tree differs")
                subprocess.run(["diff", path + ".tree", os.path.join(tmp, name + ".tree")])
            print(("ok   " if not problems else "FAIL ") + name)
            for p in problems:
                print("     " + p)
            failures += bool(problems)
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", nargs="?")
    ap.add_argument("--data", action="append", default=[], help=".ptd file belonging to the .pte")
    ap.add_argument("--out-dir", help="write <file>.json/.tree here instead of beside the file")
    ap.add_argument("--inputs-from", help="reuse runtime_check inputs of this manifest")
    ap.add_argument("--no-runtime", action="store_true", help="skip runtime_check")
    ap.add_argument("--check", metavar="DIR", help="regenerate DIR's manifests and compare")
    args = ap.parse_args()
    if args.check:
        sys.exit(1 if check_dir(args.check) else 0)
    if not args.file:
        ap.error("FILE is required")
    inputs_from = None
    if args.inputs_from:
        inputs_from = json.load(open(args.inputs_from)).get("runtime_check")
    base = make(args.file, args.data, args.out_dir, inputs_from, not args.no_runtime)
    print(base + ".json")


if __name__ == "__main__":
    main()
