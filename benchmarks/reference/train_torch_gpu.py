#!/usr/bin/python3
"""The Switchyard decoder (docs/model.md) in PyTorch as a GPU performance engineer writes it:
the strong reference of scripts/gpu_bench.sh (train_torch.py is the plain eager one).

Same model math as train_torch.py (which `tests/cli/train_torch_test.sh` checks against
`switchyard train`), written for speed:
  - q, k and v as one fused projection; attention by F.scaled_dot_product_attention with
    is_causal (flash attention on a GPU in bf16; a masked softmax where SDPA is missing);
  - the experts of a layer stacked (E, f, d) and run by torch._grouped_mm on the rows sorted
    by expert, no padding, one call per matrix (a per-expert loop where _grouped_mm is missing
    or refuses: the reason is printed); dropless routing takes no host sync at all;
  - bf16 autocast on CUDA (the router, its softmax and the losses stay f32, as in the engine);
  - AdamW(fused=True) on CUDA (foreach elsewhere), clip_grad_norm_(foreach=True);
  - torch.compile of the fixed-shape parts (attention sublayer, dense MLP sublayer, router,
    final norm + head + cross-entropy) when it compiles: tried on a first call, else eager with
    the reason printed.
Which path ran is in `paths` (printed and in the JSON).

  check: from a Switchyard checkpoint (weights, AdamW state) and train_batches' batches,
         trains --steps steps in f32 (no autocast) with Switchyard's keyed random draws and
         compares each step's loss with a Switchyard run's metrics.jsonl; exit 1 on a mismatch.
  time:  the same model (from --checkpoint, or initialised as docs/model.md says with torch's
         own generator) on --device, --warmup + --steps steps; times each step with CUDA
         events (host clock on a CPU); prints and writes tokens/s (median), the spread, the
         step-0 loss and the fraction of assignments dropped by capacity.

    train_torch_gpu.py check --checkpoint RUN/step-00000001 --batches B.bin --metrics M.jsonl
    train_torch_gpu.py time --config configs/gpu-d1024-e16.yaml --batches B.bin --device cuda
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "docs"))
from model_reference import expert_capacity, load_checkpoint_tensors, load_config  # noqa: E402
from model_params import checkpoint_shapes, decays, init_tensors  # noqa: E402
from train_torch import Rng, lr_at, read_batches  # noqa: E402


class Paths:
    """Which implementation each part ran with, and why a fast one did not."""

    def __init__(self):
        self.items = {}

    def set(self, what, value):
        if self.items.get(what) != value:
            self.items[what] = value
            print(f"train_torch_gpu: {what}: {value}", file=sys.stderr, flush=True)


class FastModel(torch.nn.Module):
    """Parameters in the layouts the fast kernels want; `spec` maps each parameter to the
    checkpoint names it is built from (so weights and AdamW moments load the same way)."""

    def __init__(self, cfg, tensors, device, bf16, compile_mode, paths):
        super().__init__()
        self.cfg, self.m, self.e = cfg, cfg["model"], cfg["moe"]
        self.device, self.bf16, self.paths = device, bf16, paths
        m = self.m
        self.hq = m["n_heads"]
        self.hkv = m.get("n_kv_heads", 0) or self.hq
        self.hd = m.get("head_dim") or m["d_model"] // self.hq
        self.p = torch.nn.ParameterDict()
        self.spec = {}   # parameter key -> (checkpoint names, how to build from their arrays)
        self.buffers_ = {}
        T = lambda a: a.transpose(-1, -2)  # noqa: E731

        def add(key, names, build, trained=True):
            arrays = [tensors[n] for n in names]
            value = build(*[torch.as_tensor(np.asarray(a, dtype=np.float32)) if not torch.is_tensor(a) else a
                            for a in arrays]).to(device=device, dtype=torch.float32).contiguous()
            if not trained:
                self.buffers_[key] = value
                return
            self.p[key.replace(".", "/")] = torch.nn.Parameter(value)
            self.spec[key.replace(".", "/")] = (names, build)

        ident = lambda a: a  # noqa: E731
        for name in checkpoint_shapes(cfg):
            if ".attn." in name or ".moe.shared." in name:
                continue
            if name.endswith(".moe.experts.w1") or name.endswith(".moe.experts.w3") or \
                    name.endswith(".moe.experts.w2"):
                add(name, [name], T)                               # (E, out, in)
            elif name.endswith(".weight") and len(checkpoint_shapes(cfg)[name]) == 2 and \
                    ".router." not in name and not name.startswith("embed.") and name != "head.weight":
                add(name, [name], T)                               # nn.Linear's (out, in)
            elif name == "head.weight":
                add(name, [name], T)
            else:
                add(name, [name], ident)
        for i in range(m["n_layers"]):
            p = f"layers.{i}.attn"
            add(f"{p}.qkv.weight", [f"{p}.{n}.weight" for n in "qkv"], lambda q, k, v: torch.cat([q, k, v], 1).t())
            if m["bias"]:
                add(f"{p}.qkv.bias", [f"{p}.{n}.bias" for n in "qkv"], lambda q, k, v: torch.cat([q, k, v]))
                add(f"{p}.o.bias", [f"{p}.o.bias"], ident)
            add(f"{p}.o.weight", [f"{p}.o.weight"], T)
            q = f"layers.{i}.moe.shared"
            for n in ("w1", "w2", "w3", "b1", "b2"):
                if f"{q}.{n}" in tensors:
                    add(f"{q}.{n}", [f"{q}.{n}"], (lambda a: a[0].t()) if n[0] == "w" else (lambda a: a[0]))
            eb = f"layers.{i}.moe.expert_bias"
            if eb in tensors:
                add(eb, [eb], ident, trained=False)
        if m["position"] == "rope":
            half = self.hd // 2
            theta = float(m["rope_base"]) ** (-2.0 * np.arange(half) / self.hd)
            angle = np.arange(m["seq_len"])[:, None] * theta[None, :]
            self.cos = torch.from_numpy(np.concatenate([np.cos(angle)] * 2, 1).astype(np.float32)).to(device)
            self.sin = torch.from_numpy(np.concatenate([np.sin(angle)] * 2, 1).astype(np.float32)).to(device)
        self.has_sdpa = hasattr(F, "scaled_dot_product_attention")
        paths.set("attention", "F.scaled_dot_product_attention(is_causal=True)" if self.has_sdpa
                  else f"masked softmax (no F.scaled_dot_product_attention in torch {torch.__version__})")
        self.grouped = None  # decided on the first MoE call
        self.autocast = dict(device_type=device.type, dtype=torch.bfloat16, enabled=bf16)
        self.dropped = torch.zeros((), device=device)  # assignments dropped, summed
        self.assigned = 0
        # The fixed-shape parts, compiled when asked and possible.
        self.fn = {"attn": self.attn_sublayer, "mlp": self.mlp_sublayer, "router": self.router,
                   "head": self.head_loss}
        self.compiled = False
        if compile_mode:
            if not hasattr(torch, "compile"):
                paths.set("compile", f"off: torch {torch.__version__} has no torch.compile")
            else:
                self.fn = {k: torch.compile(v, dynamic=False) for k, v in self.fn.items()}
                self.compiled = True
        else:
            paths.set("compile", "off (asked)")

    def w(self, name):
        key = name.replace(".", "/")
        if key in self.p:
            return self.p[key]
        return self.buffers_.get(name)

    # ---- the fixed-shape parts (compiled) ----

    def norm(self, x, wt, b):
        eps = self.m["norm_eps"]
        if self.m["norm"] == "layernorm":
            return F.layer_norm(x, (x.shape[-1],), wt, b, eps)
        if hasattr(F, "rms_norm"):
            return F.rms_norm(x.float(), (x.shape[-1],), wt, eps)
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * wt

    def rope(self, x):  # (B, H, S, hd)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * self.cos[:x.shape[2]] + rotated * self.sin[:x.shape[2]]

    def attn_sublayer(self, x, nw, nb, qkv_w, qkv_b, o_w, o_b):
        """x + attention(norm1(x)), x (B, S, d). Weights are arguments, so that one compiled
        graph serves every layer."""
        with torch.autocast(**self.autocast):
            b, s, _ = x.shape
            hd, hq, hkv = self.hd, self.hq, self.hkv
            h = self.norm(x, nw, nb)
            qkv = F.linear(h, qkv_w, qkv_b)
            q, k, v = qkv.split([hq * hd, hkv * hd, hkv * hd], -1)
            q = q.reshape(b, s, hq, hd).transpose(1, 2)
            k = k.reshape(b, s, hkv, hd).transpose(1, 2)
            v = v.reshape(b, s, hkv, hd).transpose(1, 2)
            if self.m["position"] == "rope":
                q, k = self.rope(q).to(v.dtype), self.rope(k).to(v.dtype)
            if hkv != hq:
                k = k.repeat_interleave(hq // hkv, dim=1)
                v = v.repeat_interleave(hq // hkv, dim=1)
            if self.has_sdpa:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
                scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
                o = torch.softmax(scores.masked_fill(mask, float("-inf")), -1) @ v
            o = o.transpose(1, 2).reshape(b, s, hq * hd)
            return x + F.linear(o, o_w, o_b).float()

    def ffn(self, x, w1, w2, w3, b1, b2, activation):
        a = F.linear(x, w1, b1)
        if activation == "swiglu":
            h = F.silu(a) * F.linear(x, w3)
        elif activation == "gelu":
            h = F.gelu(a, approximate="tanh")
        else:
            h = F.relu(a)
        return F.linear(h, w2, b2)

    def mlp_sublayer(self, x, nw, nb, w1, w2, w3, b1, b2):
        """x + mlp(norm2(x)) of a dense layer."""
        with torch.autocast(**self.autocast):
            h = self.norm(x, nw, nb)
            return x + self.ffn(h, w1, w2, w3, b1, b2, self.m["activation"]).float()

    def router(self, x, nw, nb, router_w, expert_bias, u_jitter, u_second):
        """norm2, router (f32), top-k, gates, aux + z loss, capacity (position priority):
        h (T, d), idx (T, k), gates (T, k), keep (T, k) bool, loss."""
        e = self.e
        with torch.autocast(**self.autocast):
            h = self.norm(x, nw, nb).reshape(-1, x.shape[-1])
        with torch.autocast(device_type=self.device.type, enabled=False):
            h = h.float()
            T, E, k = h.shape[0], e["num_experts"], e["top_k"]
            hr = h if u_jitter is None else h * (1.0 - e["jitter_eps"] + 2.0 * e["jitter_eps"] * u_jitter)
            logits = hr @ router_w                                                 # (T, E)
            probs = torch.softmax(logits, dim=-1)
            score = probs if expert_bias is None else probs + expert_bias
            idx = torch.topk(score.detach(), k, dim=-1).indices                      # (T, k)
            gates = probs.gather(1, idx)
            if e["normalize_gates"]:
                gates = gates / gates.sum(1, keepdim=True)
            onehot = F.one_hot(idx, E)                                               # (T, k, E)
            f = onehot.sum((0, 1)).float() / (T * k)
            loss = e["aux_loss_coef"] * E * (f * probs.mean(0)).sum()
            if e["z_loss_coef"] > 0:
                loss = loss + e["z_loss_coef"] * torch.logsumexp(logits, -1).pow(2).mean()
            keep = torch.ones(T, k, dtype=torch.bool, device=h.device)
            if u_second is not None:
                p = probs.detach().gather(1, idx)
                keep[:, 1] = u_second < 2 * p[:, 1] / (p[:, 0] + p[:, 1])
            cap = expert_capacity(e["capacity_factor"], T, k, E)
            if cap is not None:  # slot-major cumulative count per expert
                kept_onehot = (onehot * keep.unsqueeze(-1)).transpose(0, 1).reshape(k * T, E)
                pos = (kept_onehot.cumsum(0) - 1).reshape(k, T, E).transpose(0, 1)
                keep = keep & ((pos * onehot).sum(-1) < cap)
        return h, idx, gates, keep, loss

    def head_loss(self, x, nw, nb, head, targets):
        with torch.autocast(**self.autocast):
            hidden = self.norm(x, nw, nb)
            logits = F.linear(hidden, head)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    # ---- the data-dependent part (eager) ----

    def experts(self, rows, experts, counts, i):
        """The expert MLPs on rows (A, d) sorted by expert; experts (A,) their expert, counts (E,)."""
        name = f"layers.{i}.moe.experts"
        w1, w2, w3 = self.w(name + ".w1"), self.w(name + ".w2"), self.w(name + ".w3")
        b1, b2 = self.w(name + ".b1"), self.w(name + ".b2")
        act = self.e["activation"]
        if self.grouped is None:
            why = None
            if not hasattr(torch, "_grouped_mm"):
                why = f"torch {torch.__version__} has no torch._grouped_mm"
            elif self.device.type != "cuda" or not self.bf16:
                why = "torch._grouped_mm needs CUDA and bf16 (f32 check or a CPU run)"
            elif torch.cuda.get_device_capability(self.device) < (9, 0):
                why = "torch._grouped_mm needs sm_90 or newer"
            if why is None:
                try:
                    self.grouped = True
                    out = self._grouped(rows, experts, counts, w1, w2, w3, b1, b2, act)
                    self.paths.set("experts", "torch._grouped_mm (bf16, rows sorted by expert, no padding)")
                    return out
                except Exception as err:  # noqa: BLE001 -- any refusal falls back
                    why = f"torch._grouped_mm failed: {type(err).__name__}: {str(err).splitlines()[0][:160]}"
            self.grouped = False
            self.paths.set("experts", f"per-expert loop ({why})")
        if self.grouped:
            return self._grouped(rows, experts, counts, w1, w2, w3, b1, b2, act)
        outs = []
        with torch.autocast(**self.autocast):
            for e, chunk in enumerate(rows.split(counts.tolist())):
                if chunk.shape[0]:
                    outs.append(self.ffn(chunk, w1[e], w2[e], None if w3 is None else w3[e],
                                         None if b1 is None else b1[e], None if b2 is None else b2[e], act).float())
        return torch.cat(outs) if outs else rows.new_zeros(rows.shape)

    def _grouped(self, rows, experts, counts, w1, w2, w3, b1, b2, act):
        bf = torch.bfloat16
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        x = rows.to(bf)
        a = torch._grouped_mm(x, w1.to(bf).transpose(-2, -1), offs=offs)           # (A, f)
        if b1 is not None:
            a = a + b1.to(bf)[experts]
        if act == "swiglu":
            h = F.silu(a) * torch._grouped_mm(x, w3.to(bf).transpose(-2, -1), offs=offs)
        elif act == "gelu":
            h = F.gelu(a, approximate="tanh")
        else:
            h = F.relu(a)
        y = torch._grouped_mm(h, w2.to(bf).transpose(-2, -1), offs=offs)           # (A, d)
        if b2 is not None:
            y = y + b2.to(bf)[experts]
        return y.float()

    def moe(self, x, i, rng, step, first_token):
        e = self.e
        T, d = x.shape[0] * x.shape[1], x.shape[2]
        E, k = e["num_experts"], e["top_k"]
        u_jitter = rng.uniform("jitter", i, step, first_token * d, (T, d)) if e["jitter_eps"] > 0 else None
        u_second = rng.uniform("second_expert", i, step, first_token, (T,)) \
            if e["second_expert_policy"] == "random" else None
        w = lambda n: self.w(f"layers.{i}.{n}")  # noqa: E731
        h, idx, gates, keep, loss = self.fn["router"](x, w("norm2.weight"), w("norm2.bias"), w("moe.router.weight"),
                                                      w("moe.expert_bias"), u_jitter, u_second)
        dropless = expert_capacity(e["capacity_factor"], T, k, E) is None and u_second is None
        if dropless:
            flat = torch.arange(T * k, device=x.device)       # every assignment: no host sync
        else:
            flat = keep.reshape(-1).nonzero().squeeze(1)
        self.dropped += T * k - keep.sum()
        self.assigned += T * k
        experts, order = torch.sort(idx.reshape(-1)[flat], stable=True)
        flat = flat[order]
        counts = F.one_hot(experts, E).sum(0) if dropless else torch.bincount(experts, minlength=E)
        tokens = flat // k
        out = self.experts(h[tokens], experts, counts, i)
        g = gates.reshape(-1)[flat].unsqueeze(1)
        y = torch.zeros_like(h).index_add(0, tokens, out * g)
        if self.w(f"layers.{i}.moe.shared.w1") is not None:
            s = lambda n: self.w(f"layers.{i}.moe.shared.{n}")  # noqa: E731
            with torch.autocast(**self.autocast):
                y = y + self.ffn(h, s("w1"), s("w2"), s("w3"), s("b1"), s("b2"), e["activation"]).float()
        return x + y.reshape(x.shape), loss

    def forward(self, tokens, targets, rng, step, first_token):
        m, f = self.m, self.e["layer_freq"]
        x = F.embedding(tokens, self.w("embed.wte"))
        if m["position"] == "learned":
            x = x + self.w("embed.wpe")[:tokens.shape[1]]
        extra = x.new_zeros(())
        for i in range(m["n_layers"]):
            w = lambda n: self.w(f"layers.{i}.{n}")  # noqa: E731
            x = self.fn["attn"](x, w("norm1.weight"), w("norm1.bias"), w("attn.qkv.weight"),
                                w("attn.qkv.bias"), w("attn.o.weight"), w("attn.o.bias"))
            if i % f == f - 1:
                x, loss = self.moe(x, i, rng, step, first_token)
                extra = extra + loss
            else:
                x = self.fn["mlp"](x, w("norm2.weight"), w("norm2.bias"), w("mlp.w1.weight"), w("mlp.w2.weight"),
                                   w("mlp.w3.weight"), w("mlp.w1.bias"), w("mlp.w2.bias"))
        head = self.w("head.weight") if self.w("head.weight") is not None else self.w("embed.wte")
        return self.fn["head"](x, self.w("norm_f.weight"), self.w("norm_f.bias"), head, targets) + extra


def make_optimizer(model, cfg, checkpoint, paths):
    """AdamW with Switchyard's two groups; moments and step from the checkpoint when given."""
    t = cfg["train"]
    if t["optimizer"] != "adamw":
        sys.exit(f"train_torch_gpu: train.optimizer={t['optimizer']}: only adamw is implemented")
    keys = list(model.p.keys())
    groups = [{"params": [model.p[k] for k in keys if decays(model.spec[k][0][0])], "weight_decay": t["weight_decay"]},
              {"params": [model.p[k] for k in keys if not decays(model.spec[k][0][0])], "weight_decay": 0.0}]
    kw = dict(lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"])
    opt = None
    if model.device.type == "cuda":
        try:
            opt = torch.optim.AdamW(groups, fused=True, **kw)
            paths.set("optimizer", "AdamW(fused=True)")
        except (TypeError, RuntimeError) as err:
            paths.set("optimizer", f"AdamW(foreach=True) (fused refused: {err})")
    if opt is None:
        opt = torch.optim.AdamW(groups, foreach=True, **kw)
        if model.device.type != "cuda":
            paths.set("optimizer", "AdamW(foreach=True) (fused is for CUDA)")
    step = 0
    if checkpoint:
        state = load_checkpoint_tensors(checkpoint, "optimizer")
        step = int(float(np.array(state["optimizer.step"]).reshape(-1)[0])) if "optimizer.step" in state else 0
        for k in keys:
            names, build = model.spec[k]
            if f"optimizer.exp_avg.{names[0]}" not in state:
                continue
            moments = [build(*[torch.from_numpy(np.array(state[f"optimizer.{what}.{n}"], dtype=np.float32))
                               for n in names]).to(model.device).contiguous()
                       for what in ("exp_avg", "exp_avg_sq")]
            step_t = torch.tensor(float(step), device=model.device if model.device.type == "cuda" and
                                  opt.defaults.get("fused") else "cpu")
            opt.state[model.p[k]] = {"step": step_t, "exp_avg": moments[0], "exp_avg_sq": moments[1]}
    return opt, step


def clip(model, max_norm):
    try:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
    except TypeError:  # torch < 2.0
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


class DeviceRng:
    """Switchyard's keyed draws (check: exact, host) moved to the device, or (time) torch's
    generator drawing on the device itself (no host-to-device copy of T x d uniforms)."""

    def __init__(self, rng, device):
        self.rng, self.device = rng, device

    def uniform(self, what, layer, step, first, shape):
        if self.rng.exact:
            return self.rng.uniform(what, layer, step, first, shape).to(self.device)
        return torch.rand(shape, device=self.device)


def train_step(model, opt, cfg, batch, step, rng):
    tokens, targets, first_token = batch
    tokens, targets = tokens.to(model.device, non_blocking=True), targets.to(model.device, non_blocking=True)
    for group in opt.param_groups:
        group["lr"] = lr_at(step, cfg["train"])
    opt.zero_grad(set_to_none=True)
    loss = model(tokens, targets, rng, step, first_token)
    loss.backward()
    if cfg["train"]["grad_clip"] > 0:
        clip(model, cfg["train"]["grad_clip"])
    opt.step()
    return loss.detach()


def build(cfg, args, paths, device, bf16):
    """The model (and optimizer), compiled if asked and possible: a compile that fails on the
    first step is retried eager, with the reason printed."""
    tensors = load_checkpoint_tensors(args.checkpoint) if args.checkpoint else init_tensors(cfg, args.seed, device)
    model = FastModel(cfg, tensors, device, bf16, args.compile, paths)
    opt, step = make_optimizer(model, cfg, args.checkpoint, paths)
    return model, opt, step


class Trainer:
    """A model + optimizer that trains step after step (round after round in gpu_bench.py)."""

    def __init__(self, cfg, batches, args, device, bf16, exact_rng=False):
        self.cfg, self.batches, self.args, self.device, self.bf16 = cfg, batches, args, device, bf16
        self.paths = Paths()
        self.model, self.opt, self.step = build(cfg, args, self.paths, device, bf16)
        self.rng = DeviceRng(Rng(exact=exact_rng, seed=cfg["moe"]["seed"]), device)
        self.first_loss, self.compile_s = None, None
        self.tokens_per_step = batches[0][0].numel()

    def one(self):
        b = self.batches[self.step % len(self.batches)]
        try:
            loss = train_step(self.model, self.opt, self.cfg, b, self.step, self.rng)
        except Exception as err:  # noqa: BLE001 -- a compile failure: fall back to eager once
            if not self.model.compiled:
                raise
            reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200]}" if str(err).strip() else type(err).__name__
            self.paths.set("compile", f"off: torch.compile failed ({reason})")
            self.args.compile = False
            self.model, self.opt, self.step = build(self.cfg, self.args, self.paths, self.device, self.bf16)
            self.model.compiled = False
            return self.one()
        if self.first_loss is None:
            self.first_loss = float(loss)
            if self.model.compiled:
                self.paths.set("compile", "torch.compile (dynamic=False) of the attention, dense MLP, "
                               "router and head parts")
        self.step += 1
        return loss

    def run(self, warmup, steps):
        """warmup + steps steps; per-step seconds of the timed ones (CUDA events on a GPU)."""
        cuda = self.device.type == "cuda"
        if cuda:  # this run's peak: the model states live now plus what the steps add
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        for _ in range(warmup):
            self.one()
        if cuda:
            torch.cuda.synchronize()
        warm_s = time.perf_counter() - t0
        if self.compile_s is None:
            self.compile_s = warm_s
        d0, a0 = float(self.model.dropped), self.model.assigned
        marks, losses = [], []
        for _ in range(steps):
            if cuda:
                ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                ev[0].record()
                losses.append(self.one())
                ev[1].record()
                marks.append(ev)
            else:
                t = time.perf_counter()
                losses.append(float(self.one()))
                marks.append(time.perf_counter() - t)
        if cuda:
            torch.cuda.synchronize()
            secs = [a.elapsed_time(b) / 1e3 for a, b in marks]
        else:
            secs = marks
        assigned = self.model.assigned - a0
        result = {"step_s": secs, "warmup_s": warm_s, "last_loss": float(losses[-1]) if losses else None,
                  "dropped_frac": (float(self.model.dropped) - d0) / assigned if assigned else 0.0}
        if cuda:
            result["max_allocated_bytes"] = torch.cuda.max_memory_allocated(self.device)
            result["max_reserved_bytes"] = torch.cuda.max_memory_reserved(self.device)
        return result


def summary(secs, tokens_per_step):
    med = statistics.median(secs)
    return {"tokens_per_s": tokens_per_step / med, "step_ms_median": 1e3 * med,
            "step_ms_min": 1e3 * min(secs), "step_ms_max": 1e3 * max(secs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["check", "time"])
    ap.add_argument("--checkpoint", default="", help="a step-* directory (check: required)")
    ap.add_argument("--config", default="", help="time without --checkpoint: a config YAML "
                    "(flat 'section:' / '  key: value' form, as configs/ and checkpoints hold)")
    ap.add_argument("--batches", required=True, help="train_batches' output (from step 0)")
    ap.add_argument("--metrics", default="", help="check: the Switchyard run's metrics.jsonl")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"],
                    help="auto: bf16 autocast on CUDA, f32 on the CPU")
    ap.add_argument("--compile", type=int, default=-1, help="1: torch.compile, 0: eager, -1: 1 on CUDA")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.mode == "check":
        if not (args.checkpoint and args.metrics):
            sys.exit("train_torch_gpu: error: check needs --checkpoint and --metrics")
        args.precision, args.compile = "fp32", 0
    if args.compile < 0:
        args.compile = int(device.type == "cuda")
    bf16 = args.precision == "bf16" or (args.precision == "auto" and device.type == "cuda")
    if not args.checkpoint and not args.config:
        sys.exit("train_torch_gpu: error: give --checkpoint or --config")
    cfg = load_config(f"{args.checkpoint}/config.yaml" if args.checkpoint else args.config)
    if cfg["train"].get("grad_accum", 1) != 1:
        sys.exit("train_torch_gpu: only train.grad_accum 1 is implemented")
    for key, ok in (("score", "softmax"), ("route_groups", 0), ("aux_loss_scope", "group"),
                    ("drop_policy", "position"), ("expert_bias_rate", 0)):
        if cfg["moe"].get(key, ok) not in (ok, float(ok) if isinstance(ok, int) else ok):
            sys.exit(f"train_torch_gpu: moe.{key}={cfg['moe'][key]}: only {ok} is implemented")
    torch.manual_seed(1)
    batches = read_batches(args.batches)
    trainer = Trainer(cfg, batches, args, device, bf16, exact_rng=args.mode == "check")

    if args.mode == "check":
        want = {}
        for line in open(args.metrics):
            j = json.loads(line)
            if "loss" in j and "step" in j:
                want[j["step"]] = j["loss"]
        worst, rows = 0.0, []
        for _ in range(args.steps):
            s = trainer.step
            if s not in want:
                sys.exit(f"train_torch_gpu: {args.metrics} has no loss for step {s}")
            got = float(trainer.one())
            rel = abs(got - want[s]) / abs(want[s])
            worst = max(worst, rel)
            rows.append({"step": s, "torch": got, "switchyard": want[s], "rel": rel})
            print(f"step {s}: torch loss {got:.7f}  switchyard {want[s]:.7f}  rel {rel:.2e}")
        ok = worst <= args.rtol
        print(f"{'ok' if ok else 'MISMATCH'}: largest relative difference {worst:.2e} "
              f"(tolerance {args.rtol:g}); paths: {json.dumps(trainer.paths.items)}")
        if args.json:
            with open(args.json, "w") as out:
                json.dump({"ok": ok, "worst_rel": worst, "steps": rows, "paths": trainer.paths.items}, out, indent=2)
        sys.exit(0 if ok else 1)

    r = trainer.run(args.warmup, args.steps)
    result = {"benchmark": "train_torch_gpu", "torch": torch.__version__, "device": str(device),
              "bf16": bf16, "steps": args.steps, "warmup": args.warmup,
              "tokens_per_step": trainer.tokens_per_step, "first_loss": trainer.first_loss,
              "ln_vocab": math.log(cfg["model"]["vocab_size"]), "paths": trainer.paths.items,
              **summary(r["step_s"], trainer.tokens_per_step), **r}
    print(f"train_torch_gpu: {result['tokens_per_s']:.0f} tokens/s (median of {args.steps} steps, "
          f"{result['step_ms_min']:.2f}-{result['step_ms_max']:.2f} ms), step-0 loss "
          f"{trainer.first_loss:.4f} (ln V {result['ln_vocab']:.4f}), dropped {r['dropped_frac']:.4f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
            out.write("\n")


if __name__ == "__main__":
    main()
