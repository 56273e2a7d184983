"""Every repository path the docs name exists: README.md and docs/*.md may not send a
reader to a file that moved or never was.

What counts as a path: the target of a relative Markdown link (resolved from the doc's
folder, as a Markdown viewer does), and a word in inline code that starts with one of the
repository's top-level folders and a ``/`` (``plugins/falkirk/cli.py``, ``bin/demo``,
``tests/test_delta.py::test_x``: the pytest id is cut off) or that is a top-level file
(``pyproject.toml``). Fenced code blocks are commands and their outputs, not references,
and are not read; nor are words with placeholders (``<pipeline>``, ``*``, ``$VAR``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOP_FOLDERS = ("plugins", "tools", "tests", "docs", "examples", "bin", "docker", ".ci")
TOP_FILES = ("README.md", "CHANGELOG.md", "pyproject.toml", "docker-compose.yml", "uv.lock")
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# A path-like word that names no file of this repository, on purpose: (doc, word) → why.
NOT_REPO_PATHS = {
    ("docs/guide.md", "tests/test_transforms.py"):
        "a file falkirk init writes into the reader's own pipeline folder",
}

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
PLACEHOLDER = re.compile(r"[*<>{}$…|]")


def named_paths(doc: Path) -> list[tuple[str, Path]]:
    """Each (word as written, the path it names) of a doc."""
    text = FENCE.sub("", doc.read_text())
    found = []
    for match in LINK.finditer(text):
        target = match.group(1).split("#")[0]
        if target and not re.match(r"[a-z][a-z0-9+.-]*:", target):  # not a URL or mailto
            found.append((target, (doc.parent / target)))
    for match in CODE.finditer(text):
        for word in match.group(1).split():
            word = word.split("::")[0].rstrip(",.;:)")
            if PLACEHOLDER.search(word):
                continue
            if word in TOP_FILES or ("/" in word and word.split("/")[0] in TOP_FOLDERS):
                found.append((word, REPO / word))
    return found


def test_the_top_level_names_are_the_repositorys():
    for name in TOP_FOLDERS:
        assert (REPO / name).is_dir(), name
    for name in TOP_FILES:
        assert (REPO / name).is_file(), name


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_a_doc_names_exists(doc: Path):
    rel = str(doc.relative_to(REPO))
    missing = sorted({word for word, path in named_paths(doc)
                      if not path.exists() and (rel, word) not in NOT_REPO_PATHS})
    assert not missing, f"{rel} names paths that are not in the repository: {missing}"
