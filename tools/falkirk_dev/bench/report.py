"""``falkirk bench report``: docs/benchmarks.md and docs/faults-results.md, generated.

The numbers the docs quote come from the figure files under ``docs/figures/`` and nowhere
else, so text and measurements cannot drift apart: ``docs/figures/index.json`` says which
file is the latest of each benchmark and campaign kind (the others of a kind are history,
listed, not shown), which figures each table shows and how to format them; every file
shown must carry its provenance (``falkirk_dev.bench.figures``), which the docs print
under its table. The Markdown is rendered with Jinja2 from ``report.md.j2`` beside this
module. Running it twice writes nothing the second time.

Run: ``falkirk bench report`` after adding or replacing a figure file (and its entry in
the index); ``tests/test_bench_report.py`` fails while the docs differ from what the
figures give.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jinja2

from falkirk_dev.bench.figures import FigureError, Provenance, read_figure

REPO_ROOT = Path(__file__).resolve().parents[3]
FIGURES_DIR = REPO_ROOT / "docs" / "figures"
DOCS_DIR = REPO_ROOT / "docs"
INDEX = "index.json"
TEMPLATE = "report.md.j2"
COMMAND = "falkirk bench report"
MISSING = object()  # a key the file does not have, unlike a key whose value is null
NONE = "—"


def _recovered(data: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The recovered kills of a campaign's events (not its other events, such as the
    restart that arms a crash point: only targets counted in ``kills_by_target``)."""
    events, targets = data.get("events"), data.get("kills_by_target")
    if not isinstance(events, list):
        return None
    return [e for e in events if isinstance(e, dict) and e.get("recovery_s") is not None
            and (not isinstance(targets, dict) or e.get("target") in targets)]


def _waited_s(kill: dict[str, Any]) -> float:
    """The wait a campaign takes out of a recovery (falkirk_dev.chaos_airflow.waited_s)."""
    return kill["parts"].get("waited_s", 0.0) if "parts" in kill else kill.get("waited_s", 0.0)


def _within_30s(data: dict[str, Any], less_wait: bool = False) -> Any:
    kills = _recovered(data)
    if kills is None or (less_wait and "recovery_less_waiting_s_p50" not in data):
        return MISSING  # a campaign that did not count the wait apart
    ok = sum(round(k["recovery_s"] - (_waited_s(k) if less_wait else 0.0), 2) <= 30
             for k in kills)
    return f"{ok} of {len(kills)}"


# Figures computed from a file's events rather than read from one of its keys ("=name").
DERIVED: dict[str, Callable[[dict[str, Any]], Any]] = {
    "within_30s": _within_30s,
    "within_30s_less_wait": lambda data: _within_30s(data, less_wait=True),
}


def value_at(data: dict[str, Any], key: str) -> Any:
    """The value at a dotted ``key`` of a figure file (``=name``: a derived figure), or
    ``MISSING``."""
    if key.startswith("="):
        return DERIVED[key[1:]](data)
    node: Any = data
    for part in key.split("."):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]  # an item of a list (a quarter of the soak's)
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return MISSING
    return node


def _one(value: Any, spec: str) -> str:
    if value is None or value is MISSING:
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


def fmt(value: Any, spec: str = "{}") -> str:
    """A figure as text: numbers by ``spec`` (a ``str.format`` field), lists item by
    item, a dict as ``key value; …`` (``rollback_s`` reads ``rollback``)."""
    if isinstance(value, list):
        return ", ".join(_one(v, spec) for v in value) if value else NONE
    if isinstance(value, dict):
        return "; ".join(f"{k.removesuffix('_s').replace('_', ' ')} {_one(v, spec)}"
                         for k, v in value.items()) if value else NONE
    return _one(value, spec)


def _figure(data: dict[str, Any], row: dict[str, Any]) -> Any:
    keys = row["key"]
    if isinstance(keys, list):  # several keys in one cell: "a / b"
        values = [value_at(data, k) for k in keys]
        if all(v is MISSING for v in values):
            return MISSING
        return " / ".join(fmt(v, row.get("format", "{}")) for v in values)
    value = value_at(data, keys)
    return value if value is MISSING else fmt(value, row.get("format", "{}"))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _link(path: Path, docs_dir: Path) -> str:
    return Path(os.path.relpath(path, docs_dir)).as_posix()


class Shown:
    """One figure file a section shows: its data, provenance and label."""

    def __init__(self, figures_dir: Path, entry: dict[str, Any]) -> None:
        self.name: str = entry["file"]
        self.label: str = entry.get("label", self.name.removesuffix(".json"))
        self.path = figures_dir / self.name
        self.data, self.provenance = read_figure(self.path)


def figures_table(files: list[Shown], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures as rows, one column per file; a row no file has is left out."""
    body, goals = [], any("goal" in r for r in rows)
    for row in rows:
        values = [_figure(f.data, row) for f in files]
        if all(v is MISSING for v in values):
            continue
        cells = [row["label"], *(NONE if v is MISSING else v for v in values)]
        body.append(cells + ([row.get("goal", "")] if goals else []))
    header = ["figure", *(f.label if len(files) > 1 else "value" for f in files)]
    return {"header": header + (["goal"] if goals else []),
            "rows": [[_cell(c) for c in r] for r in body]}


def _matrix_rows(f: Shown, spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any],
                                                                    str | None, dict[str, Any]]]:
    """Per row of a file: its label, the object its columns read, the name ``{row}``
    stands for in their keys (None: the keys are the item's own), and its own spec."""
    if "list" in spec:
        items = value_at(f.data, spec["list"])
        label = spec["label"]
        for item in items if isinstance(items, list) else []:
            yield fmt(value_at(item, label["key"]), label.get("format", "{}")), item, None, {}
    else:
        for key, row in spec["keys"].items():
            yield row["label"], f.data, key, row


def matrix_table(files: list[Shown], table: dict[str, Any]) -> dict[str, Any]:
    """Rows from a list in each file (``rows.list``) or from named keys (``rows.keys``,
    whose columns read ``{row}`` in their keys), one column per figure; with several
    files a column names the file of each row."""
    many = len(files) > 1
    header = [table["row_header"], *(c["label"] for c in table["columns"])]
    body = []
    for f in files:
        for label, source, key, row in _matrix_rows(f, table["rows"]):
            cells = [label]
            for col in table["columns"]:
                where = col["key"] if key is None else col["key"].format(row=key)
                spec = col["format"] if col.get("own_format") else \
                    row.get("format", col.get("format", "{}"))  # (a ratio column's own)
                cells.append(fmt(value_at(source, where), spec))
            body.append(cells + ([f.name] if many else []))
    return {"header": header + (["file"] if many else []),
            "rows": [[_cell(c) for c in r] for r in body]}


def _provenance_row(f: Shown, docs_dir: Path) -> dict[str, str]:
    p: Provenance = f.provenance
    return {"file": f.name, "link": _link(f.path, docs_dir),
            **{k: _cell(p.get(k, "")) for k in ("command", "commit", "date", "machine",
                                                  "note")}}


def section(entry: dict[str, Any], index: dict[str, Any], figures_dir: Path,
            docs_dir: Path) -> dict[str, Any]:
    """What the template needs for one benchmark or campaign kind."""
    files = [Shown(figures_dir, e) for e in entry["files"]]
    tables = []
    if "row_set" in entry:
        tables.append(figures_table(files, index["row_sets"][entry["row_set"]]))
    for table in entry.get("tables", []):
        tables.append(figures_table(files, table["figures"]) if "figures" in table
                      else matrix_table(files, table))
    plots = [{"title": f.label, "link": _link(f.path.with_suffix(".svg"), docs_dir)}
             for f in files if f.path.with_suffix(".svg").is_file()]
    return {
        "title": entry["title"], "about": entry["about"], "command": entry["command"],
        "tables": tables if files else [], "plots": plots,
        "provenance": [_provenance_row(f, docs_dir) for f in files],
        "history": [{"file": h["file"], "link": _link(figures_dir / h["file"], docs_dir),
                     "note": h["note"]} for h in entry.get("history", [])],
    }


def load_index(figures_dir: Path) -> dict[str, Any]:
    """The index, checked against the folder: every file it names exists, and every
    figure file is shown or listed as history exactly once."""
    path = figures_dir / INDEX
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise FigureError(f"{path}: not a readable index ({exc})") from None
    named: dict[str, str] = {}
    for entry in index["benchmarks"] + index["campaigns"]:
        for name in [e["file"] for e in entry["files"]] + [h["file"] for h in
                                                            entry.get("history", [])]:
            if name in named:
                raise FigureError(f"{path}: {name} is in both {named[name]!r} and "
                                  f"{entry['kind']!r}")
            named[name] = entry["kind"]
            if not (figures_dir / name).is_file():
                raise FigureError(f"{path}: {entry['kind']!r} names {name}, which is not in "
                                  f"{figures_dir}")
    loose = sorted(p.name for p in figures_dir.glob("*.json")
                   if p.name != INDEX and p.name not in named)
    if loose:
        raise FigureError(f"{path}: {', '.join(loose)} in no section: show each in a "
                          f"section's files or list it in a section's history")
    return index


def render(figures_dir: Path = FIGURES_DIR, docs_dir: Path = DOCS_DIR) -> dict[Path, str]:
    """Each generated doc's path and text, from the figure files alone."""
    index = load_index(figures_dir)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent),
                             autoescape=False, keep_trailing_newline=True, trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    template = env.get_template(TEMPLATE)
    out: dict[Path, str] = {}
    for name, group in (("benchmarks", "benchmarks"), ("faults-results", "campaigns")):
        doc = index["docs"][name]
        text = template.render(
            doc=doc, command=COMMAND, index_link=_link(figures_dir / INDEX, docs_dir),
            figures_link=_link(figures_dir, docs_dir) + "/",
            sections=[section(e, index, figures_dir, docs_dir) for e in index[group]])
        out[docs_dir / doc["out"]] = text.rstrip("\n") + "\n"
    return out


def write(figures_dir: Path = FIGURES_DIR, docs_dir: Path = DOCS_DIR) -> list[Path]:
    """Render the docs and write those whose text changed; the paths written."""
    changed = []
    for path, text in render(figures_dir, docs_dir).items():
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    return changed


def main(args: Any = None, figures_dir: Path = FIGURES_DIR,
         docs_dir: Path = DOCS_DIR) -> list[Path]:
    """The ``falkirk bench report`` verb (``args``, the bench's parsed arguments, are not
    used): regenerate the docs, say which changed; a figure it cannot quote ends it with
    a one-line error."""
    try:
        changed = write(figures_dir, docs_dir)
    except FigureError as exc:
        raise SystemExit(f"{COMMAND}: {exc}") from None
    for path in changed:
        print(f"written: {_link(path, Path.cwd())}")
    if not changed:
        print("the generated docs are up to date")
    return changed
