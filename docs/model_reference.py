#!/usr/bin/env python3
"""A second implementation of the Switchyard model (docs/model.md), in numpy.

Loads a checkpoint (its model tensors, assembled from the pieces its
model.safetensors.index.json lists, + config.yaml) and a `switchyard prep` folder and
prints, as one JSON object, the mean validation cross-entropy of the micro-batches that
`switchyard eval` scores by default (train.eval_batches of them, one data-parallel rank).
Nothing here imports Switchyard: the file formats and the math are those docs/model.md
describes, so that this script agreeing with `switchyard eval` is a check of that page.
Every numpy operation has a one-line PyTorch equivalent (see docs/model.md, "PyTorch").

    python3 docs/model_reference.py CHECKPOINT_STEP_DIR DATA_DIR [--batches N]
"""
import json
import math
import struct
import sys

import numpy as np

F32 = np.float32

# When a list, moe() appends (layer, experts (T, k), gates (T, k), kept (T, k)) of every
# routing group it runs (the route test compares `switchyard route` with them).
ROUTING_TRACE = None
# moe() appends (layer, aux) of every routing group it runs (main() reports their means).
AUX_VALUES = []


# ---- Files ----------------------------------------------------------------------------

DTYPES = {"F32": "<f4", "I32": "<i4", "I64": "<i8", "U8": "u1", "F64": "<f8"}


def load_safetensors(path):
    """{name: array} from a safetensors file (little-endian; F32, I32, I64, U8, F64)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


def load_checkpoint_tensors(ckpt, kind="model"):
    """{name: array} of a step directory's tensors of one kind ("model" or "optimizer"),
    assembled whole (docs/checkpoints.md, "The piece rule"): each rank's file holds, under
    the tensor's name, elements [begin, end) of the row-major flattening of a box (offset,
    box) of the tensor. A format 1 index (no "tensors") means one model.safetensors."""
    index = json.load(open(f"{ckpt}/model.safetensors.index.json"))
    if "tensors" not in index:
        return load_safetensors(f"{ckpt}/model.safetensors")
    files, out = {}, {}
    for name, t in index["tensors"].items():
        if t["kind"] != kind:
            continue
        whole = np.zeros(t["shape"], dtype=DTYPES[t["dtype"]])
        for piece in t["pieces"]:
            if piece["file"] not in files:
                files[piece["file"]] = load_safetensors(f"{ckpt}/{piece['file']}")
            begin, end = piece["elements"]
            box = whole[tuple(slice(o, o + n) for o, n in zip(piece["offset"], piece["box"])) + (...,)]
            flat = box.flatten()                     # the box in row-major order (a copy)
            flat[begin:end] = files[piece["file"]][name].reshape(-1)
            box[...] = flat.reshape(box.shape)
        out[name] = whole
    return out


def _yaml_value(text):
    """One value as config.yaml writes it: a double-quoted string (escapes \\" \\\\ \\n \\t
    \\xNN), or a plain scalar, either followed by an optional ' # comment'."""
    if text.startswith('"'):
        out, i = [], 1
        while text[i] != '"':
            if text[i] == "\\":
                code = text[i + 1]
                if code == "x":
                    out.append(chr(int(text[i + 2:i + 4], 16)))
                    i += 4
                    continue
                out.append({"n": "\n", "t": "\t"}.get(code, code))
                i += 2
                continue
            out.append(text[i])
            i += 1
        return "".join(out), True
    return text.split(" #", 1)[0].strip(), False


def load_config(path):
    """config.yaml as saved with a checkpoint: 'section:' lines, then '  key: value'."""
    config, section = {}, None
    for line in open(path):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            section = config.setdefault(line.strip().rstrip(":"), {})
            continue
        key, _, value = line.strip().partition(":")
        value, quoted = _yaml_value(value.strip())
        if quoted:
            section[key] = value
        elif value in ("true", "false"):
            section[key] = value == "true"
        else:
            try:
                section[key] = int(value)
            except ValueError:
                try:
                    section[key] = float(value)
                except ValueError:
                    section[key] = value
    return config


def validation_stream(data_dir):
    """The validation tokens: the val shards in index order (32-byte header, then tokens)."""
    index = json.load(open(f"{data_dir}/index.json"))
    dtype = "<u2" if index["dtype"] == "u16" else "<u4"
    parts = [np.fromfile(f"{data_dir}/{s['name']}", dtype=dtype, offset=32)
             for s in index["shards"] if s["split"] == "val"]
    return np.concatenate(parts).astype(np.int64)


# ---- Counter-based randomness (GShard's random second expert only) --------------------

M32 = 0xFFFFFFFF


def fnv1a64(name):
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def philox4x32_10(counter, key):
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, p0 & M32
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def uniform_at(seed, stream, index):
    """Uniform [0, 1) of element `index`: word index % 4 of Philox block index / 4."""
    block = index >> 2
    words = philox4x32_10((block & M32, block >> 32, stream & M32, stream >> 32),
                          (seed & M32, seed >> 32))
    return (words[index & 3] >> 8) / 16777216.0


# ---- Layers (docs/model.md, "The decoder" and "The MoE layer") -------------------------

def norm(x, p, name, cfg):
    x64 = x.astype(np.float64)
    if cfg["norm"] == "layernorm":
        mu = x64.mean(-1, keepdims=True)
        var = ((x64 - mu) ** 2).mean(-1, keepdims=True)  # biased, as torch.nn.LayerNorm
        y = (x64 - mu) / np.sqrt(var + cfg["norm_eps"]) * p[name + ".weight"] + p[name + ".bias"]
    else:
        ms = (x64 ** 2).mean(-1, keepdims=True)
        y = x64 / np.sqrt(ms + cfg["norm_eps"]) * p[name + ".weight"]
    return y.astype(F32)


def linear(x, p, name):
    """x @ W (+ b) with W stored (in, out)."""
    y = x @ p[name + ".weight"]
    return y + p[name + ".bias"] if name + ".bias" in p else y


def gelu(x):  # the tanh approximation: torch.nn.functional.gelu(x, approximate="tanh")
    return F32(0.5) * x * (F32(1) + np.tanh(F32(math.sqrt(2 / math.pi)) * (x + F32(0.044715) * x ** 3)))


def silu(x):
    return x / (F32(1) + np.exp(-x))


def rope(x, base):
    """Rotate-half RoPE on (B, S, H, hd): element i pairs with i + hd/2, angle s * base^(-2i/hd)."""
    s, hd = x.shape[1], x.shape[3]
    half = hd // 2
    theta = float(base) ** (-2.0 * np.arange(half) / hd)
    angle = np.arange(s)[:, None] * theta[None, :]               # (S, hd/2), float64
    cos, sin = np.cos(angle).astype(F32)[None, :, None, :], np.sin(angle).astype(F32)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(x, p, name, cfg):
    b, s, d = x.shape
    hq = cfg["n_heads"]
    hkv = cfg["n_kv_heads"] or hq
    hd = cfg.get("head_dim") or d // hq
    q = linear(x, p, name + ".q").reshape(b, s, hq, hd)
    k = linear(x, p, name + ".k").reshape(b, s, hkv, hd)
    v = linear(x, p, name + ".v").reshape(b, s, hkv, hd)
    if cfg["position"] == "rope":
        q, k = rope(q, cfg["rope_base"]), rope(k, cfg["rope_base"])
    k = np.repeat(k, hq // hkv, axis=2)  # query head h reads key/value head h // (hq / hkv)
    v = np.repeat(v, hq // hkv, axis=2)
    scores = np.einsum("bihd,bjhd->bhij", q, k) / F32(math.sqrt(hd))
    scores = np.where(np.tril(np.ones((s, s), dtype=bool)), scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    probs = np.exp(scores)
    probs = (probs / probs.sum(-1, keepdims=True)).astype(F32)
    out = np.einsum("bhij,bjhd->bihd", probs, v).reshape(b, s, hq * hd)
    return linear(out, p, name + ".o")


def ffn(x, w1, w2, w3, b1, b2, activation):
    """One MLP: act(x W1 + b1) W2 + b2, or (silu(x W1 + b1) * (x W3)) W2 + b2."""
    a = x @ w1 + (b1 if b1 is not None else 0)
    if activation == "swiglu":
        h = silu(a) * (x @ w3)
    elif activation == "gelu":
        h = gelu(a)
    else:
        h = np.maximum(a, 0)
    return h @ w2 + (b2 if b2 is not None else 0)


def expert_capacity(cf, tokens, k, e):
    if not cf > 0:
        return None  # dropless
    x = float(F32(cf)) * (tokens * k) / e
    if x >= tokens * k:
        return tokens * k
    n = round(x)
    return int(n) if abs(x - n) <= 1e-6 * x else math.ceil(x)


def router_scores(logits, cfg):
    """(scores, probs) of logits (T, E): softmax (scores = probs), or sigmoid with
    probs = scores / their sum over the experts (float64, rounded to f32)."""
    l64 = logits.astype(np.float64)
    if cfg.get("score", "softmax") == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-l64))
        return s.astype(F32), (s / s.sum(-1, keepdims=True)).astype(F32)
    z = np.exp(l64 - l64.max(-1, keepdims=True))
    probs = (z / z.sum(-1, keepdims=True)).astype(F32)
    return probs, probs


def choose(choice, k, groups, group_topk):
    """The top-k experts of choice scores (T, E), best first, ties to the smaller index;
    with groups G > 0 only among the experts of each token's group_topk best groups (a
    group of E/G contiguous experts scores the f32 sum of its two largest choice scores)."""
    T, E = choice.shape
    if groups:
        n = E // groups
        top = -np.sort(-choice.reshape(T, groups, n), axis=2)    # each group, descending
        group_score = top[:, :, 0] + top[:, :, 1] if n >= 2 else top[:, :, 0]
        best = np.argsort(-group_score, axis=1, kind="stable")[:, :group_topk]
        allowed = np.zeros((T, groups), dtype=bool)
        np.put_along_axis(allowed, best, True, axis=1)
        choice = np.where(np.repeat(allowed, n, axis=1), choice, F32(-np.inf))
    return np.argsort(-choice, axis=1, kind="stable")[:, :k]


def balance_loss(probs, idx, cfg, seq_len, load):
    """The load-balancing loss of a group (docs/model.md, "Auxiliary losses"), float64."""
    T, E = probs.shape
    k = idx.shape[1]
    coef = float(F32(cfg["aux_loss_coef"]))
    def term(pr, ix, f=None):
        if f is None:
            f = np.bincount(ix.reshape(-1), minlength=E) / (pr.shape[0] * k)
        return coef * E * float((f * pr.astype(np.float64).mean(0)).sum())
    scope = cfg.get("aux_loss_scope", "group")
    if scope == "sequence" and 0 < seq_len < T:
        parts = [term(probs[b:b + seq_len], idx[b:b + seq_len]) for b in range(0, T, seq_len)]
        return sum(parts) / len(parts)
    if scope == "global":
        return term(probs, idx, load.astype(np.float64))
    return term(probs, idx)


def moe(h, p, name, layer, cfg, step, first_token, seq_len=0):
    """The MoE layer on one routing group h (T, d), in eval mode."""
    T = h.shape[0]
    E, k = cfg["num_experts"], cfg["top_k"]
    logits = h @ p[name + ".router.weight"]                      # (T, E)
    scores, probs = router_scores(logits, cfg)
    choice = scores + p[name + ".expert_bias"] if name + ".expert_bias" in p else scores
    idx = choose(choice, k, cfg.get("route_groups", 0), cfg.get("route_group_topk", 0))
    AUX_VALUES.append((layer, balance_loss(probs, idx, cfg, seq_len, p.get(name + ".expert_load"))))
    gates = np.take_along_axis(scores, idx, axis=1)
    if cfg["normalize_gates"]:
        gates = gates / gates.sum(1, keepdims=True)
    keep = np.ones((T, k), dtype=bool)
    if cfg["second_expert_policy"] == "random":
        stream = fnv1a64(f"layers.{layer}.moe.router.second_expert.step.{step}")
        for t in range(T):
            p1, p2 = scores[t, idx[t, 0]], scores[t, idx[t, 1]]
            u = uniform_at(cfg["seed"], stream, first_token + t)
            keep[t, 1] = u < 2 * float(p2 / (p1 + p2))
    capacity = expert_capacity(cfg["eval_capacity_factor"], T, k, E)
    if capacity is not None:
        if cfg["drop_policy"] == "position":
            order = [(t, j) for j in range(k) for t in range(T)]
        else:  # probability: decreasing gate, ties by token then slot
            order = sorted(((t, j) for t in range(T) for j in range(k)), key=lambda tj: -gates[tj])
        count = np.zeros(E, dtype=np.int64)
        for t, j in order:
            if keep[t, j]:
                e = idx[t, j]
                if count[e] < capacity:
                    count[e] += 1
                else:
                    keep[t, j] = False
    if ROUTING_TRACE is not None:
        ROUTING_TRACE.append((layer, idx.copy(), gates.copy(), keep.copy()))
    y = np.zeros_like(h)
    get = lambda key, e: p[f"{name}.experts.{key}"][e] if f"{name}.experts.{key}" in p else None
    for e in range(E):
        rows = [(t, j) for t in range(T) for j in range(k) if keep[t, j] and idx[t, j] == e]
        if not rows:
            continue
        ts = np.array([t for t, _ in rows])
        out = ffn(h[ts], get("w1", e), get("w2", e), get("w3", e), get("b1", e), get("b2", e),
                  cfg["activation"])
        for (t, j), row in zip(rows, out):
            # moe.routed_scaling_factor s: the combine reads s * gate (model.md, step 7).
            y[t] += cfg.get("routed_scaling_factor", 1.0) * gates[t, j] * row
    if name + ".shared.w1" in p:
        s = lambda key: p[f"{name}.shared.{key}"][0] if f"{name}.shared.{key}" in p else None
        y += ffn(h, s("w1"), s("w2"), s("w3"), s("b1"), s("b2"), cfg["activation"])
    return y


def forward_ce(tokens, targets, p, cfg, step, first_token):
    """Sum of -log p(target) and the target count for one micro-batch (B, S)."""
    m, e = cfg["model"], cfg["moe"]
    b, s = tokens.shape
    x = p["embed.wte"][tokens]
    if m["position"] == "learned":
        x = x + p["embed.wpe"][:s]
    for i in range(m["n_layers"]):
        x = x + attention(norm(x, p, f"layers.{i}.norm1", m), p, f"layers.{i}.attn", m)
        h = norm(x, p, f"layers.{i}.norm2", m)
        if i % e["layer_freq"] == e["layer_freq"] - 1:
            y = moe(h.reshape(b * s, -1), p, f"layers.{i}.moe", i, e, step, first_token, s)
            x = x + y.reshape(b, s, -1)
        else:
            w = lambda key: p.get(f"layers.{i}.mlp.{key}")
            x = x + ffn(h, w("w1.weight"), w("w2.weight"), w("w3.weight"), w("w1.bias"),
                        w("w2.bias"), m["activation"])
    hidden = norm(x, p, "norm_f", m).reshape(b * s, -1)
    head = p["head.weight"] if "head.weight" in p else p["embed.wte"].T
    logits = (hidden @ head).astype(np.float64)
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    t = targets.reshape(-1)
    counted = t >= 0
    return float((lse - logits[np.arange(t.size), np.maximum(t, 0)])[counted].sum()), int(counted.sum())


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    ckpt, data = argv[1], argv[2]
    cfg = load_config(f"{ckpt}/config.yaml")
    p = load_checkpoint_tensors(ckpt)
    step = json.load(open(f"{ckpt}/trainer_state.json"))["step"]
    batches = cfg["train"]["eval_batches"]
    if "--batches" in argv:
        batches = int(argv[argv.index("--batches") + 1])
    seq, mbs = cfg["model"]["seq_len"], cfg["train"]["micro_batch_size"]
    stream = validation_stream(data)
    windows = (stream.size - 1) // seq                  # window w: tokens w*S .. w*S + S
    available = windows // mbs
    batches = available if batches <= 0 else min(batches, available)
    ce, count = 0.0, 0
    for b in range(batches):
        rows = np.stack([stream[w * seq:w * seq + seq + 1] for w in range(b * mbs, (b + 1) * mbs)])
        s, n = forward_ce(rows[:, :-1], rows[:, 1:], p, cfg, step, first_token=b * mbs * seq)
        ce += s
        count += n
    per_layer = {}
    for layer, aux in AUX_VALUES:
        per_layer.setdefault(layer, []).append(aux)
    aux_loss = sum(sum(v) / len(v) for v in per_layer.values())
    print(json.dumps({"step": step, "batches": batches, "tokens": count, "loss": ce / count,
                      "aux_loss": aux_loss}))


if __name__ == "__main__":
    main(sys.argv)
