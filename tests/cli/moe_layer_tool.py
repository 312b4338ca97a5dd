#!/usr/bin/env python3
"""Inputs and checks for `switchyard moe-layer`, with the Python standard library only.

  make     writes a random input file (x, dy and the parameters a config needs), optionally
           broken on purpose (--omit NAME, --bad-shape NAME) for the error tests.
  compare  compares two output files tensor by tensor: float tensors by
           max|a - b| / max|b| (the largest difference relative to the tensor's largest
           value), integer tensors exactly. Exit status 1 when any differs.
  tiny     writes the hand-checkable case (E=1, top-1, relu, bias, dropless) and the
           expected outputs, computed here in float64 from the formulas of MODEL.md
           section 2.

Safetensors: an 8-byte little-endian header length, a JSON header
{"name": {"dtype", "shape", "data_offsets"}}, then the little-endian data.
"""
import argparse
import json
import math
import random
import struct
import sys

FORMATS = {"F32": "f", "F64": "d", "I64": "q", "I32": "i", "U8": "B"}


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> (dtype, shape, flat list of values)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, values = tensors[name]
        assert len(values) == numel(shape), (name, shape, len(values))
        blob = struct.pack("<%d%s" % (len(values), FORMATS[dtype]), *values)
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def read_safetensors(path):
    """Returns name -> (dtype, shape, flat list of values)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        fmt = FORMATS[info["dtype"]]
        count = (end - begin) // struct.calcsize(fmt)
        out[name] = (info["dtype"], tuple(info["shape"]),
                     list(struct.unpack("<%d%s" % (count, fmt), body[begin:end])))
    return out


# ---- make --------------------------------------------------------------------------

def cmd_make(a):
    rng = random.Random(a.seed)
    g, t, d, e, f = a.groups, a.tokens, a.d, a.experts, a.hidden

    def normal(shape, std):
        return ("F32", shape, [rng.gauss(0.0, std) for _ in range(numel(shape))])

    tensors = {
        "x": normal((g, t, d), 1.0),
        "dy": normal((g, t, d), 1.0),
        "router.weight": normal((d, e), 1.0 / math.sqrt(d)),
        "experts.w1": normal((e, d, f), 1.0 / math.sqrt(d)),
        "experts.w2": normal((e, f, d), 1.0 / math.sqrt(f)),
    }
    swiglu = a.activation == "swiglu"
    if swiglu:
        tensors["experts.w3"] = normal((e, d, f), 1.0 / math.sqrt(d))
    if a.bias:
        tensors["experts.b1"] = normal((e, f), 0.1)
        tensors["experts.b2"] = normal((e, d), 0.1)
    if a.expert_bias:
        tensors["router.expert_bias"] = ("F32", (e,), [rng.uniform(-0.05, 0.05) for _ in range(e)])
    h = a.shared_hidden
    if h > 0:
        tensors["shared.w1"] = normal((d, h), 1.0 / math.sqrt(d))
        tensors["shared.w2"] = normal((h, d), 1.0 / math.sqrt(h))
        if swiglu:
            tensors["shared.w3"] = normal((d, h), 1.0 / math.sqrt(d))
        if a.bias:
            tensors["shared.b1"] = normal((h,), 0.1)
            tensors["shared.b2"] = normal((d,), 0.1)
    for name in a.omit:
        del tensors[name]
    for name in a.bad_shape:  # one more element in the last dimension
        dtype, shape, values = tensors[name]
        shape = tuple(shape[:-1]) + (shape[-1] + 1,)
        tensors[name] = (dtype, shape, [0.5] * numel(shape))
    write_safetensors(a.out, tensors)


# ---- compare -----------------------------------------------------------------------

def cmd_compare(a):
    got, want = read_safetensors(a.got), read_safetensors(a.want)
    ok = True
    if sorted(got) != sorted(want):
        print("tensor names differ: only in %s: %s; only in %s: %s" % (
            a.got, sorted(set(got) - set(want)), a.want, sorted(set(want) - set(got))))
        ok = False
    worst = 0.0
    for name in sorted(set(got) & set(want)):
        gd, gs, gv = got[name]
        wd, ws, wv = want[name]
        floats = ("F32", "F64")
        if gs != ws or (gd != wd and not (gd in floats and wd in floats)):
            print("  %-22s %s %s vs %s %s  MISMATCH" % (name, gd, gs, wd, ws))
            ok = False
            continue
        if gd in floats:
            diff = max((abs(x - y) for x, y in zip(gv, wv)), default=0.0)
            scale = max((abs(y) for y in wv), default=0.0)
            rel = diff / scale if scale > 0 else diff
            worst = max(worst, rel)
            good = rel <= a.rtol and all(math.isfinite(x) for x in gv)
            print("  %-22s %-14s %s  max|diff| %.3e  max|want| %.3e  rel %.3e  %s" % (
                name, str(gs), gd, diff, scale, rel, "ok" if good else "FAIL"))
        else:
            bad = sum(1 for x, y in zip(gv, wv) if x != y)
            good = bad == 0
            print("  %-22s %-14s %s  %s" % (
                name, str(gs), gd, "equal" if good else "%d elements differ  FAIL" % bad))
        ok = ok and good
    print("%s: max relative difference %.3e over float tensors (tolerance %.0e); "
          "integer tensors %s" % (a.label or "compare", worst, a.rtol,
                                  "equal" if ok else "see above"))
    print("%s: %s" % (a.label or "compare", "MATCH" if ok else "DIFFER"))
    return 0 if ok else 1


# ---- tiny --------------------------------------------------------------------------

def cmd_tiny(a):
    """E=1, k=1, relu, bias, dropless: every token goes to the one expert with gate 1
    (softmax of one logit), so y = relu(x W1 + b1) W2 + b2; aux = aux_loss_coef (f = P = 1);
    z = z_loss_coef * mean_t logit_t^2 (logsumexp of one logit is the logit). The gate gets
    no gradient (softmax of one logit is constant), so the router weight's gradient comes
    from the z-loss alone: dlogit_t = (1/G) * z_loss_coef * 2 * logit_t / T."""
    G, T, d, f = 2, 3, 2, 2
    aux_coef, z_coef = a.aux_loss_coef, a.z_loss_coef
    x = [[[1.0, 2.0], [-1.0, 0.5], [0.25, -2.0]],
         [[0.5, 0.5], [2.0, -0.75], [-0.75, 1.5]]]
    dy = [[[1.0, 0.0], [0.0, 1.0], [0.5, -1.0]],
          [[-1.0, 2.0], [1.0, 1.0], [0.25, 0.5]]]
    wr = [[0.5], [-1.0]]                 # (d, E=1)
    w1 = [[1.0, 0.0], [0.0, 1.0]]        # identity (d, f)
    b1 = [0.5, -0.25]
    w2 = [[1.0, 0.0], [0.0, 2.0]]        # (f, d)
    b2 = [0.1, -0.1]

    y, gx = [], []
    gwr = [[0.0] for _ in range(d)]
    gw1 = [[0.0] * f for _ in range(d)]
    gb1 = [0.0] * f
    gw2 = [[0.0] * d for _ in range(f)]
    gb2 = [0.0] * d
    aux, z = [], []
    for g in range(G):
        zsum = 0.0
        for t in range(T):
            xt, dyt = x[g][t], dy[g][t]
            logit = sum(xt[i] * wr[i][0] for i in range(d))
            zsum += logit * logit
            pre = [sum(xt[i] * w1[i][j] for i in range(d)) + b1[j] for j in range(f)]
            assert all(v != 0 for v in pre)
            hid = [max(v, 0.0) for v in pre]
            y.extend(sum(hid[j] * w2[j][i] for j in range(f)) + b2[i] for i in range(d))
            # backward: dout = dy (gate 1)
            for j in range(f):
                for i in range(d):
                    gw2[j][i] += hid[j] * dyt[i]
            for i in range(d):
                gb2[i] += dyt[i]
            dpre = [sum(dyt[i] * w2[j][i] for i in range(d)) * (1.0 if pre[j] > 0 else 0.0)
                    for j in range(f)]
            for i in range(d):
                for j in range(f):
                    gw1[i][j] += xt[i] * dpre[j]
            for j in range(f):
                gb1[j] += dpre[j]
            dlogit = (1.0 / G) * z_coef * 2.0 * logit / T
            for i in range(d):
                gwr[i][0] += xt[i] * dlogit
            gx.extend(sum(dpre[j] * w1[i][j] for j in range(f)) + dlogit * wr[i][0]
                      for i in range(d))
        aux.append(aux_coef)
        z.append(z_coef * zsum / T)

    flat = lambda m: [v for row in m for v in row]
    flat3 = lambda m: [v for a2 in m for row in a2 for v in row]
    write_safetensors(a.input, {
        "x": ("F32", (G, T, d), flat3(x)), "dy": ("F32", (G, T, d), flat3(dy)),
        "router.weight": ("F32", (d, 1), flat(wr)),
        "experts.w1": ("F32", (1, d, f), flat(w1)), "experts.b1": ("F32", (1, f), b1),
        "experts.w2": ("F32", (1, f, d), flat(w2)), "experts.b2": ("F32", (1, d), b2),
    })
    write_safetensors(a.expected, {
        "y": ("F64", (G, T, d), y), "grad.x": ("F64", (G, T, d), gx),
        "grad.router.weight": ("F64", (d, 1), flat(gwr)),
        "grad.experts.w1": ("F64", (1, d, f), flat(gw1)), "grad.experts.b1": ("F64", (1, f), gb1),
        "grad.experts.w2": ("F64", (1, f, d), flat(gw2)), "grad.experts.b2": ("F64", (1, d), gb2),
        "aux_loss": ("F64", (G,), aux), "z_loss": ("F64", (G,), z),
        "tokens_per_expert": ("I64", (G, 1), [T] * G), "dropped": ("I64", (G,), [0] * G),
    })
    print("tiny: y[0,0] = relu([1, 2] + [0.5, -0.25]) @ diag(1, 2) + [0.1, -0.1] = %s" % y[:2])


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    m.add_argument("--groups", type=int, default=8)
    m.add_argument("--tokens", type=int, default=16)
    m.add_argument("--d", type=int, default=8)
    m.add_argument("--experts", type=int, default=8)
    m.add_argument("--hidden", type=int, default=16)
    m.add_argument("--activation", default="swiglu", choices=["gelu", "relu", "swiglu"])
    m.add_argument("--bias", action="store_true")
    m.add_argument("--expert-bias", action="store_true")
    m.add_argument("--shared-hidden", type=int, default=0,
                   help="H = num_shared_experts * d_shared; 0: no shared experts")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--omit", action="append", default=[])
    m.add_argument("--bad-shape", action="append", default=[])
    c = sub.add_parser("compare")
    c.add_argument("got")
    c.add_argument("want")
    c.add_argument("--rtol", type=float, default=1e-5)
    c.add_argument("--label", default="")
    t = sub.add_parser("tiny")
    t.add_argument("--input", required=True)
    t.add_argument("--expected", required=True)
    t.add_argument("--aux-loss-coef", type=float, default=0.01)
    t.add_argument("--z-loss-coef", type=float, default=0.1)
    a = p.parse_args()
    return {"make": cmd_make, "compare": cmd_compare, "tiny": cmd_tiny}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
