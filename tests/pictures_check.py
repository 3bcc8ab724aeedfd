#!/usr/bin/env python3
"""Checks the pictures of a tree, dumped under DIR, with real renderers and NumPy.

For every `*.dot`: Graphviz `dot -Tsvg` must exit 0 with nothing on stderr (no warning) and
draw an SVG. For every `*.svg`: `rsvg-convert -f png` must render it to a PNG that is not
blank (pixels other than the white background, counted by decoding the PNG here with zlib).
For every `<base>.hist.svg`: it has the fixed size, and its `<metadata>` counts equal
`numpy.histogram` of the values of `<base>.f32.npy` (else `<base>.npy`) with the same edges,
its edges run from the values' min to max, and its totals (values, finite, NaN, ±Inf, zero)
are NumPy's.

Usage: pictures_check.py DIR HIST_SVG_LEN. Prints one line per failure, then
"N passed, M failed"; exits 1 when something failed.
"""

import json
import os
import struct
import subprocess
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def png_pixels(data):
    """(width, height, rows of RGBA or RGB bytes) of an 8-bit non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, [], None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + n
    w, h, depth, color, _, _, interlace = ihdr
    assert depth == 8 and interlace == 0 and color in (2, 6), f"PNG type {ihdr}"
    bpp = 4 if color == 6 else 3
    raw = zlib.decompress(b"".join(idat))
    stride = w * bpp
    rows, prev, at = [], bytearray(stride), 0
    for _ in range(h):
        f, line = raw[at], bytearray(raw[at + 1:at + 1 + stride])
        at += 1 + stride
        if f == 0:
            rows.append(bytes(line))
            prev = line
            continue
        if f == 2:  # Up: no dependency inside the row
            line = bytearray(((np.frombuffer(line, np.uint8).astype(np.uint16)
                               + np.frombuffer(bytes(prev), np.uint8)) & 255).astype(np.uint8).tobytes())
            rows.append(bytes(line))
            prev = line
            continue
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pr) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def ink(data):
    """Fraction of pixels that are neither white nor transparent."""
    w, h, bpp, rows = png_pixels(data)
    px = np.frombuffer(b"".join(rows), np.uint8).reshape(h, w, bpp)
    rgb = px[:, :, :3].astype(int)
    visible = px[:, :, 3] > 0 if bpp == 4 else np.ones((h, w), bool)
    inked = visible & (rgb.sum(axis=2) < 3 * 250)
    return inked.sum() / (w * h)


def values_of(base):
    for ext in (".f32.npy", ".npy"):
        if os.path.exists(base + ext):
            a = np.load(base + ext)
            if a.dtype.kind == "V" and a.dtype.itemsize == 2:  # bfloat16
                a = (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            return a.astype(np.float64).ravel()
    raise AssertionError(f"no .npy beside {base}.hist.svg")


def check_hist(path, size):
    text = open(path, "rb").read()
    assert len(text) == size, f"{len(text)} bytes, expected {size}"
    meta = text.split(b'<metadata id="ptefs-histogram">')[1].split(b"</metadata>")[0]
    m = json.loads(meta)
    v = values_of(path[: -len(".hist.svg")])
    finite = v[np.isfinite(v)]
    edges = np.array(m["edges"], np.float64)
    counts, _ = np.histogram(finite, bins=edges)
    assert counts.tolist() == m["counts"], f"counts {m['counts']} != numpy {counts.tolist()}"
    assert m["total"] == v.size and m["finite"] == finite.size, "totals differ"
    assert m["nan"] == int(np.isnan(v).sum()), "NaN count differs"
    assert m["pos_inf"] == int(np.isposinf(v).sum()) and m["neg_inf"] == int(np.isneginf(v).sum())
    assert m["zero"] == int((finite == 0).sum()), "zero count differs"
    if finite.size and finite.min() != finite.max():
        assert (edges[0], edges[-1]) == (finite.min(), finite.max()), "edges are not min..max"
    return finite.size


def run(cmd):
    return subprocess.run(cmd, capture_output=True, timeout=120)


def check(path, size):
    if path.endswith(".dot"):
        r = run(["dot", "-Tsvg", path])
        assert r.returncode == 0, f"dot exited {r.returncode}: {r.stderr.decode()[:300]}"
        assert r.stderr == b"", f"dot warned: {r.stderr.decode()[:300]}"
        assert b"<svg" in r.stdout, "dot drew no SVG"
    if path.endswith(".svg"):
        # A real rendering, scaled down so decoding it here stays quick.
        r = run(["rsvg-convert", "-f", "png", "--width", "240", "--keep-aspect-ratio", path])
        assert r.returncode == 0, f"rsvg-convert exited {r.returncode}: {r.stderr.decode()[:300]}"
        share = ink(r.stdout)
        assert share > 0.005, f"rendered blank ({share:.4f} of the pixels inked)"
    if path.endswith(".hist.svg"):
        check_hist(path, size)


def main():
    root, size = sys.argv[1], int(sys.argv[2])
    paths = sorted(
        os.path.join(d, f)
        for d, _, files in os.walk(root)
        for f in files
        if f.endswith((".dot", ".svg"))
    )

    def one(p):
        try:
            check(p, size)
            return None
        except Exception as e:  # noqa: BLE001 (every failure is reported)
            return f"FAIL {os.path.relpath(p, root)}: {type(e).__name__}: {e}"

    with ThreadPoolExecutor(max_workers=2) as ex:
        failures = [f for f in ex.map(one, paths) if f]
    for f in failures:
        print(f)
    kinds = {k: sum(p.endswith(k) for p in paths) for k in (".dot", ".hist.svg", "sizes.svg")}
    print(f"checked {kinds}")
    print(f"{len(paths) - len(failures)} passed, {len(failures)} failed")
    sys.exit(1 if failures or not paths else 0)


if __name__ == "__main__":
    main()
