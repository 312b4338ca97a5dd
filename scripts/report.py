#!/usr/bin/python3
"""Builds the load-balance report of `switchyard report` (docs/report.md).

    /usr/bin/python3 scripts/report.py --out FILE.html RUN [RUN ...] [--route FILE.json]

Each RUN is a training output directory: metrics.jsonl (per step: losses, throughput and per
MoE layer the routing scalars; validation losses), routing.jsonl (per-expert counts and
expert biases every logging.routing_every steps) and routing_by_language.json (written at
the end of training). The page is one self-contained HTML file: every plot is an inline SVG
drawn by matplotlib (heatmaps are embedded PNG data URIs inside it), no script or style is
fetched. The numbers of every plot are embedded as JSON in <script id="switchyard-data"> so
that a reader (and the test) can check them against the run's files.

Errors are one line on stderr ("switchyard report: error: <what>") and exit status 1; the output file is
written to a temporary name and renamed, so a failure leaves an older report intact.
"""
import argparse
import html
import io
import json
import math
import os
import sys

# The figures' arrays are small: OpenBLAS's threads (numpy's, loaded with matplotlib) would
# only spin beside the one that works. Read when OpenBLAS loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

plt = None  # matplotlib.pyplot: load_pyplot(), once the inputs have passed their checks


def load_pyplot():
    """Imports matplotlib (most of a small report's time), so a bad input is refused without it."""
    global plt
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError:
        sys.stderr.write("switchyard report: error: python3-matplotlib is not installed (scripts/setup.sh installs it)\n")
        sys.exit(1)
    pyplot.rcParams["svg.fonttype"] = "none"  # text stays text: smaller pages
    plt = pyplot

# Per-layer scalars of metrics.jsonl plotted over the steps: (key, title).
LAYER_SCALARS = [
    ("dropped_frac", "dropped fraction of the assignments"),
    ("router_entropy", "router entropy (nats, mean over tokens)"),
    ("aux", "aux loss (mean over routing groups)"),
    ("z", "z loss (mean over routing groups)"),
    ("max_violation", "maximal violation (max load / mean load - 1, before dropping)"),
    ("load_cv", "coefficient of variation of the load (before dropping)"),
]


class ReportError(Exception):
    pass


def read_jsonl(path):
    out = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as e:
                raise ReportError("%s:%d: not UTF-8 text (byte 0x%02x at column %d); is it a "
                                  "metrics file?" % (path, n, raw[e.start], e.start + 1))
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError as e:
                raise ReportError("%s:%d: not JSON (%s)" % (path, n, e))
            except RecursionError:
                raise ReportError("%s:%d: JSON nested too deeply to read (arrays or objects "
                                  "about %d levels deep)" % (path, n, sys.getrecursionlimit()))
    return out


def read_json(path):
    """One JSON document; a file that is not UTF-8 JSON is one error naming it."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ReportError("%s: not UTF-8 text (byte 0x%02x at offset %d)"
                          % (path, raw[e.start], e.start))
    except ValueError as e:
        raise ReportError("%s: not JSON (%s)" % (path, e))
    except RecursionError:
        raise ReportError("%s: JSON nested too deeply to read (arrays or objects about %d "
                          "levels deep)" % (path, sys.getrecursionlimit()))


def is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def is_num_or_null(x):
    """A number, or null: what the trainer writes for a NaN or an infinity (a diverged run)."""
    return x is None or is_num(x)


def nans_for_nulls(steps, val, routing):
    """The checked records' nulls (NaN or infinity written by a diverged run) as NaN: gaps in
    the plots (the page's data writes them back as null)."""
    nan = lambda x: float("nan") if x is None else x
    for d in steps:
        d["loss"] = nan(d["loss"])
        for m in d["moe"]:
            for k, _ in LAYER_SCALARS:
                m[k] = nan(m[k])
    for d in routing:
        if "expert_bias" in d:
            d["expert_bias"] = [[nan(v) for v in row] for row in d["expert_bias"]]
    return {s: nan(v) for s, v in val.items()}


def is_count(x):
    """A finite number >= 0 (NaN fails both comparisons)."""
    return is_num(x) and 0 <= x < math.inf


def is_list(x, n=None, item=None):
    """x is a list (of n entries, each passing item, when given)."""
    return (isinstance(x, list) and (n is None or len(x) == n)
            and (item is None or all(item(v) for v in x)))


def need(ok, where, what):
    if not ok:
        raise ReportError("%s: %s" % (where, what))


def check_steps(path, steps):
    """The fields of the training records the plots read: step, loss, tokens_per_s and
    every MoE layer's scalars, the same layers in every record."""
    layers = None
    for d in steps:
        where = "%s: the record of step %s" % (path, d.get("step"))
        need(is_int(d["step"]), path,
             "a training record's step is %r, not an integer" % (d["step"],))
        need(is_num_or_null(d["loss"]) and is_num(d.get("tokens_per_s")), where,
             "loss must be a number (or null, diverged) and tokens_per_s a number")
        moe = d["moe"]
        need(is_list(moe, item=lambda m: isinstance(m, dict) and is_int(m.get("layer"))
                     and all(k in m and is_num_or_null(m[k]) for k, _ in LAYER_SCALARS)), where,
             "moe must be a list of layers, each with its layer number and %s (numbers, or "
             "null where diverged)" % ", ".join(k for k, _ in LAYER_SCALARS))
        ids = [m["layer"] for m in moe]
        need(layers is None or ids == layers, where,
             "its MoE layers %s are not those of the first record %s" % (ids, layers))
        layers = ids


def check_routing(path, records):
    """routing.jsonl: every record's layers and per-layer expert counts of one width."""
    first = None
    for d in records:
        where = "%s: the record of step %s" % (path, d.get("step"))
        need(is_int(d.get("step")), path,
             "a record's step is %r, not an integer" % (d.get("step"),))
        layers = d.get("layers")
        need(is_list(layers, item=is_int) and (first is None or layers == first), where,
             "layers must be the list of MoE layer numbers of the first record")
        first = layers
        for key in ("tokens_per_expert", "tokens_per_expert_kept") + (
                ("expert_bias",) if "expert_bias" in records[0] else ()):
            rows = d.get(key)
            counts = key != "expert_bias"
            item = is_count if counts else is_num_or_null
            need(is_list(rows, len(layers), lambda r: is_list(r, item=item) and len(r) > 0)
                 and len({len(r) for r in rows}) <= 1, where,
                 "%s must hold, for each of the %d layers, one %s per expert"
                 % (key, len(layers), "finite count >= 0" if counts else "number (or null)"))


def check_lang(path, lang):
    """routing_by_language.json: counts[layer][label] holds num_experts numbers."""
    need(isinstance(lang, dict), path, "not a JSON object")
    labels, layers, experts = lang.get("labels"), lang.get("layers"), lang.get("num_experts")
    need(is_list(labels, item=lambda v: isinstance(v, str)), path,
         "labels must be a list of strings")
    need(is_list(layers, item=is_int), path, "layers must be a list of layer numbers")
    need(is_int(experts) and experts >= 1, path, "num_experts must be an integer >= 1")
    counts = lang.get("counts")
    need(is_list(counts, len(layers), lambda per_layer: is_list(
        per_layer, len(labels), lambda c: is_list(c, experts, lambda v: is_num(v) and v >= 0))),
         path, "counts must hold, for each of the %d layers, %d labels of %d non-negative counts "
         "(one per expert)" % (len(layers), len(labels), experts))


def check_route(path, route):
    """A `switchyard route --json` output: num_experts >= 1, the layers, and per token its
    text and, per layer, its experts (integers in [0, num_experts)), as the sample plot
    reads them."""
    need(isinstance(route, dict), path, "not a JSON object (a `switchyard route --json` output)")
    experts, layers, tokens = route.get("num_experts"), route.get("layers"), route.get("tokens")
    need(is_int(experts) and experts >= 1, path, "num_experts must be an integer >= 1")
    need(is_list(layers, item=is_int) and layers, path,
         "layers must be a non-empty list of layer numbers")
    need(is_list(tokens, item=lambda t: isinstance(t, dict)), path,
         "tokens must be a list of objects")
    for i, t in enumerate(tokens):
        where = "%s: tokens[%d]" % (path, i)
        need(isinstance(t.get("text"), str), where, "text must be a string")
        need(is_list(t.get("layers"), len(layers), lambda l: isinstance(l, dict)), where,
             "layers must hold one object per layer (%d)" % len(layers))
        for li, l in enumerate(t["layers"]):
            need(is_list(l.get("experts"), item=lambda e: is_int(e) and 0 <= e < experts)
                 and l["experts"], "%s.layers[%d]" % (where, li),
                 "experts must be a non-empty list of expert ids, integers in [0, %d)" % experts)


def load_run(path):
    """A run's records: steps (the last record of each step wins, as after a resume),
    validation losses, routing counts and the routing-by-language table (or None). A file
    whose content the plots cannot read is one ReportError naming it."""
    metrics = os.path.join(path, "metrics.jsonl")
    if not os.path.isfile(metrics):
        raise ReportError("%s: no metrics.jsonl (not a training output directory)" % path)
    steps, val = {}, {}
    for d in read_jsonl(metrics):
        need(isinstance(d, dict), metrics, "a line that is not a JSON object")
        if "moe" in d and "loss" in d:
            steps[d.get("step")] = d
        elif "val_loss" in d:
            val[d.get("step")] = d["val_loss"]
    if not steps:
        raise ReportError("%s: metrics.jsonl holds no training step" % metrics)
    try:
        check_steps(metrics, steps.values())
    except KeyError as e:
        raise ReportError("%s: a training record lacks the field %s" % (metrics, e))
    need(all(is_int(s) and is_num_or_null(v) for s, v in val.items()), metrics,
         "a validation record's step is not an integer or its val_loss not a number (or null)")
    routing = {}
    rpath = os.path.join(path, "routing.jsonl")
    if os.path.isfile(rpath):
        records = read_jsonl(rpath)
        need(all(isinstance(d, dict) for d in records), rpath, "a line that is not a JSON object")
        check_routing(rpath, records)
        for d in records:
            routing[d["step"]] = d
    val = nans_for_nulls(steps.values(), val, routing.values())
    lang = None
    lpath = os.path.join(path, "routing_by_language.json")
    if os.path.isfile(lpath):
        lang = read_json(lpath)
        check_lang(lpath, lang)
    eval_loss = None  # the study's evaluation of the final checkpoint (study_load_balance.sh)
    epath = os.path.join(path, "eval.json")
    if os.path.isfile(epath):
        doc = read_json(epath)
        need(isinstance(doc, dict) and (doc.get("loss") is None or is_num(doc["loss"])), epath,
             "not an object with a numeric loss")
        eval_loss = doc.get("loss")
    return {
        "path": path,
        "eval_loss": eval_loss,
        "steps": [steps[s] for s in sorted(steps)],
        "val": [[s, val[s]] for s in sorted(val)],
        "routing": [routing[s] for s in sorted(routing)],
        "lang": lang,
    }


def run_names(paths):
    """Short distinct names: the directory's base name, or the whole path on a clash."""
    base = [os.path.basename(os.path.normpath(p)) or p for p in paths]
    return [b if base.count(b) == 1 else os.path.normpath(p) for b, p in zip(base, paths)]


class Page:
    """The plots in order, each an SVG and the numbers it shows."""

    def __init__(self):
        self.sections = []  # (title, [plot ids], [notes])
        self.plots = {}  # id -> {"svg", "data"}
        self.order = []

    def section(self, title):
        self.sections.append((title, [], []))

    def note(self, text):
        """A line of text in the current section, in place of a plot that would be empty."""
        self.sections[-1][2].append(text)

    def add(self, plot_id, fig, data):
        plt.rcParams["svg.hashsalt"] = plot_id  # unique ids inside each inline SVG
        buf = io.StringIO()
        fig.savefig(buf, format="svg", bbox_inches="tight")
        plt.close(fig)
        svg = buf.getvalue()
        svg = svg[svg.index("<svg"):]  # drop the XML declaration and doctype
        self.plots[plot_id] = {"svg": svg, "data": data}
        self.order.append(plot_id)
        self.sections[-1][1].append(plot_id)


def rolling_mean(y, w):
    """Mean of the last w values at each point (fewer at the start); None (a diverged
    value) counts as missing. Prefix sums: linear in len(y) (summing each window again was
    quadratic: 100000 steps, a window of 2000, took minutes)."""
    total, count = [0.0], [0]
    for v in y:
        ok = v is not None and math.isfinite(v)
        total.append(total[-1] + (v if ok else 0.0))
        count.append(count[-1] + ok)
    out = []
    for i in range(1, len(y) + 1):
        j = max(0, i - w)
        n = count[i] - count[j]
        out.append((total[i] - total[j]) / n if n else float("nan"))
    return out


def line_plot(page, plot_id, title, ylabel, series, xlabel="step"):
    """series: [{"label", "x", "y"}]. Long series (over 100 points) are drawn faintly with
    their rolling mean over 1/50 of their length on top; the page's data keeps the raw
    values (and the window, "smoothing")."""
    fig, ax = plt.subplots(figsize=(8.5, 3.4))
    longest = max((len(s["x"]) for s in series), default=0)
    window = max(2, longest // 50) if longest > 100 else 1
    for s in series:
        if window > 1:
            (raw,) = ax.plot(s["x"], s["y"], linewidth=0.5, alpha=0.25)
            ax.plot(s["x"], rolling_mean(s["y"], window), label=s["label"], linewidth=1.2,
                    color=raw.get_color())
        else:
            ax.plot(s["x"], s["y"], label=s["label"], linewidth=1.2,
                    marker="o" if len(s["x"]) < 30 else None, markersize=3)
    ax.set_title(title + (" (rolling mean over %d steps)" % window if window > 1 else ""), fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  ncol=1 if len(series) <= 14 else 2)
    page.add(plot_id, fig, {"kind": "lines", "smoothing": window, "series": series})


def heatmap(page, plot_id, title, z, rows, cols, xlabel, ylabel, fmt=None):
    """z: rows x cols values (lists); rows and cols: their labels."""
    fig, ax = plt.subplots(figsize=(7.5, max(1.6, 0.28 * len(rows) + 1.2)))
    im = ax.imshow(z, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([str(r) for r in rows], fontsize=7)
    step = max(1, len(cols) // 12)
    ax.set_xticks(range(0, len(cols), step))
    ax.set_xticklabels([str(c) for c in cols[::step]], fontsize=7)
    fig.colorbar(im, ax=ax)
    if fmt and len(rows) * len(cols) <= 160:
        for i, row in enumerate(z):
            for j, v in enumerate(row):
                ax.text(j, i, fmt % v, ha="center", va="center", fontsize=6, color="w")
    page.add(plot_id, fig, {"kind": "heatmap", "rows": rows, "cols": cols, "z": z})


def shares(counts):
    total = sum(counts)
    return [c / total if total else 0.0 for c in counts]


def build(runs, names, route):
    page = Page()

    page.section("Loss")
    line_plot(page, "loss", "training loss (ce + aux + z)", "loss",
              [{"label": n, "x": [d["step"] for d in r["steps"]], "y": [d["loss"] for d in r["steps"]]}
               for r, n in zip(runs, names)])
    validated = [(r, n) for r, n in zip(runs, names) if r["val"]]
    if validated:
        line_plot(page, "val_loss", "validation loss", "cross-entropy",
                  [{"label": n, "x": [v[0] for v in r["val"]], "y": [v[1] for v in r["val"]]}
                   for r, n in validated])
        if len(validated) < len(runs):
            page.note("no validation in %s (train.eval_every 0)" %
                      ", ".join(n for r, n in zip(runs, names) if not r["val"]))
    else:
        page.note("no validation in these runs (train.eval_every 0): no validation-loss plot")
    page.section("Throughput")
    line_plot(page, "tokens_per_s", "throughput", "tokens / s",
              [{"label": n, "x": [d["step"] for d in r["steps"]],
                "y": [d["tokens_per_s"] for d in r["steps"]]} for r, n in zip(runs, names)])

    page.section("Routing over the steps (every MoE layer)")
    for key, title in LAYER_SCALARS:
        series = []
        for r, n in zip(runs, names):
            for i, layer in enumerate(r["steps"][0]["moe"]):
                series.append({"label": "%s L%d" % (n, layer["layer"]),
                               "x": [d["step"] for d in r["steps"]],
                               "y": [d["moe"][i][key] for d in r["steps"]]})
        line_plot(page, "layer_" + key, title, key, series)

    for ri, (r, n) in enumerate(zip(runs, names)):
        page.section("Expert load of %s (share of the layer's assignments before dropping)" % n)
        if not r["routing"]:
            continue
        logged = [d["step"] for d in r["routing"]]
        for li, layer in enumerate(r["routing"][0]["layers"]):
            for key, what in (("tokens_per_expert", "before dropping"),
                              ("tokens_per_expert_kept", "after dropping")):
                # Both heatmaps divide by the assignments before dropping, so the kept one
                # shows what capacity removed (its columns sum to 1 - dropped fraction).
                cols = [[c / sum(d["tokens_per_expert"][li]) if sum(d["tokens_per_expert"][li]) else 0.0
                         for c in d[key][li]] for d in r["routing"]]  # steps x E
                z = [[c[e] for c in cols] for e in range(len(cols[0]))]  # E x steps
                heatmap(page, "share_%d_L%d_%s" % (ri, layer, "before" if key == "tokens_per_expert" else "after"),
                        "%s, layer %d: token share per expert, %s" % (n, layer, what),
                        z, list(range(len(z))), logged, "step", "expert")
            if "expert_bias" in r["routing"][0]:
                E = len(r["routing"][0]["expert_bias"][li])
                line_plot(page, "bias_%d_L%d" % (ri, layer),
                          "%s, layer %d: expert bias (aux-loss-free balancing)" % (n, layer), "bias",
                          [{"label": "e%d" % e, "x": logged,
                            "y": [d["expert_bias"][li][e] for d in r["routing"]]} for e in range(E)])

    for ri, (r, n) in enumerate(zip(runs, names)):
        lang = r["lang"]
        if not lang:
            continue
        page.section("Routing by language of %s (second half of the run)" % n)
        for li, layer in enumerate(lang["layers"]):
            rows, z = [], []
            for label, counts in zip(lang["labels"], lang["counts"][li]):
                if sum(counts):
                    rows.append(label)
                    z.append([100.0 * c for c in shares(counts)])
            if not rows:  # nothing to draw: say so rather than an empty image
                page.note("layer %d: routing_by_language.json counts no assignment of any "
                          "language" % layer)
                continue
            heatmap(page, "lang_%d_L%d" % (ri, layer),
                    "%s, layer %d: %% of each language's assignments per expert" % (n, layer),
                    z, rows, list(range(lang["num_experts"])), "expert", "language", fmt="%.0f")

    if route:
        page.section("Token-level routing of a sample (switchyard route)")
        if not route["tokens"]:
            page.note("the --route file holds no token")
        for li, layer in enumerate(route["layers"] if route["tokens"] else []):
            toks = [t["text"] for t in route["tokens"]]
            k = len(route["tokens"][0]["layers"][li]["experts"]) if toks else 0
            z = [[t["layers"][li]["experts"][0] for t in route["tokens"]]]
            heatmap(page, "route_L%d" % layer, "sample: first choice per token, layer %d (top-%d)" % (layer, k),
                    z, ["expert"], toks, "token", "", fmt="%d")
    return page


def finite(x):
    """NaN and infinities (a diverged run) as null: JSON.parse takes no NaN."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, list):
        return [finite(v) for v in x]
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    return x


def render(page, runs, names, title):
    out = ["<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>%s</title>" % html.escape(title),
           "<style>body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}"
           "div.plot{margin:0.6em 0}div.plot svg{max-width:100%;height:auto}"
           "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px}</style>",
           "</head><body><h1>%s</h1>" % html.escape(title)]
    out.append("<table><tr><th>run</th><th>directory</th><th>steps</th><th>final loss</th>"
               "<th>final validation loss</th><th>eval.json loss</th></tr>")
    for r, n in zip(runs, names):
        final_val = "%.4f" % r["val"][-1][1] if r["val"] else "-"
        evaluated = "%.4f" % r["eval_loss"] if r["eval_loss"] is not None else "-"
        out.append("<tr><td>%s</td><td>%s</td><td>%d</td><td>%.4f</td><td>%s</td><td>%s</td></tr>" % (
            html.escape(n), html.escape(r["path"]), len(r["steps"]), r["steps"][-1]["loss"], final_val,
            evaluated))
    out.append("</table>")
    for title_, ids, notes in page.sections:
        if not ids and not notes:
            continue
        out.append("<h2>%s</h2>" % html.escape(title_))
        for text in notes:
            out.append("<p class=\"note\">%s</p>" % html.escape(text))
        for pid in ids:
            out.append("<div class=\"plot\" id=\"plot-%s\">%s</div>" % (pid, page.plots[pid]["svg"]))
    data = {"runs": names, "plots": {pid: page.plots[pid]["data"] for pid in page.order}}
    text = json.dumps(finite(data), allow_nan=False).replace("</", "<\\/")
    out.append("<script type=\"application/json\" id=\"switchyard-data\">%s</script>" % text)
    # Marks the page once every plot is in the DOM (what a headless load can check).
    out.append("<script>(function(){var d=JSON.parse(document.getElementById('switchyard-data').textContent);"
               "var ok=0;for(var id in d.plots){var e=document.getElementById('plot-'+id);"
               "if(e&&e.querySelector('svg'))ok++;else console.error('plot '+id+' missing');}"
               "document.body.setAttribute('data-plots-rendered',ok);})();</script>")
    out.append("</body></html>\n")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--route", help="a `switchyard route --json` output to show as a sample")
    ap.add_argument("--title", default="Switchyard load-balance report")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    try:
        runs = [load_run(p) for p in a.runs]
        route = None
        if a.route:
            route = read_json(a.route)
            check_route(a.route, route)
        names = run_names(a.runs)
    except ReportError as e:
        sys.stderr.write("switchyard report: error: %s\n" % e)
        return 1
    except OSError as e:
        sys.stderr.write("switchyard report: error: %s: cannot read (%s)\n"
                         % (e.filename, e.strerror))
        return 1
    load_pyplot()
    try:
        text = render(build(runs, names, route), runs, names, a.title)
    except Exception as e:  # what the checks above let through: still one line, no traceback
        sys.stderr.write("switchyard report: error: the report of %s%s cannot be drawn (%s: %s)\n"
                         % (" ".join(a.runs), " with --route " + a.route if a.route else "",
                            type(e).__name__, e))
        return 1
    tmp = a.out + ".tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, a.out)
    except OSError as e:
        sys.stderr.write("switchyard report: error: %s: cannot write (%s)\n" % (a.out, e.strerror))
        return 1
    print("wrote %s (%d runs, %d plots)" % (a.out, len(runs), text.count("<div class=\"plot\"")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
