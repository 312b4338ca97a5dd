#!/usr/bin/python3
"""The MoE layer of MODEL.md section 2 in plain PyTorch, timed like moe_layer_perf.

Same shapes and the same work on one process: router (fp32 logits, softmax, top-k, gates =
the top-k probabilities), position-priority capacity per routing group, the Switch
load-balancing loss, per-expert MLPs (gelu tanh / relu / swiglu) on the rows sorted by
expert, and the gate-weighted combine; backward by autograd from
loss = sum(y * dy) + sum(aux) (dy random, daux = 1, as moe_layer_perf does).

It is written the way a PyTorch user would write it (sort the kept assignments by expert,
one matmul chain per expert, index_add back); --threads sets torch.set_num_threads, and
scripts/bench_moe_layer.sh runs it under each thread setting of side_by_side.py (with
OPENBLAS_NUM_THREADS and OMP_WAIT_POLICY) to find PyTorch's fastest. Prints a one-line
summary and, with --json, the same keys as moe_layer_perf's JSON (fwd_ms, bwd_ms, total_ms).

    /usr/bin/python3 benchmarks/reference/moe_layer_torch.py --tokens 1024 --threads 2
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F


def capacity(cf, t, k, e):
    """C = ceil(cf * T * k / E), capped at T * k; None when dropless (cf <= 0)."""
    if cf <= 0:
        return None
    c = cf * (t * k) / e
    if abs(c - round(c)) <= 1e-6 * max(1.0, abs(c)):
        c = round(c)
    return min(int(math.ceil(c)), t * k)


def route(h, wr, k, cap, aux_coef):
    """One routing group. h (T, d) -> (indices (T, k), gates (T, k), kept (T, k) bool, aux)."""
    t, e = h.shape[0], wr.shape[1]
    probs = torch.softmax(h @ wr, dim=-1)                      # (T, E)
    gates, idx = torch.topk(probs, k, dim=-1)                  # (T, k)
    onehot = F.one_hot(idx, e)                                 # (T, k, E)
    # Position priority: all first choices in token order, then all second choices, ...
    slot_major = onehot.transpose(0, 1).reshape(k * t, e)      # (k*T, E)
    pos = (torch.cumsum(slot_major, dim=0) - 1).reshape(k, t, e).transpose(0, 1)
    pos = (pos * onehot).sum(-1)                               # (T, k)
    kept = torch.ones_like(pos, dtype=torch.bool) if cap is None else pos < cap
    f = onehot.sum((0, 1)).float() / (t * k)                   # before dropping; constant
    aux = aux_coef * e * (f * probs.mean(0)).sum()
    return idx, gates, kept, aux


def moe_forward(x, p, args):
    t_all, d = x.shape
    e, k = args.experts, args.topk
    y = torch.zeros_like(x)
    cap = capacity(args.capacity, args.group, k, e)
    aux_total = x.new_zeros(())
    idx_l, gate_l, kept_l = [], [], []
    for g0 in range(0, t_all, args.group):
        idx, gates, kept, aux = route(x[g0:g0 + args.group], p["wr"], k, cap, args.aux_coef)
        idx_l.append(idx), gate_l.append(gates), kept_l.append(kept)
        aux_total = aux_total + aux
    idx, gates, kept = torch.cat(idx_l), torch.cat(gate_l), torch.cat(kept_l)
    flat_e, flat_g = idx.reshape(-1), gates.reshape(-1)
    tok = torch.arange(t_all).repeat_interleave(k)
    sel = kept.reshape(-1).nonzero().squeeze(1)
    order = torch.argsort(flat_e[sel], stable=True)
    sel = sel[order]
    counts = torch.bincount(flat_e[sel], minlength=e).tolist()
    rows = x[tok[sel]]                                         # (A, d) sorted by expert
    outs = []
    for i, chunk in enumerate(rows.split(counts)):
        if chunk.shape[0] == 0:
            continue
        a = chunk @ p["w1"][i]
        if args.activation == "swiglu":
            hid = F.silu(a) * (chunk @ p["w3"][i])
        elif args.activation == "relu":
            hid = F.relu(a)
        else:
            hid = F.gelu(a, approximate="tanh")
        outs.append(hid @ p["w2"][i])
    out = torch.cat(outs) * flat_g[sel].unsqueeze(1)
    y = y.index_add(0, tok[sel], out)
    return y, aux_total, 1.0 - sel.numel() / (t_all * k)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--activation", default="gelu", choices=["gelu", "relu", "swiglu"])
    ap.add_argument("--capacity", type=float, default=1.25)
    ap.add_argument("--group", type=int, default=0, help="tokens per routing group (0: all)")
    ap.add_argument("--aux_coef", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave)")
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("-w", "--warmup_iters", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    args.group = args.group or args.tokens
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    d, f, e = args.hidden, args.ffn, args.experts
    # One leaf tensor per expert matrix, as an nn.ModuleList of experts holds them: slicing
    # one (E, d, f) parameter instead would make autograd add E full-size zero-padded
    # gradients per step (SelectBackward), which no one would benchmark against.
    names = ["w1", "w2"] + (["w3"] if args.activation == "swiglu" else [])
    shapes = {"w1": (d, f), "w2": (f, d), "w3": (d, f)}
    p = {"wr": (torch.randn(d, e) * 0.02).requires_grad_(True)}
    for name in names:
        p[name] = [(torch.randn(*shapes[name]) * 0.02).requires_grad_(True) for _ in range(e)]
    leaves = [p["wr"]] + [w for name in names for w in p[name]]
    x = torch.randn(args.tokens, d, requires_grad=True)
    dy = torch.randn(args.tokens, d)

    fwd_s = bwd_s = 0.0
    dropped = 0.0
    for i in range(-args.warmup_iters, args.iters):
        for v in leaves + [x]:
            v.grad = None
        t0 = time.perf_counter()
        y, aux, dropped = moe_forward(x, p, args)
        t1 = time.perf_counter()
        ((y * dy).sum() + aux).backward()
        t2 = time.perf_counter()
        if i >= 0:
            fwd_s += t1 - t0
            bwd_s += t2 - t1
    fwd, bwd = 1e3 * fwd_s / args.iters, 1e3 * bwd_s / args.iters
    result = {"benchmark": "moe_layer_torch", "torch": torch.__version__,
              "threads": torch.get_num_threads(), "tokens": args.tokens, "hidden": d, "ffn": f,
              "experts": e, "topk": args.topk, "activation": args.activation,
              "capacity": args.capacity, "group": args.group, "dropped": dropped,
              "iters": args.iters, "warmup_iters": args.warmup_iters,
              "fwd_ms": fwd, "bwd_ms": bwd, "total_ms": fwd + bwd}
    print(f"# moe_layer_torch: torch {torch.__version__}, {torch.get_num_threads()} thread(s)\n"
          f"# tokens {args.tokens} d {d} f {f} E {e} k {args.topk} {args.activation} "
          f"cf {args.capacity} dropped {100 * dropped:.1f}%\n"
          f"fwd {fwd:.2f} ms  bwd {bwd:.2f} ms  total {fwd + bwd:.2f} ms")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
            out.write("\n")


if __name__ == "__main__":
    main()
