"""docs/guide.md, followed verbatim: every command of its ```bash blocks, in order, in one
shell session (exports carry over), with falkirk installed from its wheel, in a temporary
home outside the checkout (so ``~/pipelines`` and ``~/.falkirk`` are the test's own).

The only settings the test adds are ones the guide documents: the broker's, engine's and
Airflow's ports (free ones, so a run beside other work takes nobody's) and where the jars
are (the wheel install's, fetched once). A block may be annotated by an HTML comment on the
line before it:

- ``<!-- guide-test: skip (why) -->``: not run; the test reports it, with its reason;
- ``<!-- guide-test: repeat until "phrase" ... -->``: the block is what a user runs again
  until it shows progress; it is re-run until its output (table rules removed, spaces
  collapsed) holds every phrase.

Then the walkthrough's outcomes: its tables have rows and equal what ``falkirk run`` made
(the kill changed nothing), the rollback dry run printed a plan, and the garbage
collection's dry run lists no row of a user table.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from falkirk.config import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.system]  # Spark, the broker and Airflow

GUIDE = REPO_ROOT / "docs" / "guide.md"
TABLES = ("clean_clicks", "page_counts", "user_totals", "clicks_dead_letters")
REPEAT_TIMEOUT_S = 600.0
COMMAND_TIMEOUT_S = 900.0
ANNOTATION = re.compile(r"<!--\s*guide-test:\s*(.*?)\s*-->")


@dataclass
class Block:
    """One ```bash block of the guide: its first line's number, its commands and what the
    line before it asks of the test."""

    line: int
    commands: list[str]
    skip: str | None = None
    until: list[str] = field(default_factory=list)


def guide_blocks(text: str) -> list[Block]:
    """The guide's ```bash blocks, in order, each command one logical line (a trailing
    backslash continues it; blank lines are dropped)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```bash":
            i += 1
            continue
        start, body = i + 1, []
        i += 1
        while lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        commands, pending = [], ""
        for raw in body:
            if raw.rstrip().endswith("\\"):
                pending += raw.strip()[:-1].strip() + " "
                continue
            command = (pending + raw.strip()).strip()
            pending = ""
            if command and not command.startswith("#"):
                commands.append(command)
        block = Block(start + 1, commands)
        before = lines[start - 2] if start >= 2 else ""
        note = ANNOTATION.search(before)
        if note:
            kind, _, rest = note.group(1).partition(" ")
            if kind == "skip":
                block.skip = rest.strip().strip("()") or "no reason given"
            elif note.group(1).startswith("repeat until "):
                block.until = shlex.split(note.group(1)[len("repeat until "):])
            else:
                raise AssertionError(f"docs/guide.md:{start - 1}: unknown guide-test "
                                     f"annotation {note.group(1)!r}")
        blocks.append(block)
        i += 1
    return blocks


def plain(text: str) -> str:
    """Output without table rules and with spaces collapsed: rich's tables as words."""
    return " ".join(re.sub(r"[│┃║|┏┓┗┛┡┩└┘┌┐├┤┬┴┼━─═╇╈╋]", " ", text).split())


class Shell:
    """One user's shell: each command runs in bash with the environment and folder the
    previous one left (``export`` and ``cd`` carry over, as typed in one terminal)."""

    def __init__(self, env: dict[str, str], cwd: Path, state: Path):
        self.env, self.cwd, self.state = env, cwd, state
        self.transcript: list[str] = []

    def run(self, command: str, timeout: float = COMMAND_TIMEOUT_S
            ) -> subprocess.CompletedProcess:
        env_file, pwd_file = self.state / "env", self.state / "pwd"
        script = (f"{command}\n__guide_rc=$?\nenv -0 > {shlex.quote(str(env_file))}\n"
                  f"pwd > {shlex.quote(str(pwd_file))}\nexit $__guide_rc\n")
        started = time.monotonic()
        done = subprocess.run(["bash", "-c", script], env=self.env, cwd=self.cwd,
                              capture_output=True, text=True, timeout=timeout)
        if env_file.exists():
            pairs = [p.split("=", 1) for p in env_file.read_text().split("\0") if "=" in p]
            self.env = {k: v for k, v in pairs if k not in ("_", "SHLVL", "PWD", "OLDPWD")}
            self.cwd = Path(pwd_file.read_text().strip())
            env_file.unlink()
        self.transcript.append(f"$ {command}   [exit {done.returncode}, "
                               f"{time.monotonic() - started:.0f} s]")
        out = (done.stdout + done.stderr).rstrip().splitlines()
        shown = out if len(out) <= 40 else [*out[:10], f"… ({len(out) - 30} lines)",
                                            *out[-20:]]
        print("\n".join([self.transcript[-1], *(f"    {line}" for line in shown)]),
              flush=True)
        return done


def _free_port() -> int:
    from falkirk.local.broker import free_port

    return free_port()


@pytest.fixture
def user_shell(installed, tmp_path):
    """A shell as the guide's user has it: falkirk from its wheel on PATH, HOME a temporary
    folder, falkirk's own settings only those the guide documents (free ports)."""
    from falkirk_dev.demo.airflow import _free_port_block

    home, work, state = tmp_path / "home", tmp_path / "work", tmp_path / "shell"
    for folder in (home, work, state):
        folder.mkdir()
    assert not str(tmp_path).startswith(str(REPO_ROOT))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FALKIRK_", "AIRFLOW", "PYTEST", "SPARK_"))}
    env.update(HOME=str(home), PATH=installed["env"]["PATH"], COLUMNS="250",
               FALKIRK_JARS_DIR=str(installed["jars"]),
               FALKIRK_KAFKA_BOOTSTRAP=f"127.0.0.1:{_free_port()}",
               FALKIRK_SPARK_REMOTE=f"sc://127.0.0.1:{_free_port()}",
               FALKIRK_AIRFLOW_PORT=str(_free_port_block()))
    shell = Shell(env, work, state)
    yield shell
    _clean_up(shell, home)


def _clean_up(shell: Shell, home: Path) -> None:
    """Whatever a failed walkthrough left running, stopped the guide's own way (each
    stop acts on the process its start recorded), then any job still recorded."""
    from falkirk.runtime.procs import alive, stop_group

    for command in ("falkirk airflow stop", "falkirk broker stop", "falkirk engine stop"):
        shell.run(command, timeout=300)
    for record in (home / ".falkirk" / "run").glob("*/*.json"):
        info = json.loads(record.read_text())
        if alive(info["pid"]):
            stop_group(info["pgid"], timeout_s=10)


def test_the_guide_runs_verbatim(user_shell):
    blocks = guide_blocks(GUIDE.read_text())
    assert len(blocks) >= 10, "docs/guide.md lost its commands?"
    outputs: dict[str, str] = {}  # command -> its last output
    skipped = []
    for block in blocks:
        where = f"docs/guide.md:{block.line}"
        if block.skip is not None:
            skipped.append(f"{where}: {block.commands} ({block.skip})")
            continue
        deadline = time.monotonic() + REPEAT_TIMEOUT_S
        while True:
            for command in block.commands:
                done = user_shell.run(command)
                assert done.returncode == 0, (
                    f"{where}: `{command}` exited {done.returncode}\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
                outputs[command] = done.stdout + done.stderr
            seen = plain(outputs[block.commands[-1]])
            missing = [p for p in block.until if p not in seen]
            if not missing:
                break
            assert time.monotonic() < deadline, (
                f"{where}: `{block.commands[-1]}` never showed {missing} in "
                f"{REPEAT_TIMEOUT_S:.0f} s; last output:\n{outputs[block.commands[-1]]}")
            time.sleep(5)
    for line in skipped:  # reported, never silent
        print(f"not run: {line}")
        warnings.warn(f"guide-test skipped {line}", stacklevel=1)
    assert len(skipped) <= 1, skipped

    home = Path(user_shell.env["HOME"])
    # The deployment's tables have rows and equal the ones `falkirk run` made: killing
    # user_totals under Airflow changed nothing in the outputs.
    deployed = _rows(home / ".falkirk" / "lake")
    assert all(deployed[t] for t in TABLES), {t: len(r) for t, r in deployed.items()}
    assert deployed == _rows(home / "pipelines" / "clicks" / ".falkirk" / "run" / "lake")
    # The rollback's dry run printed its plan and changed nothing.
    plan = plain(outputs["falkirk rollback --pipeline clicks --failed user_totals --dry-run"])
    assert "dry run: nothing changed" in plan and "user_totals eager" in plan, plan
    # Garbage collection's dry run: no row of a user table (they are products).
    gc = plain(outputs["falkirk gc --pipeline clicks"])
    assert "(dry run: nothing changed" in gc, gc
    listed = gc.split("low watermarks")[0]  # its table: store, name, rows, files, bytes, rule
    for table in TABLES:
        assert not re.search(rf"\btable {table} [\d,]*[1-9]", listed), gc
    kept = gc.split("tables kept whole")[-1]
    assert all(t in kept for t in TABLES), gc


def _rows(lake: Path) -> dict[str, list[str]]:
    from falkirk.io.lake import read_table

    return {t: sorted(json.dumps(r, sort_keys=True, default=str)
                      for r in read_table(str(lake / t)).to_pylist()) for t in TABLES}


def test_guide_blocks_are_parsed_with_their_annotations():
    """The parser itself: continuation lines, comments, skip and repeat annotations."""
    text = "\n".join([
        "<!-- guide-test: skip (needs a network) -->", "```bash", "uv pip install x", "```",
        "", '<!-- guide-test: repeat until "a b" "c" -->', "```bash", "# a comment",
        "falkirk status \\", "  --pipeline clicks", "", "```", "```bash", "echo hi", "```"])
    skip, repeat, plain_block = guide_blocks(text)
    assert (skip.skip, skip.commands) == ("needs a network", ["uv pip install x"])
    assert repeat.until == ["a b", "c"] and repeat.commands == [
        "falkirk status --pipeline clicks"]
    assert plain_block.skip is None and plain_block.until == [] and plain_block.line == 14
    assert plain("┃ region ┃ x │\n│ clean  │ 2 committed │") == "region x clean 2 committed"
