#!/usr/bin/python3
"""Training throughput, `switchyard train` against the same model in eager PyTorch
(train_torch.py), per config: same start checkpoint, same batches, same steps.

For each config: (1) `switchyard train --steps 1` makes the start checkpoint (step 1);
(2) train_batches writes the batches of every step used; (3) the check: Switchyard trains
--check_steps steps from the checkpoint and train_torch.py must reproduce each step's loss
to --rtol (the timing is not run when it does not); (4) --rounds rounds in which every
thread setting of both sides trains --warmup + --steps steps from the checkpoint, in
alternation; tokens/s of a run = mean over its timed steps of tokens / step time.
Prints median (min-max) per side at its best setting and the ratio of the medians (ours /
torch, > 1: ours faster); writes OUT/train_torch.json. Driven by scripts/bench_train_torch.sh.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import side_by_side as sbs  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs"))
from model_reference import load_config  # noqa: E402

PY = "/usr/bin/python3"


def ours_tokens_per_s(metrics, warmup):
    steps = [json.loads(line) for line in open(metrics) if line.strip()]
    steps = [s for s in steps if "tokens_per_s" in s]
    timed = steps[warmup:]
    if not timed:
        sys.exit(f"compare_train: {metrics} has {len(steps)} steps, none after {warmup} warm-up")
    return statistics.fmean(s["tokens_per_s"] for s in timed), timed[-1]["loss"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switchyard", required=True)
    ap.add_argument("--train_batches", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", required=True, help="space-separated config files")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--check_steps", type=int, default=3)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--check_only", action="store_true", help="the loss check, no timing")
    ap.add_argument("--torch_settings", default="all")
    ap.add_argument("--ours_settings", default="all")
    ap.add_argument("--gemm_perf", default="",
                    help="gemm_perf: measures the sgemm peak after each config's rounds, for "
                         "ours' MFU and the bound (empty: not measured)")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    sides = {"ours": sbs.pick(sbs.OURS_SETTINGS, args.ours_settings),
             "torch": sbs.pick(sbs.TORCH_SETTINGS, args.torch_settings)}
    rows = []
    for cfg in args.configs.split():
        name = os.path.splitext(os.path.basename(cfg))[0]
        work = os.path.join(args.out, "train_torch", name)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        sets = ["--set", f"data.dir={args.data}", "--set", "train.eval_every=0",
                "--set", "train.grad_accum=1", "--set", "parallel.ep=1"]
        train = [args.switchyard, "train", "--config", cfg] + sets
        print(f"# {name}: start checkpoint, batches, loss check", file=sys.stderr, flush=True)
        sbs.run(train + ["--steps", "1", "--out", f"{work}/start"], {}, f"{work}/start.log")
        start = f"{work}/start/step-00000001"
        resolved = load_config(f"{start}/config.yaml")
        total = 1 + max(args.check_steps, args.warmup + args.steps)
        batches = f"{work}/batches.bin"
        sbs.run([args.train_batches, "--data", args.data,
                 "--seq_len", str(resolved["model"]["seq_len"]),
                 "--micro_batch_size", str(resolved["train"]["micro_batch_size"]),
                 "--seed", str(resolved["train"]["seed"]),
                 "--steps", str(total), "--out", batches], {}, f"{work}/batches.log")
        sbs.run(train + ["--resume", start, "--steps", str(args.check_steps), "--out",
                         f"{work}/check"], {}, f"{work}/check.log")
        sbs.run([PY, f"{here}/train_torch.py", "check", "--checkpoint", start, "--batches",
                 batches, "--metrics", f"{work}/check/metrics.jsonl", "--steps",
                 str(args.check_steps), "--rtol", str(args.rtol), "--json",
                 f"{work}/check.json"], {}, f"{work}/check_torch.log")
        check = json.load(open(f"{work}/check.json"))
        print(f"#   loss check: {args.check_steps} steps agree to {check['worst_rel']:.2e} "
              f"(tolerance {args.rtol:g})", file=sys.stderr, flush=True)
        row = {"config": name, "check": check}
        if args.check_only:
            rows.append(row)
            continue
        losses = {}

        def measure(side, setting, payload, r):
            env, flags = payload
            stem = f"{work}/{side}-{setting}-r{r}"
            if side == "ours":
                shutil.rmtree(stem, ignore_errors=True)
                sbs.run(train + ["--resume", start, "--steps", str(args.warmup + args.steps),
                                 "--set", "train.checkpoint_every=0", "--out", stem],
                        env, stem + ".log")
                tps, loss = ours_tokens_per_s(f"{stem}/metrics.jsonl", args.warmup)
                shutil.rmtree(stem, ignore_errors=True)  # the end-of-run checkpoint
            else:
                sbs.run([PY, f"{here}/train_torch.py", "time", "--checkpoint", start,
                         "--batches", batches, "--steps", str(args.steps), "--warmup",
                         str(args.warmup), "--json", stem + ".json"] + flags, env, stem + ".log")
                result = json.load(open(stem + ".json"))
                tps, loss = result["tokens_per_s"], result["final_loss"]
            losses[side, setting] = loss
            return tps

        print(f"# {name}: {args.rounds} rounds of {', '.join(sides['ours'])} (ours) and "
              f"{', '.join(sides['torch'])} (torch)", file=sys.stderr, flush=True)
        per = sbs.alternate(sides, args.rounds, measure)
        ours_name, ours = sbs.best(per["ours"], lower_is_better=False)
        torch_name, ref = sbs.best(per["torch"], lower_is_better=False)
        if args.gemm_perf:
            # MFU and the bound: the training FLOPs per token (the dry-run's) at the sgemm
            # peak (2 threads, 2048^3, measured now) are the most tokens/s any fp32
            # implementation reaches here; bound = that over torch's median.
            text = subprocess.run(train + ["--dry-run"], capture_output=True, text=True,
                                  check=True).stdout
            m = re.search(r"training FLOPs / token\s+([\d.]+) ([KMGTP]?)FLOP", text)
            fpt = float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[m.group(2)]
            sbs.run([args.gemm_perf, "--sizes", "2048", "-n", "3", "-w", "1", "--threads", "2",
                     "--json", f"{work}/peak.json"], {}, f"{work}/peak.log")
            peak = json.load(open(f"{work}/peak.json"))["peak_gflops_per_rank"] * 1e9
            row.update({"flops_per_token": fpt, "peak_gflops": peak / 1e9,
                        "ours_mfu": ours["median"] * fpt / peak,
                        "bound_ours_over_torch": peak / fpt / ref["median"]})
        row.update({"ours_setting": ours_name, "torch_setting": torch_name,
                    "ours_tokens_per_s": ours, "torch_tokens_per_s": ref,
                    "ours_over_torch": ours["median"] / ref["median"],
                    "final_loss": {"ours": losses["ours", ours_name],
                                   "torch": losses["torch", torch_name]},
                    "all_settings": per})
        rows.append(row)

    print(f"# training tokens/s, one rank, switchyard vs eager PyTorch; loss checked over "
          f"{args.check_steps} steps (rtol {args.rtol:g}) before timing")
    if not args.check_only:
        print(f"# {args.rounds} alternating rounds per setting, {args.warmup} warm-up + "
              f"{args.steps} timed steps each; median (min-max) at each side's best setting")
        print("# ratio = ours median / torch median (> 1: ours faster); MFU = ours' median x the "
              "training FLOPs per token / the sgemm peak;")
        print("# bound = the peak / FLOPs per token / torch median: the ratio no fp32 "
              "implementation on this machine can pass")
        print(f"# {'config':>14s} {'check rel':>9s} | {'ours tokens/s':>24s} {'setting':>14s} | "
              f"{'torch tokens/s':>24s} {'setting':>21s} | ratio  MFU% bound")
    for row in rows:
        if args.check_only:
            print(f"  {row['config']:>14s} loss agrees to {row['check']['worst_rel']:.2e}")
            continue
        print(f"  {row['config']:>14s} {row['check']['worst_rel']:9.1e} | "
              f"{sbs.fmt(row['ours_tokens_per_s'], 0):>24s} {row['ours_setting']:>14s} | "
              f"{sbs.fmt(row['torch_tokens_per_s'], 0):>24s} {row['torch_setting']:>21s} | "
              f"{row['ours_over_torch']:5.2f} "
              + (f"{100 * row['ours_mfu']:5.1f} {row['bound_ours_over_torch']:5.2f}"
                 if "ours_mfu" in row else "    -     -"))
    if not args.check_only:
        print("# every setting (median tokens/s):")
        for row in rows:
            cells = [f"{side}:{n} {v['median']:.0f}" for side, per in row["all_settings"].items()
                     for n, v in per.items()]
            print(f"#   {row['config']}: " + ", ".join(cells))
    sbs.write_json(f"{args.out}/train_torch.json",
                   {"benchmark": "bench_train_torch", "rounds": args.rounds, "steps": args.steps,
                    "warmup": args.warmup, "check_steps": args.check_steps, "rtol": args.rtol,
                    "rows": rows})
    print(f"# wrote {args.out}/train_torch.json")


if __name__ == "__main__":
    main()
