#!/usr/bin/env python3
"""Where a GPU training step's time goes, kernel by kernel: reads Nsight Compute's raw CSV of
every launch's duration (`ncu --metrics gpu__time_duration.sum --csv --page raw`, as
scripts/gpu_bench.sh runs it over a few steps of `switchyard train`) and prints

  - the families (matrix products, grouped expert products, attention, norms, activations,
    dispatch, routing, optimizer, conversions, loss, embedding, copies and fills, other):
    GPU ms per step, share, launches per step;
  - the heaviest kernels by total time;

and writes the same as JSON. Durations are the kernels' own GPU times (ncu runs the launches
one at a time), so their sum is the step's GPU busy time, without the host's gaps between
launches: set it beside the step time measured with CUDA events to see what the host costs.

  python3 benchmarks/reference/kernel_profile.py ncu.csv --steps 3 --json out.json
"""
import argparse
import csv
import io
import json
import re
import sys

# Family of a kernel: the first pattern that matches its short name (without namespaces,
# template arguments and parameters; case-insensitive), in this order. Ours are named whole;
# cuBLAS's and CUB's by their libraries' naming.
FAMILIES = [
    ("grouped products", r"^Grouped(Gemm|WeightGrad)Kernel$"),
    ("matrix products", r"gemm|xmma|nvjet|cutlass|^sm\d+_|cublas|splitk|gemv|RowExactGemm"),
    ("attention", r"^Flash|^(Delta|Merge|RowMax|MaskedExp|MaskedSoftmax\w*|Softmax\w*|"
                  r"RopeRotate|RopeTable)Kernel$"),
    ("norms", r"^(LayerNorm|RmsNorm)\w*Kernel$|^Column(Partial|Finish)Kernel$"),
    ("activations, bias", r"^(Gelu|Relu|Swiglu)\w*Kernel$|Bias|^(ChunkColumnSum|ColumnPartialSums|"
                          r"ColumnFinalSums|AddColumn\w*)Kernel$"),
    ("dispatch, combine", r"^(Gather|GatherRows|GatherRowsToBf16|ScatterAdd|Combine\w*|Admission\w*|AdmittedCounts|"
                          r"MakeKeys|FinishSort|Offsets|Iota|Entropy|SumInOrder)Kernel$"),
    ("routing, sort", r"^(RouterTopK|RouterBackwardLogits|CountSlotAssignments|Balance\w*|ZLoss\w*|"
                r"Part(SlotCounts|ColumnSums|Balance\w*)|GlobalBalance\w*|AddPartColumns|"
                r"AddLabelAssignmentCounts|UpdateExpertBias|GroupSum|MulUniform)Kernel$|"
                r"radix|onesweep|histogram|scan|select|sort"),
    ("optimizer", r"^(AdamW\w*|Sgd|Scale\w*|SumSquares\w*)Kernel$"),
    ("conversions", r"^(CastToBf16|F32ToBf16|Bf16ToF32)Kernel$"),
    ("loss", r"^(CrossEntropyRow|ExpSum|TargetLogit|SumRows|SumDoubles)Kernel$"),
    ("embedding", r"^(EmbeddingForward|PositionBackward|AddPieces|ScatterAddPieces|"
                  r"ScatterAddRuns|AddPosition|LocalIds|ValidateIds)Kernel$"),
    ("copies, fills", r"^(Fill|Arith|Bits|ZeroMany)Kernel$|copy|fill|memset|elementwise|"
                      r"vectorized"),
]


def short_name(name):
    """The kernel's own name: `ns::(anonymous namespace)::Foo<float, 2>(float*, ...)` -> Foo
    (Nsight Compute writes an anonymous namespace as `<unnamed>`)."""
    head = name.replace("<unnamed>", "(anonymous namespace)")
    depth, cut = 0, len(head)
    for i, ch in enumerate(head):  # the parameter list: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and not head.startswith("(anonymous", i):
            cut = i
            break
    head = head[:cut]
    head = re.sub(r"<.*>", "", head)  # template arguments
    head = head.replace("(anonymous namespace)", "anon")
    head = re.sub(r"^(void|__global__)\s+", "", head.strip())
    return head.split("::")[-1].strip()


def family(name):
    short = short_name(name)
    for fam, pattern in FAMILIES:
        if re.search(pattern, short, re.IGNORECASE):
            return fam
    return "other"


UNITS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
         "second": 1e3, "s": 1e3}


def read_launches(text):
    """[(kernel name, milliseconds)] from ncu's raw CSV: the header row names the columns,
    an optional row of units follows it, then one row per launch (lines before the header,
    ncu's own messages, are skipped)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if '"Kernel Name"' in line or
                  line.startswith("Kernel Name") or ',"Kernel Name"' in line), None)
    if start is None:
        raise ValueError("no header row with a \"Kernel Name\" column")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = rows[0]
    name_col = header.index("Kernel Name")
    metric = [i for i, h in enumerate(header) if h.startswith("gpu__time_duration")]
    if not metric:
        raise ValueError("no gpu__time_duration column in " + ", ".join(header))
    col = metric[0]
    scale = 1e-6  # ns unless a units row says otherwise
    launches = []
    for row in rows[1:]:
        if len(row) <= max(col, name_col):
            continue
        value = row[col].replace(",", "").strip()
        try:
            launches.append((row[name_col], float(value) * scale))
        except ValueError:
            if value in UNITS:  # the units row
                scale = UNITS[value]
    return launches


def summarise(launches, steps, top):
    total = sum(ms for _, ms in launches)
    fams, kernels = {}, {}
    for name, ms in launches:
        f = fams.setdefault(family(name), [0.0, 0])
        f[0] += ms
        f[1] += 1
        k = kernels.setdefault(short_name(name)[:90], [0.0, 0, family(name)])
        k[0] += ms
        k[1] += 1
    share = (lambda ms: ms / total if total > 0 else 0.0)
    return {
        "steps": steps,
        "launches_per_step": len(launches) / steps,
        "gpu_ms_per_step": total / steps,
        "families": [{"family": f, "ms_per_step": v[0] / steps, "share": share(v[0]),
                      "launches_per_step": v[1] / steps}
                     for f, v in sorted(fams.items(), key=lambda kv: -kv[1][0])],
        "kernels": [{"kernel": k, "family": v[2], "ms_per_step": v[0] / steps,
                     "share": share(v[0]), "launches_per_step": v[1] / steps,
                     "us_per_launch": 1e3 * v[0] / v[1]}
                    for k, v in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]],
    }


def table(s):
    out = [f"GPU time per step {s['gpu_ms_per_step']:.3f} ms in {s['launches_per_step']:.0f} launches "
           f"(over {s['steps']} steps; kernels alone, without the host's gaps)",
           f"  {'family':<20} {'ms/step':>9} {'share':>7} {'launches':>9}"]
    for f in s["families"]:
        out.append(f"  {f['family']:<20} {f['ms_per_step']:9.3f} {100 * f['share']:6.1f}% "
                   f"{f['launches_per_step']:9.1f}")
    out.append(f"  {'kernel':<72} {'ms/step':>9} {'share':>7} {'n/step':>7} {'us each':>8}")
    for k in s["kernels"]:
        out.append(f"  {k['kernel'][:72]:<72} {k['ms_per_step']:9.3f} {100 * k['share']:6.1f}% "
                   f"{k['launches_per_step']:7.1f} {k['us_per_launch']:8.1f}")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", help="ncu --csv --page raw output")
    p.add_argument("--steps", type=int, default=1, help="training steps the launches cover")
    p.add_argument("--top", type=int, default=30, help="kernels listed")
    p.add_argument("--json", help="write the summary here")
    a = p.parse_args(argv)
    if a.steps < 1:
        p.error(f"--steps {a.steps}: at least 1")
    with open(a.csv, encoding="utf-8", errors="replace") as f:
        launches = read_launches(f.read())
    if not launches:
        print(f"kernel_profile: no launches in {a.csv}", file=sys.stderr)
        return 1
    s = summarise(launches, a.steps, a.top)
    print(table(s))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(s, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
