#!/usr/bin/env python3
"""The GPU benchmark (scripts/gpu_bench.sh): `switchyard train` on CUDA beside the strong
PyTorch reference (train_torch_gpu.py) on the same config and the same batches, per case.

Per case (a config and its --set overrides):
  1. the planner's prediction for this layout on one GPU (`switchyard plan --gpus 1 --gpu HW
     --config-layout --json`) and the training FLOPs per token (`switchyard train --dry-run`);
  2. train_batches writes the batches of the steps run (the very tokens the engine reads);
  3. --rounds rounds alternating the sides (round r: ours then torch when r is even, torch
     then ours when odd). Ours: `switchyard train` for --warmup + --steps steps (a fresh run
     each round; the last round with --profile, whose profile.json gives the phase times);
     its step times are metrics.jsonl's step_s of the timed steps. Torch: one model kept in
     this process over the rounds (compiled once), timed with CUDA events;
  4. per side the median tokens/s of the timed steps (min-max), MFU = FLOPs per token x tokens/s
     / the hardware file's bf16 peak, the fraction of assignments dropped by capacity, the
     step-0 loss beside ln V; the planner's step beside ours measured; peak memory per device:
     ours from the trainer's memory record (the ledger's model states + workspace peak, and
     the bytes the caching allocator held from the device) beside the dry-run's prediction,
     and the reference's torch.cuda max allocated and reserved.
A case is skipped, with the reason, once --budget_s has passed. Writes OUT/gpu_bench.json and
OUT/gpu_bench.txt (the table).
"""
import argparse
import gc
import glob
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "docs"))
from model_reference import load_config  # noqa: E402

D1024 = "configs/gpu-d1024-e16.yaml"
CASES = {  # name -> (config, overrides); the order they run in (the budget may cut the last)
    # First what the targets read and the two expert-product choices to settle: the
    # d 1024 target case, then the same with the Hopper tiles and with host-sized cuBLAS products,
    # then switch-medium strong and eager.
    "d1024-e16-mb64-dropless": (D1024, ["train.micro_batch_size=64", "moe.capacity_factor=0"]),
    # The expert GEMMs on the Hopper tiles (wgmma; kernels/cuda/grouped_gemm_hopper.cuh), not
    # yet the default: ours only, beside the case above.
    "d1024-e16-mb64-dropless-wgmma": (D1024, ["train.micro_batch_size=64", "moe.capacity_factor=0",
                                              "env:SWITCHYARD_GROUPED_WGMMA=1"]),
    # The dropless dispatch with its counts copied to the host (cuBLAS's grouped products, one
    # wait per MoE layer) beside the default device-sized products: ours only.
    "d1024-e16-mb64-dropless-hostcounts": (D1024, ["train.micro_batch_size=64", "moe.capacity_factor=0",
                                                   "moe.dispatch_counts=host"]),
    "switch-medium-mb64": ("configs/switch-medium.yaml", ["train.micro_batch_size=64"]),
    # The micro-batches replayed as one CUDA graph (runtime.cuda_graphs; docs/gpu.md), beside
    # the same cases run eagerly. At switch-medium, where launches decide, against PyTorch
    # eager (torch:compile=0: the reference without torch.compile), issue #36's "2x eager".
    "switch-medium-mb64-graphs": ("configs/switch-medium.yaml", ["train.micro_batch_size=64",
                                  "runtime.cuda_graphs=true", "torch:compile=0"]),
    "d1024-e16-mb64-cf1.25": (D1024, ["train.micro_batch_size=64"]),
    "d1024-e16-mb16-dropless": (D1024, ["train.micro_batch_size=16", "moe.capacity_factor=0"]),
    "d1024-e16-mb16-cf1.25": (D1024, ["train.micro_batch_size=16"]),
    "d1024-e16-mb64-cf1.25-graphs": (D1024, ["train.micro_batch_size=64",
                                             "runtime.cuda_graphs=true"]),
    # What f32 activation storage costs (each product converts its f32 input, twice for a
    # weight's gradient): ours only, beside d1024-e16-mb64-dropless.
    "d1024-e16-mb64-dropless-f32store": (D1024, ["train.micro_batch_size=64", "moe.capacity_factor=0",
                                                 "runtime.activation_dtype=fp32"]),
    # The Linear layers' product and bias add apart (no cuBLASLt epilogue; kernels/gemm.h
    # GemmBias): ours only, beside d1024-e16-mb64-dropless.
    "d1024-e16-mb64-dropless-nolt": (D1024, ["train.micro_batch_size=64", "moe.capacity_factor=0",
                                             "env:SWITCHYARD_CUBLASLT=0"]),
}
# The reference's run is its case's twin.
OURS_ONLY = {"d1024-e16-mb64-dropless-wgmma", "d1024-e16-mb64-dropless-hostcounts", "d1024-e16-mb64-cf1.25-graphs",
             "d1024-e16-mb64-dropless-f32store", "d1024-e16-mb64-dropless-nolt"}
# Not in the default list: a check of this driver on a CPU (--device cpu; tests/cli/gpu_bench_test.sh).
SMOKE = {"switch-tiny-smoke": ("configs/switch-tiny.yaml", ["train.micro_batch_size=4"]),
         "switch-tiny-smoke-eager": ("configs/switch-tiny.yaml", ["train.micro_batch_size=4",
                                                                  "torch:compile=0"])}
PREFIX = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def log(msg):
    print(f"gpu_bench: {msg}", file=sys.stderr, flush=True)


# The most one of our commands may take (a hung run must not spend the GPU session).
COMMAND_TIMEOUT_S = float(os.environ.get("COMMAND_TIMEOUT_S", "180"))


def run(cmd, out_path, env=None):
    """Runs cmd with its output in out_path; returns the output; raises with its tail on failure
    (or when it runs past COMMAND_TIMEOUT_S)."""
    with open(out_path, "w") as out:
        try:
            p = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                               timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{' '.join(cmd[:2])} timed out after {COMMAND_TIMEOUT_S:.0f} s "
                               f"({out_path})")
    text = open(out_path).read()
    if p.returncode != 0:
        lines = text.strip().splitlines()
        errors = [l for l in lines if re.search(r"error|Error|FAILED|refused", l)]
        why = errors[0] if errors else " | ".join(lines[-3:])
        raise RuntimeError(f"{' '.join(cmd[:2])} exit {p.returncode} ({out_path}): {why.strip()}")
    return text


def flops_per_token(text):
    m = re.search(r"training FLOPs / token\s+([0-9.]+) ([KMGTP]?)FLOP", text)
    return float(m.group(1)) * PREFIX[m.group(2)] if m else None


def dry_run_peak(text):
    """The dry-run's peak per device in bytes ("peak / device (...): 21.28 MiB = ...")."""
    m = re.search(r"^peak / device[^:]*:\s+([0-9.]+) ([KMGT]?i?B)", text, re.M)
    if not m:
        return None
    unit = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}.get(m.group(2))
    return float(m.group(1)) * unit if unit else None


def measured_memory(rows):
    """The trainer's memory record in metrics.jsonl (rank 0): the ledger's peak (model states +
    workspace peak) and the allocator's peak held from the device."""
    for r in rows:
        ranks = r.get("memory", {}).get("ranks") if isinstance(r.get("memory"), dict) else None
        if ranks:
            x = ranks[0]
            peak = sum(x.get(k, 0) for k in ("parameters", "gradients", "optimizer", "workspace_peak"))
            return {"ledger_peak_bytes": peak, "held_peak_bytes": x.get("reserved_peak"),
                    "device_used_bytes": x.get("device_used")}
    return {}


def peak_flops(hardware):
    """bf16 peak of a configs/hardware file (name or path)."""
    path = hardware if os.path.isfile(hardware) else os.path.join(ROOT, "configs", "hardware", hardware + ".yaml")
    try:
        m = re.search(r"peak_flops:\s*\{[^}]*bf16:\s*([0-9.e+]+)", open(path).read())
        return float(m.group(1)) if m else None
    except OSError:
        return None


def profile_phases(path):
    """profile.json's per-step phase times, read defensively: every top-level object of numbers
    (ms_per_step, phases, and any GPU/CUDA-event or counter objects another version adds)."""
    try:
        j = json.load(open(path))
    except (OSError, ValueError):
        return {}
    out = {}
    for key, value in j.items():
        if isinstance(value, dict):
            nums = {k: v for k, v in value.items() if isinstance(v, (int, float))}
            nested = {k: v for k, v in value.items() if isinstance(v, dict)}
            if nums:
                out[key] = nums
            for k, v in nested.items():
                sub = {kk: vv for kk, vv in v.items() if isinstance(vv, (int, float))}
                if sub:
                    out[f"{key}.{k}"] = sub
        elif isinstance(value, (int, float)):
            out.setdefault("scalars", {})[key] = value
    return out


def best_phase_view(phases):
    """The per-step phase times to print: a GPU (CUDA event) view when the profile has one,
    else the host ms_per_step."""
    for key in sorted(phases):
        if re.search(r"gpu|cuda|device|event", key, re.I) and ("ms" in key or "phase" in key):
            return key, phases[key]
    for key in ("ms_per_step", "phases"):
        if key in phases:
            return key, phases[key]
    return None, {}


def scratch_dir(args):
    """Where the engine's runs write: /dev/shm when there (the end-of-run checkpoint of the
    d 1024 model is 3.5 GB, written in a blink to memory), else under --out."""
    if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > 16 << 30:
        return "/dev/shm"
    return args.out


def ours_round(args, cfg_path, sets, work, tag, steps, profile):
    out_dir = os.path.join(scratch_dir(args), f"gpu_bench-{os.getpid()}-{os.path.basename(work)}-{tag}")
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [args.switchyard, "train", "--config", cfg_path, "--steps", str(steps), "--out", out_dir]
    env = dict(os.environ)
    for s in sets:
        if s.startswith("env:"):  # an environment variable of ours' run, not a config key
            key, _, value = s[len("env:"):].partition("=")
            env[key] = value
        else:
            cmd += ["--set", s]
    if profile:
        cmd.append("--profile")
    t0 = time.perf_counter()
    run(cmd, f"{work}/ours-{tag}.log", env=env)
    wall = time.perf_counter() - t0
    shutil.copy(f"{out_dir}/metrics.jsonl", f"{work}/ours-{tag}.metrics.jsonl")
    rows = [json.loads(line) for line in open(f"{out_dir}/metrics.jsonl") if line.strip()]
    memory = measured_memory(rows)
    rows = [r for r in rows if "step_s" in r]
    timed = rows[args.warmup:]
    drops = [l.get("dropped_frac", 0.0) for r in timed for l in r.get("moe", [])]
    result = {"step_s": [r["step_s"] for r in timed], "first_loss": rows[0]["loss"] if rows else None,
              "dropped_frac": statistics.fmean(drops) if drops else 0.0, "wall_s": wall,
              "profiled": profile, **memory}
    ckpts = sorted(glob.glob(f"{out_dir}/step-*"))
    config = load_config(f"{ckpts[-1]}/config.yaml") if ckpts else None
    if profile and os.path.isfile(f"{out_dir}/profile.json"):
        shutil.copy(f"{out_dir}/profile.json", f"{work}/profile.json")
        result["profile"] = profile_phases(f"{out_dir}/profile.json")
    shutil.rmtree(out_dir, ignore_errors=True)  # the end-of-run checkpoint: GBs at d 1024
    return result, config


def stats(secs, tokens):
    if not secs:
        return {}
    med = statistics.median(secs)
    return {"tokens_per_s": tokens / med, "step_ms_median": 1e3 * med, "step_ms_min": 1e3 * min(secs),
            "step_ms_max": 1e3 * max(secs), "timed_steps": len(secs)}


def bench_case(args, name, cfg_path, overrides, torch_mod, peak, started):
    work = os.path.join(args.out, name)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # On the GPU ours runs as the reference does under autocast: bf16 products, and what the
    # layers keep for backward in bf16 (runtime.activation_dtype; autocast keeps the products'
    # bf16 inputs and its bf16 activations). A case may set activation_dtype=fp32 after this.
    cuda = args.device == "cuda"
    sets = [f"data.dir={args.data}", f"runtime.device={args.device}",
            f"runtime.precision={'bf16' if cuda else 'fp32'}",
            f"runtime.activation_dtype={'bf16' if cuda else 'fp32'}",
            # No evaluation (the pack's small validation split holds fewer windows than one
            # micro-batch of 64 at seq 512 needs).
            "train.eval_every=0", "train.eval_batches=0", "train.grad_accum=1", "parallel.ep=1",
            "train.checkpoint_every=0"] + overrides
    # "torch:compile=0": the reference's run without torch.compile (PyTorch eager), not ours'.
    eager_reference = "torch:compile=0" in sets
    sets = [x for x in sets if not x.startswith("torch:")]
    setflags = [x for s in sets if not s.startswith("env:") for x in ("--set", s)]
    row = {"case": name, "config": cfg_path, "overrides": overrides, "torch_eager": eager_reference}
    dry = run([args.switchyard, "train", "--config", cfg_path, "--dry-run"] + setflags, f"{work}/dry_run.log")
    row["flops_per_token"] = flops_per_token(dry)
    row["dry_run_peak_bytes"] = dry_run_peak(dry)
    try:
        plan = json.loads(run([args.switchyard, "plan", "--config", cfg_path, "--gpus", "1", "--gpu",
                               args.hardware, "--config-layout", "--json"] + setflags, f"{work}/plan.json"))
        row["plan"] = plan["layouts"][0] if plan.get("layouts") else None
        if args.calibration:
            cal = json.loads(run([args.switchyard, "plan", "--config", cfg_path, "--gpus", "1", "--gpu",
                                  args.calibration, "--config-layout", "--json"] + setflags,
                                 f"{work}/plan_calibrated.json"))
            row["plan_calibrated"] = cal["layouts"][0] if cal.get("layouts") else None
            # The same file at elementwise_efficiency 1 (the key left out): what the measured
            # memory-bound share changes, which the measured step judges.
            text = open(args.calibration).read()
            if "elementwise_efficiency" in text:
                plain = f"{work}/hardware_elementwise1.yaml"
                with open(plain, "w") as f:
                    f.write("".join(l for l in text.splitlines(True)
                                    if not l.startswith("elementwise_efficiency")))
                cal1 = json.loads(run([args.switchyard, "plan", "--config", cfg_path, "--gpus", "1",
                                       "--gpu", plain, "--config-layout", "--json"] + setflags,
                                      f"{work}/plan_calibrated_elementwise1.json"))
                row["plan_calibrated_elementwise1"] = cal1["layouts"][0] if cal1.get("layouts") else None
    except (RuntimeError, ValueError, KeyError) as err:
        row["plan_error"] = str(err)
    steps = args.warmup + args.steps
    # The resolved config (model shapes) the batches need, from the config itself.
    ours_rounds, torch_rounds, trainer, config = [], [], None, None
    for r in range(args.rounds):
        order = ["ours", "torch"] if r % 2 == 0 or trainer is None else ["torch", "ours"]
        for side in order:
            if side == "ours":
                if torch_mod is not None and args.device == "cuda":
                    torch_mod.cuda.empty_cache()
                res, cfg = ours_round(args, cfg_path, sets, work, f"r{r}", steps, profile=r == args.rounds - 1)
                config = config or cfg
                ours_rounds.append(res)
                log(f"{name} round {r} ours: median step {1e3 * statistics.median(res['step_s']):.2f} ms"
                    f"{' (profiled)' if res['profiled'] else ''}")
                continue
            if torch_mod is None or config is None or name in OURS_ONLY:
                continue
            if trainer is None:
                import train_torch_gpu as ttg  # noqa: E402 (imports torch)
                s, b = config["model"]["seq_len"], config["train"]["micro_batch_size"]
                run([args.train_batches, "--data", args.data, "--seq_len", str(s), "--micro_batch_size", str(b),
                     "--seed", str(config["train"]["seed"]), "--steps", str(steps), "--out",
                     f"{work}/batches.bin"], f"{work}/batches.log")
                targs = argparse.Namespace(checkpoint="", compile=args.compile and not eager_reference,
                                           seed=config["train"]["seed"])
                if targs.compile and time.time() - started > args.budget_s / 2:
                    targs.compile = 0
                    log(f"{name}: torch.compile off: past half the time budget ({args.budget_s:.0f} s)")
                trainer = ttg.Trainer(config, ttg.read_batches(f"{work}/batches.bin"), targs,
                                      torch_mod.device(args.device), args.device == "cuda")
                if not targs.compile:
                    trainer.paths.set("compile", "off: the eager reference" if eager_reference else
                                      "off: past half the time budget" if args.compile else "off (asked)")
                res = trainer.run(args.warmup, args.steps)
            else:
                res = trainer.run(min(args.warmup, 2), args.steps)
            torch_rounds.append(res)
            log(f"{name} round {r} torch: median step {1e3 * statistics.median(res['step_s']):.2f} ms")
    tokens = config["train"]["micro_batch_size"] * config["model"]["seq_len"] if config else 0
    unprofiled = [x for rr in ours_rounds if not rr["profiled"] for x in rr["step_s"]]
    profiled = [x for rr in ours_rounds if rr["profiled"] for x in rr["step_s"]]
    ours = stats(unprofiled or profiled, tokens)
    ours.update({"rounds": ours_rounds, "first_loss": ours_rounds[0]["first_loss"] if ours_rounds else None,
                 "dropped_frac": statistics.fmean(rr["dropped_frac"] for rr in ours_rounds) if ours_rounds else None,
                 "from_profiled_round": not unprofiled})
    if profiled:
        ours["profiled_tokens_per_s"] = tokens / statistics.median(profiled)
    for key in ("ledger_peak_bytes", "held_peak_bytes", "device_used_bytes"):  # the largest of the rounds
        vals = [rr[key] for rr in ours_rounds if rr.get(key) is not None]
        ours[key] = max(vals) if vals else None
    prof = next((rr.get("profile") for rr in ours_rounds if rr.get("profile")), None)
    if prof:
        ours["profile"] = prof
    row["ours"] = ours
    if trainer is not None:
        tt = stats([x for rr in torch_rounds for x in rr["step_s"]], tokens)
        for key in ("max_allocated_bytes", "max_reserved_bytes"):
            vals = [rr[key] for rr in torch_rounds if rr.get(key) is not None]
            tt[key] = max(vals) if vals else None
        tt.update({"rounds": torch_rounds, "first_loss": trainer.first_loss, "paths": trainer.paths.items,
                   "warmup_s_first_round": trainer.compile_s,
                   "dropped_frac": statistics.fmean(rr["dropped_frac"] for rr in torch_rounds)})
        row["torch"] = tt
        del trainer  # the compiled parts refer back to the model: a cycle, freed by gc
        gc.collect()
        if args.device == "cuda":
            torch_mod.cuda.empty_cache()
    row["ln_vocab"] = math.log(config["model"]["vocab_size"]) if config else None
    for side in ("ours", "torch"):
        if side in row and row[side].get("tokens_per_s") and row["flops_per_token"] and peak:
            row[side]["mfu"] = row["flops_per_token"] * row[side]["tokens_per_s"] / peak
    if row.get("torch", {}).get("tokens_per_s") and ours.get("tokens_per_s"):
        row["ratio_ours_over_torch"] = ours["tokens_per_s"] / row["torch"]["tokens_per_s"]
    return row


def fmt(v, spec, none="-"):
    return none if v is None else format(v, spec)


def gib(v):
    return fmt(None if v is None else v / (1 << 30), ".3f")


def memory_line(r):
    """Peak memory per device: ours (the ledger's peak and what the allocator held) beside the
    dry-run's prediction, and the reference's (torch.cuda max allocated / reserved)."""
    ours, torch_side, dry = r.get("ours") or {}, r.get("torch") or {}, r.get("dry_run_peak_bytes")
    if ours.get("ledger_peak_bytes") is None and dry is None:
        return ""
    text = (f"memory GiB: ours {gib(ours.get('ledger_peak_bytes'))} (held {gib(ours.get('held_peak_bytes'))})"
            f", dry-run {gib(dry)}")
    if dry and ours.get("ledger_peak_bytes"):
        text += f" (ours/dry-run {ours['ledger_peak_bytes'] / dry:.2f}"
        if ours.get("held_peak_bytes"):
            text += f", held/dry-run {ours['held_peak_bytes'] / dry:.2f}"
        text += ")"
    if ours.get("device_used_bytes") is not None:
        text += f", device in use {gib(ours['device_used_bytes'])} (cudaMemGetInfo)"
    if torch_side.get("max_allocated_bytes") is not None:
        text += (f", torch {gib(torch_side['max_allocated_bytes'])}"
                 f" (reserved {gib(torch_side.get('max_reserved_bytes'))})")
    return text


# Issue #36's targets (benchmarks, not tests): the d 1024 model at 32k tokens a step, dropless,
# at >= 30% MFU; ours >= 1.2x the strong reference (torch.compile) at both shapes; >= 2x
# PyTorch eager at switch-medium; the peak memory within 10% of the dry-run's.
MFU_CASE, MFU_TARGET = "d1024-e16-mb64-dropless", 0.30
STRONG_RATIO, EAGER_RATIO, MEMORY_TOLERANCE = 1.2, 2.0, 0.10


def targets(rows):
    """The targets' lines: each with what was measured and ok / MISS, or "not measured"."""
    by = {r["case"]: r for r in rows if "skipped" not in r}
    lines = ["issue #36 targets:"]

    def verdict(ok):
        return "ok" if ok else "MISS"

    mfu = (by.get(MFU_CASE) or {}).get("ours", {}).get("mfu")
    lines.append(f"  MFU of {MFU_CASE} >= {MFU_TARGET:.0%}: " +
                 (f"{mfu:.1%} {verdict(mfu >= MFU_TARGET)}" if mfu is not None else "not measured"))
    strong, eager = [], []
    for r in rows:
        ratio = r.get("ratio_ours_over_torch") if "skipped" not in r else None
        if ratio is None:
            continue
        if r.get("torch_eager"):
            eager.append(f"{r['case']} {ratio:.2f}x {verdict(ratio >= EAGER_RATIO)}")
        else:
            strong.append(f"{r['case']} {ratio:.2f}x {verdict(ratio >= STRONG_RATIO)}")
    lines.append(f"  ours >= {STRONG_RATIO}x the strong reference: " + ("; ".join(strong) or "not measured"))
    lines.append(f"  ours >= {EAGER_RATIO}x PyTorch eager at switch-medium: " + ("; ".join(eager) or "not measured"))
    memory = []
    for r in rows:
        ours, dry = (r.get("ours") or {}).get("ledger_peak_bytes"), r.get("dry_run_peak_bytes")
        if "skipped" not in r and ours and dry:
            memory.append(f"{r['case']} {ours / dry:.2f} {verdict(abs(ours / dry - 1) <= MEMORY_TOLERANCE)}")
    lines.append(f"  peak memory (ledger) / dry-run within {MEMORY_TOLERANCE:.0%}: " +
                 ("; ".join(memory) or "not measured"))
    return lines


def table(rows, meta):
    lines = [f"# gpu_bench {meta['date']} on {meta['gpu']} (torch {meta['torch']}); tokens/s = median of the "
             f"timed steps (min-max of the step ms); MFU against {fmt(meta['peak_flops'], '.4g')} FLOP/s bf16",
             f"{'case':26} {'side':5} {'tokens/s':>10} {'step ms (min-max)':>22} {'MFU':>6} {'dropped':>8} "
             f"{'loss@0':>7} {'plan ms':>8}"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['case']:26} skipped: {r['skipped']}")
            continue
        for side in ("ours", "torch"):
            s = r.get(side)
            if not s or not s.get("tokens_per_s"):
                lines.append(f"{r['case']:26} {side:5} {'(not run)':>10}")
                continue
            plan = r.get("plan") or {}
            lines.append(
                f"{r['case']:26} {side:5} {s['tokens_per_s']:10.0f} "
                f"{s['step_ms_median']:8.2f} ({s['step_ms_min']:.2f}-{s['step_ms_max']:.2f}) "
                f"{fmt(s.get('mfu'), '6.1%'):>6} {fmt(s.get('dropped_frac'), '8.4f'):>8} "
                f"{fmt(s.get('first_loss'), '7.3f'):>7} "
                f"{fmt(1e3 * plan['step_s'] if side == 'ours' and plan.get('step_s') else None, '8.2f'):>8}")
        extra = [f"ln V {fmt(r.get('ln_vocab'), '.3f')}"]
        if r.get("ratio_ours_over_torch"):
            extra.append(f"ours/torch {r['ratio_ours_over_torch']:.2f}x")
        if r.get("plan"):
            p = r["plan"]
            extra.append(f"plan {1e3 * p['step_s']:.2f} ms/step, MFU {p['mfu']:.1%} "
                         f"(measured/planned {r['ours']['step_ms_median'] / (1e3 * p['step_s']):.2f})"
                         if r["ours"].get("step_ms_median") else "")
        if r.get("plan_calibrated"):
            one = r.get("plan_calibrated_elementwise1")
            extra.append(f"calibrated plan {1e3 * r['plan_calibrated']['step_s']:.2f} ms/step" +
                         (f" ({1e3 * one['step_s']:.2f} at elementwise_efficiency 1)" if one else ""))
        mem = memory_line(r)
        if mem:
            extra.append(mem)
        if r.get("torch", {}).get("paths"):
            extra.append("torch paths: " + "; ".join(f"{k}={v}" for k, v in r["torch"]["paths"].items()))
        lines.append("    " + " | ".join(e for e in extra if e))
        prof = r["ours"].get("profile") if r.get("ours") else None
        if prof:
            key, view = best_phase_view(prof)
            if view:
                lines.append(f"    ours per-step phases ({key}): " +
                             ", ".join(f"{k} {v:.3g}" for k, v in view.items()))
            for k in sorted(prof):
                if k != key and k not in ("phases", "scalars"):
                    lines.append(f"    profile {k}: " + ", ".join(f"{kk} {vv:.4g}" for kk, vv in list(prof[k].items())[:16]))
    lines += targets(rows)
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switchyard", required=True)
    ap.add_argument("--train_batches", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=15, help="timed steps per side per round")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (torch: the first round's "
                    "include torch.compile's compile)")
    ap.add_argument("--compile", type=int, default=1)
    ap.add_argument("--hardware", default="h200", help="the planner's --gpu and the MFU's peak")
    ap.add_argument("--calibration", default="", help="a plan_calibrate hardware file: also plan with it")
    ap.add_argument("--budget_s", type=float, default=300, help="no new case starts after this")
    ap.add_argument("--no_torch", action="store_true", help="ours only")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: both sides on the CPU in f32 (a check of this driver, not a benchmark)")
    args = ap.parse_args()
    started = time.time()
    os.makedirs(args.out, exist_ok=True)
    torch_mod, gpu = None, "no GPU"
    if not args.no_torch:
        try:
            import torch as torch_mod
            if args.device == "cpu":
                gpu = "CPU (driver check)"
            elif not torch_mod.cuda.is_available():
                log(f"torch {torch_mod.__version__} sees no CUDA device: the reference is not run")
                torch_mod = None
            else:
                gpu = torch_mod.cuda.get_device_name(0)
        except ImportError as err:
            log(f"no torch ({err}): the reference is not run")
    peak = peak_flops(args.hardware)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": gpu,
            "torch": getattr(torch_mod, "__version__", None), "peak_flops": peak,
            "hardware": args.hardware, "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup}
    rows = []
    for name in args.cases.split(","):
        if name not in CASES and name not in SMOKE:
            sys.exit(f"gpu_bench: --cases: unknown case {name!r} (one of {', '.join(CASES)})")
        if time.time() - started > args.budget_s:
            rows.append({"case": name, "skipped": f"time budget of {args.budget_s:.0f} s spent"})
            log(f"{name}: skipped (budget)")
            continue
        cfg_path, overrides = CASES.get(name) or SMOKE[name]
        log(f"{name}: {cfg_path} {' '.join(overrides)}")
        try:
            rows.append(bench_case(args, name, os.path.join(ROOT, cfg_path), overrides, torch_mod, peak, started))
        except Exception as err:  # noqa: BLE001 -- report the case, go on with the next
            log(f"{name}: FAILED: {type(err).__name__}: {err}")
            rows.append({"case": name, "skipped": f"failed: {type(err).__name__}: {str(err)[:300]}"})
    meta["wall_s"] = time.time() - started
    with open(os.path.join(args.out, "gpu_bench.json"), "w") as f:
        json.dump({"meta": meta, "cases": rows}, f, indent=1)
        f.write("\n")
    text = table(rows, meta)
    open(os.path.join(args.out, "gpu_bench.txt"), "w").write(text)
    print(text)
    return 0 if all("skipped" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
