#!/usr/bin/env python3
"""Renders walbox's Grafana dashboard (deploy/grafana/walbox.json) as a PNG from a real run.

Grafana does not run everywhere; this draws the same panels, with the same titles, layout,
queries, legends, units and value mappings, so a reader sees what an operator will see. The run
comes from `cargo run --example stack_sample -- RUN_DIR` (the compose stack on a throwaway
PostgreSQL cluster and librdkafka's mock Kafka cluster, scraped every second by a real
Prometheus into RUN_DIR/data).

    pip install matplotlib        # the only Python dependency (tested with 3.11)
    python3 scripts/render-dashboard.py RUN_DIR docs/dashboard.png

The script evaluates nothing itself: it starts Prometheus on the run's storage and asks its
`query_range` API for each panel's query over the run's window (RUN_DIR/run.json), one point a
second, with `$__rate_interval` as 15 s. A query Prometheus rejects stops the script with Prometheus' own error; it never draws an empty panel instead.
"""

import json
import math
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

RATE_INTERVAL = "15s"
ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- Prometheus

class Prometheus:
    """A Prometheus server reading RUN_DIR/data, scraping nothing, on a free local port."""

    def __init__(self, data):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.config = tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False)
        self.config.write("global:\n  scrape_interval: 1m\n")
        self.config.close()
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={self.config.name}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=100y"],
            stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"prometheus exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline:
                self.close()
                raise SystemExit("prometheus was not ready within 60 s")
            time.sleep(0.2)

    def log_tail(self):
        self.log.seek(0)
        return "".join(self.log.readlines()[-20:])

    def query_range(self, expr, start, end):
        """[(labels dict, [t...], [v...])] for expr, one point a second; SystemExit if rejected."""
        query = expr.replace("$__rate_interval", RATE_INTERVAL)
        params = urllib.parse.urlencode({"query": query, "start": start, "end": end, "step": "1"})
        url = f"http://127.0.0.1:{self.port}/api/v1/query_range?{params}"
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        if body.get("status") != "success":
            raise SystemExit(f"prometheus rejected {query!r}: {body.get('errorType')}: {body.get('error')}")
        out = []
        for series in body["data"]["result"]:
            points = [(float(t), float(v)) for t, v in series["values"] if not math.isnan(float(v))]
            out.append((series["metric"], [t for t, _ in points], [v for _, v in points]))
        return out

    def close(self):
        self.proc.terminate()
        self.proc.wait()
        Path(self.config.name).unlink(missing_ok=True)
        Path(self.log.name).unlink(missing_ok=True)


def legend(fmt, labels, fallback):
    if not fmt:
        return fallback
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


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


def render(run_dir, out, dashboard_path):
    dashboard = json.load(open(dashboard_path, encoding="utf-8"))
    run_dir = Path(run_dir)
    window = json.load(open(run_dir / "run.json", encoding="utf-8"))
    first, last = window["start"], window["end"]
    if last - first < 2:
        raise SystemExit(f"{run_dir}/run.json: a window of under two seconds")
    prometheus = Prometheus(run_dir / "data")
    try:
        draw(dashboard, prometheus, first, last, out)
    finally:
        prometheus.close()
    print(f"wrote {out}")


def draw(dashboard, prometheus, first, last, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    panels = []
    for p in dashboard["panels"]:
        panels.append(p)
        panels.extend(p.get("panels", []))
    height_units = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_px, width_px, dpi = 30, 1600, 100
    fig = plt.figure(figsize=(width_px / dpi, (height_units * unit_px + 40) / dpi), dpi=dpi, facecolor=BG)
    H = height_units * unit_px + 40
    t0 = first
    start = datetime.fromtimestamp(t0, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    fig.text(0.01, 1 - 18 / H, f"{dashboard['title']}", color=TEXT, fontsize=13, weight="bold", va="center")
    fig.text(0.99, 1 - 18 / H, f"Prometheus, scraping every 1 s, from {start} for {last - first:.0f} s; rates over {RATE_INTERVAL}",
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
            series = prometheus.query_range(target["expr"], first, last)
            for labels, xs, ys in sorted(series, key=lambda s: sorted(s[0].items())):
                results.append((legend(target.get("legendFormat"), labels, target["expr"]), xs, ys))
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        if p["type"] == "state-timeline":
            draw_state_timeline(ax, p, results, t0)
        else:
            draw_timeseries(ax, p, results, t0, unit)
        ax.set_xlim(0, last - t0)
        ax.xaxis.set_major_formatter(FuncFormatter(
            lambda v, _: datetime.fromtimestamp(t0 + v, timezone.utc).strftime("%H:%M:%S")))
        ax.xaxis.set_major_locator(matplotlib.ticker.MultipleLocator(30))
    fig.savefig(out, facecolor=BG, dpi=dpi)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    render(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else ROOT / "deploy/grafana/walbox.json")
