"""Shared fixtures: one Spark session per test module, a local broker, a test Airflow
home (set before Airflow is first imported) and a freshly parsed rollback DAG."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from falkirk.config import REPO_ROOT


@pytest.fixture(scope="module")
def spark():
    """A local[2] Spark session, reused by every test of a module (cold start 5–8 s)."""
    from falkirk.io.spark import session

    s = session("falkirk-tests")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """One embedded Apache Kafka broker (KRaft) for the whole test session."""
    from falkirk.local.broker import LocalBroker

    with LocalBroker(tmp_path_factory.mktemp("broker")) as b:
        yield b


@pytest.fixture(scope="module")
def world_template(tmp_path_factory, spark):
    """The small pipeline of tests/tiny_pipeline.py after a few epochs, built once a module."""
    from tiny_pipeline import build_world

    root = tmp_path_factory.mktemp("world")
    build_world(root, spark)
    return root


@pytest.fixture
def world(tmp_path, world_template, spark):
    """A fresh copy of the world for one test: (cfg, log, executor, stopped regions)."""
    from tiny_pipeline import make_world

    return make_world(tmp_path, world_template, spark)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """falkirk's wheel, built once per session from this checkout."""
    import shutil

    dest = tmp_path_factory.mktemp("dist")
    # uv: on PATH, or the system python's module that bin/setup installs
    uv = [shutil.which("uv")] if shutil.which("uv") else ["python3", "-m", "uv"]
    subprocess.run([*uv, "build", "--wheel", "-q", "-o", str(dest), str(REPO_ROOT)],
                   check=True, timeout=300)
    [built] = dest.glob("falkirk-*.whl")
    return built


@pytest.fixture(scope="session")
def airflow_env(tmp_path_factory):
    """A migrated SQLite Airflow home of its own, set before Airflow is first imported."""
    if "airflow.configuration" in sys.modules:
        pytest.fail("Airflow was imported before its test home was set: a test imported it "
                    "at module level; import it inside the test instead")
    home = tmp_path_factory.mktemp("airflow_home")
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], check=True,
                   capture_output=True, timeout=300)
    yield env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def rollback_dag(airflow_env):
    """A freshly parsed rollback DAG: dag.test() leaves the run's conf in the DAG's Param
    objects (Param.resolve keeps the value), so a reused DAG would carry it over."""
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO_ROOT / "dags" / "falkirk_pipelines.py")).dags[
        "falkirk_reference_rollback"]


@pytest.fixture(scope="session")
def golden(tmp_path_factory):
    """The reference pipeline's failure-free run on the embedded defaults (reference_runs):
    what every run with faults must end equal to, computed once per session."""
    from reference_runs import run_pipeline

    outputs, _, sent = run_pipeline(tmp_path_factory.mktemp("golden"))
    # Without a failure every answer is sent once, in generation 0.
    assert sent["responses"]["resent"] == 0 and sent["responses"]["messages"] > 0
    # The run did real work: every output has rows (dead letters too: 1% malformed).
    for name in ("purchases", "interactions", "item_popularity", "user_community",
                 "query_stats", "dead_letters", "topic:responses"):
        assert outputs[name], name
    return outputs
