#!/usr/bin/python3
"""One MoE layer, forward + backward: build/bin/moe_layer_perf (ours, one rank) against
moe_layer_torch.py (plain PyTorch) at the same shapes, each side under every thread setting
of side_by_side.py, alternating over ROUNDS rounds; prints median (min-max) of the
fwd+bwd time per side at its best setting, the setting's name, and the ratio of the
medians (torch / ours, > 1: ours faster); writes OUT/moe_layer.json.
Driven by scripts/bench_moe_layer.sh, which documents the variables.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import side_by_side as sbs  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True, help="moe_layer_perf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", required=True, help="'tokens,d,f,E,k,act,cf ...'")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--torch_settings", default="all")
    ap.add_argument("--ours_settings", default="all")
    ap.add_argument("--reuse", action="store_true",
                    help="keep the runs whose JSON is already in OUT (continue an interrupted "
                         "comparison with the same options)")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    logs = os.path.join(args.out, "moe_layer")
    os.makedirs(logs, exist_ok=True)
    sides = {"ours": sbs.pick(sbs.OURS_SETTINGS, args.ours_settings),
             "torch": sbs.pick(sbs.TORCH_SETTINGS, args.torch_settings)}

    rows = []
    for i, shape in enumerate(args.shapes.split()):
        tokens, d, f, e, k, act, cf = shape.split(",")
        common = ["--tokens", tokens, "--hidden", d, "--ffn", f, "--experts", e, "--topk", k,
                  "--activation", act, "--capacity", cf, "-n", str(args.iters),
                  "-w", str(args.warmup)]
        extra = {}  # (side, setting) -> the last run's JSON

        def measure(side, name, setting, r):
            env, flags = setting
            stem = f"{logs}/{side}-{i}-{name}-r{r}"
            prog = [args.bin] if side == "ours" else ["/usr/bin/python3",
                                                       f"{here}/moe_layer_torch.py"]
            if not (args.reuse and os.path.exists(stem + ".json")):
                sbs.run(prog + common + flags + ["--json", stem + ".json"], env, stem + ".log")
            result = json.load(open(stem + ".json"))
            extra[side, name] = result
            return result["total_ms"]

        print(f"# shape {shape}: {args.rounds} rounds of {', '.join(sides['ours'])} (ours) "
              f"and {', '.join(sides['torch'])} (torch)", file=sys.stderr, flush=True)
        per = sbs.alternate(sides, args.rounds, measure)
        ours_name, ours = sbs.best(per["ours"], lower_is_better=True)
        torch_name, ref = sbs.best(per["torch"], lower_is_better=True)
        last = extra["ours", ours_name]
        # The fastest the layer's FLOPs can run: all of them at the sgemm peak measured
        # beside our layer; bound = the ratio ours would then reach.
        floor_ms = 1e3 * last["flops_per_iter"] / last["peak_flops"]
        rows.append({"shape": {"tokens": int(tokens), "d": int(d), "f": int(f), "E": int(e),
                               "k": int(k), "act": act, "cf": float(cf)},
                     "ours_setting": ours_name, "torch_setting": torch_name,
                     "ours_total_ms": ours, "torch_total_ms": ref,
                     "torch_over_ours": ref["median"] / ours["median"],
                     "ours_peak_fraction_last_run": last["achieved_flops"] / last["peak_flops"],
                     "peak_gflops": last["peak_flops"] / 1e9, "floor_ms": floor_ms,
                     "ours_peak_fraction": floor_ms / ours["median"],
                     "bound_torch_over_ours": ref["median"] / floor_ms,
                     "all_settings": per})

    print(f"# MoE layer fwd+bwd, one rank; {args.rounds} alternating rounds per setting, "
          f"{args.iters} timed iterations each; ms: median (min-max) at each side's best setting")
    print("# ratio = torch median / ours median (> 1: ours faster); %peak = ours' FLOP/s at its median "
          "over the sgemm peak measured beside it;")
    print("# bound = torch median / the time of the layer's FLOPs at that peak: the ratio no fp32 "
          "implementation on this machine can pass")
    print(f"# {'tokens':>6s} {'d':>5s} {'f':>5s} {'E':>3s} {'k':>2s} {'act':>7s} {'cf':>5s} | "
          f"{'ours ms':>22s} {'setting':>14s} | {'torch ms':>22s} {'setting':>21s} | ratio %peak bound")
    for row in rows:
        s = row["shape"]
        print(f"  {s['tokens']:6d} {s['d']:5d} {s['f']:5d} {s['E']:3d} {s['k']:2d} {s['act']:>7s} "
              f"{s['cf']:5.2f} | {sbs.fmt(row['ours_total_ms']):>22s} {row['ours_setting']:>14s} | "
              f"{sbs.fmt(row['torch_total_ms']):>22s} {row['torch_setting']:>21s} | "
              f"{row['torch_over_ours']:5.2f} {100 * row['ours_peak_fraction']:5.1f} "
              f"{row['bound_torch_over_ours']:5.2f}")
    print("# every setting (median ms):")
    for row in rows:
        s = row["shape"]
        cells = [f"{side}:{name} {v['median']:.2f}" for side, per in row["all_settings"].items()
                 for name, v in per.items()]
        print(f"#   {s['tokens']},{s['d']},{s['f']},{s['E']},{s['k']},{s['act']}: " + ", ".join(cells))
    sbs.write_json(f"{args.out}/moe_layer.json",
                   {"benchmark": "bench_moe_layer", "rounds": args.rounds, "iters": args.iters,
                    "torch": extra.get(("torch", rows[-1]["torch_setting"]), {}).get("torch"),
                    "rows": rows})
    print(f"# wrote {args.out}/moe_layer.json")


if __name__ == "__main__":
    main()
