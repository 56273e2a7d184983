"""One direction of imports: the import-linter contracts of pyproject.toml hold for the
package, and an import that runs back up a layer (or joins recovery and quality) breaks
them, made inside a function too: grimp, which import-linter builds its graph with, reads
imports wherever they are. The declared dependencies cover every package the framework
imports (deptry)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    """``lint-imports`` with the configuration in ``cwd``'s pyproject.toml (no cache: a
    copy of the package must not be read from the repository's)."""
    env = dict(os.environ)
    if pythonpath is not None:  # before the editable install's path
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath),
                                                          env.get("PYTHONPATH")]))
    return subprocess.run([str(BIN / "lint-imports"), "--no-cache", "--no-logo"], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def importlinter_config() -> str:
    """The ``[tool.importlinter]`` tables of the repository's pyproject.toml, as written."""
    lines, keep = [], False
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.startswith("["):
            keep = line.strip("[] ").startswith("tool.importlinter")
        if keep:
            lines.append(line)
    return "\n".join(lines) + "\n"


def test_the_import_contracts_hold():
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout, done.stdout


@pytest.mark.parametrize(("module", "imported", "name"), [
    ("model/times.py", "falkirk.cli", "main"),  # the bottom importing the front door
    ("io/spark.py", "falkirk.runtime.engine", "ensure"),  # a session starting the engine
    ("config.py", "falkirk.io.launch", "launch_conf"),  # the config building settings
    ("quality/checks.py", "falkirk.recovery.gc", "collect"),  # two independent siblings
])
def test_an_upward_import_inside_a_function_breaks_the_contracts(tmp_path, module, imported,
                                                                 name):
    """A copy of the package with one import added inside a function, checked with the
    repository's contracts: the check fails and names the import."""
    shutil.copytree(REPO / "plugins" / "falkirk", tmp_path / "src" / "falkirk",
                    ignore=shutil.ignore_patterns("__pycache__", "jvm", "template"))
    path = tmp_path / "src" / "falkirk" / module
    importer = "falkirk." + module.removesuffix(".py").replace("/", ".")
    path.write_text(path.read_text() + f"\n\ndef _added():\n    from {imported} import {name}"
                    f"\n\n    return {name}\n")
    (tmp_path / "pyproject.toml").write_text(importlinter_config())

    done = lint_imports(tmp_path, pythonpath=tmp_path / "src")
    assert done.returncode != 0, done.stdout
    assert "BROKEN" in done.stdout and f"{importer} -> {imported}" in done.stdout, done.stdout


def test_every_package_the_framework_imports_is_declared():
    """deptry on the package (the dev tooling, the tests, the template and the extras are
    configured apart in pyproject.toml [tool.deptry])."""
    done = subprocess.run([str(BIN / "deptry"), "plugins"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
