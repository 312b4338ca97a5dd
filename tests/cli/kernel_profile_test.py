#!/usr/bin/python3
"""benchmarks/reference/kernel_profile.py (the per-kernel GPU profile scripts/gpu_bench.sh
prints) on hand-made input: Nsight Compute's raw CSV with its messages before the header and
a units row (nanoseconds and microseconds), the sums per family and per kernel over the
steps, the short names of demangled kernels, and every __global__ kernel of kernels/cuda
given a family (a new kernel must be placed, or the profile calls it "other").
    kernel_profile_test.py path/to/repo
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(sys.argv[1])
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "reference"))
import kernel_profile as kp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402

NORM = ("void switchyard::kernels::cuda::norm_dev::(anonymous namespace)::LayerNormForwardKernel"
        "<__nv_bfloat16>(const float *, const float *, const float *, float, T1 *, float *, "
        "float *, long, long, const float *, float *)")
FLASH = ("void switchyard::kernels::cuda::flash::(anonymous namespace)::FlashForwardKernel<64, "
         "float>(const float *, const float *, const float *, T2 *, float *, Dims, bool, float)")
GEMM = "nvjet_tst_192x192_64x4_2x1_v_bz_coopA_NNT"
SORT = ("void cub::CUB_300000_SM_900::detail::radix_sort::DeviceRadixSortOnesweepKernel<Policy, "
        "false, int, long, unsigned int, int, int>(int *, int *, ...)")


def csv_text(unit, rows):
    lines = ['==PROF== Connected to process 1234 (/x/switchyard)',
             '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
             '"Block Size","Grid Size","Device","CC","gpu__time_duration.sum"',
             '"","","","","","","","","","","","%s"' % unit]
    for i, (name, value) in enumerate(rows):
        lines.append('"%d","1234","switchyard","h","%s","1","7","(256, 1, 1)","(8, 1, 1)","0",'
                     '"9.0","%s"' % (i, name, value))
    return "\n".join(lines) + "\n"


# ---- parsing: the units row scales the values; messages before the header are skipped ----
launches = kp.read_launches(csv_text("usecond", [(NORM, "10.5"), (GEMM, "1,000"), (FLASH, "250")]))
check("three launches", len(launches) == 3, launches)
check("microseconds to ms", [round(ms, 9) for _, ms in launches] == [0.0105, 1.0, 0.25], launches)
ns = kp.read_launches(csv_text("nsecond", [(GEMM, "2000000")]))
check("nanoseconds to ms", ns == [(GEMM, 2.0)], ns)
try:
    kp.read_launches("==PROF== nothing profiled\n")
    check("no header is an error", False)
except ValueError:
    pass

# ---- short names and families ----
for name, short, fam in [(NORM, "LayerNormForwardKernel", "norms"),
                         (FLASH, "FlashForwardKernel", "attention"),
                         (GEMM, GEMM, "matrix products"),
                         (SORT, "DeviceRadixSortOnesweepKernel", "routing, sort"),
                         ("CastToBf16Kernel", "CastToBf16Kernel", "conversions"),
                         ("void at::native::vectorized_elementwise_kernel<4, F, A>(int, F, A)",
                          "vectorized_elementwise_kernel", "copies, fills"),
                         # Nsight Compute's CSV names an anonymous namespace `<unnamed>`
                         ("void switchyard::<unnamed>::FillKernel<float, 1>(T1 *, long, "
                          "switchyard::RngKey, long, float, float, const long *, long, long)",
                          "FillKernel", "copies, fills"),
                         ("mystery_kernel", "mystery_kernel", "other")]:
    check("short name of " + short, kp.short_name(name) == short, kp.short_name(name))
    check("family of " + short, kp.family(name) == fam, kp.family(name))

# ---- every kernel of ours has a family ----
names = set()
for path in glob.glob(os.path.join(ROOT, "kernels", "cuda", "*.cu*")):
    text = open(path).read()
    names |= set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", text))
check("the kernels were found", len(names) > 60, len(names))
for n in sorted(names):
    check("a family for " + n, kp.family(n) != "other", kp.family(n))

# ---- the summary over 2 steps, and the program's table and JSON ----
rows = [(GEMM, "3000"), (GEMM, "1000"), (NORM, "500"), (FLASH, "400"), (NORM, "100"), ("odd", "0")]
s = kp.summarise(kp.read_launches(csv_text("usecond", rows)), steps=2, top=2)
check("ms per step", abs(s["gpu_ms_per_step"] - 2.5) < 1e-12, s["gpu_ms_per_step"])
check("launches per step", s["launches_per_step"] == 3.0, s["launches_per_step"])
fams = {f["family"]: f for f in s["families"]}
check("products first", s["families"][0]["family"] == "matrix products", s["families"][0])
check("products 2 ms a step", abs(fams["matrix products"]["ms_per_step"] - 2.0) < 1e-12)
check("products share 0.8", abs(fams["matrix products"]["share"] - 0.8) < 1e-12)
check("norms 0.3 ms, 1 launch a step", abs(fams["norms"]["ms_per_step"] - 0.3) < 1e-12 and
      fams["norms"]["launches_per_step"] == 1.0, fams["norms"])
check("the top 2 kernels", [k["kernel"] for k in s["kernels"]] == [GEMM, "LayerNormForwardKernel"],
      s["kernels"])
check("us per launch", abs(s["kernels"][1]["us_per_launch"] - 300.0) < 1e-9, s["kernels"][1])
with tempfile.TemporaryDirectory() as tmp:
    src, out = os.path.join(tmp, "k.csv"), os.path.join(tmp, "k.json")
    open(src, "w").write(csv_text("usecond", rows))
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "reference", "kernel_profile.py"),
                          src, "--steps", "2", "--json", out], capture_output=True, text=True)
    check("the program runs", run.returncode == 0, run.stderr)
    check("the table", "matrix products" in run.stdout and "GPU time per step 2.500 ms" in run.stdout,
          run.stdout)
    check("the JSON", json.load(open(out))["gpu_ms_per_step"] == 2.5)
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "reference", "kernel_profile.py"),
                          src, "--steps", "0"], capture_output=True, text=True)
    check("--steps 0 is refused", bad.returncode == 2 and "--steps 0" in bad.stderr, bad.stderr)
finish("kernel_profile.py: parsing, families and sums as computed by hand")
