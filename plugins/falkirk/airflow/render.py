"""A rollback plan for people: a table (Markdown or HTML) and the region graph as SVG.

Pure functions of a plan's JSON (``RollbackPlan.to_json()``) and the pipeline, with no
Airflow, matplotlib or graphviz, so the Airflow plan page, the task logs and the demo
report draw the same picture anywhere.
"""

from __future__ import annotations

import html
import json
from typing import Any

from falkirk.times import DOMAINS
from falkirk.topology import Pipeline

# One colour per regime (fill, text); the legend explains them.
REGIME_COLOURS: dict[str, str] = {
    "ephemeral": "#dbeafe",
    "batch": "#fef3c7",
    "lazy": "#dcfce7",
    "eager": "#f3e8ff",
}
AFFECTED_STROKE = "#dc2626"
KEPT_STROKE = "#475569"


def describe(pipeline: Pipeline, region: str, value: Any) -> str:
    """A JSON time of ``region`` in words (⊤, ⊥, epoch 4, epoch 4 iteration 2)."""
    if value is None:
        return "nothing yet"
    dom = DOMAINS[pipeline.regions[region].domain]
    key = dom.parse(value)
    if key == dom.top:
        return "⊤ keeps its live state"
    if key == dom.bottom:
        return "⊥ before epoch 0"
    if isinstance(value, list):
        epoch, iteration = value
        return f"epoch {epoch} (converged)" if iteration == "inf" else \
            f"epoch {epoch} iteration {iteration}"
    return f"epoch {dom.describe(key)}"


def plan_rows(plan: dict, pipeline: Pipeline) -> list[dict[str, str]]:
    """One row per region, in declaration order: what it is, where it is, where it goes."""
    reruns = {r["region"]: r for r in plan.get("rerun", [])}
    rows = []
    for name, spec in pipeline.regions.items():
        frontier = plan["frontiers"].get(name, "top")
        if frontier == "top":
            action = "keeps running"
        elif name in reruns:
            action = "restores and reruns"
        else:
            action = "restores"
        rows.append({
            "region": name, "regime": spec.regime, "job": spec.job or "",
            "current": describe(pipeline, name, plan["current"].get(name)),
            "frontier": describe(pipeline, name, frontier), "action": action,
        })
    return rows


def _t(value: Any) -> str:
    """A JSON time as the CLI prints it ("top", -1, 4, [4, "inf"])."""
    return json.dumps(value)


def _request_line(plan: dict) -> str:
    req = plan.get("request", {})
    what = (f"take {req.get('region')} back to epoch {req.get('to_epoch')}"
            if req.get("region") else f"failed: {', '.join(req.get('failed') or []) or '—'}")
    mode = "dry run: nothing changed" if req.get("dry_run") else "carried out"
    return f"{what}; reason: {req.get('reason') or '—'} ({mode})"


def plan_markdown(plan: dict, pipeline: Pipeline) -> str:
    """The plan as a Markdown table plus the restores, replays and reruns it implies."""
    out = [f"### Rollback {plan['rollback_id']} of `{plan['pipeline']}` → generation "
           f"{plan['generation']}", "", _request_line(plan), "",
           "| region | regime | current | frontier | action |",
           "| --- | --- | --- | --- | --- |"]
    out += [f"| {r['region']} | {r['regime']} | {r['current']} | {r['frontier']} | "
            f"{r['action']} |" for r in plan_rows(plan, pipeline)]
    out.append("")
    out += [f"- restore table `{t['table']}` to version {t['to_version']} ({t['region']})"
            for t in plan.get("tables", [])]
    out += [f"- replay `{r['edge']}` after {_t(r['after'])} through {_t(r['through'])}"
            for r in plan.get("replay", [])]
    out += [f"- rerun {r['region']} after {_t(r['after'])}"
            + (f" through {_t(r['through'])}" if r.get("through") is not None else "")
            for r in plan.get("rerun", [])]
    if not plan.get("tables") and not plan.get("replay") and not plan.get("rerun"):
        out.append("- nothing to roll back: every region keeps its live state")
    return "\n".join(out) + "\n"


def plan_html(plan: dict, pipeline: Pipeline) -> str:
    """The plan as an HTML fragment: the same table, then the region graph."""
    e = html.escape
    head = "".join(f"<th>{c}</th>" for c in ("region", "regime", "current", "frontier",
                                               "action"))
    body = "".join(
        "<tr>" + "".join(f"<td>{e(r[c])}</td>" for c in ("region", "regime", "current",
                                                          "frontier", "action")) + "</tr>"
        for r in plan_rows(plan, pipeline))
    steps = [f"restore table <code>{e(t['table'])}</code> to version {t['to_version']} "
             f"({e(t['region'])})" for t in plan.get("tables", [])]
    steps += [f"replay <code>{e(r['edge'])}</code> after {e(_t(r['after']))} through "
              f"{e(_t(r['through']))}" for r in plan.get("replay", [])]
    steps += [f"rerun {e(r['region'])} after {e(_t(r['after']))}" for r in plan.get("rerun", [])]
    items = "".join(f"<li>{s}</li>" for s in steps) or \
        "<li>nothing to roll back: every region keeps its live state</li>"
    return (f"<h2>Rollback {e(plan['rollback_id'])} of <code>{e(plan['pipeline'])}</code> → "
            f"generation {plan['generation']}</h2><p>{e(_request_line(plan))}</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f"<ul>{items}</ul>"
            + region_graph_svg(pipeline, plan["frontiers"], plan["current"]))


# ---- the region graph ------------------------------------------------------------------

def _layers(pipeline: Pipeline) -> dict[str, int]:
    """Column of each region: longest path from a source (cycles end at iterating regions)."""
    layer = {r: 0 for r in pipeline.regions}
    edges = [(e.src, e.dst) for e in pipeline.edges.values()
             if e.src and e.dst and e.src != e.dst and not pipeline.regions[e.dst].iterating]
    for _ in range(len(layer)):
        changed = False
        for src, dst in edges:
            if layer[dst] < layer[src] + 1:
                layer[dst] = layer[src] + 1
                changed = True
        if not changed:
            break
    return layer


def region_graph_svg(pipeline: Pipeline, frontiers: dict[str, Any] | None = None,
                     current: dict[str, Any] | None = None) -> str:
    """The region graph, coloured by regime; an affected region is outlined in red and
    shows where it is and the frontier it restores to. Plain SVG, no dependencies."""
    e = html.escape
    frontiers = frontiers or {}
    current = current or {}
    layer = _layers(pipeline)
    inputs = [x for x in pipeline.edges.values() if x.src is None and x.dst]
    columns: dict[int, list[str]] = {}
    for name in pipeline.regions:
        columns.setdefault(layer[name] + 1, []).append(name)
    w, h, gap_x, gap_y, margin = 200, 74, 70, 28, 20
    pos: dict[str, tuple[float, float]] = {}
    for col, names in columns.items():
        for i, name in enumerate(names):
            pos[name] = (margin + col * (w + gap_x), margin + 30 + i * (h + gap_y))
    for i, edge in enumerate(inputs):  # outside inputs in column 0, one row each
        pos[f"input:{edge.name}"] = (margin, margin + 30 + i * (h + gap_y))
    n_cols = max(columns) + 1
    rows = max(len(inputs), *(len(v) for v in columns.values()))
    width = margin * 2 + n_cols * w + (n_cols - 1) * gap_x
    height = margin * 2 + 30 + rows * (h + gap_y) + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" '
             'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
             '<path d="M 0 0 L 10 5 L 0 10 z" fill="#64748b"/></marker></defs>',
             f'<text x="{margin}" y="{margin + 6}" font-size="14" font-weight="bold">'
             f'pipeline {e(pipeline.name)}: regions by regime, frontiers of the plan</text>']

    def box(name: str) -> tuple[float, float, float]:
        x, y = pos[name]
        return x, y, (w if not name.startswith("input:") else w * 0.7)

    for edge in pipeline.edges.values():  # edges first: boxes paint over their ends
        src = edge.src or (f"input:{edge.name}" if edge.dst else None)
        if src is None or edge.dst is None or src == edge.dst:
            continue
        sx, sy, sw = box(src)
        dx, dy, _ = box(edge.dst)
        x1, y1, x2, y2 = sx + sw, sy + h / 2, dx, dy + h / 2
        if x2 <= x1:  # back edge into an iterating region: route over the top
            mid = min(sy, dy) - 14
            path = f"M {x1} {y1} C {x1 + 40} {mid} {x2 - 40} {mid} {x2} {y2}"
        elif edge.src is None and x2 - x1 > w + gap_x:  # a topic read far right: go under
            lane = margin + 30 + rows * (h + gap_y) - gap_y + 60  # the curve dips ¾ of it
            path = f"M {x1} {y1} C {x1 + 120} {lane} {x2 - 120} {lane} {x2} {y2}"
        else:
            path = f"M {x1} {y1} C {(x1 + x2) / 2} {y1} {(x1 + x2) / 2} {y2} {x2} {y2}"
        dash = ' stroke-dasharray="5 4"' if edge.kind == "unlogged" else ""
        parts.append(f'<path d="{path}" fill="none" stroke="#64748b" stroke-width="1.3"'
                     f'{dash} marker-end="url(#arrow)"><title>{e(edge.name)} ({edge.kind})'
                     f'</title></path>')
        parts.append(f'<text x="{(x1 + x2) / 2}" y="{(y1 + y2) / 2 - 4}" font-size="10" '
                     f'fill="#475569" text-anchor="middle">{e(edge.name)}</text>')
    for edge in inputs:
        x, y, bw = box(f"input:{edge.name}")
        parts.append(f'<rect x="{x}" y="{y + 18}" width="{bw}" height="{h - 36}" rx="18" '
                     f'fill="#f1f5f9" stroke="#94a3b8"/><text x="{x + bw / 2}" y="{y + h / 2 + 4}"'
                     f' text-anchor="middle">topic {e(edge.topic or edge.name)}</text>')
    for name, spec in pipeline.regions.items():
        x, y, bw = box(name)
        f = frontiers.get(name, "top")
        affected = f != "top" and name in frontiers
        stroke, sw = (AFFECTED_STROKE, 3) if affected else (KEPT_STROKE, 1.2)
        fill = REGIME_COLOURS.get(spec.regime, "#e5e7eb")
        lines = [(f"{name}", "bold", 13), (f"{spec.regime}"
                  + (f", {spec.domain}" if spec.domain != "epoch" else ""), "normal", 11)]
        if affected:
            lines.append((f"{describe(pipeline, name, current.get(name))} → "
                          f"{describe(pipeline, name, f)}", "normal", 10))
        elif name in frontiers:
            lines.append(("⊤ keeps its live state", "normal", 10))
        parts.append(f'<rect x="{x}" y="{y}" width="{bw}" height="{h}" rx="8" fill="{fill}" '
                     f'stroke="{stroke}" stroke-width="{sw}"><title>{e(name)}</title></rect>')
        for i, (text, weight, size) in enumerate(lines):
            parts.append(f'<text x="{x + bw / 2}" y="{y + 20 + i * 18}" text-anchor="middle" '
                         f'font-weight="{weight}" font-size="{size}">{e(text)}</text>')
    ly = height - margin - 10
    lx = margin
    for regime, colour in REGIME_COLOURS.items():
        parts.append(f'<rect x="{lx}" y="{ly - 11}" width="14" height="14" fill="{colour}" '
                     f'stroke="{KEPT_STROKE}"/><text x="{lx + 20}" y="{ly}">{regime}</text>')
        lx += 110
    parts.append(f'<rect x="{lx}" y="{ly - 11}" width="14" height="14" fill="white" '
                 f'stroke="{AFFECTED_STROKE}" stroke-width="3"/><text x="{lx + 20}" y="{ly}">'
                 'rolls back (current → frontier)</text>')
    lx += 230
    parts.append(f'<path d="M {lx} {ly - 4} L {lx + 30} {ly - 4}" stroke="#64748b" '
                 f'stroke-dasharray="5 4"/><text x="{lx + 36}" y="{ly}">unlogged edge</text>')
    parts.append("</svg>")
    return "".join(parts)
