"""What the scripts that run ExecuTorch share (conformance.py, conformance_edits.py,
manifest.py, xnnpack-rules): loading torch and the ExecuTorch runtime, turning a manifest's
`runtime_check` into tensors, running a method in the runtime (in a forked child, so a crash
on a damaged file is a result, not the end of the run), and comparing outputs within the
tolerance of their dtype. Runs in the ExecuTorch virtualenv ($ET_VENV, default
/work/et-venv).
"""

import os
import pickle
import signal


def quiet_native_logs():
    """The runtime logs CPU-detection chatter on stderr; keep stderr for real errors."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("torch").setLevel(logging.ERROR)


def load_torch():
    """Imports torch and starts the ExecuTorch runtime once; returns the torch module."""
    quiet_native_logs()
    import torch  # noqa: F401
    from executorch.runtime import Runtime

    Runtime.get()
    return torch


def inputs_to_tensors(torch, inputs):
    """The tensors a manifest's `runtime_check.inputs` describes."""
    out = []
    for i in inputs:
        dtype = getattr(torch, i["dtype"].split(".", 1)[1])
        t = torch.tensor(i["values"], dtype=dtype).reshape(i["shape"])
        if i.get("channels_last"):
            t = t.contiguous(memory_format=torch.channels_last)
        out.append(t)
    return out


def import_modules(names):
    """Imports the modules `names`: they register the custom kernels a program calls (the
    LLM exports' `llama::custom_sdpa`, for one)."""
    import importlib

    for name in names:
        importlib.import_module(name)


def register_imports(runtime_check):
    """`import_modules` of what a `runtime_check` lists under `imports`."""
    import_modules(runtime_check.get("imports", []))


def manifest_io(torch, manifest):
    """The inputs of a manifest's `runtime_check`, and its expected output as a float32
    tensor."""
    rc = manifest["runtime_check"]
    register_imports(rc)
    inputs = inputs_to_tensors(torch, rc["inputs"])
    exp = rc["expected"]
    expected = torch.tensor(exp["values"], dtype=torch.float32).reshape(exp["shape"])
    return inputs, expected


def run_method(pte, ptd, method, inputs, imports=()):
    """Runs `method` of the program on the manifest `inputs` in this process, after importing
    the modules `imports` names (custom operators the program calls); returns its outputs."""
    import torch

    import_modules(imports)
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte, data_path=ptd)
    m = program.load_method(method)
    if m is None:
        raise RuntimeError(f"method {method!r} not found")
    return m.execute(inputs_to_tensors(torch, inputs))


def run_in_child(pte, ptd, method, inputs, imports=()):
    """`run_method` in a forked child; returns ("ok", shape, values, dtype) of the first
    output or ("error", reason)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            import torch

            # Silence the runtime's own stderr chatter in the child.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            out = run_method(pte, ptd, method, inputs, imports)[0]
            if isinstance(out, torch.Tensor):
                t = out.contiguous()
                dtype = str(t.dtype)
                values = (t.to(torch.float64) if t.is_floating_point() else t).reshape(-1).tolist()
                result = ("ok", list(t.shape), values, dtype)
            else:
                result = ("ok", [], [out], type(out).__name__)
        except BaseException as e:  # noqa: BLE001
            msg = str(e).strip().splitlines()
            result = ("error", f"{type(e).__name__}: {msg[0] if msg else ''}")
        with os.fdopen(w, "wb") as f:
            pickle.dump(result, f)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return ("error", f"runtime crashed ({signal.Signals(sig).name})")
    if not data:
        return ("error", f"runtime exited with status {os.WEXITSTATUS(status)}")
    return pickle.loads(data)


def tolerances(dtype):
    """(rtol, atol) for outputs of `dtype` (a torch dtype's name)."""
    if "bfloat16" in dtype:
        return 1e-2, 1e-2
    if "float16" in dtype:
        return 1e-3, 1e-3
    return 1e-5, 1e-5


def close(torch, shape_a, values_a, shape_b, values_b, dtype):
    """Whether two outputs given as shapes and flat values are the same shape and close."""
    if list(shape_a) != list(shape_b):
        return False
    a = torch.tensor(values_a, dtype=torch.float64)
    b = torch.tensor(values_b, dtype=torch.float64)
    rtol, atol = tolerances(dtype)
    return bool(torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))


def allclose(torch, a, b):
    """`close` for two tensors, with the tolerance of `a`'s dtype."""
    flat = lambda t: t.to(torch.float64).reshape(-1).tolist()  # noqa: E731
    return close(torch, a.shape, flat(a), b.shape, flat(b), str(a.dtype))
