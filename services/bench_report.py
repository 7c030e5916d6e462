"""How a bench reads: the terminal tables and the self-contained report.html with its inline SVG plots."""

from __future__ import annotations

import html
import math
from importlib import resources
from typing import Any

import jinja2
from markupsafe import Markup
from rich.console import Console
from rich.table import Table

from stitchcuda.bench import BASELINES, FAST_P, fast_p, speedup

COLORS = {"eager": "#4b6cf0", "compile": "#e0793a"}
LABELS = {"eager": "vs eager", "compile": "vs torch.compile"}
# Speedup bins of the distribution plot: [low, high) edges, read as people do around 1x.
BINS = (0.0, 0.5, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, math.inf)


def _x(value: Any) -> str:
    return f"{value:.2f}x" if value else "-"


def _pct(value: Any) -> str:
    return f"{100 * value:.0f}%" if value is not None else "-"


def print_table(data: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"StitchCUDA bench {data['suite']} on {data['settings']['device']}")
    for col in (
        "level",
        "problem",
        "verified",
        "vs eager",
        "vs compile",
        "custom",
        "library",
        "rounds",
        "wall",
    ):
        table.add_column(col)
    table.add_column("reason", overflow="fold")
    for r in data["rows"]:
        table.add_row(
            r["level"], r["problem"], "yes" if r["verified"] else "no", _x(r["speedup_vs_eager"]),
            _x(r["speedup_vs_compile"]), _pct(r["custom_share"]), _pct(r["library_share"]), str(r["rounds"]),
            f"{r['wall_s']:.0f}s", (r["error_code"] + ": " if r["error_code"] else "") + r["reason"][:80],
        )  # fmt: skip
    console.print(table)
    summary = Table(
        title="per level (fast_p: share of all problems verified and faster than p x the baseline)"
    )
    summary.add_column("level")
    summary.add_column("verified")
    for b in BASELINES:
        for p in FAST_P[1:]:
            summary.add_column(f"{b} fast_{p:g}")
        summary.add_column(f"geomean {b}")
    groups = {**data["summary"]["levels"], "overall": data["summary"]["overall"]}
    for name, s in groups.items():
        cells = [name, f"{s['verified']}/{s['problems']}"]
        for b in BASELINES:
            cells += [_pct(s["fast_p"][b][f"{p:g}"]) for p in FAST_P[1:]] + [_x(s[f"geomean_vs_{b}"])]
        summary.add_row(*cells)
    console.print(summary)


# -- plots ---------------------------------------------------------------------------------------------------

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 640, 260, 48, 16, 16, 44


def _svg(body: list[str], title: str) -> Markup:
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
        f'role="img" aria-label="{html.escape(title)}" font-family="system-ui, sans-serif" font-size="11">'
    )
    return Markup(head + "".join(body) + "</svg>")  # every piece is numbers or escaped text


def _legend(x: float) -> list[str]:
    out = []
    for i, b in enumerate(BASELINES):
        y = PAD_T + 4 + 16 * i
        out.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{COLORS[b]}"/>')
        out.append(f'<text x="{x + 14}" y="{y + 9}">{html.escape(LABELS[b])}</text>')
    return out


def _axes(y_max: float, y_label: str, ticks: int = 4) -> list[str]:
    plot_h = H - PAD_T - PAD_B
    out = [f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" stroke="#667"/>']
    for i in range(ticks + 1):
        value = y_max * i / ticks
        y = H - PAD_B - plot_h * i / ticks
        out.append(f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" stroke="#eef"/>')
        label = f"{value:.0%}" if y_label == "share" else f"{value:g}"
        out.append(f'<text x="{PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    out.append(
        f'<text x="12" y="{PAD_T + plot_h / 2}" transform="rotate(-90 12 {PAD_T + plot_h / 2})" '
        f'text-anchor="middle">{html.escape(y_label)}</text>'
    )
    return out


def distribution_svg(rows: list[dict[str, Any]]) -> Markup:
    """How many verified problems fall in each speedup bin, per baseline (grouped bars)."""
    counts = {b: [0] * (len(BINS) - 1) for b in BASELINES}
    for r in rows:
        for b in BASELINES:
            value = speedup(r, b)
            if r.get("verified") and value > 0:
                counts[b][next(i for i in range(len(BINS) - 1) if value < BINS[i + 1])] += 1
    y_max = max(1, *(max(c) for c in counts.values()))
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    slot = plot_w / (len(BINS) - 1)
    bar = slot * 0.8 / len(BASELINES)
    body = _axes(y_max, "problems", ticks=min(4, y_max))
    for i in range(len(BINS) - 1):
        lo, hi = BINS[i], BINS[i + 1]
        label = f"≥{lo:g}x" if math.isinf(hi) else f"<{hi:g}x" if lo == 0 else f"{lo:g}-{hi:g}x"
        x0 = PAD_L + slot * i
        body.append(f'<text x="{x0 + slot / 2:.1f}" y="{H - PAD_B + 16}" text-anchor="middle">{label}</text>')
        for j, b in enumerate(BASELINES):
            n = counts[b][i]
            h = plot_h * n / y_max
            x = x0 + slot * 0.1 + bar * j
            body.append(
                f'<rect class="bar-{b}" x="{x:.1f}" y="{H - PAD_B - h:.1f}" width="{bar:.1f}" '
                f'height="{h:.1f}" '
                f'fill="{COLORS[b]}"><title>{html.escape(LABELS[b])} {label}: {n}</title></rect>'
            )
    body.append(f'<text x="{PAD_L + plot_w / 2}" y="{H - 8}" text-anchor="middle">speedup</text>')
    return _svg([*body, *_legend(W - PAD_R - 130)], "speedup distribution of verified problems")


def fast_p_svg(rows: list[dict[str, Any]], p_max: float = 3.0, steps: int = 60) -> Markup:
    """fast_p as p sweeps 0..p_max, one curve per baseline; dots at the reported thresholds."""
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_T - PAD_B

    def point(p: float, value: float) -> tuple[float, float]:
        return PAD_L + plot_w * p / p_max, H - PAD_B - plot_h * value

    body = _axes(1.0, "share")
    for i in range(int(p_max) + 1):
        x, _ = point(i, 0)
        body.append(f'<text x="{x:.1f}" y="{H - PAD_B + 16}" text-anchor="middle">{i}</text>')
    for b in BASELINES:
        pts = [point(p_max * k / steps, fast_p(rows, b, p_max * k / steps)) for k in range(steps + 1)]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        body.append(
            f'<polyline class="curve-{b}" points="{path}" fill="none" stroke="{COLORS[b]}" stroke-width="2"/>'
        )
        for p in FAST_P:
            value = fast_p(rows, b, p)
            x, y = point(p, value)
            body.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{COLORS[b]}">'
                f"<title>fast_{p:g} {html.escape(LABELS[b])}: {value:.0%}</title></circle>"
            )
    body.append(
        f'<text x="{PAD_L + plot_w / 2}" y="{H - 8}" text-anchor="middle">p (speedup threshold)</text>'
    )
    return _svg([*body, *_legend(W - PAD_R - 130)], "fast_p curves")


def to_html(data: dict[str, Any]) -> str:
    # The template is package data of stitchcuda.shared (setup.py ships *.j2), found where it is installed.
    template = resources.files("stitchcuda.shared").joinpath("templates/bench.html.j2").read_text()
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["x"] = _x
    env.filters["pct"] = _pct
    return env.from_string(template).render(
        d=data,
        fast_p=FAST_P,
        baselines=BASELINES,
        labels=LABELS,
        distribution=distribution_svg(data["rows"]),
        curves=fast_p_svg(data["rows"]),
    )
