"""A rollback plan for people: a table (Markdown or HTML) and the region graph as SVG.

Pure functions of a plan's JSON (``RollbackPlan.to_json()``) and the pipeline, with no
Airflow, matplotlib or graphviz, so the Airflow plan page, the task logs and the demo
report draw the same picture anywhere.
"""

from __future__ import annotations

import html
import json
from typing import Any

from falkirk.model.times import DOMAINS
from falkirk.model.topology import Pipeline

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
        restart = plan.get("restarts_from", {}).get(name)
        if frontier == "top":
            action = "keeps running"
        elif restart is not None:  # its outputs up to the frontier stay
            action = (f"restarts from {describe(pipeline, name, restart)}, replays to its "
                      "frontier for its state" + (", reruns" if name in reruns else ""))
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

# Text widths are estimated, per character class, from DejaVu Sans: the sans-serif of
# Debian and most Linux browsers, and wider than Arial, Helvetica or Liberation Sans, so a
# box sized by this estimate holds its text in any of them.
_WIDE = frozenset("mwMW@#%&+<=>^~→⊤⊥∞…—")
_NARROW = frozenset("!'(),-./:;I[\\]fijlrt|")
_BOLD = 1.12
GRAPH_FONT = 12  # font sizes: region name 13 bold, other lines and edge labels 11
LABEL_FONT = 11

Point = tuple[float, float]
Segment = tuple[Point, Point, Point, Point]  # a cubic Bézier; a line has its controls on it
Rect = tuple[float, float, float, float]  # x, y, width, height


def text_width(text: str, size: float, bold: bool = False) -> float:
    """An upper bound of TEXT's width in pixels at font size SIZE (see _WIDE)."""
    ems = sum(0.35 if c == " " else 1.0 if c in _WIDE else 0.45 if c in _NARROW else
              0.8 if c.isupper() else 0.64 for c in text)
    return ems * size * (_BOLD if bold else 1.0)


def _layers(pipeline: Pipeline) -> dict[str, int]:
    """Column of each region: longest path from a source, without the edges that close a
    cycle (each enters an iterating region: it is what ends a loop)."""
    pairs = {(e.src, e.dst) for e in pipeline.edges.values()
             if e.src and e.dst and e.src != e.dst}
    succ: dict[str, set[str]] = {r: set() for r in pipeline.regions}
    for src, dst in pairs:
        succ[src].add(dst)

    def reaches(a: str, b: str) -> bool:
        seen, todo = {a}, [a]
        while todo:
            for m in succ[todo.pop()]:
                if m == b:
                    return True
                if m not in seen:
                    seen.add(m)
                    todo.append(m)
        return False

    edges = [(s, d) for s, d in pairs
             if not (pipeline.regions[d].iterating and reaches(d, s))]
    layer = {r: 0 for r in pipeline.regions}
    for _ in range(len(layer)):
        changed = False
        for src, dst in edges:
            if layer[dst] < layer[src] + 1:
                layer[dst] = layer[src] + 1
                changed = True
        if not changed:
            break
    return layer


def _spread(wants: list[float], step: float) -> list[float]:
    """Positions in order, at least STEP apart, as near to WANTS as can be (least squares:
    boxes that would overlap move as one block to their mean)."""
    blocks: list[tuple[float, list[int]]] = []
    for i, want in enumerate(wants):
        blocks.append((want, [i]))
        while len(blocks) > 1 and blocks[-2][0] + len(blocks[-2][1]) * step > blocks[-1][0]:
            idx = blocks[-2][1] + blocks.pop()[1]
            blocks[-1] = (sum(wants[j] - (j - idx[0]) * step for j in idx) / len(idx), idx)
    return [start + (j - idx[0]) * step for start, idx in blocks for j in idx]


def _lerp(p: Point, q: Point, t: float) -> Point:
    return p[0] + (q[0] - p[0]) * t, p[1] + (q[1] - p[1]) * t


def _line(p: Point, q: Point) -> Segment:
    return p, _lerp(p, q, 1 / 3), _lerp(p, q, 2 / 3), q


def _s_curve(p: Point, q: Point) -> Segment:
    """From a box's right side to the next column's left side: leaves and arrives level."""
    xm = (p[0] + q[0]) / 2
    return p, (xm, p[1]), (xm, q[1]), q


def _rounded(points: list[Point], r: float = 8) -> list[Segment]:
    """A polyline with its corners rounded."""
    segs: list[Segment] = []
    cur = points[0]
    for prev, corner, nxt in zip(points, points[1:], points[2:], strict=False):
        a = _lerp(corner, prev, min(0.5, r / max(1e-9, abs(corner[0] - prev[0])
                                                  + abs(corner[1] - prev[1]))))
        b = _lerp(corner, nxt, min(0.5, r / max(1e-9, abs(corner[0] - nxt[0])
                                                 + abs(corner[1] - nxt[1]))))
        segs += [_line(cur, a), (a, corner, corner, b)]
        cur = b
    return segs + [_line(cur, points[-1])]


def _at(seg: Segment, t: float) -> Point:
    (x0, y0), (x1, y1), (x2, y2), (x3, y3) = seg
    u = 1 - t
    return (u ** 3 * x0 + 3 * u * u * t * x1 + 3 * u * t * t * x2 + t ** 3 * x3,
            u ** 3 * y0 + 3 * u * u * t * y1 + 3 * u * t * t * y2 + t ** 3 * y3)


def _overlaps(a: Rect, b: Rect) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and \
        b[1] < a[1] + a[3]


def _n(v: float) -> str:
    return f"{v:.1f}".removesuffix(".0")


def region_graph_svg(pipeline: Pipeline, frontiers: dict[str, Any] | None = None,
                     current: dict[str, Any] | None = None) -> str:
    """The region graph, coloured by regime; an affected region is outlined in red and
    shows where it is and the frontier it restores to. Plain SVG, no dependencies.

    Layout: regions in columns by longest path (a topic just left of the region reading
    it); rows placed near their neighbours; boxes as wide as their longest line; an edge
    spanning columns passes between the boxes of those in between, an edge back (into an
    iterating region, closing a loop) goes round above; edges and their labels (with a
    white halo, in free space where there is some) are drawn over the boxes. The SVG
    shrinks to fit its container (max-width: 100%)."""
    e = html.escape
    frontiers = frontiers or {}
    current = current or {}

    # what each box says, and how big it is
    lines: dict[str, list[tuple[str, str, int]]] = {}
    for name, spec in pipeline.regions.items():
        f = frontiers.get(name, "top")
        lines[name] = [(name, "bold", 13), (spec.regime + (
            f", {spec.domain}" if spec.domain != "epoch" else ""), "normal", LABEL_FONT)]
        if f != "top" and name in frontiers:
            lines[name].append((f"{describe(pipeline, name, current.get(name))} → "
                                f"{describe(pipeline, name, f)}", "normal", LABEL_FONT))
        elif name in frontiers:
            lines[name].append(("⊤ keeps its live state", "normal", LABEL_FONT))
    drawn = []  # (edge, source box, destination region)
    for edge in pipeline.edges.values():
        src = edge.src or f"input:{edge.name}"
        if edge.dst is not None and src != edge.dst:
            drawn.append((edge, src, edge.dst))
            if edge.src is None:
                lines[src] = [(f"topic {edge.topic or edge.name}", "normal", GRAPH_FONT)]
    h = 20 + 18 * max(len(v) for v in lines.values())
    pill_h, gap_y, clearance = 38, 40, 12

    # columns: longest path; a topic just left of its reader; no empty column
    layer = _layers(pipeline)
    col = {name: layer[name] + 1 for name in pipeline.regions}
    for edge, src, dst in drawn:
        if edge.src is None:
            col[src] = col[dst] - 1
    renumber = {c: i for i, c in enumerate(sorted(set(col.values())))}
    col = {k: renumber[c] for k, c in col.items()}
    n_cols = len(renumber)
    columns: dict[int, list[str]] = {c: [] for c in range(n_cols)}
    for key in lines:
        columns[col[key]].append(key)
    width = {k: max(text_width(t, s, w == "bold") for t, w, s in v)
             + (32 if k.startswith("input:") else 24) for k, v in lines.items()}
    width.update({k: max(w, 150) for k, w in width.items() if not k.startswith("input:")})
    col_w = [max(width[k] for k in columns[c]) for c in range(n_cols)]

    # rows: sweeps down and up the columns, each box as near as it can be to the mean of
    # its neighbours' rows (sources, then destinations); boxes of a column never overlap
    forward = [(s, d) for _, s, d in drawn if col[d] > col[s]]
    preds = {k: [s for s, d in forward if d == k] for k in lines}
    succs = {k: [d for s, d in forward if s == k] for k in lines}
    top: dict[str, float] = {}
    for sweep in range(5):
        down = sweep % 2 == 0
        for c in range(n_cols) if down else reversed(range(n_cols)):
            wants = []
            for k in columns[c]:
                near = [top[m] for m in (preds if down else succs)[k] if m in top]
                wants.append(sum(near) / len(near) if near else top.get(k))
            order = sorted(range(len(wants)), key=lambda i: (wants[i] is None, wants[i] or 0,
                                                             i))
            columns[c] = [columns[c][i] for i in order]
            wanted: list[float] = []
            for i in order:
                wanted.append(wants[i] if wants[i] is not None else
                              (wanted[-1] + h + gap_y if wanted else 0.0))
            for k, y in zip(columns[c], _spread(wanted, h + gap_y), strict=True):
                top[k] = y

    # columns' x: a gap between two is as wide as the labels of the edges crossing it
    gap_w = [56.0] * n_cols
    for edge, s, d in drawn:
        if col[d] == col[s] + 1:
            gap_w[col[s]] = max(gap_w[col[s]], text_width(edge.name, LABEL_FONT) + 24)
    col_x = [0.0]
    for c in range(n_cols - 1):
        col_x.append(col_x[-1] + col_w[c] + gap_w[c])
    rect: dict[str, Rect] = {}
    for k, y in top.items():
        c = col[k]
        if k.startswith("input:"):  # right-aligned, a pill as tall as a line or two
            rect[k] = (col_x[c] + col_w[c] - width[k], y + (h - pill_h) / 2, width[k], pill_h)
        else:
            rect[k] = (col_x[c], y, col_w[c], h)

    # routes: ideal heights through the columns in between, moved into free space
    def center(k: str) -> float:
        return rect[k][1] + rect[k][3] / 2

    channels: dict[int, list[float]] = {c: [] for c in range(n_cols)}
    via: dict[str, list[tuple[int, float]]] = {}
    backs = []
    for edge, s, d in drawn:
        a, b = col[s], col[d]
        if b <= a:
            backs.append(edge.name)
            continue
        via[edge.name] = []
        for k in range(a + 1, b):
            ideal = center(s) + (center(d) - center(s)) * (k - a) / (b - a)
            blocked = [(rect[n][1] - clearance, rect[n][1] + rect[n][3] + clearance)
                       for n in columns[k]] + [(u - 16, u + 16) for u in channels[k]]
            free = [y for y in [ideal, *(lo for lo, _ in blocked), *(hi for _, hi in blocked)]
                    if not any(lo < y < hi for lo, hi in blocked)]
            y = min(free, key=lambda y: abs(y - ideal))
            channels[k].append(y)
            via[edge.name].append((k, y))
    highest = min([r[1] for r in rect.values()] + [y for v in channels.values() for y in v])

    # ports: a box's edges leave (right side) and arrive (left side) spread in the order
    # of where they go to or come from, so they do not cross at the box
    outs: dict[str, list[tuple[float, str]]] = {k: [] for k in lines}
    ins: dict[str, list[tuple[float, str]]] = {k: [] for k in lines}
    for edge, s, d in drawn:
        if edge.name in backs:  # goes round above
            outs[s].append((-1e9, edge.name))
            ins[d].append((-1e9, edge.name))
        else:
            hops = via[edge.name]
            outs[s].append((hops[0][1] if hops else center(d), edge.name))
            ins[d].append((hops[-1][1] if hops else center(s), edge.name))
    port: dict[tuple[str, str], float] = {}
    for side, ends in (("out", outs), ("in", ins)):
        for k, there in ends.items():
            for i, (_, name) in enumerate(sorted(there)):
                port[side, name] = rect[k][1] + rect[k][3] * (i + 1) / (len(there) + 1)

    paths: dict[str, list[Segment]] = {}
    for edge, s, d in drawn:
        start = (rect[s][0] + rect[s][2], port["out", edge.name])
        end = (rect[d][0], port["in", edge.name])
        if edge.name in backs:
            i = backs.index(edge.name)
            lane = highest - 26 - 16 * i
            xr, xl = col_x[col[s]] + col_w[col[s]] + 14 + 6 * i, col_x[col[d]] - 14 - 6 * i
            paths[edge.name] = _rounded([start, (xr, start[1]), (xr, lane), (xl, lane),
                                         (xl, end[1]), end])
            continue
        segs, cur = [], start
        for k, y in via[edge.name]:
            segs += [_s_curve(cur, (col_x[k], y)), _line((col_x[k], y),
                                                         (col_x[k] + col_w[k], y))]
            cur = (col_x[k] + col_w[k], y)
        paths[edge.name] = segs + [_s_curve(cur, end)]

    # labels: over (or on) a level stretch long enough, else along the curve, where no box
    # or other label is (edges between neighbouring columns first: they have less room)
    taken = [(x - 3, y - 3, w + 6, hh + 6) for x, y, w, hh in rect.values()]
    label_at: dict[str, Point] = {}
    for edge, *_ in sorted(drawn, key=lambda t: col[t[2]] != col[t[1]] + 1):
        lw, lh = text_width(edge.name, LABEL_FONT) + 6, 15.0
        segs = paths[edge.name]
        level = [g for g in segs
                 if abs(g[3][1] - g[0][1]) < 2 and abs(g[3][0] - g[0][0]) > lw + 8]
        level.sort(key=lambda g: abs(segs.index(g) - (len(segs) - 1) / 2))
        spots = [(x, y + dy) for x, y in (_at(g, 0.5) for g in level) for dy in (-10, 0)]
        spots += [_at(g, t) for g in segs if g not in level and g[0] != g[3]
                  for t in (0.5, 0.35, 0.65, 0.2, 0.8)]
        for x, y in spots:
            box = (x - lw / 2, y - lh / 2, lw, lh)
            if not any(_overlaps(box, t) for t in taken):
                break
        else:
            x, y = spots[0]
            box = (x - lw / 2, y - lh / 2, lw, lh)
        taken.append(box)
        label_at[edge.name] = (x, y)

    # extent of the drawing; the title above it and the legend below
    xs = [v for r in rect.values() for v in (r[0], r[0] + r[2])]
    ys = [v for r in rect.values() for v in (r[1], r[1] + r[3])]
    for segs in paths.values():
        xs += [p[0] for g in segs for p in g]
        ys += [p[1] for g in segs for p in g]
    for name, (x, y) in label_at.items():
        half = (text_width(name, LABEL_FONT) + 6) / 2
        xs += [x - half, x + half]
        ys += [y - 8, y + 8]
    margin = 20
    title = f"pipeline {pipeline.name}: regions by regime, frontiers of the plan"
    legend = [*((regime, colour, KEPT_STROKE, 1) for regime, colour in REGIME_COLOURS.items()),
              ("rolls back (current → frontier)", "white", AFFECTED_STROKE, 3),
              ("unlogged edge", None, None, 0)]
    legend_w = sum(34 + 20 + text_width(t, GRAPH_FONT) for t, *_ in legend)
    dx, dy = margin - min(xs), margin + 34 - min(ys)
    total_w = round(max(max(xs) - min(xs), legend_w, text_width(title, 14, True))
                    + 2 * margin)
    legend_y = max(ys) + dy + 36
    total_h = round(legend_y + 10 + margin)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{total_h}" '
             f'viewBox="0 0 {total_w} {total_h}" style="max-width:100%;height:auto" '
             f'font-family="sans-serif" font-size="{GRAPH_FONT}">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" '
             'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
             '<path d="M 0 0 L 10 5 L 0 10 z" fill="#64748b"/></marker></defs>',
             f'<text x="{margin}" y="{margin + 6}" font-size="14" font-weight="bold">'
             f'{e(title)}</text>', f'<g transform="translate({_n(dx)} {_n(dy)})">']
    for k, (x, y, w, hh) in rect.items():
        if k.startswith("input:"):
            text, _, size = lines[k][0]
            parts.append(f'<g class="topic"><rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" '
                         f'height="{hh}" rx="{hh / 2}" fill="#f1f5f9" stroke="#94a3b8"/>'
                         f'<text x="{_n(x + w / 2)}" y="{_n(y + hh / 2 + 4)}" '
                         f'text-anchor="middle">{e(text)}</text></g>')
            continue
        spec = pipeline.regions[k]
        affected = frontiers.get(k, "top") != "top" and k in frontiers
        stroke, sw = (AFFECTED_STROKE, 3) if affected else (KEPT_STROKE, 1.2)
        fill = REGIME_COLOURS.get(spec.regime, "#e5e7eb")
        parts.append(f'<g class="region" data-region="{e(k)}"><rect x="{_n(x)}" y="{_n(y)}" '
                     f'width="{_n(w)}" height="{hh}" rx="8" fill="{fill}" stroke="{stroke}" '
                     f'stroke-width="{sw}"><title>{e(k)}</title></rect>')
        for i, (text, weight, size) in enumerate(lines[k]):
            parts.append(f'<text x="{_n(x + w / 2)}" y="{_n(y + 20 + i * 18)}" '
                         f'text-anchor="middle" font-weight="{weight}" font-size="{size}">'
                         f'{e(text)}</text>')
        parts.append("</g>")
    for edge, _, _ in drawn:
        segs = paths[edge.name]
        d = f"M {_n(segs[0][0][0])} {_n(segs[0][0][1])} " + " ".join(
            "C " + " ".join(f"{_n(x)} {_n(y)}" for x, y in g[1:]) for g in segs)
        dash = ' stroke-dasharray="5 4"' if edge.kind == "unlogged" else ""
        parts.append(f'<path class="edge" d="{d}" fill="none" stroke="#64748b" '
                     f'stroke-width="1.3"{dash} marker-end="url(#arrow)"><title>'
                     f'{e(edge.name)} ({edge.kind})</title></path>')
    for edge, _, _ in drawn:
        x, y = label_at[edge.name]
        lw = text_width(edge.name, LABEL_FONT) + 6
        parts.append(f'<g class="edge-label"><rect x="{_n(x - lw / 2)}" y="{_n(y - 7.5)}" '
                     f'width="{_n(lw)}" height="15" rx="3" fill="white" fill-opacity="0.9"/>'
                     f'<text x="{_n(x)}" y="{_n(y + 4)}" font-size="{LABEL_FONT}" '
                     f'fill="#475569" text-anchor="middle">{e(edge.name)}</text></g>')
    parts.append("</g>")
    lx = margin
    for text, fill, stroke, sw in legend:
        if fill is None:
            parts.append(f'<path d="M {_n(lx)} {_n(legend_y - 4)} L {_n(lx + 30)} '
                         f'{_n(legend_y - 4)}" stroke="#64748b" stroke-dasharray="5 4"/>')
        else:
            parts.append(f'<rect x="{_n(lx + 8)}" y="{_n(legend_y - 11)}" width="14" '
                         f'height="14" fill="{fill}" stroke="{stroke}" stroke-width="{sw}"/>')
        parts.append(f'<text x="{_n(lx + 36)}" y="{_n(legend_y)}">{e(text)}</text>')
        lx += 34 + 20 + text_width(text, GRAPH_FONT)
    parts.append("</svg>")
    return "".join(parts)
