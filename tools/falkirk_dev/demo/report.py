"""The demo's report: charts (SVG) and the HTML page (Jinja2 templates beside this)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any


def throughput_per_epoch(run) -> dict[str, list[tuple[int, float]]]:
    """Per region: (epoch, records read per second) from the epoch log's rows."""
    out: dict[str, list[tuple[int, float]]] = {}
    started: dict[tuple[str, str], object] = {}
    for r in run.log.records(run.pipeline.name):
        key = (r.region, json.dumps(r.time))
        if r.status == "running":
            started[key] = r.recorded_at
        elif r.status in ("committed", "checkpointed") and key in started:
            seconds = (r.recorded_at - started[key]).total_seconds()
            records = sum(sum(v["to"].values()) - sum(v["from"].values())
                          for v in (r.inputs or {}).values() if "to" in v)
            if records and seconds > 0:
                out.setdefault(r.region, []).append((r.epoch, records / seconds))
    return out


def throughput_svg(series: dict[str, list[tuple[int, float]]], title: str) -> str:
    """A small line chart: records/s per epoch, one line per region."""
    from falkirk_dev.plot import lines_svg

    if not any(series.values()):
        return "<p>no epoch read input records</p>"
    epochs = sorted({e for pts in series.values() for e, _ in pts})
    return lines_svg(title, "epoch", "records/s",
                     {r: sorted(pts) for r, pts in sorted(series.items())},
                     x_ticks=list(range(epochs[0], epochs[-1] + 1)), width=560, height=240)


def progress_over_time(run) -> tuple[dict[str, list[tuple[float, int]]], Any]:
    """Per region: (seconds since the first epoch started, epochs done) at each change, from
    the epoch log: a commit moves a region on, a rollback's invalidations take it back."""
    records = run.log.records(run.pipeline.name)
    if not records:
        return {}, None
    t0 = records[0].recorded_at
    done: dict[str, dict[int, bool]] = {}
    out: dict[str, list[tuple[float, int]]] = {}
    for r in records:
        epochs = done.setdefault(r.region, {})
        if r.status in ("committed", "checkpointed"):
            epochs[r.epoch] = True
        elif r.status in ("invalidated", "quarantined"):
            epochs.pop(r.epoch, None)
        else:
            continue
        n = 0
        while epochs.get(n):
            n += 1
        series = out.setdefault(r.region, [(0.0, 0)])
        if series[-1][1] != n:
            series.append(((r.recorded_at - t0).total_seconds(), n))
    return out, t0


def progress_svg(series: dict[str, list[tuple[float, int]]], epochs: int,
                 marks: list[tuple[float, str]], title: str) -> str:
    """Epochs done per region over time (a step line each), with vertical marks."""
    colours = {"ingest": "#2563eb", "popularity": "#d97706", "communities": "#059669",
               "serve": "#7c3aed", "stats": "#dc2626"}
    if not series:
        return "<p>no epoch was committed</p>"
    w, h, m, right = 640, 260, 48, 110
    end = max([t for s in series.values() for t, _ in s] + [t for t, _ in marks]) or 1.0

    def xy(t: float, n: float) -> tuple[float, float]:
        return m + (w - m - right) * t / end, h - m - (h - 2 * m) * n / epochs

    e = html.escape
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'font-family="sans-serif" font-size="11">',
             f'<text x="{m}" y="16" font-size="13">{e(title)}</text>',
             f'<line x1="{m}" y1="{h - m}" x2="{w - right}" y2="{h - m}" stroke="#333"/>',
             f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="#333"/>',
             f'<text x="{(w - right + m) / 2}" y="{h - 12}" text-anchor="middle">seconds '
             f'since the first epoch started</text>']
    for n in range(epochs + 1):
        _, y = xy(0, n)
        parts.append(f'<text x="{m - 6}" y="{y + 4:.1f}" text-anchor="end">{n}</text>')
    step = max(60, round(end / 6 / 60) * 60)
    for t in range(0, int(end) + 1, step):
        x, _ = xy(t, 0)
        parts.append(f'<text x="{x:.1f}" y="{h - m + 14}" text-anchor="middle">{t}</text>')
    for t, label in marks:
        x, _ = xy(t, 0)
        parts.append(f'<line x1="{x:.1f}" y1="{m - 6}" x2="{x:.1f}" y2="{h - m}" '
                     f'stroke="#dc2626" stroke-dasharray="4 3"/>'
                     f'<text x="{x + 3:.1f}" y="{m - 8}" fill="#dc2626">{e(label)}</text>')
    parts.append(f'<text x="{m - 30}" y="{m - 12}">epochs done</text>')
    same: dict[str, list[str]] = {}  # regions of one job move together: one line, one label
    for region, pts in series.items():
        twin = next((k for k in same if [(round(t), n) for t, n in series[k]]
                     == [(round(t), n) for t, n in pts]), None)
        same.setdefault(twin or region, []).extend([] if twin is None else [region])
    for i, (region, pts) in enumerate((k, series[k]) for k in same):
        c = colours.get(region, "#475569")
        steps = []
        for j, (t, n) in enumerate(pts):
            if j:
                steps.append(xy(t, pts[j - 1][1]))
            steps.append(xy(t, n))
        steps.append(xy(end, pts[-1][1]))
        line = " ".join(f"{x:.1f},{y:.1f}" for x, y in steps)
        parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" '
                     f'stroke-opacity="0.85" points="{line}"/>')
        parts.append(f'<text x="{w - right + 8}" y="{m + 14 * i}" fill="{c}">'
                     f'{e(", ".join([region, *same[region]]))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def checks_summary(rows: list[dict]) -> list[dict]:
    """The ``checks`` table per (region, epoch, generation): checks run, passed, failed
    (the latest result of each check counts), the failing checks' names."""
    latest: dict[tuple[str, int, int], dict[str, bool]] = {}
    tables: dict[tuple[str, int, int], set[str]] = {}
    for r in rows:
        key = (r["region"], r["epoch"], r["generation"])
        latest.setdefault(key, {})[r["check"]] = r["success"]
        tables.setdefault(key, set()).add(r["table"])
    out = []
    for (region, epoch, generation), checks in sorted(latest.items()):
        failed = sorted(c for c, ok in checks.items() if not ok)
        out.append({"region": region, "epoch": epoch, "generation": generation,
                    "tables": sorted(tables[(region, epoch, generation)]),
                    "checks": len(checks), "passed": len(checks) - len(failed),
                    "failed": failed})
    return out


def report_html(pipeline, plan: dict, comparison: dict, series: dict, timings: dict,
                golden_note: str = "", airflow: dict | None = None,
                checks: dict | None = None, progress: str = "",
                sent: dict | None = None) -> str:
    """The report page (templates/report.html.j2; values are escaped, the charts and the
    plan come as HTML already)."""
    import jinja2

    from falkirk.airflow.render import plan_html

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=True, trim_blocks=True, lstrip_blocks=True,
        undefined=jinja2.StrictUndefined)
    lost = sum(v["lost"] for v in comparison.values())
    dup = sum(v["duplicated"] for v in comparison.values())
    docs = (checks or {}).get("data_docs")
    return env.get_template("report.html.j2").render(
        pipeline=pipeline.name, airflow=airflow, lost=lost, duplicated=dup,
        verdict=("every output equals the failure-free run" if lost == dup == 0
                 else f"{lost} row(s) lost, {dup} duplicated"),
        plan_html=plan_html(plan, pipeline),
        throughput_svg=throughput_svg(
            series, "input records per second per epoch (regions reading a topic)"),
        progress=progress, checks=checks, docs_uri=Path(docs).as_uri() if docs else "",
        golden_note=golden_note, comparison=comparison, sent=sent or {}, timings=timings)
