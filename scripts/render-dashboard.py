#!/usr/bin/env python3
"""Renders walbox's Grafana dashboard (deploy/grafana/walbox.json) as a PNG from /metrics samples.

Grafana does not run everywhere; this draws the same panels, with the same titles, layout,
queries, legends, units and value mappings, from scrapes of a real run, so a reader sees what an
operator will see. The samples come from `cargo run --example stack_sample -- samples.txt`
(the compose stack on a throwaway PostgreSQL cluster and librdkafka's mock Kafka cluster):
blocks of `# scrape <job> <unix ms>` followed by a Prometheus text exposition.

    pip install matplotlib        # the only dependency (tested with 3.11)
    python3 scripts/render-dashboard.py samples.txt docs/dashboard.png

Each query is evaluated by the small PromQL evaluator below, which knows the subset the
dashboard uses: selectors with label matchers, rate/increase over a range, histogram_quantile,
sum/max [by (...)], comparisons as filters, and arithmetic between vectors or numbers.
`$__rate_interval` is 15 s (the samples are 1 s apart). A query outside that subset is an
error, never a silently empty panel.
"""

import json
import math
import re
import sys
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

RATE_INTERVAL = 15.0
ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- samples

def parse_samples(path):
    """(times, series): series maps (name, labels tuple) to {t: value}; times are sorted."""
    series = defaultdict(dict)
    times = set()
    job = t = None
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in open(path, encoding="utf-8"):
        if line.startswith("# scrape "):
            _, _, job, ms = line.split()
            t = int(ms) / 1000.0
            times.add(t)
            continue
        if line.startswith("#") or not line.strip():
            continue
        m = line_re.match(line)
        if not m:
            raise ValueError(f"cannot parse sample line: {line!r}")
        labels = dict(label_re.findall(m.group(3) or ""))
        labels["job"] = job
        series[(m.group(1), tuple(sorted(labels.items())))][t] = float(m.group(4))
    return sorted(times), series


# ---------------------------------------------------------------- PromQL subset

TOKEN_RE = re.compile(r'\s*(?:(\d+(?:\.\d+)?)|([a-zA-Z_:][a-zA-Z0-9_:]*)|(==|!=|>=|<=|[-+*/(){}\[\],<>=])|("(?:[^"\\]|\\.)*"))')


def tokenize(expr):
    tokens, pos = [], 0
    expr = expr.replace("$__rate_interval", f"{int(RATE_INTERVAL)}s")
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        m = TOKEN_RE.match(expr, pos)
        if not m:
            raise ValueError(f"unsupported PromQL near {expr[pos:]!r}")
        pos = m.end()
        num, ident, op, string = m.groups()
        if num is not None:
            # A duration such as 15s or 1m directly follows its number.
            d = re.match(r'(ms|s|m|h)', expr[pos:])
            if d and ident is None:
                pos += d.end()
                tokens.append(("dur", float(num) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[d.group(1)]))
            else:
                tokens.append(("num", float(num)))
        elif ident is not None:
            tokens.append(("id", ident))
        elif string is not None:
            tokens.append(("str", json.loads(string)))
        else:
            tokens.append(("op", op))
    return tokens


class Parser:
    """Expression tree as tuples: ("num", x), ("sel", name, matchers, range), ("call", f, args),
    ("agg", op, by, expr), ("bin", op, lhs, rhs)."""

    PRECEDENCE = {"==": 1, "!=": 1, ">": 1, "<": 1, ">=": 1, "<=": 1, "+": 2, "-": 2, "*": 3, "/": 3}

    def __init__(self, expr):
        self.expr, self.tokens, self.i = expr, tokenize(expr), 0

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else (None, None)

    def take(self, kind=None, value=None):
        tok = self.peek()
        if (kind and tok[0] != kind) or (value is not None and tok[1] != value):
            raise ValueError(f"{self.expr}: expected {value or kind}, got {tok[1]!r}")
        self.i += 1
        return tok[1]

    def parse(self):
        node = self.binary(0)
        if self.i != len(self.tokens):
            raise ValueError(f"{self.expr}: unexpected {self.peek()[1]!r}")
        return node

    def binary(self, min_prec):
        lhs = self.unary()
        while True:
            kind, op = self.peek()
            if kind != "op" or op not in self.PRECEDENCE or self.PRECEDENCE[op] < min_prec + 1:
                return lhs
            self.i += 1
            rhs = self.binary(self.PRECEDENCE[op])
            lhs = ("bin", op, lhs, rhs)

    def unary(self):
        kind, value = self.peek()
        if kind == "num":
            self.i += 1
            return ("num", value)
        if kind == "op" and value == "(":
            self.i += 1
            node = self.binary(0)
            self.take("op", ")")
            return node
        name = self.take("id")
        if name in ("sum", "max", "min", "avg"):
            by = []
            if self.peek() == ("id", "by"):
                self.i += 1
                self.take("op", "(")
                while self.peek() != ("op", ")"):
                    by.append(self.take("id"))
                    if self.peek() == ("op", ","):
                        self.i += 1
                self.take("op", ")")
            self.take("op", "(")
            inner = self.binary(0)
            self.take("op", ")")
            return ("agg", name, tuple(by), inner)
        if self.peek() == ("op", "("):
            self.i += 1
            args = [self.binary(0)]
            while self.peek() == ("op", ","):
                self.i += 1
                args.append(self.binary(0))
            self.take("op", ")")
            if name not in ("rate", "increase", "histogram_quantile"):
                raise ValueError(f"{self.expr}: function {name} is not supported")
            return ("call", name, args)
        matchers = []
        if self.peek() == ("op", "{"):
            self.i += 1
            while self.peek() != ("op", "}"):
                label = self.take("id")
                self.take("op", "=")
                matchers.append((label, self.take("str")))
                if self.peek() == ("op", ","):
                    self.i += 1
            self.take("op", "}")
        rng = None
        if self.peek() == ("op", "["):
            self.i += 1
            rng = self.take("dur")
            self.take("op", "]")
        return ("sel", name, tuple(matchers), rng)


class Evaluator:
    def __init__(self, series):
        self.by_name = defaultdict(list)
        for (name, labels), points in series.items():
            times = sorted(points)
            self.by_name[name].append((labels, times, [points[t] for t in times]))

    def select(self, name, matchers):
        for labels, times, values in self.by_name.get(name, []):
            d = dict(labels)
            if all(d.get(k) == v for k, v in matchers):
                yield labels, times, values

    def eval(self, node, t):
        """An instant vector {labels: value} or a number."""
        kind = node[0]
        if kind == "num":
            return node[1]
        if kind == "sel":
            _, name, matchers, rng = node
            if rng is not None:
                raise ValueError(f"range selector {name}[...] outside rate/increase")
            out = {}
            for labels, times, values in self.select(name, matchers):
                # The newest sample at or before t, if it is at most 5 s old (staleness).
                j = _bisect_right(times, t) - 1
                if j >= 0 and t - times[j] <= 5.0:
                    out[labels] = values[j]
            return out
        if kind == "call":
            _, fn, args = node
            if fn in ("rate", "increase"):
                sel = args[0]
                if sel[0] != "sel" or sel[3] is None:
                    raise ValueError(f"{fn} needs a range selector")
                out = {}
                for labels, times, values in self.select(sel[1], sel[2]):
                    lo, hi = _bisect_right(times, t - sel[3]), _bisect_right(times, t)
                    if hi - lo < 2:
                        continue
                    gain = 0.0
                    for a, b in zip(values[lo:hi - 1], values[lo + 1:hi]):
                        gain += b - a if b >= a else b  # a counter reset starts from 0
                    rate = gain / (times[hi - 1] - times[lo])
                    out[labels] = rate * sel[3] if fn == "increase" else rate
                return out
            q = self.eval(args[0], t)
            return histogram_quantile(q, self.eval(args[1], t))
        if kind == "agg":
            _, op, by, inner = node
            vec = self.eval(inner, t)
            groups = defaultdict(list)
            for labels, v in vec.items():
                groups[tuple((k, x) for k, x in labels if k in by)].append(v)
            f = {"sum": sum, "max": max, "min": min, "avg": lambda xs: sum(xs) / len(xs)}[op]
            return {k: f(vs) for k, vs in groups.items()}
        if kind == "bin":
            _, op, lhs, rhs = node
            a, b = self.eval(lhs, t), self.eval(rhs, t)
            return binary(op, a, b)
        raise ValueError(node)


def _bisect_right(xs, x):
    lo, hi = 0, len(xs)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < xs[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def histogram_quantile(q, vec):
    groups = defaultdict(list)
    for labels, v in vec.items():
        d = dict(labels)
        le = d.pop("le")
        groups[tuple(sorted(d.items()))].append((float(le), v))
    out = {}
    for key, buckets in groups.items():
        buckets.sort()
        total = buckets[-1][1]
        if total <= 0:
            continue
        rank = q * total
        prev_le, prev_count = 0.0, 0.0
        for le, count in buckets:
            if count >= rank:
                if math.isinf(le):
                    out[key] = prev_le
                else:
                    width = count - prev_count
                    out[key] = prev_le + (le - prev_le) * ((rank - prev_count) / width if width else 1)
                break
            prev_le, prev_count = le, count
    return out


def binary(op, a, b):
    ops = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
           "/": lambda x, y: x / y if y else math.nan}
    cmp = {"==": lambda x, y: x == y, "!=": lambda x, y: x != y, ">": lambda x, y: x > y,
           "<": lambda x, y: x < y, ">=": lambda x, y: x >= y, "<=": lambda x, y: x <= y}
    if isinstance(a, dict) and isinstance(b, dict):
        pairs = {k: (a[k], b[k]) for k in a if k in b}
        if op in cmp:
            return {k: x for k, (x, y) in pairs.items() if cmp[op](x, y)}
        return {k: ops[op](x, y) for k, (x, y) in pairs.items()}
    if isinstance(a, dict):
        return {k: x for k, x in a.items() if cmp[op](x, b)} if op in cmp else {k: ops[op](x, b) for k, x in a.items()}
    if isinstance(b, dict):
        return {k: y for k, y in b.items() if cmp[op](a, y)} if op in cmp else {k: ops[op](a, y) for k, y in b.items()}
    return ops[op](a, b)


def legend(fmt, labels, fallback):
    d = dict(labels)
    if not fmt:
        return fallback
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: d.get(m.group(1), ""), fmt)


# ---------------------------------------------------------------- drawing

BG, PANEL, GRID, TEXT, MUTED = "#111217", "#181b1f", "#2c3235", "#d8d9da", "#8e8e8e"
PALETTE = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9"]
NAMED = {"green": "#73bf69", "yellow": "#fade2a", "orange": "#ff9830", "red": "#f2495c", "blue": "#5794f2"}


def fmt_unit(unit):
    def bytes_(v, _):
        for u in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(v) < 1024 or u == "TiB":
                return f"{v:.0f} {u}" if u == "B" else f"{v:.1f} {u}"
            v /= 1024

    def seconds(v, _):
        if v == 0:
            return "0"
        if abs(v) < 1:
            return f"{v * 1000:.0f} ms" if abs(v) >= 0.01 else f"{v * 1000:.1f} ms"
        return f"{v:.0f} s" if abs(v) >= 10 else f"{v:.1f} s"

    def short(v, _):
        if abs(v) >= 1000:
            return f"{v / 1000:.1f}k".replace(".0k", "k")
        return f"{v:.0f}" if v == int(v) else f"{v:.2g}"

    def ops(v, p):
        return short(v, p) + "/s"

    return {"bytes": bytes_, "s": seconds, "ops": ops}.get(unit, short)


def mapping_of(panel):
    out = {}
    for m in panel.get("fieldConfig", {}).get("defaults", {}).get("mappings", []):
        for value, spec in m.get("options", {}).items():
            out[float(value)] = (spec.get("text", value), NAMED.get(spec.get("color"), spec.get("color")))
    return out


def draw_timeseries(ax, panel, results, t0, unit):
    from matplotlib.ticker import FuncFormatter, MultipleLocator
    i = 0
    for name, xs, ys in results:
        color = PALETTE[i % len(PALETTE)]
        i += 1
        ax.plot([x - t0 for x in xs], ys, color=color, linewidth=1.3, label=name)
        ax.fill_between([x - t0 for x in xs], ys, color=color, alpha=0.08, linewidth=0)
    ax.yaxis.set_major_formatter(FuncFormatter(fmt_unit(unit)))
    d = panel.get("fieldConfig", {}).get("defaults", {})
    if "min" in d:
        ax.set_ylim(bottom=d["min"])
    if results:
        ax.legend(loc="upper left", fontsize=7, frameon=False, labelcolor=TEXT, ncol=len(results))
        ax.set_ylim(top=ax.get_ylim()[1] * 1.25)  # room for the legend
    if unit == "bytes":
        # Ticks on powers of two (1, 2, 4 … KiB/MiB), as Grafana's bytes unit does.
        top, step = ax.get_ylim()[1], 1.0
        while top / step > 6:
            step *= 2
        ax.yaxis.set_major_locator(MultipleLocator(step))


def draw_state_timeline(ax, panel, results, t0):
    mapping = mapping_of(panel)
    steps = panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])
    names = [r[0] for r in results]
    for row, (name, xs, ys) in enumerate(results):
        y = len(results) - 1 - row
        for j, (x, v) in enumerate(zip(xs, ys)):
            x_end = xs[j + 1] if j + 1 < len(xs) else x + 1
            if x_end - x > 5:  # a gap in the data: leave it blank
                x_end = x + 1
            text, color = mapping.get(v, (None, None))
            if color is None:
                color = NAMED.get(next((s["color"] for s in reversed(steps) if s["value"] is None or v >= s["value"]), "green"), "#73bf69")
            ax.barh(y, x_end - x, left=x - t0, height=0.8, color=color, linewidth=0)
        # Labels at each change of value, as Grafana's "merge values" does.
        start = 0
        for j in range(1, len(xs) + 1):
            if j == len(xs) or ys[j] != ys[start]:
                text = mapping.get(ys[start], (f"{ys[start]:g}", None))[0]
                if xs[j - 1] - xs[start] > 6:
                    ax.text(xs[start] - t0 + 1, y, text, va="center", ha="left", fontsize=7, color="#111217")
                start = j
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(list(reversed(names)), fontsize=7, color=TEXT)
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.grid(False)


def render(samples, out, dashboard_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    dashboard = json.load(open(dashboard_path, encoding="utf-8"))
    times, series = parse_samples(samples)
    if len(times) < 2:
        raise SystemExit(f"{samples}: fewer than two scrapes")
    ev = Evaluator(series)
    panels = []
    for p in dashboard["panels"]:
        panels.append(p)
        panels.extend(p.get("panels", []))
    height_units = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_px, width_px, dpi = 30, 1600, 100
    fig = plt.figure(figsize=(width_px / dpi, (height_units * unit_px + 40) / dpi), dpi=dpi, facecolor=BG)
    H = height_units * unit_px + 40
    t0 = times[0]
    start = datetime.fromtimestamp(t0, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    fig.text(0.01, 1 - 18 / H, f"{dashboard['title']}", color=TEXT, fontsize=13, weight="bold", va="center")
    fig.text(0.99, 1 - 18 / H, f"{len(times)} scrapes from {start}, 1 s apart; rates over {RATE_INTERVAL:.0f} s",
             color=MUTED, fontsize=8, va="center", ha="right")
    for p in panels:
        g = p["gridPos"]
        left, width = g["x"] / 24, g["w"] / 24
        top = 40 + g["y"] * unit_px
        if p["type"] == "row":
            fig.text(left + 0.006, 1 - (top + unit_px / 2) / H, p["title"], color=TEXT, fontsize=10.5, weight="bold", va="center")
            continue
        pad_x, pad_top, pad_bottom = 0.004, 26, 22
        rect = [left + pad_x + 0.03, 1 - (top + g["h"] * unit_px - pad_bottom) / H,
                width - 2 * pad_x - 0.036, (g["h"] * unit_px - pad_top - pad_bottom) / H]
        bg = fig.add_axes([left + pad_x, 1 - (top + g["h"] * unit_px - 4) / H, width - 2 * pad_x, (g["h"] * unit_px - 8) / H])
        bg.set_facecolor(PANEL)
        bg.set_xticks([])
        bg.set_yticks([])
        for s in bg.spines.values():
            s.set_color(GRID)
        bg.text(0.012, 1 - 14 / (g["h"] * unit_px - 8), p["title"], transform=bg.transAxes, color=TEXT, fontsize=9, weight="bold", va="center")
        ax = fig.add_axes(rect)
        ax.set_facecolor(PANEL)
        for s in ax.spines.values():
            s.set_visible(False)
        ax.tick_params(colors=MUTED, labelsize=7, length=0)
        ax.grid(True, color=GRID, linewidth=0.6)
        ax.set_axisbelow(True)
        results = []
        for target in p["targets"]:
            tree = Parser(target["expr"]).parse()
            per_series = defaultdict(lambda: ([], []))
            for t in times:
                vec = ev.eval(tree, t)
                if not isinstance(vec, dict):
                    vec = {(): vec}
                for labels, v in vec.items():
                    if not math.isnan(v):
                        per_series[labels][0].append(t)
                        per_series[labels][1].append(v)
            for labels, (xs, ys) in sorted(per_series.items()):
                results.append((legend(target.get("legendFormat"), labels, target["expr"]), xs, ys))
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        if p["type"] == "state-timeline":
            draw_state_timeline(ax, p, results, t0)
        else:
            draw_timeseries(ax, p, results, t0, unit)
        ax.set_xlim(0, times[-1] - t0)
        ax.xaxis.set_major_formatter(FuncFormatter(
            lambda v, _: datetime.fromtimestamp(t0 + v, timezone.utc).strftime("%H:%M:%S")))
        ax.xaxis.set_major_locator(matplotlib.ticker.MultipleLocator(30))
    fig.savefig(out, facecolor=BG, dpi=dpi)
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    render(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else ROOT / "deploy/grafana/walbox.json")
