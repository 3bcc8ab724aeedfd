#!/usr/bin/env python3
"""Edits through a ptefs mount whose outcome depends on writes keeping tensors apart:
ExecuTorch stores equal bytes once, and writing one of several distinct tensors that share
them must change that one only.

Used by scripts/conformance-edits, run in the ExecuTorch virtualenv. The float model of a
fixture is rebuilt from scripts/export-fixtures with the seed it was exported with, and its
output on the manifest's inputs must reproduce the manifest before anything is edited. A
failure prints one line on stderr and exits 1.

  zero-bias MOUNT NAME MANIFEST OUT.npy
      The first Linear's bias (the bias operand of the first aten::addmm in
      instructions.txt) shares its bytes with distinct tensors (`aliases`). Writes
      [1, 2, 3, 4] onto its values/<i>.npy with numpy.save, checks that the sharers still
      read zeros, and saves the output of the float model with only that bias changed.

  checkpoint MOUNT NAME MANIFEST OUT.npy
      Applies a fine-tuned checkpoint tensor by tensor, as a user does: every key of the
      attached .ptd (named by its fully qualified name) is read with numpy.load, compared
      with the float model's parameter, perturbed differently, and written back with
      numpy.save. Saves the output of the float model with the perturbed state dict.
"""

import glob
import importlib.machinery
import importlib.util
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)
from conformance_edits import Failure, Plan  # noqa: E402
from etlib import allclose, load_torch, manifest_io  # noqa: E402

# The float model of each fixture: its class in scripts/export-fixtures and its export seed.
MODELS = {
    "zero_biases": ("ZeroBiases", 12),
    "zero_biases_ext": ("ZeroBiases", 12),
    "ext_shared": ("Shared", 9),
}


def float_model(torch, name, manifest):
    """The fixture's float module, rebuilt as scripts/export-fixtures built it, checked
    against the manifest; and the manifest's inputs."""
    if name not in MODELS:
        raise Failure(f"no float model known for {name}")
    cls, seed = MODELS[name]
    loader = importlib.machinery.SourceFileLoader("export_fixtures", os.path.join(HERE, "export-fixtures"))
    spec = importlib.util.spec_from_loader("export_fixtures", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    torch.manual_seed(seed)
    model = getattr(module, cls)().eval()
    inputs, expected = manifest_io(torch, manifest)
    with torch.no_grad():
        if not allclose(torch, model(*inputs), expected):
            raise Failure(f"the rebuilt {cls} does not reproduce {name}'s manifest")
    return model, inputs


def run(torch, model, inputs, state=None):
    if state is not None:
        model.load_state_dict({k: torch.from_numpy(np.array(v, copy=True)) for k, v in state.items()})
    with torch.no_grad():
        return model(*inputs)


def zero_bias(mount, name, manifest_path, out_npy):
    torch = load_torch()
    manifest = json.load(open(manifest_path))
    model, inputs = float_model(torch, name, manifest)
    plan = Plan(torch, mount, manifest["runtime_check"]["method"])
    addmm = [a for n, a in plan.instructions if n == "aten::addmm.out"]
    if not addmm:
        raise Failure("no aten::addmm in instructions.txt")
    bias = addmm[0][0]
    meta = plan.value_json(bias)
    sharers = [a["path"] for a in meta["aliases"] if a["relation"] == "distinct"]
    if not sharers:
        raise Failure(f"values/{bias} shares its bytes with no distinct tensor")
    current = np.load(plan.npy_path(bias))
    if not np.array_equal(current, model.lin1.bias.detach().numpy()):
        raise Failure(f"values/{bias}.npy is not lin1.bias")
    new = np.arange(1, current.size + 1, dtype=current.dtype).reshape(current.shape)
    np.save(plan.npy_path(bias), new)
    if not np.array_equal(np.load(plan.npy_path(bias)), new):
        raise Failure(f"values/{bias}.npy read back after the write differs from what was written")
    for p in sharers:
        if np.load(os.path.join(mount, p + ".npy")).any():
            raise Failure(f"{p} changed with values/{bias}: they are distinct tensors")
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    state["lin1.bias"] = new
    np.save(out_npy, run(torch, model, inputs, state).numpy())
    print(f"plans/forward/values/{bias}.npy (lin1.bias; {len(sharers)} distinct sharers kept)")


def checkpoint(mount, name, manifest_path, out_npy):
    torch = load_torch()
    manifest = json.load(open(manifest_path))
    model, inputs = float_model(torch, name, manifest)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    npys = sorted(glob.glob(os.path.join(mount, "data", "*", "named_data", "*.npy")))
    if not npys:
        raise Failure("no .npy under data/*/named_data: mount the .ptd with --data")
    rng = np.random.default_rng(2026)
    written, shared = 0, 0
    for path in npys:
        key = json.load(open(path[: -len(".npy")] + ".json"))["key"]
        if key not in state:
            raise Failure(f"{key} is not a parameter or buffer of the model")
        have = np.load(path)
        if not np.array_equal(have, state[key]):
            raise Failure(f"{key}: the .npy does not hold the model's tensor")
        shared += any(a["relation"] == "distinct" for a in json.load(open(path[:-4] + ".json"))["aliases"])
        if have.dtype.kind == "f":
            new = (have + rng.normal(0, 0.05 * (written + 1), have.shape)).astype(have.dtype)
        else:
            new = (have + written + 1).astype(have.dtype)
        np.save(path, new)
        state[key] = new
        written += 1
    for path in npys:
        key = json.load(open(path[:-4] + ".json"))["key"]
        if not np.array_equal(np.load(path), state[key]):
            raise Failure(f"{key} does not hold what was written to it")
    np.save(out_npy, run(torch, model, inputs, state).numpy())
    print(f"{written} tensors perturbed and written with numpy.save, {shared} of them sharing bytes with a distinct tensor")


def main(argv):
    cmds = {"zero-bias": zero_bias, "checkpoint": checkpoint}
    if len(argv) != 6 or argv[1] not in cmds:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        cmds[argv[1]](*argv[2:])
    except (Failure, OSError) as e:
        print(f"{argv[1]}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
