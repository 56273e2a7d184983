"""The README's picture: a pipeline's region graph, coloured by regime, as an SVG file.

Drawn by the same function as the Airflow plan page and the demo's report
(``falkirk.airflow.render.region_graph_svg``) from the pipeline's declaration, so the
picture changes when the declaration does, and only then. With no rollback plan, no
region is outlined.

Run: ``.venv/bin/python -m falkirk_dev.region_graph`` (defaults: the reference pipeline,
written to ``docs/figures/reference-regions.svg``).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PIPELINE = REPO_ROOT / "examples" / "reference" / "pipeline.yaml"
OUT = REPO_ROOT / "docs" / "figures" / "reference-regions.svg"


def svg(pipeline_yaml: Path) -> str:
    """The region graph of the pipeline declared in ``pipeline_yaml``, titled for a reader
    who has no plan in front of them."""
    from falkirk.airflow.render import region_graph_svg
    from falkirk.model.topology import load_pipeline

    pipeline = load_pipeline(pipeline_yaml)
    drawing = region_graph_svg(pipeline)
    # the plan page's title speaks of a plan's frontiers; here there is no plan
    drawing = re.sub(r"(<text[^>]*font-weight=\"bold\">)pipeline [^<]*(</text>)",
                     rf"\1the {pipeline.name} pipeline: its regions, coloured by regime\2",
                     drawing, count=1)
    # a page in a dark theme shows an SVG on its own background: give it a white one
    head = drawing.index(">") + 1
    return drawing[:head] + '<rect width="100%" height="100%" fill="white"/>' + \
        drawing[head:] + "\n"


def main(argv: list[str] | None = None) -> Path:
    """Write the SVG; the path written."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", type=Path, default=PIPELINE, help="its pipeline.yaml")
    parser.add_argument("--out", type=Path, default=OUT, help="the SVG file to write")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(svg(args.pipeline))
    print(f"written: {args.out}")
    return args.out


if __name__ == "__main__":
    main()
