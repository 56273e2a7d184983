"""Benchmarks: commands that print performance figures next to their goals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_figures(where: str, figures: dict[str, Any]) -> Path:
    """Write a benchmark's figures as JSON to ``where`` (folders made); its path, beside
    which the benchmark may put its plot (``.svg``)."""
    path = Path(where)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=1, default=str))
    return path
