#!/usr/bin/env python3
"""Edits made through a ptefs mount, and the outputs they should produce.

Used by scripts/conformance-edits, run in the ExecuTorch virtualenv. Every subcommand works
on a live mount and reads and writes only through it; a failure prints one line on stderr
and exits 1.

  plan-weight MOUNT MANIFEST FACTOR OUT.npy
      Evaluates the plan's instructions with torch eager ops on the constants read from the
      mount and checks that this reproduces the manifest's expected output. Then it writes
      the weight of aten::addmm (the input of the permute_copy feeding its mat2) back as
      weight * FACTOR with numpy.save onto values/<i>.npy, reads it back through the mount,
      and saves the output the edited program must produce to OUT.npy. Prints the edited
      value's path relative to the mount.

  xnnpack-weight MOUNT MANIFEST FACTOR OUT.npy
      For a delegated Linear followed by a multiplication by a scalar constant: finds the
      weight and bias among named_data/*.bin by size, checks (x @ W.T + b) * s against the
      manifest's expected output, writes W * FACTOR onto the weight's .bin (same size), reads
      it back, and saves the predicted output to OUT.npy. Prints the edited blob's path.

  bulk-weights MOUNT MANIFEST OUT.npy
      Checks the eager evaluation of the plan against the manifest, like plan-weight, then
      writes one safetensors file onto weights.safetensors that changes every float tensor
      it lists (each scaled by its own factor and shifted): one bulk commit. Reads back
      weights.safetensors with safe_open and every tensor's .npy, evaluates the plan on the
      constants read through the mount again, and saves that prediction to OUT.npy. Prints
      how many tensors it changed.

  snapshot MOUNT DIR
      Copies segments/<n>, named_data/*.bin and delegates/*/processed.bin out of the mount.

  verify-relayout MOUNT DIR DELEGATE_PATH EXPECTED_PAYLOAD ALIGN
      After a size-changing commit of DELEGATE_PATH: the payload equals EXPECTED_PAYLOAD,
      every other snapshotted file is byte-identical, and every segment-backed file starts
      at a multiple of ALIGN in the model file.

  xnnpack-fp32-filter MOUNT MANIFEST FACTOR OUT.npy RANGES.json
      For a delegated fp32 Linear followed by a multiplication by a scalar constant: finds
      the filter and bias through xnnpack/graph.json, checks (x @ W.T + b) * s against the
      manifest, writes W * FACTOR with numpy.save onto xnnpack/values/<filter>.npy, reads it
      back, saves the predicted output to OUT.npy and the filter's byte range (from its
      .json) to RANGES.json. Prints the edited path.

  xnnpack-f32-filter MOUNT MANIFEST DATATYPE DELEGATE PRED.npy TOL.npy RANGES.json
      Writes new float32 values (the view x1.5, shifted per element) with numpy.save onto
      xnnpack/values/<id>.f32.npy of the first filter of DATATYPE in delegate DELEGATE, and
      checks that the view reads back within half a fresh quantization step. RANGES.json gets
      the byte ranges the write may change (the filter's weights and scales, and the integers
      and scales of an int32 bias, which follow the filter's scales). When the delegate is one
      quantized Linear, saves the output the runtime must give (computed from the values read
      back, with XNNPACK's input and output quantization) to PRED.npy and the bound on its
      deviation to TOL.npy; otherwise prints "unpredictable" after the path.

  run-within PTE PTD|- MANIFEST PRED.npy TOL.npy
      Runs the manifest's runtime_check on the file: the output must differ from the
      manifest's and lie within TOL of PRED everywhere.

  verify-diff ORIGINAL EDITED RANGES.json
      Every byte of EDITED that differs from ORIGINAL lies in a range of RANGES.json for
      EDITED, and the first range (the weights) changed.
"""

import glob
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)
from etlib import allclose, close, load_torch, manifest_io, run_in_child  # noqa: E402


class Failure(Exception):
    pass


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def write_bytes(path, data):
    # close() is where ptefs commits and reports a rejected or failed write.
    with open(path, "wb") as f:
        f.write(data)


# --- plan interpreter -------------------------------------------------------------------


def parse_instructions(text):
    """`chain:pc<TAB>kernel aten::name.overload(%a, %b, ...)` -> [(name, [indices])]."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        _, body = line.split("\t", 1)
        kind, rest = body.split(" ", 1)
        if kind != "kernel":
            out.append((body, []))
            continue
        name, args = rest.split("(", 1)
        args = args.rstrip(")").split(",")
        out.append((name.strip(), [int(a.strip().lstrip("%")) for a in args if a.strip()]))
    return out


class Plan:
    def __init__(self, torch, mount, name="forward"):
        self.torch = torch
        self.dir = os.path.join(mount, "plans", name)
        self.meta = json.load(open(os.path.join(self.dir, "plan.json")))
        self.instructions = parse_instructions(open(os.path.join(self.dir, "instructions.txt")).read())
        self.json = {}

    def value_json(self, i):
        if i not in self.json:
            self.json[i] = json.load(open(os.path.join(self.dir, "values", f"{i}.json")))
        return self.json[i]

    def npy_path(self, i):
        return os.path.join(self.dir, "values", f"{i}.npy")

    def scalar(self, i):
        v = self.value_json(i)
        if v["type"] not in ("Int", "Double", "Bool"):
            raise Failure(f"value {i} is {v['type']}, expected a scalar")
        return v["value"]

    def int_list(self, i):
        v = self.value_json(i)
        if v["type"] != "IntList":
            raise Failure(f"value {i} is {v['type']}, expected an IntList")
        return [self.scalar(j) for j in v["items"]]

    def constants(self):
        """Every tensor whose bytes are in the files, as numpy arrays read from the mount."""
        consts = {}
        for i in range(self.meta["counts"]["values"]):
            v = self.value_json(i)
            if v["type"] == "Tensor" and v["data"] in ("constant", "external"):
                consts[i] = np.load(self.npy_path(i))
        return consts

    def evaluate(self, inputs, consts):
        torch = self.torch
        env = {i: torch.from_numpy(np.array(a, copy=True)) for i, a in consts.items()}
        for idx, t in zip(self.meta["inputs"], inputs):
            env[idx] = t
        for name, a in self.instructions:
            if name == "aten::permute_copy.out":
                env[a[2]] = env[a[0]].permute(self.int_list(a[1])).contiguous()
            elif name == "aten::addmm.out":
                env[a[5]] = torch.addmm(env[a[0]], env[a[1]], env[a[2]], beta=self.scalar(a[3]), alpha=self.scalar(a[4]))
            elif name == "aten::mul.out":
                env[a[2]] = torch.mul(env[a[0]], env[a[1]])
            elif name == "aten::relu.out":
                env[a[1]] = torch.relu(env[a[0]])
            else:
                raise Failure(f"no eager equivalent for {name}")
        return env[self.meta["outputs"][0]]

    def addmm_weight(self):
        """The value index of the weight of aten::addmm: the input of the permute_copy that
        produces its mat2."""
        producers = {a[2]: (n, a) for n, a in self.instructions if n == "aten::permute_copy.out"}
        for name, a in self.instructions:
            if name == "aten::addmm.out" and a[2] in producers:
                w = producers[a[2]][1][0]
                if w in self.constants_index():
                    return w
        raise Failure("no aten::addmm whose mat2 is a permuted constant")

    def constants_index(self):
        return {
            i
            for i in range(self.meta["counts"]["values"])
            if self.value_json(i)["type"] == "Tensor" and self.value_json(i)["data"] in ("constant", "external")
        }


def plan_weight(mount, manifest_path, factor, out_npy):
    torch = load_torch()
    manifest = json.load(open(manifest_path))
    inputs, expected = manifest_io(torch, manifest)
    plan = Plan(torch, mount, manifest["runtime_check"]["method"])
    consts = plan.constants()
    before = plan.evaluate(inputs, consts)
    if not allclose(torch, before, expected):
        raise Failure("the eager evaluation of the unedited constants does not reproduce the manifest")
    w = plan.addmm_weight()
    new_w = (consts[w] * np.float32(factor)).astype(consts[w].dtype)
    np.save(plan.npy_path(w), new_w)
    back = np.load(plan.npy_path(w))
    if back.dtype != new_w.dtype or back.shape != new_w.shape or back.tobytes() != new_w.tobytes():
        raise Failure(f"values/{w}.npy read back after the write differs from what was written")
    edited = dict(consts)
    edited[w] = new_w
    after = plan.evaluate(inputs, edited)
    if allclose(torch, after, expected):
        raise Failure("the edit does not change the predicted output")
    np.save(out_npy, after.numpy())
    print(os.path.relpath(plan.npy_path(w), mount))


# --- delegated linear -------------------------------------------------------------------


def scaled_linear(torch, plan, x, b):
    """For a delegated Linear followed by a multiplication by the plan's one 0-dim constant
    s (read through the mount): the output for a weight, (x @ weight.T + b) * s."""
    scalars = [i for i in plan.constants_index() if plan.value_json(i)["sizes"] == []]
    if len(scalars) != 1:
        raise Failure("expected one 0-dim constant (the multiplier)")
    s = torch.from_numpy(np.array(np.load(plan.npy_path(scalars[0])), copy=True))
    return lambda weight: (x @ torch.from_numpy(weight).T + torch.from_numpy(b)) * s


def xnnpack_weight(mount, manifest_path, factor, out_npy):
    torch = load_torch()
    manifest = json.load(open(manifest_path))
    inputs, expected = manifest_io(torch, manifest)
    (x,) = inputs
    n_in, n_out = x.shape[-1], expected.shape[-1]
    blobs = {p: read_bytes(p) for p in sorted(glob.glob(os.path.join(mount, "named_data", "*.bin")))}
    weights = [p for p, b in blobs.items() if len(b) == 4 * n_in * n_out]
    biases = [p for p, b in blobs.items() if len(b) == 4 * n_out]
    if len(weights) != 1 or len(biases) != 1:
        raise Failure(f"expected one {n_out}x{n_in} float weight and one bias among named_data")
    wpath, bpath = weights[0], biases[0]
    w = np.frombuffer(blobs[wpath], dtype="<f4").reshape(n_out, n_in).copy()
    b = np.frombuffer(blobs[bpath], dtype="<f4").copy()
    linear = scaled_linear(torch, Plan(torch, mount, manifest["runtime_check"]["method"]), x, b)
    if not allclose(torch, linear(w), expected):
        raise Failure("(x @ W.T + b) * s with the blobs read from the mount does not reproduce the manifest")
    new_w = (w * np.float32(factor)).astype("<f4")
    write_bytes(wpath, new_w.tobytes())
    if read_bytes(wpath) != new_w.tobytes():
        raise Failure(f"{os.path.basename(wpath)} read back after the write differs from what was written")
    after = linear(new_w)
    np.save(out_npy, after.numpy())
    print(os.path.relpath(wpath, mount))


# --- bulk update through weights.safetensors -------------------------------------------


def bulk_weights(mount, manifest_path, out_npy):
    from safetensors import safe_open
    from safetensors.numpy import save

    torch = load_torch()
    manifest = json.load(open(manifest_path))
    inputs, expected = manifest_io(torch, manifest)
    plan = Plan(torch, mount, manifest["runtime_check"]["method"])
    if not allclose(torch, plan.evaluate(inputs, plan.constants()), expected):
        raise Failure("the eager evaluation of the unedited constants does not reproduce the manifest")
    path = os.path.join(mount, "weights.safetensors")
    new = {}
    with safe_open(path, "np") as f:
        paths = f.metadata() or {}
        for k, name in enumerate(f.keys()):
            a = f.get_tensor(name)
            if a.dtype.kind == "f":
                new[name] = np.array(a * (1.0 + 0.1 * (k % 7)) + 0.01 * (k % 3), dtype=a.dtype)
    if not new:
        raise Failure("weights.safetensors lists no float tensor")
    write_bytes(path, save(new))
    with safe_open(path, "np") as f:
        for name, a in new.items():
            if f.get_tensor(name).tobytes() != a.tobytes():
                raise Failure(f"{name}: weights.safetensors read back differs from the update")
    for name, a in new.items():
        if np.load(os.path.join(mount, paths[name] + ".npy")).tobytes() != a.tobytes():
            raise Failure(f"{paths[name]}.npy does not show the update of {name}")
    after = Plan(torch, mount, manifest["runtime_check"]["method"])
    predicted = after.evaluate(inputs, after.constants())
    if allclose(torch, predicted, expected):
        raise Failure("the update does not change the predicted output")
    np.save(out_npy, predicted.numpy())
    print(f"{len(new)} float tensors in one commit")


# --- re-layout --------------------------------------------------------------------------


def payload_files(mount):
    pats = ["segments/*", "named_data/*.bin", "plans/*/delegates/*/processed.bin"]
    return sorted(os.path.relpath(p, mount) for pat in pats for p in glob.glob(os.path.join(mount, pat)))


def snapshot(mount, dest):
    for rel in payload_files(mount):
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(read_bytes(os.path.join(mount, rel)))


def verify_relayout(mount, snap, delegate_rel, expected_payload, align):
    align = int(align)
    new_payload = read_bytes(expected_payload)
    delegate_dir = os.path.dirname(delegate_rel)
    info = json.load(open(os.path.join(mount, delegate_dir, "delegate.json")))
    if info["processed"]["location"] != "SEGMENT":
        raise Failure("the delegate payload is not in a segment")
    grown_segment = os.path.join("segments", str(info["processed"]["index"]))
    now_files = set(payload_files(mount))
    if now_files != {os.path.relpath(p, snap) for p in glob.glob(os.path.join(snap, "**"), recursive=True) if os.path.isfile(p)}:
        raise Failure("the set of segments and blobs changed")
    for rel in sorted(now_files):
        now = read_bytes(os.path.join(mount, rel))
        if rel in (delegate_rel, grown_segment):
            if now != new_payload:
                raise Failure(f"{rel} is not the grown payload after the remount")
        elif now != read_bytes(os.path.join(snap, rel)):
            raise Failure(f"{rel} changed although it was not edited")
    offsets = [(delegate_rel, info["file_offset"])]
    for p in sorted(glob.glob(os.path.join(mount, "named_data", "*.json"))):
        offsets.append((os.path.relpath(p, mount), json.load(open(p))["file_offset"]))
    for rel, off in offsets:
        if off % align:
            raise Failure(f"{rel} starts at {off}, not a multiple of {align}")


# --- XNNPACK values through xnnpack/ ----------------------------------------------------


def xnn_dir(mount, method, delegate=0):
    return os.path.join(mount, "plans", method, "delegates", str(delegate), "xnnpack")


def xnn_json(d, name):
    return json.load(open(os.path.join(d, name)))


def xnn_value(d, i):
    return xnn_json(d, os.path.join("values", f"{i}.json"))


def fully_connected(d):
    """The fields of the delegate's one XNNFullyConnected node."""
    nodes = [n["xnode_union"] for n in xnn_json(d, "graph.json")["xnodes"]]
    fcs = [n for n in nodes if n["type"] == "XNNFullyConnected"]
    if len(fcs) != 1:
        raise Failure(f"{d}: expected one XNNFullyConnected node, found {len(fcs)}")
    return fcs[0], nodes


def span(place):
    """A byte range a value's .json names; `file` is the model file's name."""
    return {"file": os.path.basename(place["file"]), "start": place["file_offset"], "end": place["file_offset"] + place["nbytes"]}


def xnnpack_fp32_filter(mount, manifest_path, factor, out_npy, ranges_json):
    torch = load_torch()
    manifest = json.load(open(manifest_path))
    inputs, expected = manifest_io(torch, manifest)
    (x,) = inputs
    method = manifest["runtime_check"]["method"]
    d = xnn_dir(mount, method)
    fc, _ = fully_connected(d)
    fv = xnn_value(d, fc["filter_id"])
    if fv["datatype"] != "fp32":
        raise Failure(f"the filter %{fc['filter_id']} is {fv['datatype']}, expected fp32")
    w_path = os.path.join(d, "values", f"{fc['filter_id']}.npy")
    w = np.load(w_path)
    b = np.load(os.path.join(d, "values", f"{fc['bias_id']}.npy"))
    linear = scaled_linear(torch, Plan(torch, mount, method), x, b)
    if not allclose(torch, linear(w), expected):
        raise Failure("(x @ W.T + b) * s with the values read from xnnpack/ does not reproduce the manifest")
    new_w = (w * np.float32(float(factor))).astype(w.dtype)
    np.save(w_path, new_w)
    back = np.load(w_path)
    if back.dtype != new_w.dtype or back.shape != new_w.shape or back.tobytes() != new_w.tobytes():
        raise Failure(f"{os.path.relpath(w_path, mount)} read back after the write differs from what was written")
    np.save(out_npy, linear(new_w).numpy())
    json.dump([span(fv["constant"])], open(ranges_json, "w"))
    print(os.path.relpath(w_path, mount))


QMAX = {"qcint4": 7, "qbint4": 7, "qcint8": 127, "qint8": 127}


def xnnpack_f32_filter(mount, manifest_path, datatype, delegate, pred_npy, tol_npy, ranges_json):
    torch = load_torch()
    manifest = json.load(open(manifest_path))
    inputs, _ = manifest_io(torch, manifest)
    d = xnn_dir(mount, manifest["runtime_check"]["method"], delegate)
    values = sorted(int(f[: -len(".json")]) for f in os.listdir(os.path.join(d, "values")) if f.endswith(".json"))
    filters = [
        v for v in (xnn_value(d, i) for i in values)
        if v["datatype"] == datatype and [u["role"] for u in v["used_by"]] == ["filter"]
    ]
    if not filters:
        raise Failure(f"{d}: no {datatype} filter")
    fv = filters[0]
    ranges = [span(fv["constant"]), span(fv["quant"]["scales"])]
    fc, nodes = fully_connected(d)
    bias = xnn_value(d, fc["bias_id"]) if fc.get("bias_id") not in (None, 0xFFFFFFFF) else None
    if bias is not None and bias["datatype"] in ("qint32", "qcint32"):
        ranges += [span(bias["constant"]), span(bias["quant"]["scales"])]
    path = os.path.join(d, "values", f"{fv['id']}.f32.npy")
    w = np.load(path)
    shift = ((np.arange(w.size) % 7) - 3).astype(np.float32).reshape(w.shape)
    new = (w * np.float32(1.5) + np.float32(0.03) * np.abs(w).max() * shift).astype(np.float32)
    np.save(path, new)
    back = np.load(path)
    worst = float(np.abs(back - new).max())
    if back.shape != new.shape or worst > 0.5 * float(np.abs(new).max()) / QMAX[datatype] * 1.01:
        raise Failure(f"{os.path.relpath(path, mount)} reads back {worst} away from what was written")
    json.dump(ranges, open(ranges_json, "w"))
    rel = os.path.relpath(path, mount)
    linear = [n["type"] for n in nodes] in (["XNNConvert", "XNNFullyConnected"], ["XNNConvert", "XNNFullyConnected", "XNNConvert"])
    if not linear or fc["filter_id"] != fv["id"]:
        print(f"{rel} unpredictable")
        return
    # The delegate is the whole method only when it is the plan's one instruction.
    if len(Plan(torch, mount, manifest["runtime_check"]["method"]).instructions) != 1 or len(inputs) != 1:
        print(f"{rel} unpredictable")
        return
    x = inputs[0].numpy().astype(np.float64)
    wd = back.astype(np.float64)
    if bias is None:
        b = 0.0
    elif os.path.exists(os.path.join(d, "values", f"{bias['id']}.f32.npy")):
        b = np.load(os.path.join(d, "values", f"{bias['id']}.f32.npy")).astype(np.float64)
    else:
        b = np.load(os.path.join(d, "values", f"{bias['id']}.npy")).astype(np.float64)
    qin = xnn_value(d, fc["input1_id"])
    if qin["datatype"] == "qdint8":
        # Dynamic: each row quantized asymmetrically over [min(x, 0), max(x, 0)] in 255
        # steps; the output can differ from the float product by half a step per weight.
        step = (np.maximum(x.max(axis=-1), 0) - np.minimum(x.min(axis=-1), 0)) / 255
        pred = x @ wd.T + b
        tol = 0.5 * step[..., None] * np.abs(wd).sum(axis=1)[None, :] * 1.01 + 1e-5
    elif qin["datatype"] == "qint8":
        # Static: the input quantized with its scale and zero point, int32 accumulation, the
        # output requantized with its own; rounding may differ by one output step.
        s_in, z_in = qin["quant"]["scale"], qin["quant"]["zero_point"]
        qout = xnn_value(d, fc["output_id"])
        s_out, z_out = qout["quant"]["scale"], qout["quant"]["zero_point"]
        xq = np.clip(np.rint(x / s_in) + z_in, -128, 127)
        acc = ((xq - z_in) * s_in) @ wd.T + b
        pred = (np.clip(np.rint(acc / s_out) + z_out, -128, 127) - z_out) * s_out
        tol = np.full(pred.shape, 1.01 * s_out)
    else:
        print(f"{rel} unpredictable")
        return
    np.save(pred_npy, pred.astype(np.float32))
    np.save(tol_npy, tol.astype(np.float32))
    print(rel)


def run_within(pte, ptd, manifest_path, pred_npy, tol_npy):
    torch = load_torch()
    manifest = json.load(open(manifest_path))
    rc = manifest["runtime_check"]
    result = run_in_child(pte, None if ptd == "-" else ptd, rc["method"], rc["inputs"], rc.get("imports", ()))
    if result[0] != "ok":
        raise Failure(f"runtime: {result[1]}")
    _, shape, values, dtype = result
    exp = rc["expected"]
    if close(torch, shape, values, exp["shape"], exp["values"], dtype):
        raise Failure("the output is unchanged")
    pred, tol = np.load(pred_npy), np.load(tol_npy)
    got = np.asarray(values, np.float64).reshape(shape)
    if list(got.shape) != list(pred.shape):
        raise Failure(f"output shape {list(got.shape)}, predicted {list(pred.shape)}")
    dev = np.abs(got - pred)
    if (dev > tol).any():
        k = int(np.argmax(dev - tol))
        raise Failure(f"output element {k} is {got.flat[k]}, predicted {pred.flat[k]} within {tol.flat[k]}")
    print(f"changed; within the predicted bound (max |out - predicted| {dev.max():.3g}, bound {tol.max():.3g})")


def verify_diff(original, edited, ranges_json):
    a, b = read_bytes(original), read_bytes(edited)
    if len(a) != len(b):
        raise Failure(f"{os.path.basename(edited)} changed size ({len(a)} -> {len(b)} bytes)")
    me = os.path.basename(edited)
    ranges = [(r["start"], r["end"]) for r in json.load(open(ranges_json)) if r["file"] == me]
    diff = np.flatnonzero(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8))
    outside = [int(i) for i in diff if not any(s <= i < e for s, e in ranges)]
    if outside:
        raise Failure(f"{os.path.basename(edited)}: byte {outside[0]} changed, outside the edited values' ranges {ranges}")
    if not ranges or not any(ranges[0][0] <= i < ranges[0][1] for i in diff):
        raise Failure(f"{os.path.basename(edited)}: the weights did not change")
    print(f"{len(diff)} bytes differ, all in {len(ranges)} ranges of the edited values")


XNNPACK_CMDS = {
    "xnnpack-fp32-filter": (xnnpack_fp32_filter, 5),
    "xnnpack-f32-filter": (xnnpack_f32_filter, 7),
    "run-within": (run_within, 5),
    "verify-diff": (verify_diff, 3),
}


def main(argv):
    cmds = {
        "plan-weight": (plan_weight, 4),
        "xnnpack-weight": (xnnpack_weight, 4),
        "bulk-weights": (bulk_weights, 3),
        "snapshot": (snapshot, 2),
        "verify-relayout": (verify_relayout, 5),
    }
    cmds.update(XNNPACK_CMDS)
    if len(argv) < 2 or argv[1] not in cmds or len(argv) - 2 != cmds[argv[1]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    fn, _ = cmds[argv[1]]
    args = argv[2:]
    if fn in (plan_weight, xnnpack_weight):
        args[2] = float(args[2])
    try:
        fn(*args)
    except (Failure, OSError) as e:
        print(f"{argv[1]}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
