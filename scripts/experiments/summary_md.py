"""summary.md, the experiment runner's table (runner.py, restat.py): one row per setting with
each metric's mean ± standard deviation over the seeds that finished (measures.py says what
each is), the same-seed Δ against the baseline with its pooled standard error and p, and
under the table the paired tests, the trend in log2 E and the seeds an effect needs for 80%
power (stats.py computes them; this file only writes them out).
"""
import stats


# summary.md's columns: key -> (header, printf format, scale).
COLUMNS = {
    "val_loss": ("val loss", "%.4f", 1),
    "perplexity": ("perplexity", "%.2f", 1),
    "maxvio_global": ("MaxVio global (mean of layers)", "%.3f", 1),
    "maxvio_global_max": ("MaxVio global (max layer)", "%.3f", 1),
    "maxvio_batch": ("MaxVio per batch (last 10%)", "%.3f", 1),
    "dropped_run": ("dropped (run)", "%.2f%%", 100),
    "dropped_end": ("dropped (last 10%)", "%.2f%%", 100),
    "dropped_start": ("dropped (first 10%: start-up)", "%.2f%%", 100),
    "dropped_steady": ("dropped (steady: last 90%)", "%.2f%%", 100),
    "step_s": ("step (ms, median)", "%.1f", 1000),
    "step_alone": ("step alone (ms: median of the timing rounds [range])", "%.1f", 1000),
    "flops_per_token": ("MFLOP / token", "%.3f", 1e-6),
    "train_flops": ("training PFLOP", "%.4g", 1e-15),
    "lang_mi_bits": ("label MI (bits)", "%.3f", 1),
    "lang_mi_norm": ("label MI / min(H(label), log2 E)", "%.3f", 1),
    "lang_top_share": ("label top share", "%.1f%%", 100),
    "speedup": ("speed-up (baseline steps to the run's final loss / run steps, same seed)", "%.2fx", 1),
    "delta_val_loss": ("Δ val loss vs baseline, same seed (± SE; p, setting x seed)", "%+.4f", 1),
    "delta_curve_end": ("Δ validation curve at the run's last step vs the baseline's there, same seed (± SE; p, setting x seed)", "%+.4f", 1),
}


def cell(m, fmt, scale, ok):
    """Mean ± std of one metric; "(n of ok)" when fewer seeds than finished have a value."""
    if m["mean"] is None:
        return "-"
    s = fmt % (m["mean"] * scale)
    if m["std"] is not None:
        s += " ± " + (fmt % (m["std"] * scale)).rstrip("%x").lstrip("+")
    if m["n"] < ok:
        s += " (%d of %d)" % (m["n"], ok)
    return s


def delta_cell(t, fmt="%+.4f"):
    """A setting's Δ: mean ± its pooled standard error, and the paired t's p-value."""
    if t is None or t["mean"] is None:
        return "-"
    if t["se"] is None:
        return fmt % t["mean"]
    return "%s ± %s (p %s)" % (fmt % t["mean"], ("%.4f" % t["se"]), stats.fmt_p(t["p"]))


def speedup_cell(m, ok):
    """Same-seed speed-ups: mean ± std when every seed has a value; with censored seeds
    (the baseline never reached the run's final loss) how many and their bound, and the
    median over all seeds."""
    if m["seeds"] == 0:
        return "-"
    if not m["censored"]:
        return cell(m, "%.2fx", 1, ok)
    med = ("median %.2fx" % m["median"]) if m["median"] is not None else "median > %.2fx" % m["bound"]
    vals = ", ".join("%.2fx" % v for v in m["values"])
    return "%s; %d of %d censored (> %.2fx)%s" % (med, m["censored"], m["seeds"], m["bound"],
                                                 "; others " + vals if vals else "")


def tests_markdown(summary):
    """The paired tests, the trend and the seed counts under summary.md's table."""
    out = []
    pt = summary.get("paired_test")
    rows = [s for s in summary["settings"] if s.get("delta_test") and s["delta_test"]["mean"] is not None]
    if pt and pt["df"] and rows:
        level = round(100 * (1 - pt["alpha"]))
        out += ["", "Δ val loss of each setting against the %s run of the same seed, tested in the "
                "two-way table setting x seed fitted by least squares (val loss = setting + seed + "
                "error): residual s = %.4f nats on %d degrees of freedom (runs - settings - seeds + 1), "
                "so a same-seed difference has SD s sqrt 2 = %.4f; SE = s sqrt(2 / n) with every seed "
                "run; p two-sided and the %d%% interval from t(%d). Own p: the setting's paired t on its "
                "own differences alone (n - 1 df), which does not assume every setting equally noisy."
                % (summary["baseline"], pt["sd"], pt["df"], pt["delta_sd"], level, pt["df"]), "",
                "| setting | n | mean Δ | SE | t | p | %d%% interval | own SD | own p |" % level,
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for s in rows:
            t = s["delta_test"]
            out.append("| %s | %d | %+.4f | %.4f | %s | %s | [%+.4f, %+.4f] | %s | %s |"
                       % (s["name"], t["n"], t["mean"], t["se"],
                          "%.2f" % t["t"] if t["t"] is not None else "-", stats.fmt_p(t["p"]),
                          t["lo"], t["hi"], "%.4f" % t["own_sd"] if t.get("own_sd") is not None else "-",
                          stats.fmt_p(t.get("own_p"))))
    pc = summary.get("paired_test_curve_end")
    if pc and pc["df"] and "delta_curve_end" in summary.get("columns", []):
        out += ["", "Δ at the run's last step (its curve minus the %s run's curve there, same seed): "
                "the same test, s = %.4f nats on %d degrees of freedom; the column gives mean ± SE (p)."
                % (summary["baseline"], pc["sd"], pc["df"])]
    tr = summary.get("trend")
    if tr:
        out += ["", "Trend in log2 E of the effects of %s (a linear contrast in the same two-way fit; "
                "with every seed run, the least-squares slope of their Δ): slope %+.4f nats per "
                "doubling, SE %.4f, t %.2f on %d df, p %s, 95%% interval [%+.4f, %+.4f]."
                % (", ".join(tr["settings"]), tr["slope"], tr["se"], tr["t"] or 0.0, tr["df"],
                   stats.fmt_p(tr["p"]), tr["lo"], tr["hi"])]
    pw = summary.get("power")
    if pw:
        out += ["", "Seeds per setting for %d%% power at alpha %g two-sided (%s, SD of a difference %.4f): %s."
                % (round(100 * pw["power"]), pw["alpha"], pw["method"], pw["delta_sd"],
                   ", ".join("%s nats: %d" % (e, n) for e, n in pw["seeds"].items()))]
    return "\n".join(out) + ("\n" if out else "")


def markdown(summary, columns, stability):
    head = ["setting", "overrides", "seeds ok"]
    if stability:
        head += ["stable", "spiked", "diverged"]
    head += [COLUMNS[c][0] for c in columns]
    lines = ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
    for s in summary["settings"]:
        row = [s["name"], " ".join("`%s`" % o for o in s["overrides"]) or "(base)",
               "%d/%d" % (s["ok"], s["runs"])]
        if stability:
            row += ["%d/%d" % (s[k], s["runs"]) for k in ("stable", "spiked", "diverged")]
        for c in columns:
            if c == "delta_val_loss":
                row.append(delta_cell(s.get("delta_test")))
            elif c == "delta_curve_end":
                row.append(delta_cell(s.get("delta_curve_test")))
            elif c == "speedup":
                row.append(speedup_cell(s["metrics"]["speedup"], s["ok"]))
            elif c == "step_alone":
                t = (summary.get("timing") or {}).get("per_setting", {}).get(s["name"])
                row.append("%.1f [%.1f, %.1f]" % (1000 * t["median"], 1000 * t["min"], 1000 * t["max"])
                           if t else "-")
            else:
                row.append(cell(s["metrics"][c], *COLUMNS[c][1:], s["ok"]))
        lines.append("| " + " | ".join(row) + " |")
    note = ("\n%s: %s grid, %d steps, seeds %s, config %s, data %s. Each cell: mean ± sample "
            "standard deviation over the seeds that finished (no ± with one; \"(n of m)\" where "
            "only n of the m finished seeds have a value); Δ: mean ± standard error and p of "
            "the test in the table setting x seed (below).\n"
            % (summary["title"], summary["grid"], summary["steps"],
               ",".join(map(str, summary["seeds"])), summary["config"], summary["data"]))
    return "\n".join(lines) + "\n" + note + tests_markdown(dict(summary, columns=columns))
