"""The tests the experiment pages' claims rest on (docs/experiments/README.md, "Seed noise"):
each setting against the baseline in the two-way table setting x seed (blocked_paired_t: the
residual variance of the additive fit, so the baseline's noise shared by every same-seed
difference is counted once), beside each setting's own paired t; the trend of the settings'
effects in log2 E in the same fit (blocked_trend); and the seeds a given effect needs for
80% power. The earlier pooling of the differences' variances (pooled_paired_t, trend) stays
for the pages' hand checks of older tables. No files, no processes: numbers in, numbers out (tests/cli/experiments_stats_test.py
checks every function on hand-computed cases and the t distribution against table values).

The t distribution comes from scipy.stats when it is importable, otherwise from the
implementation below (the regularised incomplete beta function by its continued fraction,
quantiles by bisection); the noncentral t power is always a quadrature over the chi
distribution. The test checks them against closed forms and published tables.
"""
import math
import statistics

try:
    import scipy.stats as _sps
except ImportError:  # pragma: no cover (Debian's python3-scipy is installed here)
    _sps = None

ALPHA = 0.05
POWER = 0.8


# ---- The t distribution without scipy -------------------------------------------------

def _betacf(a, b, x):
    """The continued fraction of the regularised incomplete beta I_x(a, b) (modified Lentz:
    terms d_{2m} = m (b - m) x / ((a + 2m - 1)(a + 2m)), d_{2m+1} = -(a + m)(a + b + m) x /
    ((a + 2m)(a + 2m + 1)))."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a, b, x):
    """Regularised incomplete beta I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf_own(t, df):
    """P(T <= t) for Student's t with df degrees of freedom (df > 0, not necessarily whole)."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf_own(p, df):
    """The p quantile of Student's t (0 < p < 1), by bisection on t_cdf_own."""
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_ppf_own(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf_own(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf_own(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return 0.5 * (lo + hi)


def nct_power_own(delta, df, crit):
    """P(|T'| > crit) for the noncentral t T' = (Z + delta) / sqrt(V / df), V ~ chi2(df):
    the integral over s = sqrt(V) of Phi(delta - crit s / sqrt(df)) + Phi(-delta - crit s /
    sqrt(df)) against s's density s^(df-1) exp(-s^2/2) / (2^(df/2 - 1) Gamma(df/2)), by
    Simpson's rule on 4000 intervals of [0, sqrt(df) + 12]."""
    phi = statistics.NormalDist().cdf
    lognorm = (df / 2.0 - 1.0) * math.log(2.0) + math.lgamma(df / 2.0)
    top, n = math.sqrt(df) + 12.0, 4000
    h = top / n
    total = 0.0
    for i in range(n + 1):
        s = i * h
        dens = 0.0 if s == 0.0 else math.exp((df - 1.0) * math.log(s) - s * s / 2.0 - lognorm)
        if s == 0.0 and df == 1:
            dens = math.exp(-lognorm)
        w = 1 if i in (0, n) else (4 if i % 2 else 2)
        q = crit * s / math.sqrt(df)
        total += w * dens * (phi(delta - q) + phi(-delta - q))
    return total * h / 3.0


# ---- The distributions used (scipy when present) --------------------------------------

def t_cdf(t, df):
    return float(_sps.t.cdf(t, df)) if _sps else t_cdf_own(t, df)


def t_ppf(p, df):
    return float(_sps.t.ppf(p, df)) if _sps else t_ppf_own(p, df)


def t_two_sided_p(t, df):
    """P(|T| >= |t|) for Student's t with df degrees of freedom."""
    return float(2.0 * _sps.t.sf(abs(t), df)) if _sps else 2.0 * (1.0 - t_cdf_own(abs(t), df))


def nct_power(delta, df, crit):
    """Always the quadrature: scipy 1.10's nct warns (divide by zero) at df 1-3; the test
    checks the two agree to 1e-8 where scipy is quiet."""
    return nct_power_own(delta, df, crit)


# ---- The tests ------------------------------------------------------------------------

def _finite(xs):
    return [x for x in xs if x is not None and math.isfinite(x)]


def pooled_paired_t(deltas, alpha=ALPHA):
    """deltas: {setting: [Δ per seed]} (each Δ a run's value minus the baseline run's of the
    same seed). The variance of a Δ is pooled across the settings,
        s^2 = sum_i (n_i - 1) s_i^2 / sum_i (n_i - 1),  df = sum_i (n_i - 1),
    and each setting's mean is tested against zero with SE = s / sqrt(n_i):
        t = mean / SE, p two-sided from t(df), interval mean -+ t_{1 - alpha/2, df} SE.
    Returns {"pooled_sd", "df", "settings": {setting: {"n", "mean", "se", "t", "p", "lo",
    "hi"}}}; a setting with no Δ gets None values; pooled_sd and df are None (and every
    test None) when no setting has two Δ."""
    vals = {k: _finite(v) for k, v in deltas.items()}
    df = sum(len(v) - 1 for v in vals.values() if len(v) > 1)
    ss = sum((len(v) - 1) * statistics.variance(v) for v in vals.values() if len(v) > 1)
    sd = math.sqrt(ss / df) if df else None
    crit = t_ppf(1.0 - alpha / 2.0, df) if df else None
    out = {}
    for k, v in vals.items():
        r = {"n": len(v), "mean": sum(v) / len(v) if v else None,
             "se": None, "t": None, "p": None, "lo": None, "hi": None}
        if v and sd is not None:
            r["se"] = sd / math.sqrt(len(v))
            r["lo"], r["hi"] = r["mean"] - crit * r["se"], r["mean"] + crit * r["se"]
            if r["se"] > 0:
                r["t"] = r["mean"] / r["se"]
                r["p"] = t_two_sided_p(r["t"], df)
        out[k] = r
    return {"pooled_sd": sd, "df": df or None, "alpha": alpha, "settings": out}


def _two_way_fit(cells):
    """Least squares of the additive model value = setting effect + seed effect over cells
    [(setting, seed, value)] (the first seed's effect 0). Returns (setting index, the setting
    block of (X'X)^+, the setting effects, residual variance, df = cells - rank); variance and
    df None when no degree of freedom is left."""
    import numpy as np
    settings = list(dict.fromkeys(c[0] for c in cells))
    seeds = list(dict.fromkeys(c[1] for c in cells))
    col = {k: i for i, k in enumerate(settings)}
    row_of_seed = {s: len(settings) + i - 1 for i, s in enumerate(seeds)}  # seeds[0]: none
    x = np.zeros((len(cells), len(settings) + len(seeds) - 1))
    y = np.array([c[2] for c in cells], dtype=float)
    for i, (k, s, _) in enumerate(cells):
        x[i, col[k]] = 1.0
        if s != seeds[0]:
            x[i, row_of_seed[s]] = 1.0
    beta, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    df = len(cells) - int(rank)
    sse = float(np.sum((y - x @ beta) ** 2))
    cov = np.linalg.pinv(x.T @ x)[:len(settings), :len(settings)]
    return col, cov, beta[:len(settings)], (sse / df if df > 0 else None), (df if df > 0 else None)


def _contrast(fit, weights):
    """(estimate, its standard error or None) of sum_k weights[k] x setting effect k."""
    col, cov, effects, var, _ = fit
    import numpy as np
    w = np.zeros(len(col))
    for k, v in weights.items():
        w[col[k]] = v
    est = float(w @ effects)
    return est, (math.sqrt(max(0.0, float(w @ cov @ w)) * var) if var is not None else None)


def blocked_paired_t(cells, baseline, alpha=ALPHA):
    """cells: {setting: {seed: value}}, the baseline among the settings. Every run of every
    setting is one cell of the two-way table setting x seed, fitted by least squares as
        value = setting effect + seed effect + error (errors independent, one variance s^2),
    so the seed's common part cancels from each comparison and the baseline's own noise,
    which every same-seed difference of a seed shares, is counted once, not once per setting
    (pooling the variances of those differences as if independent made p too small: about
    7% false positives at a nominal 5% with 9 settings). Each setting's Δ = its effect minus
    the baseline's (with every seed run, the mean of its same-seed differences) is tested
    against zero: SE from s^2 and the design (sqrt(2 / n) s when complete), t, p two-sided and
    the interval from t(df), df = runs - settings - seeds + 1. Beside it the setting's own
    paired t on its same-seed differences (df n - 1, no shared variance): "own_sd", "own_p".
    Returns {"sd" (s), "delta_sd" (s sqrt 2, a difference's), "df", "alpha", "settings":
    {setting: {"n", "mean", "se", "t", "p", "lo", "hi", "own_sd", "own_p"}}} (not the
    baseline); values None where they cannot be computed."""
    flat = [(k, s, v) for k, runs in cells.items() for s, v in runs.items()
            if v is not None and math.isfinite(v)]
    base = {s: v for k, s, v in flat if k == baseline}
    fit = _two_way_fit(flat) if base and len({k for k, _, _ in flat}) > 1 else None
    var, df = (fit[3], fit[4]) if fit else (None, None)
    crit = t_ppf(1.0 - alpha / 2.0, df) if df else None
    out = {}
    for k, runs in cells.items():
        if k == baseline:
            continue
        d = [v - base[s] for s, v in runs.items() if s in base and v is not None and math.isfinite(v)]
        r = {"n": len(d), "mean": None, "se": None, "t": None, "p": None, "lo": None, "hi": None,
             "own_sd": statistics.stdev(d) if len(d) > 1 else None, "own_p": None}
        if d:
            r["mean"], r["se"] = _contrast(fit, {k: 1.0, baseline: -1.0})
        if r["se"] is not None:
            r["lo"], r["hi"] = r["mean"] - crit * r["se"], r["mean"] + crit * r["se"]
            if r["se"] > 0:
                r["t"] = r["mean"] / r["se"]
                r["p"] = t_two_sided_p(r["t"], df)
        if r["own_sd"]:
            r["own_p"] = t_two_sided_p(statistics.fmean(d) / (r["own_sd"] / math.sqrt(len(d))), len(d) - 1)
        out[k] = r
    sd = math.sqrt(var) if var is not None else None
    return {"sd": sd, "delta_sd": sd * math.sqrt(2.0) if sd is not None else None, "df": df,
            "alpha": alpha, "settings": out}


def blocked_trend(cells, xs, alpha=ALPHA):
    """The linear trend of the settings' effects in x (xs: {setting: x}, e.g. log2 E) in the
    two-way fit of blocked_paired_t over every cell of `cells` (the baseline's included: it
    gives the residual variance, not the trend): slope = sum_k w_k effect_k with w_k = n_k (x_k
    - xbar) / sum_j n_j (x_j - xbar)^2 (n_k runs at x_k, xbar their mean), which with every
    seed run is the least-squares slope of the same-seed differences on x; its SE from s^2,
    t and p from t(df), the residual df of the fit. None with fewer than two x values."""
    flat = [(k, s, v) for k, runs in cells.items() for s, v in runs.items()
            if v is not None and math.isfinite(v)]
    n = {k: sum(1 for c in flat if c[0] == k) for k in xs}
    total = sum(n.values())
    if total < 3 or len({xs[k] for k in xs if n[k]}) < 2:
        return None
    mx = sum(n[k] * xs[k] for k in xs) / total
    sxx = sum(n[k] * (xs[k] - mx) ** 2 for k in xs)
    fit = _two_way_fit(flat)
    b, se = _contrast(fit, {k: n[k] * (xs[k] - mx) / sxx for k in xs if n[k]})
    df = fit[4]
    if se is None:
        return {"n": total, "df": None, "slope": b, "se": None, "t": None, "p": None,
                "lo": None, "hi": None, "alpha": alpha}
    crit = t_ppf(1.0 - alpha / 2.0, df)
    t = b / se if se > 0 else None
    return {"n": total, "df": df, "slope": b, "se": se, "t": t,
            "p": t_two_sided_p(t, df) if t is not None else None,
            "lo": b - crit * se, "hi": b + crit * se, "alpha": alpha}


def trend(points, alpha=ALPHA):
    """Least-squares line Δ = a + b x over points [(x, Δ)] (x = log2 E, every seed of every
    setting one point, so the seeds are the replicates): slope b = Sxy / Sxx, residual
    variance s^2 = SSE / (N - 2), SE(b) = s / sqrt(Sxx), t = b / SE(b), p two-sided from
    t(N - 2), interval b -+ t_{1 - alpha/2, N - 2} SE(b). None when N < 3 or x is constant."""
    pts = [(x, y) for x, y in points if y is not None and math.isfinite(y)]
    n = len(pts)
    if n < 3:
        return None
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in pts) / sxx
    a = my - b * mx
    sse = sum((y - a - b * x) ** 2 for x, y in pts)
    df = n - 2
    se = math.sqrt(sse / df / sxx)
    crit = t_ppf(1.0 - alpha / 2.0, df)
    t = b / se if se > 0 else None
    return {"n": n, "df": df, "slope": b, "intercept": a, "se": se, "t": t,
            "p": t_two_sided_p(t, df) if t is not None else None,
            "lo": b - crit * se, "hi": b + crit * se, "alpha": alpha}


def power_paired(n, effect, sd, alpha=ALPHA, method="t", groups=1):
    """Power of the two-sided paired test of one setting's mean Δ with n seeds, when the
    true mean is `effect` and a Δ's standard deviation `sd`. method "t": the exact power of
    the t test, noncentral t with df = groups x (n - 1) (the variance pooled over `groups`
    settings of n seeds) and noncentrality effect / sd x sqrt(n); "normal": the normal
    approximation Phi(effect / sd x sqrt(n) - z_{1 - alpha/2}) (the far tail ignored)."""
    delta = abs(effect) / sd * math.sqrt(n)
    if method == "normal":
        nd = statistics.NormalDist()
        return nd.cdf(delta - nd.inv_cdf(1.0 - alpha / 2.0))
    if method != "t":
        raise ValueError("method '%s' is not one of t, normal" % method)
    df = groups * (n - 1)
    if df < 1:
        return 0.0
    return nct_power(delta, df, t_ppf(1.0 - alpha / 2.0, df))


def pooled_paired_t_from_summary(summary, alpha=ALPHA):
    """pooled_paired_t from each setting's (mean, sample sd, n) of its Δ instead of the
    values (the pooled variance and every test need no more): for the pages' tables, which
    give mean ± sd over n seeds. The same dict as pooled_paired_t."""
    df = sum(n - 1 for _, _, n in summary.values() if n > 1)
    ss = sum((n - 1) * sd * sd for _, sd, n in summary.values() if n > 1)
    sd_p = math.sqrt(ss / df) if df else None
    crit = t_ppf(1.0 - alpha / 2.0, df) if df else None
    out = {}
    for k, (mean, _, n) in summary.items():
        r = {"n": n, "mean": mean, "se": None, "t": None, "p": None, "lo": None, "hi": None}
        if sd_p is not None:
            r["se"] = sd_p / math.sqrt(n)
            r["lo"], r["hi"] = mean - crit * r["se"], mean + crit * r["se"]
            if r["se"] > 0:
                r["t"] = mean / r["se"]
                r["p"] = t_two_sided_p(r["t"], df)
        out[k] = r
    return {"pooled_sd": sd_p, "df": df or None, "alpha": alpha, "settings": out}


def trend_from_summary(groups, alpha=ALPHA):
    """trend from groups [(x, mean, sd, n)] (every seed of a group at the same x): the same
    least-squares line, since SSE = sum_i (n_i - 1) sd_i^2 (within groups) + sum_i n_i
    (mean_i - a - b x_i)^2 (the means about the line)."""
    n = sum(g[3] for g in groups)
    if n < 3:
        return None
    mx = sum(x * k for x, _, _, k in groups) / n
    my = sum(m * k for _, m, _, k in groups) / n
    sxx = sum(k * (x - mx) ** 2 for x, _, _, k in groups)
    if sxx == 0:
        return None
    b = sum(k * (x - mx) * (m - my) for x, m, _, k in groups) / sxx
    a = my - b * mx
    sse = sum((k - 1) * sd * sd + k * (m - a - b * x) ** 2 for x, m, sd, k in groups)
    df = n - 2
    se = math.sqrt(sse / df / sxx)
    crit = t_ppf(1.0 - alpha / 2.0, df)
    t = b / se if se > 0 else None
    return {"n": n, "df": df, "slope": b, "intercept": a, "se": se, "t": t,
            "p": t_two_sided_p(t, df) if t is not None else None,
            "lo": b - crit * se, "hi": b + crit * se, "alpha": alpha}


def seeds_for_power(effect, sd, alpha=ALPHA, power=POWER, method="t", groups=1):
    """The fewest seeds (>= 2) per setting with power_paired >= power. With method "normal"
    this is ceil(((z_{1 - alpha/2} + z_power) sd / effect)^2) (at least 2); "t" adds the
    seeds the t distribution's heavier tails cost (one to three at 80%)."""
    if effect == 0 or sd <= 0:
        raise ValueError("effect %r and sd %r: need a non-zero effect and a positive sd" % (effect, sd))
    if method == "normal":
        nd = statistics.NormalDist()
        z = nd.inv_cdf(1.0 - alpha / 2.0) + nd.inv_cdf(power)
        return max(2, math.ceil((z * sd / abs(effect)) ** 2 - 1e-9))
    # Start at the normal approximation (the t test needs about as many or a few more) and
    # walk to the smallest n that reaches the power.
    n = max(2, seeds_for_power(effect, sd, alpha, power, "normal") - 2)
    while n > 2 and power_paired(n - 1, effect, sd, alpha, method, groups) >= power:
        n -= 1
    while power_paired(n, effect, sd, alpha, method, groups) < power:
        n += 1
        if n > 100000:
            raise ValueError("more than 100000 seeds")
    return n


def fmt_p(p):
    """A p-value as a page writes it: 0.034, 0.0021, < 1e-4."""
    if p is None:
        return "-"
    if p < 1e-4:
        return "< 1e-4"
    return "%.2g" % p if p < 0.01 else "%.3f" % p
