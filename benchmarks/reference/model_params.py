"""The Switchyard model's trained tensors from its config alone (docs/model.md, "Parameters
and checkpoint names"): their names and shapes, a fresh initialisation with the documented
distribution (torch's generator, not Switchyard's keyed draws), and which of them AdamW
decays. Used by train_torch_gpu.py when it starts without a checkpoint (gpu_bench.py).
"""
import math

import torch


def checkpoint_shapes(cfg):
    """{checkpoint name: shape} of the trained tensors (docs/model.md, "Parameters")."""
    m, e = cfg["model"], cfg["moe"]
    d, V, S, L = m["d_model"], m["vocab_size"], m["seq_len"], m["n_layers"]
    hq, hkv = m["n_heads"], m.get("n_kv_heads", 0) or m["n_heads"]
    hd, f = m.get("head_dim") or d // hq, m.get("d_ff", 0) or 4 * d
    E, fe = e["num_experts"], e["d_expert"]
    ln, bias, ebias = m["norm"] == "layernorm", m["bias"], e.get("bias", False)
    out = {"embed.wte": (V, d)}
    if m["position"] == "learned":
        out["embed.wpe"] = (S, d)
    for i in range(L):
        p = f"layers.{i}"
        for n in ("norm1", "norm2"):
            out[f"{p}.{n}.weight"] = (d,)
            if ln:
                out[f"{p}.{n}.bias"] = (d,)
        for n, shape in (("q", (d, hq * hd)), ("k", (d, hkv * hd)), ("v", (d, hkv * hd)), ("o", (hq * hd, d))):
            out[f"{p}.attn.{n}.weight"] = shape
            if bias:
                out[f"{p}.attn.{n}.bias"] = (shape[1],)
        if i % e["layer_freq"] == e["layer_freq"] - 1:
            out[f"{p}.moe.router.weight"] = (d, E)
            out[f"{p}.moe.experts.w1"] = (E, d, fe)
            out[f"{p}.moe.experts.w2"] = (E, fe, d)
            if e["activation"] == "swiglu":
                out[f"{p}.moe.experts.w3"] = (E, d, fe)
            if ebias:
                out[f"{p}.moe.experts.b1"], out[f"{p}.moe.experts.b2"] = (E, fe), (E, d)
            ns = e.get("num_shared_experts", 0)
            if ns:
                fs = ns * (e.get("d_shared", 0) or fe)
                out[f"{p}.moe.shared.w1"], out[f"{p}.moe.shared.w2"] = (1, d, fs), (1, fs, d)
                if e["activation"] == "swiglu":
                    out[f"{p}.moe.shared.w3"] = (1, d, fs)
                if ebias:
                    out[f"{p}.moe.shared.b1"], out[f"{p}.moe.shared.b2"] = (1, fs), (1, d)
        else:
            out[f"{p}.mlp.w1.weight"], out[f"{p}.mlp.w2.weight"] = (d, f), (f, d)
            if m["activation"] == "swiglu":
                out[f"{p}.mlp.w3.weight"] = (d, f)
            if bias:
                out[f"{p}.mlp.w1.bias"], out[f"{p}.mlp.w2.bias"] = (f,), (d,)
    out["norm_f.weight"] = (d,)
    if ln:
        out["norm_f.bias"] = (d,)
    if not m["tie_embeddings"]:
        out["head.weight"] = (d, V)
    return out


def init_tensors(cfg, seed, device):
    """Fresh weights with docs/model.md's distribution (normal(0, init_std), GPT-2 scaling of
    the output projections with scaled_init; biases 0, norm weights 1) from torch's generator."""
    m = cfg["model"]
    std = m.get("init_std", 0.02)
    scaled = std / math.sqrt(2 * m["n_layers"]) if m.get("scaled_init", False) else std
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    out = {}
    for name, shape in checkpoint_shapes(cfg).items():
        leaf = name.rsplit(".", 1)[-1] if not name.endswith(".weight") else name.rsplit(".", 2)[-2]
        if ".norm" in name or name.startswith("norm_f"):
            out[name] = torch.ones(shape, device=device) if name.endswith("weight") else torch.zeros(shape, device=device)
        elif name.endswith("bias") or leaf in ("b1", "b2"):
            out[name] = torch.zeros(shape, device=device)
        else:
            s = scaled if leaf in ("o", "w2") else std
            out[name] = torch.randn(shape, generator=gen, device=device) * s
    return out


def decays(name):
    """AdamW decays matrices (embeddings, projections, expert weights), not biases, norms, the router."""
    leaf = name.rsplit(".", 1)[-1]
    return not (".norm" in name or name.startswith("norm_f") or ".router." in name
                or leaf in ("bias", "b1", "b2", "expert_bias"))
