#!/usr/bin/env python3
"""Names learned by `ptefs names` on fresh `export_llm` exports, checked against what the
export did. Used by scripts/conformance-names (see there for the cases); runs in the
ExecuTorch virtualenv.

Each case writes a checkpoint in Hugging Face's layout (scripts/llmlib.py), converts it to
the Meta checkpoint export_llm reads (ExecuTorch's own converter where the wheel has one,
torchtune's Llama conversion otherwise), exports it, and runs `ptefs names ... -o MAP`.
Then, for every checkpoint tensor, independently of ptefs:

* the transform the map gives, applied in NumPy as docs/names.md defines it, must turn the
  Hugging Face tensor into exactly the Meta tensor the conversion made of it, and be the
  conversion's own (rotary `hf_to_meta` with n_heads for q, n_kv_heads for k; identity
  elsewhere);
* the stored tensor at each target path, decoded from the export by ExecuTorch's own
  readers (flatc's decoding of the XNNPACK payload, `FlatTensorSerializer` for the .ptd;
  scripts/manifest.py) and dequantized with scripts/xnnpack-rules' rules, must be within
  half a quantization step (root mean square) of that Meta tensor, and that Meta tensor must
  be the closest to it of all Meta tensors of its shape;
* every Meta tensor export_llm consumed must be some name's target, and the map must name
  nothing else.

Cases are functions in CASES, each given an `Export` made once per run (`exported(name)`):
a case that applies a fine-tuned checkpoint by name and compares the runtime's output with a
fresh export over several decode steps takes one of these exports and its map.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True

import llmlib  # noqa: E402
import manifest  # noqa: E402

F32 = np.float32


def xnnpack_rules():
    from importlib.machinery import SourceFileLoader

    return SourceFileLoader("xnnpack_rules", os.path.join(HERE, "xnnpack-rules")).load_module()


XR = None


class Failure(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# The export, read without ptefs


class Decoded:
    """A .pte and its .ptd files as ExecuTorch's readers see them: the forward plan's XNNPACK
    delegates (flatc's decoding) and every named blob, in the shape scripts/xnnpack-rules'
    `dequantize` reads them through (`delegates`, `constant`, `read`)."""

    def __init__(self, pte, ptds):
        blobs = {}
        for p in ptds:
            blobs.update(manifest.ptd_named_blobs(p))
        self.m = manifest.read_pte(pte, blobs)
        raw = open(pte, "rb").read()
        self.data = {}
        for nd in self.m["named_data"]:
            seg = self.m["segments"][nd["segment_index"]]
            self.data.setdefault(nd["key"], raw[seg["file_offset"] : seg["file_offset"] + seg["size"]])
        # The runtime's merged map puts the external data first.
        self.data.update(blobs)
        self.ptd_layouts = {}
        for p in ptds:
            pm = manifest.read_ptd(p)
            for nd in pm["named_data"]:
                if nd.get("tensor_layout"):
                    self.ptd_layouts[nd["key"]] = nd["tensor_layout"]
        self.plan = [p for p in self.m["plans"] if p["name"] == "forward"][0]
        self.delegates = [(d["xnnpack"], 0) for d in self.plan["delegates"]]

    def constant(self, j, idx):
        xnn, _ = self.delegates[j]
        c = xnn["constant_data"][idx]
        if not c["named_key"]:
            raise Failure(f"delegate {j}: constant {idx} is inside the payload")
        return c["named_key"], 0, c["size"]

    def read(self, loc, data=None):
        key, off, n = loc
        return bytes(self.data[key][off : off + n])

    def stored(self, path):
        """(float32 values, step of each) of the stored tensor at a tree path."""
        parts = path.split("/")
        if parts[0] == "plans" and parts[2] == "delegates" and parts[4] == "xnnpack":
            j, vid = int(parts[3]), int(parts[6])
            q, s = XR.dequantize(self, j, vid)
            v = XR.deq((q, s))
            steps = np.broadcast_to(np.abs(np.asarray(s, F32)), v.shape) if np.ndim(s) or s != 1 else np.zeros_like(v)
            return v, steps
        if "named_data" in parts:
            key = parts[-1]
            layout = self.ptd_layouts.get(key)
            if layout is None or layout["scalar_type"] != "FLOAT":
                raise Failure(f"{path}: not a float tensor of a .ptd")
            v = np.frombuffer(self.data[key], F32).reshape(layout["sizes"])
            return v, np.zeros_like(v)
        raise Failure(f"{path}: not a target this check decodes")


# ---------------------------------------------------------------------------------------------
# Transforms as docs/names.md defines them


def apply_transform(t, x, stored_shape):
    """`stored = T(checkpoint)` in NumPy."""
    kind = t["kind"]
    if kind == "identity":
        return x.reshape(stored_shape)
    if kind == "axes":
        dims = x.shape if len(x.shape) == len(stored_shape) else tuple(d for d in x.shape if d != 1)
        return np.transpose(x.reshape(dims), t["order"]).reshape(stored_shape)
    if kind == "rotary":
        d1 = x.shape[0]
        d2 = int(np.prod(x.shape[1:])) if x.ndim > 1 else 1
        n = t["heads"]
        w = x.reshape(d1, d2)
        if t["direction"] == "hf_to_meta":
            out = w.reshape(n, 2, d1 // n // 2, d2).transpose(0, 2, 1, 3)
        else:
            out = w.reshape(n, d1 // n // 2, 2, d2).transpose(0, 2, 1, 3)
        return out.reshape(stored_shape)
    raise Failure(f"unknown transform {t}")


# ---------------------------------------------------------------------------------------------
# Exports, made once per run


class Export:
    def __init__(self, name, directory, pte, ptds, hf, meta, how, from_args, family):
        self.name, self.dir, self.pte, self.ptds = name, directory, pte, ptds
        self.hf, self.meta, self.how, self.from_args, self.family = hf, meta, how, from_args, family


EXPORTS = {}


def make_export(name):
    d = os.path.join(ARGS.work, name)
    os.makedirs(d, exist_ok=True)
    if name == "llama_hf":
        hf, cfg = llmlib.hf_checkpoint("llama", 101)
        llmlib.write_hf_dir(os.path.join(d, "hf"), hf, cfg, shards=3)
        meta, how = llmlib.hf_to_meta("llama", hf, cfg)
        pte, ptd = os.path.join(d, "model.pte"), os.path.join(d, "model.ptd")
        llmlib.export(meta, llmlib.meta_params("llama", cfg), pte, foundation_ptd=ptd)
        x = Export(name, d, pte, [ptd], hf, meta, how, [os.path.join(d, "hf")], "llama")
        x.cfg = cfg
        return x
    if name == "qwen_hf":
        hf, cfg = llmlib.hf_checkpoint("qwen3", 102, tied=True, dtype="bfloat16")
        llmlib.write_hf_dir(os.path.join(d, "hf"), hf, cfg)
        meta, how = llmlib.hf_to_meta("qwen3", hf, cfg)
        pte, ptd = os.path.join(d, "model.pte"), os.path.join(d, "model.ptd")
        llmlib.export(meta, llmlib.meta_params("qwen3", cfg), pte, family="qwen3", quant="qc4", foundation_ptd=ptd)
        x = Export(name, d, pte, [ptd], hf, meta, how, [os.path.join(d, "hf")], "qwen3")
        x.cfg = cfg
        return x
    if name == "llama_lora":
        hf, cfg = llmlib.hf_checkpoint("llama", 103)
        llmlib.write_hf_dir(os.path.join(d, "hf"), hf, cfg)
        meta, how = llmlib.hf_to_meta("llama", hf, cfg)
        adapter, acfg = llmlib.peft_adapter(104, hf, cfg)
        llmlib.write_adapter_dir(os.path.join(d, "adapter"), adapter, acfg)
        pte = os.path.join(d, "model.pte")
        foundation, lora = os.path.join(d, "foundation.ptd"), os.path.join(d, "lora.ptd")
        llmlib.export(meta, llmlib.meta_params("llama", cfg), pte, adapter_dir=os.path.join(d, "adapter"),
                      foundation_ptd=foundation, lora_ptd=lora)
        # export_llm maps PEFT names to Meta's and keeps the tensors as they are.
        for k, v in adapter.items():
            hf[k] = v
            how[k] = [(k, {"kind": "identity"})]
            meta[k] = v
        x = Export(name, d, pte, [foundation, lora], hf, meta, how,
                   [os.path.join(d, "hf"), os.path.join(d, "adapter")], "llama")
        x.cfg = cfg
        return x
    raise KeyError(name)


def exported(name):
    if name not in EXPORTS:
        EXPORTS[name] = make_export(name)
    return EXPORTS[name]


def learn(e):
    """`ptefs names` of an export, with `-o`: the map, and the report."""
    out = os.path.join(e.dir, "names.json")
    cmd = [ARGS.ptefs, "names", e.pte]
    for p in e.ptds:
        cmd += ["--data", p]
    for f in e.from_args:
        cmd += ["--from", f]
    cmd += ["-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    with open(os.path.join(e.dir, "report.txt"), "w") as f:
        f.write(r.stdout + r.stderr)
    if r.returncode != 0:
        raise Failure(f"ptefs names: exit {r.returncode}: {r.stderr.strip()}")
    return json.load(open(out)), r.stdout


# ---------------------------------------------------------------------------------------------
# The check


def np_of(t):
    import torch

    return t.detach().to(torch.float32).contiguous().numpy()


def check_names(e, the_map):
    """Every name's targets and transforms against the export."""
    dec = Decoded(e.pte, e.ptds)
    meta = {k: np_of(v) for k, v in e.meta.items()}
    names = the_map["names"]
    if set(names) != set(e.hf):
        raise Failure(f"the map lists {len(names)} names, the checkpoint has {len(e.hf)}")
    targeted = {}
    for hf_name, entry in names.items():
        if entry["status"] != "matched":
            raise Failure(f"{hf_name}: {entry['status']}")
        x = np_of(e.hf[hf_name])
        wanted = [m for m, _ in e.how[hf_name]]
        if len(entry["targets"]) != len(wanted):
            raise Failure(f"{hf_name}: {len(entry['targets'])} targets, the conversion made {wanted}")
        found = set()
        for t in entry["targets"]:
            v, steps = dec.stored(t["path"])
            y = apply_transform(t["transform"], x, v.shape)
            # The transform is the conversion's, and turns the checkpoint tensor into a Meta
            # tensor exactly (a tied one made twice: each target takes one).
            exact = [m for m in wanted if m not in found and meta[m].shape == y.shape
                     and np.array_equal(meta[m], y)]
            if not exact:
                raise Failure(f"{hf_name} -> {t['path']}: {t['transform']} does not give the converted tensor")
            meta_name = exact[0]
            expected = dict(e.how[hf_name])[meta_name]
            if t["transform"] != expected:
                raise Failure(f"{hf_name}: transform {t['transform']}, the conversion did {expected}")
            # The stored tensor is that Meta tensor, within noise, and no other is closer.
            def rms(m):
                d = np.abs(meta[m].astype(np.float64) - v)
                r = np.where(d == 0, 0.0, np.divide(d, steps, out=np.full(d.shape, np.inf), where=steps > 0))
                return float(np.sqrt(np.mean(r * r)))

            mine = rms(meta_name)
            if mine > 0.5:
                raise Failure(f"{t['path']}: {mine:.3f} steps rms from {meta_name}")
            others = [(rms(m), m) for m in meta if m != meta_name and meta[m].shape == v.shape
                      and not np.array_equal(meta[m], meta[meta_name])]
            if others and min(others)[0] <= mine:
                raise Failure(f"{t['path']}: {min(others)[1]} is as close as {meta_name}")
            found.add(meta_name)
            targeted.setdefault(meta_name, []).append(t["path"])
        if found != set(wanted):
            raise Failure(f"{hf_name}: stored as {sorted(found)}, the conversion made {sorted(wanted)}")
    missing = sorted(set(meta) - set(targeted))
    if missing:
        raise Failure(f"Meta tensors no name reached: {missing}")


def describe(t):
    if t["kind"] == "rotary":
        return f"rotary {t['direction']} {t['heads']} heads"
    if t["kind"] == "axes":
        return f"axes {t['order']}"
    return t["kind"]


def summarize(the_map):
    """`N names, M targets (K identity, ...)`."""
    counts = {}
    for entry in the_map["names"].values():
        for t in entry.get("targets", []):
            k = describe(t["transform"])
            counts[k] = counts.get(k, 0) + 1
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    return f"{len(the_map['names'])} names, {sum(counts.values())} targets ({kinds})"


def case_llama_hf():
    """Llama from a sharded Hugging Face checkpoint (q, k permuted), 8da4w."""
    e = exported("llama_hf")
    the_map, _ = learn(e)
    check_names(e, the_map)
    heads = sorted({(n.split(".")[-2], t["transform"]["heads"])
                    for n, v in the_map["names"].items() for t in v["targets"]
                    if t["transform"]["kind"] == "rotary"})
    if heads != [("k_proj", 2), ("q_proj", 4)]:
        raise Failure(f"rotary head counts {heads}")
    return f"{summarize(the_map)}; q and k rotary with {dict(heads)} heads"


def case_qwen_hf():
    """Qwen3-style from a bfloat16 Hugging Face checkpoint (HF rotary order, tied), qc4."""
    e = exported("qwen_hf")
    the_map, _ = learn(e)
    check_names(e, the_map)
    embed = the_map["names"]["model.embed_tokens.weight"]["targets"]
    if [t["stored"] for t in embed] != ["FLOAT[256,64]", "XNNPACK qcint4[256,64]"]:
        raise Failure(f"the tied embedding is stored as {[t['stored'] for t in embed]}")
    return f"{summarize(the_map)}; the embedding stored twice ({embed[0]['stored']}, {embed[1]['stored']})"


def case_llama_lora():
    """A LoRA export with its base and PEFT adapter: both learned together."""
    e = exported("llama_lora")
    the_map, _ = learn(e)
    check_names(e, the_map)
    adapter = the_map["checkpoints"][1].get("adapter")
    if adapter is None or (adapter["r"], adapter["lora_alpha"]) != (2, 4):
        raise Failure(f"adapter config {adapter}")
    return f"{summarize(the_map)}; adapter r={adapter['r']} alpha={adapter['lora_alpha']}"


def fine_tuned(tensors, seed, size=0.02):
    """Every float tensor of a checkpoint moved by noise of std `size` (a fine-tune), in its
    own dtype."""
    torch = llmlib._torch()
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in tensors.items():
        if v.is_floating_point():
            noise = torch.randn(v.shape, generator=gen, dtype=torch.float32) * size
            out[k] = (v.to(torch.float32) + noise).to(v.dtype)
        else:
            out[k] = v
    return out


def apply_by_name(e, update, names):
    cmd = [ARGS.ptefs, "apply", e.pte, update, "--names", names]
    for p in e.ptds:
        cmd += ["--data", p]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise Failure(f"ptefs apply --names: {r.stderr.strip()}")
    return r.stdout


def logits(pte, ptd, tokens):
    """The runtime's logits for `tokens`, one decode step each (KV cache, teacher forced)."""
    import torch

    sys.path.insert(0, HERE)
    import etlib

    etlib.import_modules(["executorch.extension.llm.custom_ops.custom_ops", "executorch.kernels.quantized"])
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte, data_path=ptd)
    m = program.load_method("forward")
    out = []
    for i, t in enumerate(tokens):
        r = m.execute((torch.tensor([[t]], dtype=torch.long), torch.tensor([i], dtype=torch.long)))
        out.append(r[0].reshape(-1).to(torch.float64).numpy().copy())
    return np.stack(out)


STEPS = [3, 17, 101, 42, 7, 250]


def compare_fine_tune(name, family, quant, seed):
    """Apply a fine-tune of the export's checkpoint by name, then compare the runtime's
    logits over every decode step with a fresh export of the fine-tune."""
    e = exported(name)
    the_map, _ = learn(e)
    d = os.path.join(e.dir, "byname")
    os.makedirs(d, exist_ok=True)
    ft = fine_tuned(e.hf, seed)
    # The copy the update is applied to, and the fresh export of the fine-tune.
    pte, ptd = os.path.join(d, "model.pte"), os.path.join(d, "model.ptd")
    shutil.copyfile(e.pte, pte)
    shutil.copyfile(e.ptds[0], ptd)
    names = os.path.join(d, "names.json")
    shutil.copyfile(os.path.join(e.dir, "names.json"), names)
    # The map names the files it was learned on: the copies have the same names.
    update = os.path.join(d, "ft.safetensors")
    llmlib.save_safetensors(ft, update, {"format": "pt"})
    base = logits(pte, ptd, STEPS)
    # The noise of re-quantizing alone: the unchanged checkpoint applied by name to another
    # copy (ptefs's fresh max-abs scales against export_llm's own).
    rq = os.path.join(d, "requant")
    os.makedirs(rq, exist_ok=True)
    rq_pte, rq_ptd = os.path.join(rq, "model.pte"), os.path.join(rq, "model.ptd")
    shutil.copyfile(e.pte, rq_pte)
    shutil.copyfile(e.ptds[0], rq_ptd)
    shutil.copyfile(os.path.join(e.dir, "names.json"), os.path.join(rq, "names.json"))
    same = os.path.join(rq, "same.safetensors")
    llmlib.save_safetensors(e.hf, same, {"format": "pt"})
    apply_by_name(Export(name, rq, rq_pte, [rq_ptd], None, None, None, None, family), same,
                  os.path.join(rq, "names.json"))
    requant = logits(rq_pte, rq_ptd, STEPS)
    report = apply_by_name(Export(name, d, pte, [ptd], None, None, None, None, family), update, names)
    ours = logits(pte, ptd, STEPS)
    cfg = e.cfg
    meta, _ = llmlib.hf_to_meta(family, ft, cfg)
    fresh_pte, fresh_ptd = os.path.join(d, "fresh.pte"), os.path.join(d, "fresh.ptd")
    llmlib.export(meta, llmlib.meta_params(family, cfg), fresh_pte, family=family, quant=quant, foundation_ptd=fresh_ptd)
    fresh = logits(fresh_pte, fresh_ptd, STEPS)
    scale = np.abs(fresh).max()
    err = np.abs(ours - fresh).max(axis=1) / scale
    moved = np.abs(base - fresh).max(axis=1) / scale
    noise = np.abs(requant - base).max(axis=1) / np.abs(base).max()
    # Both sides quantize the same fine-tuned weights to 4 bits, ptefs with fresh max-abs
    # scales, export_llm with its own: they may differ as much as re-quantizing the unchanged
    # checkpoint does (with a factor 2 of room, the noise differing between weights), and
    # less than the fine-tune moved the logits.
    if not (err.max() <= 2 * noise.max() and err.max() < moved.min()):
        raise Failure(f"logits per step {np.round(err, 4).tolist()} of the largest away from the fresh export; "
                      f"re-quantizing alone moves them {np.round(noise, 4).tolist()}; the fine-tune moved them {np.round(moved, 4).tolist()}")
    changed = report.strip().splitlines()[-1]
    return (f"{changed}; over {len(STEPS)} decode steps the logits are within {err.max():.3f} of the largest "
            f"of a fresh export's (re-quantizing the unchanged checkpoint: up to {noise.max():.3f}; "
            f"the fine-tune moved them {moved.min():.3f} to {moved.max():.3f})")


def case_llama_hf_finetune():
    """A fine-tune of the Llama applied by name (rotary-permuted q and k), against a fresh export."""
    return compare_fine_tune("llama_hf", "llama", "8da4w", 201)


def case_qwen_hf_finetune():
    """A bfloat16 fine-tune of the Qwen applied by name (tied embedding), against a fresh export."""
    return compare_fine_tune("qwen_hf", "qwen3", "qc4", 202)


def case_llama_lora_swap():
    """A new PEFT adapter (same rank, another alpha) applied by name into the LoRA export, against
    a fresh export with that adapter: the adapter's weights compared where the export keeps them."""
    e = exported("llama_lora")
    the_map, _ = learn(e)
    d = os.path.join(e.dir, "swap")
    os.makedirs(d, exist_ok=True)
    cfg = e.cfg
    adapter, acfg = llmlib.peft_adapter(301, e.hf, cfg, alpha=8)
    llmlib.write_adapter_dir(os.path.join(d, "adapter"), adapter, acfg)
    pte = os.path.join(d, "model.pte")
    foundation, lora = os.path.join(d, "foundation.ptd"), os.path.join(d, "lora.ptd")
    for src, dst in zip([e.pte] + e.ptds, [pte, foundation, lora]):
        shutil.copyfile(src, dst)
    names = os.path.join(d, "names.json")
    shutil.copyfile(os.path.join(e.dir, "names.json"), names)
    report = apply_by_name(Export("swap", d, pte, [foundation, lora], None, None, None, None, "llama"),
                           os.path.join(d, "adapter"), names)
    if "lora_B multiplied by 2" not in report:
        raise Failure(f"no rescale in the report: {report}")
    meta, _ = llmlib.hf_to_meta("llama", {k: v for k, v in e.hf.items() if "lora_" not in k}, cfg)
    fresh = os.path.join(d, "fresh")
    os.makedirs(fresh, exist_ok=True)
    llmlib.export(meta, llmlib.meta_params("llama", cfg), os.path.join(fresh, "model.pte"),
                  adapter_dir=os.path.join(d, "adapter"), foundation_ptd=os.path.join(fresh, "foundation.ptd"),
                  lora_ptd=os.path.join(fresh, "lora.ptd"))
    # The fresh export multiplies B·A by 8/2 in its graph, ours by 4/2: ours holds B twice.
    ours = Decoded(pte, [foundation, lora])
    theirs = Decoded(os.path.join(fresh, "model.pte"), [os.path.join(fresh, "foundation.ptd"), os.path.join(fresh, "lora.ptd")])
    worst = 0.0
    for name, v in the_map["names"].items():
        if "lora_" not in name:
            continue
        for t in v["targets"]:
            a = ours.stored(t["path"])[0]
            b = theirs.stored(t["path"])[0]
            factor = 2.0 if "lora_B" in name else 1.0
            worst = max(worst, float(np.abs(a - factor * b).max()))
    if worst != 0.0:
        raise Failure(f"adapter weights differ from the fresh export's by up to {worst}")
    scale_line = [l for l in report.splitlines() if l.startswith("adapter:")][0]
    return f"{report.strip().splitlines()[-1]}; every adapter weight equal to the fresh export's (lora_B times 2); {scale_line}"


CASES = [case_llama_hf, case_qwen_hf, case_llama_lora, case_llama_hf_finetune, case_qwen_hf_finetune,
         case_llama_lora_swap]


def main():
    global ARGS, XR
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ptefs", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--only", help="comma-separated case names (without case_)")
    ARGS = ap.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    XR = xnnpack_rules()
    only = set(ARGS.only.split(",")) if ARGS.only else None
    passed = failed = 0
    for case in CASES:
        name = case.__name__[len("case_"):]
        if only and name not in only:
            continue
        try:
            print(f"ok   {name}: {case()}", flush=True)
            passed += 1
        except Exception as ex:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name}: {type(ex).__name__}: {ex}", flush=True)
            if not isinstance(ex, Failure):
                traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
