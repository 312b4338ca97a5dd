#!/usr/bin/python3
"""The Switchyard decoder (docs/model.md) in eager PyTorch, trained as `switchyard train` does.

Written as a PyTorch user who cares about speed would write it: nn.Linear-layout weights and
F.linear, attention as batched matmuls on (B, H, S, hd), one leaf tensor per expert matrix
(as an nn.ModuleList of experts holds them) with one matmul chain per expert on its rows,
index_add_ for the combine, capacity by a cumulative sum, AdamW(foreach=True) with the
same two parameter groups, clip_grad_norm_; no Python loop over tokens.

It starts from a Switchyard checkpoint (weights, AdamW moments and step, config.yaml) and
trains on the batches `train_batches` wrote (the very tokens `switchyard train` reads).

  check: trains --steps steps from the checkpoint and compares each step's loss with the
         `loss` of the same step in a Switchyard run's metrics.jsonl (--metrics); jitter and
         GShard's random second expert use Switchyard's counter-based draws (Philox keyed as
         docs/model.md says), so the two runs see the same noise. Exit 1 on a mismatch.
  time:  trains --warmup + --steps steps (the random draws from torch's own generator) and
         reports tokens/s (mean of the timed steps' tokens / step time) as JSON.

    train_torch.py check --checkpoint RUN/step-00000001 --batches B.bin --metrics RUN/metrics.jsonl --steps 2
    train_torch.py time --checkpoint RUN/step-00000001 --batches B.bin --steps 20 --threads 1
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs"))
from model_reference import (expert_capacity, fnv1a64, load_checkpoint_tensors,  # noqa: E402
                             load_config)

M32 = np.uint64(0xFFFFFFFF)


def philox_uniform(seed, stream, first, n):
    """Uniforms [0, 1) of elements first .. first+n-1 of a Philox4x32-10 stream (vectorised
    docs/model.md "Initialisation and randomness": word index % 4 of block index / 4)."""
    idx = np.arange(first, first + n, dtype=np.uint64)
    block = idx >> np.uint64(2)
    c0, c1 = block & M32, block >> np.uint64(32)
    c2 = np.full_like(block, np.uint64(stream & 0xFFFFFFFF))
    c3 = np.full_like(block, np.uint64(stream >> 32))
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(10):
        p0, p1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0) & M32, p1 & M32, \
            ((p0 >> np.uint64(32)) ^ c3 ^ k1) & M32, p0 & M32
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & M32, (k1 + np.uint64(0xBB67AE85)) & M32
    words = np.stack([c0, c1, c2, c3])[(idx & np.uint64(3)).astype(np.int64), np.arange(n)]
    return torch.from_numpy(((words >> np.uint64(8)).astype(np.float64) / 16777216.0)
                            .astype(np.float32))


class Rng:
    """Where the router's random numbers come from: Switchyard's keyed draws (exact) or
    torch's generator (timing; same distribution, no Python-side Philox)."""

    def __init__(self, exact, seed):
        self.exact, self.seed = exact, seed

    def uniform(self, what, layer, step, first, shape):
        if not self.exact:
            return torch.rand(shape)
        stream = fnv1a64(f"layers.{layer}.moe.router.{what}.step.{step}")
        return philox_uniform(self.seed, stream, first, math.prod(shape)).reshape(shape)


class Model(torch.nn.Module):
    """The decoder, its parameters under their checkpoint names with '.' -> '/'; matrices
    in nn.Linear's (out, in) layout, expert matrices one leaf per expert."""

    def __init__(self, cfg, tensors):
        super().__init__()
        self.m, self.e = cfg["model"], cfg["moe"]
        self.p = torch.nn.ParameterDict()
        self.source = {}  # parameter key -> (checkpoint name, expert index or None, transposed)
        for name, value in tensors.items():
            t = torch.from_numpy(np.array(value, dtype=np.float32))
            if ".moe.experts." in name or ".moe.shared." in name:
                for i in range(t.shape[0]):
                    w = t[i].t() if t.dim() == 3 else t[i]
                    self._add(f"{name}.{i}", w, name, i, t.dim() == 3)
            elif name.endswith(".weight") and t.dim() == 2 and ".router." not in name:
                self._add(name, t.t(), name, None, True)                    # (out, in)
            else:
                self._add(name, t, name, None, False)
        m = self.m
        self.hd = m.get("head_dim") or m["d_model"] // m["n_heads"]
        if m["position"] == "rope":
            half = self.hd // 2
            theta = float(m["rope_base"]) ** (-2.0 * np.arange(half) / self.hd)
            angle = np.arange(m["seq_len"])[:, None] * theta[None, :]
            cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
            self.cos = torch.from_numpy(np.concatenate([cos, cos], 1))   # (S, hd)
            self.sin = torch.from_numpy(np.concatenate([sin, sin], 1))
        s = m["seq_len"]
        self.mask = torch.ones(s, s, dtype=torch.bool).triu(1)

    def _add(self, key, value, name, expert, transposed):
        k = key.replace(".", "/")
        self.p[k] = torch.nn.Parameter(value.contiguous())
        self.source[k] = (name, expert, transposed)

    def w(self, name):
        return self.p[name.replace(".", "/")] if name.replace(".", "/") in self.p else None

    def decays(self, key):
        """AdamW decays matrices: embeddings, projections, expert weights (not biases, norms,
        the router, the expert bias)."""
        name = self.source[key][0]
        leaf = name.rsplit(".", 1)[-1]
        return not (".norm" in name or name.startswith("norm_f") or ".router." in name
                    or leaf in ("bias", "b1", "b2", "expert_bias"))

    def norm(self, x, name):
        eps = self.m["norm_eps"]
        if self.m["norm"] == "layernorm":
            return F.layer_norm(x, (x.shape[-1],), self.w(name + ".weight"), self.w(name + ".bias"), eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.w(name + ".weight")

    def linear(self, x, name):
        return F.linear(x, self.w(name + ".weight"), self.w(name + ".bias"))

    def rope(self, x):  # (B, H, S, hd)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * self.cos + rotated * self.sin

    def attention(self, x, name):
        b, s, d = x.shape
        hq = self.m["n_heads"]
        hkv = self.m["n_kv_heads"] or hq
        q = self.linear(x, name + ".q").view(b, s, hq, self.hd).transpose(1, 2)
        k = self.linear(x, name + ".k").view(b, s, hkv, self.hd).transpose(1, 2)
        v = self.linear(x, name + ".v").view(b, s, hkv, self.hd).transpose(1, 2)
        if self.m["position"] == "rope":
            q, k = self.rope(q), self.rope(k)
        if hkv != hq:
            k = k.repeat_interleave(hq // hkv, dim=1)
            v = v.repeat_interleave(hq // hkv, dim=1)
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.hd))
        probs = torch.softmax(scores.masked_fill(self.mask, float("-inf")), dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(b, s, hq * self.hd)
        return self.linear(out, name + ".o")

    def mlp(self, x, w1, w2, w3, b1, b2, activation):
        a = F.linear(x, w1, b1)
        if activation == "swiglu":
            h = F.silu(a) * F.linear(x, w3)
        elif activation == "gelu":
            h = F.gelu(a, approximate="tanh")
        else:
            h = F.relu(a)
        return F.linear(h, w2, b2)

    def moe(self, h, layer, rng, step, first_token):
        """The MoE layer on one routing group h (T, d), training mode; returns (y, aux + z)."""
        e = self.e
        T, d = h.shape
        E, k = e["num_experts"], e["top_k"]
        name = f"layers.{layer}.moe"
        hr = h
        if e["jitter_eps"] > 0:
            u = rng.uniform("jitter", layer, step, first_token * d, (T, d))
            hr = h * (1.0 - e["jitter_eps"] + 2.0 * e["jitter_eps"] * u)
        logits = hr @ self.w(name + ".router.weight")                   # (T, E)
        probs = torch.softmax(logits, dim=-1)
        score = probs if self.w(name + ".expert_bias") is None else probs + self.w(name + ".expert_bias")
        idx = torch.topk(score.detach(), k, dim=-1).indices                # (T, k)
        gates = probs.gather(1, idx)
        if e["normalize_gates"]:
            gates = gates / gates.sum(1, keepdim=True)
        onehot = F.one_hot(idx, E)                                         # (T, k, E)
        f = onehot.sum((0, 1)).float() / (T * k)
        loss = e["aux_loss_coef"] * E * (f * probs.mean(0)).sum()
        if e["z_loss_coef"] > 0:
            loss = loss + e["z_loss_coef"] * torch.logsumexp(logits, -1).pow(2).mean()
        keep = torch.ones(T, k, dtype=torch.bool)
        if e["second_expert_policy"] == "random":
            p = probs.detach().gather(1, idx)
            u = rng.uniform("second_expert", layer, step, first_token, (T,))
            keep[:, 1] = u < 2 * p[:, 1] / (p[:, 0] + p[:, 1])
        cap = expert_capacity(e["capacity_factor"], T, k, E)
        if cap is not None:  # position priority: slot-major cumulative count per expert
            kept_onehot = (onehot * keep.unsqueeze(-1)).transpose(0, 1).reshape(k * T, E)
            pos = (kept_onehot.cumsum(0) - 1).reshape(k, T, E).transpose(0, 1)
            keep = keep & ((pos * onehot).sum(-1) < cap)
        flat = keep.reshape(-1).nonzero().squeeze(1)                       # kept assignments
        experts = idx.reshape(-1)[flat]
        order = torch.argsort(experts)
        flat = flat[order]
        counts = torch.bincount(experts, minlength=E).tolist()
        tokens = flat // k
        rows = h[tokens]                                                   # (A, d) by expert
        outs = []
        bias = self.w(name + ".experts.b1.0") is not None
        for i, chunk in enumerate(rows.split(counts)):
            if chunk.shape[0] == 0:
                continue
            g = lambda key: self.w(f"{name}.experts.{key}.{i}")
            outs.append(self.mlp(chunk, g("w1"), g("w2"), g("w3"), g("b1") if bias else None,
                                 g("b2") if bias else None, e["activation"]))
        y = torch.zeros_like(h)
        if outs:
            y = y.index_add(0, tokens, torch.cat(outs) * gates.reshape(-1)[flat].unsqueeze(1))
        if self.w(name + ".shared.w1.0") is not None:
            s = lambda key: self.w(f"{name}.shared.{key}.0")
            y = y + self.mlp(h, s("w1"), s("w2"), s("w3"), s("b1"), s("b2"), e["activation"])
        return y, loss

    def forward(self, tokens, targets, rng, step, first_token):
        """Total loss (cross-entropy mean + the MoE layers' aux + z) of one micro-batch."""
        m, f = self.m, self.e["layer_freq"]
        b, s = tokens.shape
        x = F.embedding(tokens, self.w("embed.wte"))
        if m["position"] == "learned":
            x = x + self.w("embed.wpe")[:s]
        extra = x.new_zeros(())
        for i in range(m["n_layers"]):
            x = x + self.attention(self.norm(x, f"layers.{i}.norm1"), f"layers.{i}.attn")
            h = self.norm(x, f"layers.{i}.norm2")
            if i % f == f - 1:
                y, loss = self.moe(h.reshape(b * s, -1), i, rng, step, first_token)
                x = x + y.reshape(b, s, -1)
                extra = extra + loss
            else:
                w = lambda key: self.w(f"layers.{i}.mlp.{key}")
                x = x + self.mlp(h, w("w1.weight"), w("w2.weight"), w("w3.weight"),
                                 w("w1.bias"), w("w2.bias"), m["activation"])
        hidden = self.norm(x, "norm_f")
        head = self.w("head.weight") if self.w("head.weight") is not None else self.w("embed.wte")
        logits = F.linear(hidden, head)                                    # (B, S, V)
        return F.cross_entropy(logits.reshape(b * s, -1), targets.reshape(-1)) + extra


def lr_at(step, t):
    """train.lr's schedule: linear warmup, then cosine to min_lr at max_steps."""
    lr, w, n = t["lr"], t["warmup_steps"], t["max_steps"]
    min_lr = t["min_lr"] if t["min_lr"] >= 0 else 0.1 * lr
    if step < w:
        return lr * (step + 1) / w
    if n <= w:
        return min_lr
    return min_lr + (lr - min_lr) * (1 + math.cos(math.pi * min(step - w, n - w) / (n - w))) / 2


def make_optimizer(model, ckpt, cfg):
    t = cfg["train"]
    if t["optimizer"] != "adamw":
        sys.exit(f"train_torch: train.optimizer={t['optimizer']}: only adamw is implemented")
    keys = list(model.p.keys())
    groups = [{"params": [model.p[k] for k in keys if model.decays(k)], "weight_decay": t["weight_decay"]},
              {"params": [model.p[k] for k in keys if not model.decays(k)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"],
                            foreach=True)
    state = load_checkpoint_tensors(ckpt, "optimizer")
    step = float(np.array(state["optimizer.step"]).reshape(-1)[0]) if "optimizer.step" in state else 0.0
    for k in keys:
        name, expert, transposed = model.source[k]
        if f"optimizer.exp_avg.{name}" not in state:
            continue  # not trained (the expert bias)
        moments = []
        for what in ("exp_avg", "exp_avg_sq"):
            v = torch.from_numpy(np.array(state[f"optimizer.{what}.{name}"], dtype=np.float32))
            v = v[expert] if expert is not None else v
            moments.append((v.t() if transposed else v).contiguous())
        opt.state[model.p[k]] = {"step": torch.tensor(step), "exp_avg": moments[0],
                                 "exp_avg_sq": moments[1]}
    return opt, int(step)


def read_batches(path):
    with open(path, "rb") as f:
        head = json.loads(f.readline())
        data = np.frombuffer(f.read(), dtype="<i4")
    n, b, s = head["steps"], head["micro_batch_size"], head["seq_len"]
    data = torch.from_numpy(data.astype(np.int64).reshape(n, 2, b, s))
    return [(data[i, 0], data[i, 1], head["first_sequence"][i] * s) for i in range(n)]


def train_step(model, opt, cfg, batch, step, rng):
    tokens, targets, first_token = batch
    for group in opt.param_groups:
        group["lr"] = lr_at(step, cfg["train"])
    opt.zero_grad(set_to_none=True)
    loss = model(tokens, targets, rng, step, first_token)
    loss.backward()
    clip = cfg["train"]["grad_clip"]
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["check", "time"])
    ap.add_argument("--checkpoint", required=True, help="a step-* directory")
    ap.add_argument("--batches", required=True, help="train_batches' output (from step 0)")
    ap.add_argument("--metrics", default="", help="check: the Switchyard run's metrics.jsonl")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2, help="time: untimed steps first")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    for path, what in ((f"{args.checkpoint}/config.yaml", "--checkpoint (a step-* directory)"),
                       (f"{args.checkpoint}/model.safetensors.index.json", "--checkpoint"),
                       (args.batches, "--batches (train_batches' output)"),
                       (args.metrics or args.batches, "--metrics")):
        if not os.path.isfile(path):
            sys.exit(f"train_torch: error: {what}: {path} does not exist")
    if args.mode == "check" and not args.metrics:
        sys.exit("train_torch: error: check needs --metrics (a switchyard run's metrics.jsonl)")
    cfg = load_config(f"{args.checkpoint}/config.yaml")
    if cfg["train"]["grad_accum"] != 1:
        sys.exit(f"train_torch: train.grad_accum={cfg['train']['grad_accum']} in "
                 f"{args.checkpoint}/config.yaml; only 1 (one micro-batch per step) is implemented")
    model = Model(cfg, load_checkpoint_tensors(args.checkpoint))
    opt, step = make_optimizer(model, args.checkpoint, cfg)
    batches = read_batches(args.batches)
    need = step + args.steps + (args.warmup if args.mode == "time" else 0)
    if len(batches) < need:
        sys.exit(f"train_torch: {args.batches} holds {len(batches)} steps' batches, need {need}")
    tokens_per_step = batches[0][0].numel()

    if args.mode == "check":
        want = {}
        for line in open(args.metrics):
            j = json.loads(line)
            if "loss" in j and "step" in j:
                want[j["step"]] = j["loss"]
        rng = Rng(exact=True, seed=cfg["moe"]["seed"])
        worst, rows = 0.0, []
        for s in range(step, step + args.steps):
            if s not in want:
                sys.exit(f"train_torch: {args.metrics} has no loss for step {s}")
            got = train_step(model, opt, cfg, batches[s], s, rng)
            rel = abs(got - want[s]) / abs(want[s])
            worst = max(worst, rel)
            rows.append({"step": s, "torch": got, "switchyard": want[s], "rel": rel})
            print(f"step {s}: torch loss {got:.7f}  switchyard {want[s]:.7f}  rel {rel:.2e}")
        ok = worst <= args.rtol
        print(f"{'ok' if ok else 'MISMATCH'}: largest relative difference {worst:.2e} "
              f"(tolerance {args.rtol:g}, {100 * worst / args.rtol:.1f}% of it used)")
        if args.json:
            with open(args.json, "w") as out:
                json.dump({"ok": ok, "worst_rel": worst, "steps": rows}, out, indent=2)
        sys.exit(0 if ok else 1)

    rng = Rng(exact=False, seed=0)
    times, losses = [], []
    for i in range(args.warmup + args.steps):
        s = step + i
        t0 = time.perf_counter()
        losses.append(train_step(model, opt, cfg, batches[s], s, rng))
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    tps = float(np.mean([tokens_per_step / t for t in times]))
    result = {"benchmark": "train_torch", "torch": torch.__version__,
              "threads": torch.get_num_threads(), "steps": args.steps, "warmup": args.warmup,
              "tokens_per_step": tokens_per_step, "tokens_per_s": tps,
              "step_ms_median": 1e3 * float(np.median(times)), "final_loss": losses[-1]}
    print(f"train_torch: {tps:.0f} tokens/s over {args.steps} steps, "
          f"{torch.get_num_threads()} torch thread(s), final loss {losses[-1]:.4f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
            out.write("\n")


if __name__ == "__main__":
    main()
