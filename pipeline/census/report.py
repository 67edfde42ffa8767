"""The census report: counts by status and stage, failures grouped by cause (ours or not), norms by
kind, time, and a row per architecture; census.json, census.md and census.html."""

from __future__ import annotations

import platform
import re
from collections import Counter
from importlib import metadata
from pathlib import Path

from pipeline.census.stages import OUR_STAGES, STAGES
from pipeline.evaluation.report import Flagged, html_page, html_table, markdown_table, write_report

STEM = "census"
SLOWEST = 10
_CAUSE_CHARS = 160


def _versions() -> dict[str, str]:
    versions = {}
    for package in ("torch", "executorch", "transformers", "wgpu"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def _passed(record: dict, stage: str) -> bool:
    return record.get("stages", {}).get(stage, {}).get("status") in ("ok", "skipped")


def _cause_key(cause: str) -> str:
    """Causes that differ only in numbers and names in quotes are one cause."""
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'", "'…'", cause))[:_CAUSE_CHARS]


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def worst_share(record: dict) -> float | None:
    """The largest share of the accuracy rule's limit an output's error takes (1 is the limit)."""
    shares = [_number(row["max_abs"]) / _number(row["limit"]) for row in record.get("accuracy") or []
              if _number(row.get("max_abs")) is not None and _number(row.get("limit"))]
    return max(shares) if shares else None


def summarize(records: list[dict], population: int, jobs: int, ray: str | None, wall_seconds: float,
              ran: int) -> dict:
    """What census.json holds: the counts, the causes, the time, and every record."""
    failed = [r for r in records if r["status"] != "ok"]
    causes: dict[tuple, dict] = {}
    for r in failed:
        key = (r["failed_stage"], r["status"], _cause_key(r["cause"] or ""))
        entry = causes.setdefault(key, {"stage": r["failed_stage"], "status": r["status"], "ours": bool(r["ours"]),
                                        "cause": r["cause"], "count": 0, "architectures": []})
        entry["count"] += 1
        entry["architectures"].append(r["name"])
    norms: dict[str, dict[str, int]] = {}
    for r in records:
        for kind, counts in (r.get("coverage") or {}).get("by_kind", {}).items():
            total = norms.setdefault(kind, {"architectures": 0, "eager": 0, "graph": 0, "delegated": 0})
            total["architectures"] += 1
            for key in ("eager", "graph", "delegated"):
                total[key] += counts.get(key, 0)
    seconds = sorted(((r.get("seconds") or 0.0, r["name"]) for r in records), reverse=True)
    skipped = Counter(stage for r in records for stage, e in r.get("stages", {}).items() if e["status"] == "skipped")
    return {
        "population": population,
        "recorded": len(records),
        "status": dict(Counter(r["status"] for r in records)),
        "reached": {stage: sum(_passed(r, stage) for r in records) for stage in STAGES},
        "failed_at": {stage: sum(r["failed_stage"] == stage for r in failed) for stage in STAGES},
        "skipped": dict(skipped),
        "ours": sum(bool(r["ours"]) for r in failed),
        "not_ours": sum(not r["ours"] for r in failed),
        "our_stages": list(OUR_STAGES),
        "causes": sorted(causes.values(), key=lambda c: (STAGES.index(c["stage"]) if c["stage"] in STAGES else -1,
                                                         -c["count"])),
        "norms": norms,
        "time": {"architecture_seconds": round(sum(s for s, _ in seconds), 1), "wall_seconds": round(wall_seconds, 1),
                 "rows_this_run": ran, "jobs": jobs, "ray": ray,
                 "slowest": [{"name": n, "seconds": s} for s, n in seconds[:SLOWEST]]},
        "peak_rss_mb": max((r.get("peak_rss_mb") or 0.0 for r in records), default=0.0),
        "environment": {"machine": platform.machine(), "python": platform.python_version(), "versions": _versions()},
        "architectures": records,
    }


def _summary_lines(data: dict) -> list[str]:
    status = ", ".join(f"{k} {v}" for k, v in sorted(data["status"].items()))
    t = data["time"]
    where = f"Ray {t['ray']}" if t["ray"] else f"{t['jobs']} local job(s)"
    versions = ", ".join(f"{k} {v}" for k, v in data["environment"]["versions"].items())
    return [
        f"population: {data['population']} rows, {data['recorded']} recorded ({status})",
        f"failures in our stages ({', '.join(data['our_stages'])}): {data['ours']}; not ours: {data['not_ours']}",
        f"time: {t['architecture_seconds']} s over all rows; this run {t['rows_this_run']} rows in "
        f"{t['wall_seconds']} s wall on {where}",
        f"peak RSS of a worker: {data['peak_rss_mb']:.0f} MB",
        f"versions: {versions}",
    ]


_STAGE_HEADERS = ["stage", "reached", "failed here", "skipped", "whose"]


def _stage_rows(data: dict) -> list[list[object]]:
    # Flagged where a failure there is ours (an accuracy failure export shares is not).
    ours = {c["stage"] for c in data["causes"] if c["ours"]}
    return [[s, data["reached"][s], Flagged(data["failed_at"][s]) if s in ours else data["failed_at"][s],
             data["skipped"].get(s, 0), "ours" if s in OUR_STAGES else "not ours"]
            for s in STAGES]


_CAUSE_HEADERS = ["stage", "status", "whose", "rows", "cause (first of them)", "architectures"]


def _cause_rows(data: dict) -> list[list[object]]:
    return [[c["stage"], c["status"], Flagged("ours") if c["ours"] else "not ours", c["count"], c["cause"],
             ", ".join(c["architectures"])] for c in data["causes"]]


_NORM_HEADERS = ["kind", "architectures", "eager calls", "graph ops", "delegated"]


def _norm_rows(data: dict) -> list[list[object]]:
    return [[kind, n["architectures"], n["eager"], n["graph"], n["delegated"]]
            for kind, n in sorted(data["norms"].items())]


_ROW_HEADERS = ["architecture", "status", "reached", "failed at", "whose", "norms delegated", "by kind",
                "error / limit (worst output)", "seconds", "peak RSS MB", "cause"]


def _architecture_rows(data: dict) -> list[list[object]]:
    rows = []
    for r in data["architectures"]:
        coverage = r.get("coverage")
        kinds = ", ".join(f"{k} {v['delegated']}/{v['graph']}" for k, v in sorted((coverage or {}).get("by_kind", {})
                                                                                  .items()))
        whose = None if r["status"] == "ok" else (Flagged("ours") if r["ours"] else "not ours")
        rows.append([r["name"], r["status"], r.get("reached"), r.get("failed_stage"), whose,
                     f"{coverage['delegated']}/{coverage['total']}" if coverage else None, kinds or None,
                     worst_share(r), _number(r.get("seconds")), _number(r.get("peak_rss_mb")), r.get("cause")])
    return rows


def census_markdown(data: dict) -> str:
    parts = ["# Census of the installed transformers", ""]
    parts += [f"- {line}" for line in _summary_lines(data)]
    parts += ["", "## Stages", "", markdown_table(_STAGE_HEADERS, _stage_rows(data))]
    parts += ["", "## Failures by cause", "", markdown_table(_CAUSE_HEADERS, _cause_rows(data))]
    parts += ["", "## Norms by kind", "", markdown_table(_NORM_HEADERS, _norm_rows(data))]
    parts += ["", "## Architectures", "", markdown_table(_ROW_HEADERS, _architecture_rows(data)), ""]
    return "\n".join(parts)


def census_html(data: dict) -> str:
    import html

    items = "".join(f"<li>{html.escape(line)}</li>" for line in _summary_lines(data))
    verdict = "pass" if not data["ours"] else "fail"
    return html_page("Census of the installed transformers", [
        f"<ul class='{verdict}'>{items}</ul>",
        "<h2>Stages</h2>", html_table(_STAGE_HEADERS, _stage_rows(data)),
        "<h2>Failures by cause</h2>", html_table(_CAUSE_HEADERS, _cause_rows(data)),
        "<h2>Norms by kind</h2>", html_table(_NORM_HEADERS, _norm_rows(data)),
        "<h2>Architectures</h2>", html_table(_ROW_HEADERS, _architecture_rows(data)),
    ])


def write_census_report(out_dir: str | Path, records: list[dict], population: int, jobs: int, ray: str | None,
                        wall_seconds: float, ran: int) -> list[Path]:
    """census.json, census.md and census.html under `out_dir`, written as a set."""
    data = summarize(records, population, jobs, ray, wall_seconds, ran)
    return write_report(out_dir, STEM, data, census_markdown(data), census_html(data))
