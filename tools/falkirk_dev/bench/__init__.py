"""Benchmarks: commands that print performance figures next to their goals."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_figures(where: str, figures: dict[str, Any]) -> Path:
    """Write a benchmark's figures as JSON to ``where`` (folders made), with their
    provenance (:func:`falkirk_dev.bench.figures.write_figure`: command, commit, date,
    machine); its path, beside which the benchmark may put its plot (``.svg``)."""
    from falkirk_dev.bench.figures import write_figure

    return write_figure(where, figures)
