"""The demo: the reference pipeline with a failure and a rollback, and a report.

Two sandboxed runs on the same seeded input, each with its own Kafka-compatible broker:
a failure-free run, then a run in which the communities job (lazy checkpoint) is killed
with SIGKILL in the middle of an epoch, rolled back by the executor and restarted. The
report (HTML, under var/demo/) shows the region graph coloured by regime with each
region's chosen frontier, the rollback plan, the records per second per epoch, and the
comparison with the failure-free run (rows lost, rows duplicated).

Airflow-driven runs (the supervisor DAG) come with the demo issue; this is the same
recovery, driven directly.
"""

from __future__ import annotations

import html
import json
import shutil
import time
from argparse import Namespace
from pathlib import Path

from falkirk.config import REPO_ROOT

DEMO_INPUT = {"events": 3000, "queries": 300, "epochs": 6, "seed": 21}


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
    """A small line chart in plain SVG: records/s per epoch, one line per region."""
    colours = ["#2563eb", "#d97706", "#059669", "#7c3aed", "#dc2626"]
    points = [p for s in series.values() for p in s]
    if not points:
        return "<p>no epoch read input records</p>"
    w, h, m = 560, 240, 48
    max_e = max(e for e, _ in points) or 1
    max_v = max(v for _, v in points) or 1.0

    def xy(e: int, v: float) -> tuple[float, float]:
        return m + (w - 2 * m) * e / max_e, h - m - (h - 2 * m) * v / max_v

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'font-family="sans-serif" font-size="11">',
             f'<text x="{m}" y="16" font-size="13">{html.escape(title)}</text>',
             f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="#333"/>',
             f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="#333"/>',
             f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">epoch</text>',
             f'<text x="{m - 4}" y="{m}" text-anchor="end">{max_v:,.0f}</text>',
             f'<text x="{m - 4}" y="{h - m}" text-anchor="end">0</text>']
    for e in range(max_e + 1):
        x, _ = xy(e, 0)
        parts.append(f'<text x="{x}" y="{h - m + 14}" text-anchor="middle">{e}</text>')
    for i, (region, pts) in enumerate(sorted(series.items())):
        c = colours[i % len(colours)]
        line = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(e, v) for e, v in sorted(pts)))
        parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{line}"/>')
        parts.append(f'<text x="{w - m + 4}" y="{m + 14 * i}" fill="{c}">'
                     f'{html.escape(region)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def report_html(pipeline, plan: dict, comparison: dict, series: dict, timings: dict) -> str:
    from falkirk.airflow.render import plan_html

    e = html.escape
    rows = "".join(
        f"<tr><td>{e(name)}</td><td>{v['rows']}</td><td>{v['lost']}</td>"
        f"<td>{v['duplicated']}</td></tr>" for name, v in comparison.items())
    lost = sum(v["lost"] for v in comparison.values())
    dup = sum(v["duplicated"] for v in comparison.values())
    verdict = ("every output equals the failure-free run" if lost == dup == 0
               else f"{lost} row(s) lost, {dup} duplicated")
    times = "".join(f"<li>{e(k)}: {v:.0f} s</li>" for k, v in timings.items())
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>falkirk demo: {e(pipeline.name)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px}}
.ok{{color:#059669}}.bad{{color:#dc2626}}</style></head><body>
<h1>falkirk demo: the reference pipeline, a failure and a rollback</h1>
<p>The communities job (lazy checkpoint) was killed with SIGKILL in the middle of an
epoch; the rollback executor solved the consistent frontier from the epoch log, restored,
and the stopped jobs restarted from their frontiers.</p>
<p class="{'ok' if lost == dup == 0 else 'bad'}"><b>Result: {e(verdict)}.</b></p>
{plan_html(plan, pipeline)}
<h2>Throughput per epoch (run with the failure)</h2>
{throughput_svg(series, "input records per second per epoch (regions reading a topic)")}
<h2>Comparison with the failure-free run</h2>
<table><tr><th>output</th><th>rows</th><th>lost</th><th>duplicated</th></tr>{rows}</table>
<h2>Time</h2><ul>{times}</ul>
</body></html>"""


def main(args: Namespace) -> int:
    from rich.console import Console

    from falkirk.harness import LocalRun, compare

    console = Console()
    root = Path(getattr(args, "root", None) or REPO_ROOT / "var" / "demo")
    shutil.rmtree(root, ignore_errors=True)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    with LocalRun(root / "failure-free") as run, \
            console.status("failure-free run: generating input, running 4 Spark jobs…"):
        run.generate(**DEMO_INPUT)
        run.start(until_epoch=DEMO_INPUT["epochs"] - 1)
        run.wait(progress=lambda m: console.log(m))
        golden = run.outputs()
    timings["failure-free run"] = time.monotonic() - t0
    console.log(f"failure-free run done in {timings['failure-free run']:.0f} s")

    t1 = time.monotonic()
    kill_epoch = 3
    with LocalRun(root / "with-failure") as run:
        with console.status("run with a failure: generating input, starting the jobs…"):
            run.generate(**DEMO_INPUT)
            run.start(until_epoch=DEMO_INPUT["epochs"] - 1)
        with console.status(f"waiting for communities to be in the middle of epoch "
                            f"{kill_epoch}…"):
            run.wait_for(lambda: run.epoch_running("communities", kill_epoch), timeout_s=900,
                         what=f"communities mid epoch {kill_epoch}")
        run.kill(run.pipeline.regions["communities"].job)
        console.log(f"[red]killed communities (SIGKILL) in the middle of epoch {kill_epoch}")
        t2 = time.monotonic()
        plan = run.rollback(failed=["communities"], reason="demo: communities killed",
                            progress=lambda m: console.log(m))
        timings["rollback"] = time.monotonic() - t2
        run.start()
        with console.status("finishing the pipeline from the frontiers…"):
            run.wait(progress=lambda m: console.log(m))
        outputs = run.outputs()
        series = throughput_per_epoch(run)
        pipeline = run.pipeline
    timings["run with the failure"] = time.monotonic() - t1
    comparison = compare(golden, outputs)
    timings["total"] = time.monotonic() - t0
    report = root / "report.html"
    report.write_text(report_html(pipeline, plan.to_json(), comparison, series, timings))
    lost = sum(v["lost"] for v in comparison.values())
    dup = sum(v["duplicated"] for v in comparison.values())
    console.print(f"[bold]{'✓' if lost == dup == 0 else '✗'} {lost} lost, {dup} duplicated "
                  f"across {len(comparison)} outputs; frontiers {plan.frontiers}")
    console.print(f"report: {report}   (total {timings['total']:.0f} s)")
    return 0 if lost == dup == 0 else 1
