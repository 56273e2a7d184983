"""The shipped framework is the framework only: the wheel holds no dev tooling, nothing in
it imports the tooling, and it names no application (the reference pipeline is an app)."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

from falkirk.config import REPO_ROOT

PACKAGE = REPO_ROOT / "plugins" / "falkirk"
DEV = REPO_ROOT / "tools" / "falkirk_dev"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_framework_imports_no_dev_tooling_and_jobs_only_its_job_interface():
    for path in PACKAGE.rglob("*.py"):
        dev = {m for m in _imports(path) if m.split(".")[0] == "falkirk_dev"}
        # the CLI adds the dev verbs when the tooling is importable (a checkout)
        if path.name == "cli.py" and path.parent == PACKAGE:
            assert dev == {"falkirk_dev.cli"}, path
        else:
            assert not dev, f"{path.relative_to(REPO_ROOT)} imports {sorted(dev)}"

def test_example_pipelines_use_only_the_public_api_like_a_users_own():
    """The reference pipeline is an example folder, as `falkirk init` writes one: its jobs
    import falkirk.job, its invariants falkirk.quality.invariants, its consumer DAGs
    falkirk.airflow.assets, and nothing else."""
    examples = [REPO_ROOT / "examples" / "reference", PACKAGE / "local" / "template"]
    for folder in examples:
        assert (folder / "pipeline.yaml").is_file() and (folder / "schemas").is_dir(), folder
        for path in folder.rglob("*.py"):
            used = {m for m in _imports(path) if m.split(".")[0] in ("falkirk", "falkirk_dev")}
            allowed = {"falkirk.job", "falkirk.quality.invariants"}
            if "dags" in path.relative_to(folder).parts:
                allowed = {"falkirk.airflow.assets"}
            assert used <= allowed, \
                f"{path.relative_to(REPO_ROOT)} imports {sorted(used - allowed)}"
    # nothing of the app is left in the checkout's framework folders
    assert not (REPO_ROOT / "jobs").exists() and not (REPO_ROOT / "schemas").exists()


def test_the_framework_names_no_application():
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in ("reference", "popularity", "communities", "serve"), \
                    f"{path.relative_to(REPO_ROOT)}:{node.lineno} names {node.value!r}"


def test_the_wheel_is_the_framework_without_demo_trials_benchmarks_or_generator(wheel):
    files = zipfile.ZipFile(wheel).namelist()
    modules = [f for f in files if f.endswith(".py")]
    assert modules and all(f.startswith("falkirk/") for f in modules), modules
    shipped = {Path(f).stem for f in modules}
    assert not shipped & {"demo", "trials", "chaos", "harness", "generate", "all_bench"}
    assert {"falkirk/job.py", "falkirk/solver/frontier.py", "falkirk/log/epochlog.py",
            "falkirk/recovery/rollback.py", "falkirk/state/checkpoints.py",
            "falkirk/airflow/factory.py"} <= set(files)
    # what a pipeline needs at run time beside the code: the epoch log's table schemas,
    # the dead letters' and what `falkirk init` writes
    assert {"falkirk/schemas/tables/epochs.json", "falkirk/schemas/tables/dead_letters.json",
            "falkirk/local/template/pipeline.yaml", "falkirk/solver/problems/1_unlogged_chain.json",
            "falkirk/local/template/input/clicks.jsonl", "falkirk/jvm/spark/pom.xml",
            "falkirk/jvm/kafka/pom.xml", "falkirk/jvm/s3/pom.xml",
            "falkirk/jvm/objectstore/pom.xml"} <= set(files)
