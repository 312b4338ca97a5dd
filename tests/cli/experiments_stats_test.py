#!/usr/bin/python3
"""scripts/experiments/stats.py on hand-computed cases: the t distribution (closed forms at
df 1, 2 and 4, quantiles against the printed table), the paired t with the variance pooled
across settings, the trend in log2 E, the seeds for 80% power (the normal approximation by
hand, the noncentral t against Cohen's / G*Power's sample-size table), the two-way table
setting x seed (by hand and against the closed form of a complete table), and the same tests
as the runner applies them (measures.paired_tests, measures.trend_in_experts).
    experiments_stats_test.py path/to/scripts/experiments
"""
import math
import os
import sys

sys.path.insert(0, os.path.abspath(sys.argv[1]))
import measures  # noqa: E402
import stats  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402


def near(a, b, tol):
    return a is not None and abs(a - b) <= tol


# ---- The t distribution (own implementation, used when scipy is missing) ----------------
# df 1 is Cauchy: F(t) = 1/2 + atan(t)/pi, so F(1) = 3/4.
check("cdf df1", near(stats.t_cdf_own(1.0, 1), 0.75, 1e-13), stats.t_cdf_own(1.0, 1))
# df 2: F(t) = 1/2 + t / (2 sqrt(2 + t^2)); F(1) = 1/2 + 1/(2 sqrt 3) = 0.7886751346.
check("cdf df2", near(stats.t_cdf_own(1.0, 2), 0.5 + 1 / (2 * math.sqrt(3)), 1e-13))
check("cdf df2 negative", near(stats.t_cdf_own(-1.0, 2), 0.5 - 1 / (2 * math.sqrt(3)), 1e-13))
# df 4: F(t) = 1/2 + (3/4) u (1 - u^2/3), u = t / sqrt(4 + t^2). At t = 2 sqrt 3: u = sqrt(3)/2,
# F = 1/2 + (3/4)(sqrt 3/2)(3/4) = 1/2 + 9 sqrt(3)/32 = 0.9871392896.
check("cdf df4", near(stats.t_cdf_own(2 * math.sqrt(3), 4), 0.5 + 9 * math.sqrt(3) / 32, 1e-13))
# Quantiles: df 2 inverts to t = (2p - 1) / sqrt(2 p (1 - p)); p = 0.975: 0.95 / sqrt(0.04875)
# = 4.3026527. Others against the printed table (3 decimals): t_0.975 at df 1, 4, 10, 30 is
# 12.706, 2.776, 2.228, 2.042; t_0.95 at df 5 is 2.015; t_0.995 at df 20 is 2.845.
check("ppf df2", near(stats.t_ppf_own(0.975, 2), 0.95 / math.sqrt(0.04875), 1e-9), stats.t_ppf_own(0.975, 2))
for p, df, want in [(0.975, 1, 12.706), (0.975, 4, 2.776), (0.975, 10, 2.228), (0.975, 30, 2.042),
                    (0.95, 5, 2.015), (0.995, 20, 2.845)]:
    got = stats.t_ppf_own(p, df)
    check("table t_%g(%d)" % (p, df), near(got, want, 5e-4), got)
    check("ppf symmetric", near(stats.t_ppf_own(1 - p, df), -got, 1e-9))
if stats._sps is not None:  # the two implementations agree where both exist
    for df in (1, 2, 3, 7, 40):
        for t in (0.2, 1.5, 3.0, 9.0):
            check("scipy cdf", near(stats.t_cdf_own(t, df), float(stats._sps.t.cdf(t, df)), 1e-12))
        for d in (0.5, 3.0):
            crit = stats.t_ppf(0.975, df)
            if df >= 7:  # scipy 1.10's nct divides by zero at small df
                ref = float(stats._sps.nct.sf(crit, df, d) + stats._sps.nct.cdf(-crit, df, d))
                check("scipy nct", near(stats.nct_power_own(d, df, crit), ref, 1e-8))
# Two-sided p of t = 2 sqrt 3 on 4 df: 2 (1 - F) = 1 - 9 sqrt(3)/16 = 0.0257214.
check("p df4", near(stats.t_two_sided_p(2 * math.sqrt(3), 4), 1 - 9 * math.sqrt(3) / 16, 1e-12))
# With no noncentrality the power is the size of the test: 0.05.
check("power at zero effect", near(stats.nct_power_own(0.0, 6, stats.t_ppf(0.975, 6)), 0.05, 1e-9))

# ---- Paired t, variance pooled across settings -------------------------------------------
# A: Δ 0.01, 0.03, 0.02 (mean 0.02, s^2 = (1e-4 + 1e-4 + 0)/2 = 1e-4); B: -0.01, 0.01, 0
# (mean 0, s^2 = 1e-4). Pooled s^2 = (2e-4 + 2e-4)/4 = 1e-4, s = 0.01, df = 4.
# A: SE = 0.01/sqrt 3 = 0.0057735, t = 0.02/SE = 2 sqrt 3, p = 0.0257214 (above), interval
# 0.02 -+ 2.7764451 x 0.0057735 = 0.02 -+ 0.0160298. B: t = 0, p = 1.
r = stats.pooled_paired_t({"A": [0.01, 0.03, 0.02], "B": [-0.01, 0.01, 0.0]})
a, b = r["settings"]["A"], r["settings"]["B"]
check("pooled sd", near(r["pooled_sd"], 0.01, 1e-15) and r["df"] == 4, r)
check("A se, t", near(a["se"], 0.01 / math.sqrt(3), 1e-15) and near(a["t"], 2 * math.sqrt(3), 1e-12), a)
check("A p", near(a["p"], 1 - 9 * math.sqrt(3) / 16, 1e-10), a)
check("A interval", near(a["lo"], 0.02 - 2.7764451 * 0.01 / math.sqrt(3), 1e-8)
      and near(a["hi"], 0.02 + 2.7764451 * 0.01 / math.sqrt(3), 1e-8), a)
check("B", near(b["mean"], 0.0, 1e-18) and near(b["p"], 1.0, 1e-12), b)
# Adding C: 0.0, 0.04 (n 2, s^2 = 8e-4, one df) and D: 0.05 (one seed, no df): pooled s^2 =
# (2 x 1e-4 + 2 x 1e-4 + 1 x 8e-4) / 5 = 2.4e-4 on 5 df; C: SE = sqrt(2.4e-4 / 2) = 0.0109545,
# t = 0.02 / 0.0109545 = sqrt(10/3) = 1.8257419; D: SE = sqrt(2.4e-4) = 0.0154919, t = 3.2274861.
r = stats.pooled_paired_t({"A": [0.01, 0.03, 0.02], "B": [-0.01, 0.01, 0.0], "C": [0.0, 0.04],
                           "D": [0.05], "E": [None]})
c, d = r["settings"]["C"], r["settings"]["D"]
check("pooled 3 settings", near(r["pooled_sd"], math.sqrt(2.4e-4), 1e-15) and r["df"] == 5, r)
check("C", near(c["se"], math.sqrt(1.2e-4), 1e-15) and near(c["t"], math.sqrt(10 / 3), 1e-12), c)
check("D one seed", d["n"] == 1 and near(d["t"], 0.05 / math.sqrt(2.4e-4), 1e-12), d)
check("E none", r["settings"]["E"]["mean"] is None and r["settings"]["E"]["p"] is None)
check("no df", stats.pooled_paired_t({"A": [0.1]})["df"] is None)

# ---- Trend in log2 E -----------------------------------------------------------------------
# x = 1, 1, 2, 2, 3, 3; y = 0, 0.2, 0.1, 0.3, 0.2, 0.4: mean x 2, Sxx = 4, Sxy = -1(0.2) + 1(0.6)
# = 0.4, slope 0.1, intercept 0.2 - 0.1 x 2 = 0; residuals -+0.1, SSE 0.06 on 4 df, s^2 =
# 0.015, SE = sqrt(0.015/4) = 0.0612372, t = 1.6329932 (t^2 = 8/3); u = t/sqrt(4 + t^2) =
# sqrt(0.4), p = 1 - (3/2) u (1 - u^2/3) = 1 - 1.5 sqrt(0.4)(13/15) = 0.1778078;
# interval 0.1 -+ 2.7764451 x 0.0612372.
pts = [(1, 0.0), (1, 0.2), (2, 0.1), (2, 0.3), (3, 0.2), (3, 0.4)]
tr = stats.trend(pts)
check("slope", near(tr["slope"], 0.1, 1e-14) and near(tr["intercept"], 0.0, 1e-14), tr)
check("trend se, t", near(tr["se"], math.sqrt(0.00375), 1e-14) and near(tr["t"], math.sqrt(8 / 3), 1e-12)
      and tr["df"] == 4, tr)
check("trend p", near(tr["p"], 1 - 1.5 * math.sqrt(0.4) * 13 / 15, 1e-10), tr)
check("trend interval", near(tr["hi"] - tr["lo"], 2 * 2.7764451 * math.sqrt(0.00375), 1e-7), tr)
check("trend too few", stats.trend(pts[:2]) is None and stats.trend([(1, 0.0), (1, 1.0), (1, 2.0)]) is None)

# From the tables' mean ± sd over n: the hand cases above again. A and B: (0.02, 0.01, 3),
# (0, 0.01, 3) -> the same pooled s 0.01 on 4 df and A's p; the trend's groups x = 1, 2, 3
# with means 0.1, 0.2, 0.3 and sd sqrt(0.02) each (0, 0.2 about 0.1: s^2 = 0.02) -> slope 0.1,
# SE sqrt(0.00375), p 0.1778078.
r = stats.pooled_paired_t_from_summary({"A": (0.02, 0.01, 3), "B": (0.0, 0.01, 3)})
check("summary pooled", near(r["pooled_sd"], 0.01, 1e-15) and r["df"] == 4, r)
check("summary A p", near(r["settings"]["A"]["p"], 1 - 9 * math.sqrt(3) / 16, 1e-10), r["settings"]["A"])
tr = stats.trend_from_summary([(1, 0.1, math.sqrt(0.02), 2), (2, 0.2, math.sqrt(0.02), 2), (3, 0.3, math.sqrt(0.02), 2)])
check("summary trend", near(tr["slope"], 0.1, 1e-14) and near(tr["se"], math.sqrt(0.00375), 1e-14)
      and near(tr["p"], 1 - 1.5 * math.sqrt(0.4) * 13 / 15, 1e-10), tr)

# ---- Seeds for 80% power --------------------------------------------------------------------
# Normal approximation by hand: effect 0.01, SD 0.02: ((1.959964 + 0.841621) x 2)^2 =
# 5.603170^2 = 31.3955 -> 32 seeds; its power at 32: Phi(0.5 sqrt 32 - 1.959964) =
# Phi(0.868463) = Phi(0.87) - 0.001537 phi(0.87) = 0.807850 - 0.001537 x 0.273244 = 0.807430.
check("normal n", stats.seeds_for_power(0.01, 0.02, method="normal") == 32)
check("normal power", near(stats.power_paired(32, 0.01, 0.02, method="normal"), 0.807430, 2e-6),
      stats.power_paired(32, 0.01, 0.02, method="normal"))
# Noncentral t, df n - 1 (the paired / one-sample t test): Cohen's table and G*Power give
# 199, 34, 15 and 10 seeds for effect / SD = 0.2, 0.5, 0.8 and 1.0.
for es, want in [(0.2, 199), (0.5, 34), (0.8, 15), (1.0, 10)]:
    got = stats.seeds_for_power(0.01 * es, 0.01)
    check("t seeds d=%g" % es, got == want, got)
    check("t power just enough", stats.power_paired(want, es, 1.0) >= 0.8 > stats.power_paired(want - 1, es, 1.0))
# Pooling over 4 settings gives the test 4 (n - 1) df: never more seeds than one setting.
check("pooled df needs fewer", stats.seeds_for_power(0.5, 1.0, groups=4) <= 34)
check("p format", (stats.fmt_p(0.0257), stats.fmt_p(0.0021), stats.fmt_p(3e-5)) == ("0.026", "0.0021", "< 1e-4"))

# ---- Two-way table setting x seed (blocked_paired_t, blocked_trend) ---------------------------
# base 3.00 3.00 3.00, A 3.01 3.03 3.02, B 2.99 3.01 3.00 (seeds 1-3). Setting means 3.00,
# 3.02, 3.00; seed means 3.00, 3.013333, 3.006667; grand mean 3.006667. Residuals y - row -
# column + grand: base +0.006667, -0.006667, 0; A and B -0.003333, +0.003333, 0 each. SSE =
# 2 (0.006667)^2 + 4 (0.003333)^2 = 1.333333e-4 on (3 - 1)(3 - 1) = 4 df: s^2 = 1/30000.
# A - base: 0.02, SE = s sqrt(2/3) = sqrt(2/90000), t = 3 sqrt 2; at df 4 the two-sided p is
# 1 - u (3 - u^2) / 2 with u = t / sqrt(t^2 + 4) = 3 / sqrt 11: 1 - 36 / (11 sqrt 11). Own:
# Δ 0.01 0.03 0.02, sd 0.01, t 2 sqrt 3 on 2 df: p = 1 - t / sqrt(t^2 + 2) = 1 - 2 sqrt 3 / sqrt 14.
cells = {"base": {1: 3.0, 2: 3.0, 3: 3.0}, "A": {1: 3.01, 2: 3.03, 3: 3.02}, "B": {1: 2.99, 2: 3.01, 3: 3.0}}
r = stats.blocked_paired_t(cells, "base")
a, b = r["settings"]["A"], r["settings"]["B"]
check("two-way s, df", near(r["sd"], math.sqrt(1 / 30000), 1e-12) and r["df"] == 4
      and near(r["delta_sd"], math.sqrt(2 / 30000), 1e-12), r)
check("two-way A", near(a["mean"], 0.02, 1e-12) and near(a["se"], math.sqrt(2 / 90000), 1e-12)
      and near(a["t"], 3 * math.sqrt(2), 1e-9) and near(a["p"], 1 - 36 / (11 * math.sqrt(11)), 1e-9), a)
check("two-way A own", near(a["own_sd"], 0.01, 1e-12) and near(a["own_p"], 1 - 2 * math.sqrt(3) / math.sqrt(14), 1e-9), a)
check("two-way A interval", near(a["hi"] - a["lo"], 2 * 2.7764451 * math.sqrt(2 / 90000), 1e-8), a)
check("two-way B", near(b["mean"], 0.0, 1e-12) and near(b["p"], 1.0, 1e-9) and "base" not in r["settings"], b)


def two_way_reference(table):
    """Residual variance and df of a complete two-way table {setting: [value per seed]} by
    the closed form (y - row mean - column mean + grand mean), no least squares."""
    rows = list(table.values())
    g, n = len(rows), len(rows[0])
    grand = sum(map(sum, rows)) / (g * n)
    col = [sum(r[j] for r in rows) / g for j in range(n)]
    sse = sum((r[j] - sum(r) / n - col[j] + grand) ** 2 for r in rows for j in range(n))
    return sse / ((g - 1) * (n - 1)), (g - 1) * (n - 1)


# A complete 4 x 5 table against the closed form: each setting's SE is s sqrt(2/5), and the
# trend in x of three settings is the contrast sum w_k mean_k (w = (x - xbar) / sum (x - xbar)^2
# with equal n) with SE s sqrt(sum w^2 / 5).
vals = {"base": [3.0, 3.1, 2.9, 3.05, 3.02], "e2": [3.1, 3.15, 2.97, 3.1, 3.0],
        "e4": [3.12, 3.3, 3.0, 3.2, 3.1], "e8": [3.3, 3.28, 3.1, 3.22, 3.3]}
var, df = two_way_reference(vals)
cells = {k: dict(zip(range(1, 6), v)) for k, v in vals.items()}
r = stats.blocked_paired_t(cells, "base")
check("complete table s, df", near(r["sd"] ** 2, var, 1e-13) and r["df"] == df == 12, (r["sd"] ** 2, var))
for k in ("e2", "e4", "e8"):
    want = sum(vals[k]) / 5 - sum(vals["base"]) / 5
    t = r["settings"][k]
    check("complete %s" % k, near(t["mean"], want, 1e-12) and near(t["se"], math.sqrt(var * 2 / 5), 1e-12)
          and near(t["p"], stats.t_two_sided_p(want / math.sqrt(var * 2 / 5), 12), 1e-9), t)
xs = {"e2": 1.0, "e4": 2.0, "e8": 3.0}
w = {k: (x - 2.0) / 2.0 for k, x in xs.items()}
slope = sum(w[k] * sum(vals[k]) / 5 for k in xs)
tr = stats.blocked_trend(cells, xs)
check("complete trend", near(tr["slope"], slope, 1e-12) and tr["df"] == 12
      and near(tr["se"], math.sqrt(var * sum(v * v for v in w.values()) / 5), 1e-12), tr)
# With every seed run the slope is the least-squares slope of the same-seed Δ on x.
check("trend = slope of Δ", near(tr["slope"], stats.trend(
    [(xs[k], vals[k][j] - vals["base"][j]) for k in xs for j in range(5)])["slope"], 1e-12))
# A seed only one setting ran adds a seed effect that absorbs it: nothing changes. A run
# missing from a setting leaves its contrast estimable, on one df fewer.
more = {k: dict(v) for k, v in cells.items()}
more["e4"][9] = 10.0
r2 = stats.blocked_paired_t(more, "base")
check("lone seed changes nothing", r2["df"] == 12 and near(r2["sd"], r["sd"], 1e-12)
      and near(r2["settings"]["e4"]["mean"], r["settings"]["e4"]["mean"], 1e-12), r2)
less = {k: dict(v) for k, v in cells.items()}
del less["e8"][3]
r3 = stats.blocked_paired_t(less, "base")
check("missing run", r3["df"] == 11 and r3["settings"]["e8"]["n"] == 4 and r3["settings"]["e8"]["se"] > 0, r3)
check("no baseline runs", stats.blocked_paired_t({"base": {}, "A": {1: 3.0}}, "base")["settings"]["A"]["mean"] is None)
check("trend one x", stats.blocked_trend(cells, {"e2": 1.0}) is None)

# ---- As the runner applies them -------------------------------------------------------------
# The A / B table above through measures.paired_tests (runs as run_measures gives them) and the
# same-seed Δ through summarise_setting.


def run(seed, loss, experts=None):
    return {"status": "ok", "seed": seed, "diverged": False, "spiked": False, "stable": True,
            "val_loss": loss, "curve_val": [[0, 5.0], [100, loss]], "num_experts": experts}


base = [run(s, 3.0) for s in (1, 2, 3)]
by = {"base": base, "A": [run(1, 3.01), run(2, 3.03), run(3, 3.02)], "B": [run(1, 2.99), run(2, 3.01), run(3, 3.0)]}
sa = measures.summarise_setting("A", [], by["A"], base)
sb = measures.summarise_setting("B", [], by["B"], base)
pt = measures.paired_tests(by, "base")
check("runner two-way", near(pt["sd"], math.sqrt(1 / 30000), 1e-12) and pt["df"] == 4 and set(pt["settings"]) == {"A", "B"}, pt)
check("runner A p", near(pt["settings"]["A"]["p"], 1 - 36 / (11 * math.sqrt(11)), 1e-9), pt["settings"]["A"])
check("runner A Δ", sa["metrics"]["delta_val_loss"]["values"] == [v - 3.0 for v in (3.01, 3.03, 3.02)], sa["metrics"])
ct = measures.paired_tests(by, "base", key="curve_end")  # the curves end at the final loss
check("runner curve end", near(ct["settings"]["A"]["p"], pt["settings"]["A"]["p"], 1e-12), ct)
check("runner no baseline", measures.paired_tests(by, "") is None)
by_e = {"base": [run(s + 1, vals["base"][s]) for s in range(5)]}
for k, x in (("e2", 2), ("e4", 4), ("e8", 8)):
    by_e[k] = [run(s + 1, vals[k][s], x) for s in range(5)]
tr_runner = measures.trend_in_experts(by_e, ["e2", "e4", "e8"], "base")
check("runner trend", near(tr_runner["slope"], slope, 1e-12) and near(tr_runner["p"], tr["p"], 1e-12), tr_runner)

# summary.md's tests section for the A / B case (A: +0.0200, SE 0.0047, t 4.24, p 0.013, own SD
# 0.0100, own p 0.074), the trend and the power line (SD 0.01, 0.01 nats: 10 seeds).
import summary_md  # noqa: E402
for st in (sa, sb):
    st["delta_test"] = pt["settings"][st["name"]]
md = summary_md.tests_markdown({"baseline": "base", "settings": [sa, sb],
                                "paired_test": {"sd": pt["sd"], "delta_sd": pt["delta_sd"], "df": pt["df"], "alpha": 0.05},
                                "trend": dict(tr_runner, settings=["e2", "e4", "e8"]),
                                "power": {"delta_sd": 0.01, "alpha": 0.05, "power": 0.8, "method": "noncentral t",
                                          "seeds": {"0.01": stats.seeds_for_power(0.01, 0.01)}}})
for want in ["residual s = 0.0058 nats on 4 degrees of freedom", "SD s sqrt 2 = 0.0082",
             "| A | 3 | +0.0200 | 0.0047 | 4.24 | 0.013 | [+0.0069, +0.0331] | 0.0100 | 0.074 |",
             "0.0000 | 0.0047 |", "on 12 df", "SD of a difference 0.0100", "0.01 nats: 10."]:
    check("summary.md: %s" % want, want in md, md)

finish("experiments_stats_test: all checks passed")
