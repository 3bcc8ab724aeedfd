#!/usr/bin/env python3
"""The float32 value of every XNNPACK constant of a fixture, computed in NumPy from the raw
bytes of the files and flatc's decoding of the payloads (the fixture's manifest), by the
rules of docs/formats.md#dequantization-rules that scripts/xnnpack-rules checks against the
float checkpoints and the ExecuTorch runtime. tests/xnnpack_edits.rs compares ptefs's `values/<id>.f32.npy`
with it bit for bit; nothing here comes from ptefs.

    python3 tests/xnnpack_reference.py MANIFEST OUT_DIR

Writes OUT_DIR/<plan>/<delegate>/<id>.f32 (little-endian float32) for every constant that
has a float32 view (every stored datatype but fp32), and prints `<plan>/<delegate>/<id>
<datatype>` for each.
"""

import json
import os
import sys

import numpy as np

F32 = np.float32
UINT64_MAX = 0xFFFFFFFFFFFFFFFF
VIEWED = {"fp16", "bf16", "qint8", "quint8", "qint32", "qcint8", "qcint32", "qcint4", "qbint4"}


def named_blobs(manifest_path):
    """Named-data key -> bytes: the model file's entries first, then its data files'."""
    m = json.load(open(manifest_path))
    here = os.path.dirname(manifest_path)
    files = [(os.path.join(here, m["file"]), m)]
    for d in m.get("data_files", []):
        files.append((os.path.join(here, d), json.load(open(os.path.join(here, d + ".json")))))
    keys = {}
    for path, man in files:
        data = open(path, "rb").read()
        for nd in man["named_data"]:
            seg = man["segments"][nd["segment_index"]]
            keys.setdefault(nd["key"], data[seg["file_offset"] : seg["file_offset"] + seg["size"]])
    return m, keys


def constant(xnn, keys, idx):
    """The bytes of constant_data[idx]: named data (every ExecuTorch export) only."""
    c = xnn["constant_data"][idx]
    if not c.get("named_key"):
        raise NotImplementedError(f"constant_data[{idx}] lies in the payload, which no fixture has")
    return keys[c["named_key"]]


def bf16(raw):
    return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(F32)


def nibbles(raw, dims):
    """The 4-bit values minus 8: rows (the last dimension) packed two a byte, even element
    in the low nibble, each row padded to a whole byte."""
    cols = dims[-1] if dims else 1
    rows = int(np.prod(dims[:-1])) if len(dims) > 1 else 1
    row_bytes = (cols + 1) // 2
    b = np.frombuffer(raw, np.uint8, count=rows * row_bytes).reshape(rows, row_bytes)
    q = np.empty((rows, 2 * row_bytes), np.uint8)
    q[:, 0::2] = b & 15
    q[:, 1::2] = b >> 4
    return q[:, :cols].astype(F32).reshape(dims) - F32(8)


def along(scales, dims, channel_dim):
    shape = [1] * len(dims)
    shape[channel_dim] = dims[channel_dim]
    return np.asarray(scales, F32)[: dims[channel_dim]].reshape(shape)


def dequantize(v, xnn, keys):
    dt = v["datatype"][len("xnn_datatype_") :]
    dims = list(v["dims"])
    n = int(np.prod(dims)) if dims else 1
    raw = constant(xnn, keys, v["constant_buffer_idx"])
    if dt == "fp16":
        return np.frombuffer(raw, "<f2", count=n).astype(F32).reshape(dims)
    if dt == "bf16":
        return bf16(raw[: 2 * n]).reshape(dims)
    q = v.get("quant", {})
    kind = v.get("quant_type")

    def scales(dtype):
        idx = q.get("scale_buffer_idx", 0)
        if idx:
            raw_s = constant(xnn, keys, idx)
            return bf16(raw_s) if dtype == "bf16" else np.frombuffer(raw_s, "<f4")
        if dtype == "bf16":
            raise NotImplementedError("inline blockwise scales, which no fixture has")
        return np.asarray(q["scale"], F32)

    if dt in ("qint8", "quint8", "qint32") and kind == "PerTensorQuant":
        stored = {"qint8": "i1", "quint8": "u1", "qint32": "<i4"}[dt]
        x = np.frombuffer(raw, stored, count=n).reshape(dims)
        zp, s = q.get("zero_point", 0), F32(q["scale"])
        if dt == "qint32":
            return (x.astype(np.int64) - zp).astype(F32) * s
        return (x.astype(F32) - F32(zp)) * s
    if dt in ("qcint8", "qcint32") and kind == "PerChannelQuant":
        stored = "i1" if dt == "qcint8" else "<i4"
        x = np.frombuffer(raw, stored, count=n).reshape(dims)
        return x.astype(np.int64).astype(F32) * along(scales("fp32"), dims, q.get("channel_dim", 0))
    if dt == "qcint4" and kind == "PerChannelQuant":
        return nibbles(raw, dims) * along(scales("fp32"), dims, q.get("channel_dim", 0))
    if dt == "qbint4" and kind == "PerChannelGroupQuant":
        out, inp = dims
        group = q["group_size"]
        s = scales("bf16")[: out * (inp // group)].reshape(out, inp // group)
        return nibbles(raw, dims) * np.repeat(s, group, axis=1)
    raise NotImplementedError(f"{dt} with {kind}")


def main(manifest_path, out_dir):
    m, keys = named_blobs(manifest_path)
    for plan in m["plans"]:
        for j, d in enumerate(plan["delegates"]):
            xnn = d.get("xnnpack")
            if not xnn:
                continue
            for v in xnn["values"]:
                dt = v["datatype"][len("xnn_datatype_") :]
                if v["constant_buffer_idx"] == 0 or dt not in VIEWED:
                    continue
                w = dequantize(v, xnn, keys)
                assert w.dtype == F32 and list(w.shape) == list(v["dims"]), (v, w.dtype, w.shape)
                where = os.path.join(out_dir, plan["name"], str(j))
                os.makedirs(where, exist_ok=True)
                w.astype("<f4").tofile(os.path.join(where, f"{v['id_out']}.f32"))
                print(f"{plan['name']}/{j}/{v['id_out']} {dt}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
