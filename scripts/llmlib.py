"""Tiny LLMs exported with ExecuTorch's own `export_llm` from checkpoints written here: what
scripts/export-fixtures (the `names_*` fixtures), scripts/conformance-names and
scripts/bench-names share. Runs in the ExecuTorch virtualenv ($ET_VENV, default
/work/et-venv), which needs the `safetensors` package besides executorch and torch.

A checkpoint is made in the layout its family publishes on the Hugging Face hub
(`model.layers.0.self_attn.q_proj.weight`, ...), from a seed, so the same arguments give the
same tensors. `export_llm` reads Meta's layout (`layers.0.attention.wq.weight`, a `.pth`):
the conversion is ExecuTorch's own where the wheel ships one that runs without torchtune
(`executorch.examples.models.qwen3.convert_weights` for Qwen3), and for Llama the one
torchtune's `FullModelHFCheckpointer` runs for ExecuTorch's Llama-family converters
(`examples/models/smollm2/convert_weights.py`): Hugging Face's conversion stores q and k as
`permute(w, n) = w.view(n, d1 // n // 2, 2, d2).transpose(1, 2).reshape(d1, d2)` of Meta's
layout (n = n_heads for q, n_kv_heads for k), so Meta's layout is the inverse,
`w.view(n, 2, d1 // n // 2, d2).transpose(1, 2).reshape(d1, d2)`. Families exported with
`use_hf_rope` (Qwen) keep Hugging Face's order.
"""

import json
import os
import shutil
import tempfile

import numpy as np

# The architecture of the fixtures: dim 64, 2 layers, 4 heads of 16 (2 of them for k and v),
# vocabulary 256, feed-forward 128.
TINY = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 256, "hidden_dim": 128}


def _torch():
    import torch

    return torch


def save_safetensors(tensors, path, metadata=None):
    """`tensors` (name -> torch tensor) as a safetensors file."""
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=metadata)


def load_safetensors(path):
    from safetensors.torch import load_file

    return load_file(path)


def _normal(rng, shape, std):
    return rng.normal(0.0, std, shape).astype(np.float32)


def hf_checkpoint(family, seed, arch=TINY, tied=False, dtype="float32"):
    """A checkpoint of `family` ("llama" or "qwen3") in Hugging Face's names and layout, and
    its config.json: random weights (std 0.05 for matrices, norms 1 ± 0.1), from `seed`."""
    torch = _torch()
    rng = np.random.default_rng(seed)
    d, layers, h, kv = arch["dim"], arch["n_layers"], arch["n_heads"], arch["n_kv_heads"]
    vocab, hidden = arch["vocab_size"], arch["hidden_dim"]
    hd = d // h
    t = {}

    def w(name, *shape, std=0.05):
        t[name] = torch.from_numpy(_normal(rng, shape, std))

    def norm(name, n):
        t[name] = torch.from_numpy(1.0 + _normal(rng, (n,), 0.1))

    w("model.embed_tokens.weight", vocab, d)
    for i in range(layers):
        p = f"model.layers.{i}."
        w(p + "self_attn.q_proj.weight", h * hd, d)
        w(p + "self_attn.k_proj.weight", kv * hd, d)
        w(p + "self_attn.v_proj.weight", kv * hd, d)
        w(p + "self_attn.o_proj.weight", d, h * hd)
        if family == "qwen3":
            norm(p + "self_attn.q_norm.weight", hd)
            norm(p + "self_attn.k_norm.weight", hd)
        w(p + "mlp.gate_proj.weight", hidden, d)
        w(p + "mlp.up_proj.weight", hidden, d)
        w(p + "mlp.down_proj.weight", d, hidden)
        norm(p + "input_layernorm.weight", d)
        norm(p + "post_attention_layernorm.weight", d)
    norm("model.norm.weight", d)
    if not tied:
        w("lm_head.weight", vocab, d)
    t = {k: v.to(getattr(torch, dtype)) for k, v in t.items()}
    config = {
        "architectures": ["LlamaForCausalLM" if family == "llama" else "Qwen3ForCausalLM"],
        "model_type": family,
        "hidden_size": d,
        "intermediate_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": h,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5 if family == "llama" else 1e-6,
        "rope_theta": 10000.0 if family == "llama" else 1000000.0,
        "tie_word_embeddings": tied,
        "torch_dtype": dtype,
    }
    return t, config


def meta_params(family, config):
    """The params.json `export_llm` reads for a checkpoint of `config`."""
    p = {
        "dim": config["hidden_size"],
        "n_layers": config["num_hidden_layers"],
        "n_heads": config["num_attention_heads"],
        "n_kv_heads": config["num_key_value_heads"],
        "head_dim": config["head_dim"],
        "vocab_size": config["vocab_size"],
        "hidden_dim": config["intermediate_size"],
        "norm_eps": config["rms_norm_eps"],
        "rope_theta": config["rope_theta"],
    }
    if family == "qwen3":
        p.update({"use_hf_rope": True, "use_qk_norm": True, "qk_norm_before_rope": True})
    return p


def hf_to_meta_permute(w, n_heads):
    """Meta's layout of a q or k projection stored in Hugging Face's (torchtune's
    `hf_to_tune` `_permute`): `w.view(n, 2, d1 // n // 2, d2).transpose(1, 2)`."""
    d1, d2 = w.shape
    return w.view(n_heads, 2, d1 // n_heads // 2, d2).transpose(1, 2).reshape(d1, d2)


def meta_to_hf_permute(w, n_heads):
    """Hugging Face's layout of a q or k projection stored in Meta's (the `permute` of HF's
    `convert_llama_weights_to_hf.py`)."""
    d1, d2 = w.shape
    return w.view(n_heads, d1 // n_heads // 2, 2, d2).transpose(1, 2).reshape(d1, d2)


# Hugging Face Llama name -> Meta name (the table of torchtune's convert_weights, which
# ExecuTorch's Llama-family converters go through).
_LLAMA_HF_TO_META = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attention.wq.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attention.wk.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attention.wv.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attention.wo.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.attention_norm.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.feed_forward.w1.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.feed_forward.w2.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.feed_forward.w3.weight",
}


def _mapped(key, table):
    """`key` through a table whose keys may hold one `{}` for a layer number."""
    import re

    if key in table:
        return table[key]
    m = re.search(r"\.(\d+)\.", key)
    if m:
        abstract = key[: m.start(1)] + "{}" + key[m.end(1) :]
        if abstract in table:
            return table[abstract].format(m.group(1))
    raise KeyError(key)


def hf_to_meta(family, hf, config):
    """The Meta checkpoint `export_llm` reads, converted from `hf`, and how each Hugging Face
    name became a Meta one: {hf name: (meta name, transform)}, the transform as ptefs's name
    maps write it (docs/names.md): identity, or `rotary` `hf_to_meta` with the head count."""
    torch = _torch()
    out, how = {}, {}
    if family == "qwen3":
        from executorch.examples.models.qwen3.convert_weights import qwen_3_tune_to_meta

        converted = qwen_3_tune_to_meta(dict(hf))
        inverse = {id(v): k for k, v in hf.items()}
        for meta_name, v in converted.items():
            out[meta_name] = v
            src = inverse.get(id(v))
            if src is not None:
                how.setdefault(src, [])
                how[src].append((meta_name, {"kind": "identity"}))
        return {k: v.to(torch.float32) for k, v in out.items()}, how
    for name, v in hf.items():
        meta_name = _mapped(name, _LLAMA_HF_TO_META)
        transform = {"kind": "identity"}
        if name.endswith("q_proj.weight") or name.endswith("k_proj.weight"):
            n = config["num_attention_heads"] if "q_proj" in name else config["num_key_value_heads"]
            v = hf_to_meta_permute(v, n)
            transform = {"kind": "rotary", "direction": "hf_to_meta", "heads": n}
        out[meta_name] = v
        how[name] = [(meta_name, transform)]
    if "lm_head.weight" not in hf:
        out["output.weight"] = out["tok_embeddings.weight"]
        how["model.embed_tokens.weight"].append(("output.weight", {"kind": "identity"}))
    return {k: v.to(torch.float32).contiguous() for k, v in out.items()}, how


def meta_checkpoint_names(meta):
    """Meta's checkpoint as a safetensors-ready dict: tied tensors are cloned (safetensors
    refuses two names on one storage)."""
    seen, out = set(), {}
    for k, v in meta.items():
        out[k] = v.clone() if v.data_ptr() in seen else v
        seen.add(v.data_ptr())
    return out


def write_hf_dir(directory, hf, config, shards=1):
    """`hf` as a Hugging Face checkpoint directory: config.json and model.safetensors, or
    `shards` files named model-0000k-of-0000n.safetensors with model.safetensors.index.json."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    names = list(hf)
    if shards == 1:
        save_safetensors(hf, os.path.join(directory, "model.safetensors"), {"format": "pt"})
        return
    weight_map, total = {}, 0
    per = -(-len(names) // shards)
    for s in range(shards):
        part = names[s * per : (s + 1) * per]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_safetensors({k: hf[k] for k in part}, os.path.join(directory, fname), {"format": "pt"})
        for k in part:
            weight_map[k] = fname
            total += hf[k].numel() * hf[k].element_size()
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)


def peft_adapter(seed, hf, config, rank=2, alpha=4, targets=("q_proj", "v_proj")):
    """A PEFT LoRA adapter of `hf` (names `base_model.model.model.layers.N.self_attn.
    q_proj.lora_A.weight`, ...) with random, non-zero A and B, and its adapter_config.json."""
    torch = _torch()
    rng = np.random.default_rng(seed)
    t = {}
    for name, w in hf.items():
        parts = name.split(".")
        if len(parts) < 2 or parts[-2] not in targets or parts[-1] != "weight":
            continue
        base = "base_model.model." + name[: -len(".weight")]
        out_f, in_f = w.shape
        t[base + ".lora_A.weight"] = torch.from_numpy(_normal(rng, (rank, in_f), 0.1))
        t[base + ".lora_B.weight"] = torch.from_numpy(_normal(rng, (out_f, rank), 0.1))
    cfg = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "use_rslora": False,
        "target_modules": list(targets),
        "bias": "none",
    }
    return t, cfg


def write_adapter_dir(directory, adapter, cfg):
    os.makedirs(directory, exist_ok=True)
    save_safetensors(adapter, os.path.join(directory, "adapter_model.safetensors"), {"format": "pt"})
    with open(os.path.join(directory, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)


def export(meta, params, out_pte, family="llama", quant="8da4w", adapter_dir=None,
           foundation_ptd=None, lora_ptd=None, max_seq_len=16):
    """`export_llm` of the Meta checkpoint `meta` (XNNPACK, KV cache, custom SDPA, the weights
    in `foundation_ptd` and, with an adapter, the adapter's in `lora_ptd`); quant is "8da4w"
    (torchao, group 32: qbint4) or "qc4" (pt2e xnnpack_dynamic_qc4: qcint4). Writes `out_pte`
    and the .ptd files."""
    torch = _torch()
    from executorch.examples.models.llama.export_llama_lib import export_llama
    from executorch.extension.llm.export.config.llm_config import (
        LlmConfig,
        LoraConfig,
        ModelType,
        Pt2eQuantize,
    )

    if adapter_dir:
        adapter_dir = os.path.abspath(adapter_dir)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "consolidated.pth")
        torch.save(meta, ckpt)
        pfile = os.path.join(tmp, "params.json")
        with open(pfile, "w") as f:
            json.dump(params, f)
        c = LlmConfig()
        c.base.model_class = ModelType.qwen3_0_6b if family == "qwen3" else ModelType.llama3
        c.base.checkpoint = ckpt
        c.base.params = pfile
        if adapter_dir:
            c.base.lora_config = LoraConfig(
                adapter_checkpoint=os.path.join(adapter_dir, "adapter_model.safetensors"),
                adapter_config=os.path.join(adapter_dir, "adapter_config.json"),
            )
        c.model.use_kv_cache = True
        c.model.use_sdpa_with_kv_cache = True
        c.model.enable_dynamic_shape = True
        c.backend.xnnpack.enabled = True
        c.backend.xnnpack.extended_ops = True
        if quant == "8da4w":
            c.quantization.qmode = "8da4w"
            c.quantization.group_size = 32
        elif quant == "qc4":
            c.quantization.pt2e_quantize = Pt2eQuantize.xnnpack_dynamic_qc4
        else:
            raise ValueError(quant)
        c.export.max_seq_length = max_seq_len
        c.export.max_context_length = max_seq_len
        c.export.output_dir = tmp
        c.export.output_name = "model.pte"
        if foundation_ptd:
            c.export.foundation_weights_file = "foundation.ptd"
        if lora_ptd:
            c.export.lora_weights_file = "lora.ptd"
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            export_llama(c)
        finally:
            os.chdir(cwd)
        shutil.copyfile(os.path.join(tmp, "model.pte"), out_pte)
        for want, name in ((foundation_ptd, "foundation.ptd"), (lora_ptd, "lora.ptd")):
            if want:
                shutil.copyfile(os.path.join(tmp, name), want)


def main():
    """`llmlib.py export DIR [--family llama|qwen3] [--layers N] [--dim D] [--hidden F]
    [--heads H] [--kv-heads K] [--vocab V] [--quant 8da4w|qc4] [--seed S]`: a Hugging Face
    checkpoint in DIR/hf/ and its export_llm export, DIR/model.pte and DIR/model.ptd."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("command", choices=["export"])
    ap.add_argument("dir")
    ap.add_argument("--family", default="llama", choices=["llama", "qwen3"])
    ap.add_argument("--layers", type=int, default=TINY["n_layers"])
    ap.add_argument("--dim", type=int, default=TINY["dim"])
    ap.add_argument("--hidden", type=int, default=TINY["hidden_dim"])
    ap.add_argument("--heads", type=int, default=TINY["n_heads"])
    ap.add_argument("--kv-heads", type=int, default=TINY["n_kv_heads"])
    ap.add_argument("--vocab", type=int, default=TINY["vocab_size"])
    ap.add_argument("--quant", default="8da4w", choices=["8da4w", "qc4"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    a = ap.parse_args()
    arch = {"dim": a.dim, "n_layers": a.layers, "n_heads": a.heads, "n_kv_heads": a.kv_heads,
            "vocab_size": a.vocab, "hidden_dim": a.hidden}
    hf, cfg = hf_checkpoint(a.family, a.seed, arch)
    write_hf_dir(os.path.join(a.dir, "hf"), hf, cfg, shards=a.shards)
    meta, _ = hf_to_meta(a.family, hf, cfg)
    export(meta, meta_params(a.family, cfg), os.path.join(a.dir, "model.pte"), family=a.family,
           quant=a.quant, foundation_ptd=os.path.join(a.dir, "model.ptd"))


if __name__ == "__main__":
    main()
