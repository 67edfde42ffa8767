"""Write reports: JSON, Markdown and one self-contained HTML page (plot embedded as PNG)."""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass
from pathlib import Path

from pipeline.ioutil import json_bytes, write_files_atomic


def json_safe(obj: object) -> object:
    """Non-finite floats become the strings "inf", "-inf", "nan" (strict JSON has no such numbers)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


@dataclass(frozen=True)
class Flagged:
    """A table cell to draw the eye to (an outlier): bold in Markdown, highlighted in HTML."""

    value: object


def fmt(x: object) -> str:
    if isinstance(x, Flagged):
        return fmt(x.value)
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(h.replace("|", "\\|") for h in headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        lines.append("| " + " | ".join(_markdown_cell(c) for c in row) + " |")
    return "\n".join(lines)


def _markdown_cell(c: object) -> str:
    text = fmt(c).replace("|", "\\|")
    return f"**{text}**" if isinstance(c, Flagged) else text


def html_table(headers: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=flag' if isinstance(c, Flagged) else ''}>{html.escape(fmt(c))}</td>"
                         for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_CSS = (
    "body{font-family:sans-serif;margin:2em;max-width:80em}"
    "table{border-collapse:collapse;font-size:0.85em}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}"
    ".pass{color:#070}.fail{color:#b00}.flag{background:#fdd;font-weight:bold}"
)


def html_page(title: str, sections: list[str]) -> str:
    """A complete page with no outside references (styles inline, images as data: URLs)."""
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{''.join(sections)}</body></html>\n"
    )


def png_img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{data}'>"


def error_plot(labels: list[str], series: dict[str, list[float | None]], title: str,
               inputs: dict[str, list[float | None]] | None = None, threshold: float | None = None) -> bytes:
    """A PNG of per-LayerNorm errors (log scale), one line of markers per series; with
    `inputs`, a panel below on the same x axis of input statistics (in standard deviations,
    log scale), `threshold` drawn across it."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render to memory
    import matplotlib.pyplot as plt

    width = max(6.0, 0.12 * len(labels) + 4) + 3.0  # the legends sit right of the axes
    if inputs is None:
        fig, ax = plt.subplots(figsize=(width, 4), dpi=100)
        axes = [ax]
    else:
        fig, axes = plt.subplots(2, 1, sharex=True, figsize=(width, 6.5), dpi=100, height_ratios=(3, 2))
        ax = axes[0]
    x = list(range(len(labels)))
    # Zero values cannot sit on a log axis; show them at the axis floor.
    _markers(ax, x, series, floor=1e-12)
    ax.set_yscale("log")
    ax.set_ylabel("max abs error")
    ax.set_title(title)
    if inputs is not None:
        below = axes[1]
        _markers(below, x, inputs, floor=1e-2)
        if threshold is not None:
            below.axhline(threshold, color="#b00", linestyle="--", linewidth=1, label=f"outlier ({threshold:g} std)")
        below.set_yscale("log")
        below.set_ylabel("input rows, in std")
    axes[-1].set_xlabel("LayerNorm (execution order)")
    for a in axes:
        a.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
        a.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _markers(ax, x: list[int], series: dict[str, list[float | None]], floor: float) -> None:
    for (name, values), marker in zip(series.items(), "os^vD"):
        ys = [math.nan if v is None else max(v, floor) for v in values]
        ax.plot(x, ys, marker=marker, linestyle="none", markersize=4, label=name)


def write_report(out_dir: str | Path, stem: str, data: dict, markdown: str, page: str) -> list[Path]:
    """Write STEM.json, STEM.md and STEM.html under `out_dir` as a set: all three are written
    in full before any takes its name, so a failure (a full disk) leaves the previous set."""
    out = Path(out_dir)
    paths = [out / f"{stem}.json", out / f"{stem}.md", out / f"{stem}.html"]
    write_files_atomic([(paths[0], json_bytes(json_safe(data)), None), (paths[1], markdown.encode(), None),
                        (paths[2], page.encode("utf-8"), None)])
    return paths
