"""Shared fixtures: one Spark session per test module, a local broker, a test Airflow
home (set before Airflow is first imported) and a freshly parsed rollback DAG."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from falkirk.config import REPO_ROOT
from falkirk.local.airflow import DAGS_FOLDER, plugins_folder

# py4j says "Closing down clientserver connection" from __del__ at exit, through a handler
# a test's in-process CLI set up on a captured stream pytest has closed by then: a
# "--- Logging error ---" trace after the summary, not a failure. Its warnings still show.
logging.getLogger("py4j").setLevel(logging.WARNING)


TIERS = ("unit", "integration", "system")


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="also run the tests marked full (long runs CI leaves out)")
    parser.addoption("--tier", choices=TIERS,
                     help="only one tier: unit (no Spark, broker or Airflow), integration "
                          "(the real engines, a part at a time), system (whole pipelines)")


def tier_of(item) -> str:
    """unit: not marked slow; system: marked system (a whole pipeline runs); else
    integration (Spark, the broker or Airflow, one part at a time)."""
    if item.get_closest_marker("system"):
        return "system"
    return "integration" if item.get_closest_marker("slow") else "unit"


def pytest_collection_modifyitems(config, items):
    """The tests marked ``full`` run only with --full: each is a long run whose parts are
    also tested, more cheaply, in the default run (the mark's reason says where). They are
    deselected by name, and the summary lists them, never silently. ``--tier`` keeps one
    tier; the summary says how many of the others it left out."""
    tier = config.getoption("--tier")
    if tier is not None:
        other = [item for item in items if tier_of(item) != tier]
        if other:
            config.hook.pytest_deselected(items=other)
            items[:] = [item for item in items if tier_of(item) == tier]
            config._falkirk_other_tiers = (tier, len(other))
    if config.getoption("--full"):
        return
    left_out = [item for item in items if item.get_closest_marker("full")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker("full")]
        config._falkirk_left_out = left_out


def pytest_terminal_summary(terminalreporter, config):
    tier = getattr(config, "_falkirk_other_tiers", None)
    if tier is not None:
        terminalreporter.section(f"tier {tier[0]} only")
        terminalreporter.write_line(f"{tier[1]} tests of the other tiers left out (bin/test "
                                    "without --tier runs every tier)")
    left_out = getattr(config, "_falkirk_left_out", [])
    if left_out:
        terminalreporter.section("left out of this run (bin/test --full runs them)")
        for item in left_out:
            why = item.get_closest_marker("full").kwargs.get("reason", "")
            terminalreporter.write_line(f"{item.nodeid}: {why}")


@pytest.fixture(scope="session", autouse=True)
def engine_home(tmp_path_factory):
    """The Spark Connect engine of the suite: the local profile's (on a port of its own,
    so a demo's engine beside the suite is not shared), started by the first job or
    session that needs it (falkirk.runtime.engine.ensure), with its log and process record
    in a folder of the session's, and stopped when the session ends. Every Spark session
    of the suite, the tests' own and those of the jobs they start, is one of its clients.
    ``FALKIRK_SPARK_REMOTE=`` runs the suite with an application per job instead."""
    from falkirk.config import load
    from falkirk.local.broker import free_port
    from falkirk.runtime.engine import stop_local

    folder = tmp_path_factory.mktemp("engine")
    # No warm-up before a run's first jobs (a minute each); test_engine's own test warms.
    settings = {"FALKIRK_LOCAL_ENGINE_DIR": str(folder),
                "FALKIRK_LOCAL_SPARK_REMOTE": f"sc://127.0.0.1:{free_port()}",
                "FALKIRK_ENGINE_WARMUP_S": "0"}
    before = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    yield folder
    # Frames still referenced when the engine stops release themselves at exit, each with a
    # call that finds no engine: "GRPC Error received" traces after the summary, not
    # failures.
    logging.getLogger("pyspark.sql.connect.logging").setLevel(logging.CRITICAL)
    stop_local(load("local"))
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def spark():
    """A Spark session reused by every test of a module: on the suite's engine (a
    Connect session: about a second), or with ``FALKIRK_SPARK_REMOTE=`` an application of
    its own (local[2], a cold start of 5–8 s)."""
    from falkirk.runtime.launcher import session

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
def installed(tmp_path_factory, wheel) -> dict:
    """falkirk installed from its wheel into a virtual environment of its own, outside the
    checkout, with its JVM jars fetched by ``falkirk jars`` into its own home: what a user
    has (tests/test_init.py, tests/test_guide.py). Its dependencies are this checkout's (a
    path file links their site-packages; the checkout's editable path file is not read),
    so nothing is downloaded but the jars, from the local Maven cache. Returns the
    interpreter (``python``), the environment to run it with (``env``) and the folder of
    its jars (``jars``)."""
    import shutil
    import sysconfig

    root = tmp_path_factory.mktemp("user_install")
    uv = [shutil.which("uv")] if shutil.which("uv") else ["python3", "-m", "uv"]
    venv = root / "venv"
    subprocess.run([*uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True,
                   capture_output=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "_checkout_dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([*uv, "pip", "install", "-q", "--no-deps", "--python", str(python),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    env = {"FALKIRK_HOME": str(root / "home"), "FALKIRK_JARS_DIR": "",
           "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    where = subprocess.run(
        [str(python), "-c", "import falkirk, importlib.util as u; "
         "print(falkirk.__file__, u.find_spec('falkirk_dev') is None)"],
        capture_output=True, text=True, cwd=root, env={**os.environ, **env})
    assert where.stdout.split() == [str(Path(purelib, "falkirk", "__init__.py")), "True"], \
        where.stdout + where.stderr
    fetched = subprocess.run([str(python), "-m", "falkirk.cli", "jars"], capture_output=True,
                             text=True, timeout=900, env={**os.environ, **env})
    assert fetched.returncode == 0, fetched.stderr
    jars = root / "home" / "jvm" / "lib"
    assert f"spark: 6 jars in {jars / 'spark'}, complete" in fetched.stdout
    return {"python": str(python), "env": env, "jars": jars}


@pytest.fixture(scope="session")
def airflow_env(tmp_path_factory):
    """A migrated SQLite Airflow home of its own, set before Airflow is first imported."""
    if "airflow.configuration" in sys.modules:
        pytest.fail("Airflow was imported before its test home was set: a test imported it "
                    "at module level; import it inside the test instead")
    home = tmp_path_factory.mktemp("airflow_home")
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
    }
    # As `falkirk airflow start` sets it: no folder when the installation's entry point
    # registers falkirk's plugin (a folder holding it too would register it twice).
    plugins = plugins_folder()
    saved = {k: os.environ.get(k) for k in [*env, "AIRFLOW__CORE__PLUGINS_FOLDER"]}
    os.environ.pop("AIRFLOW__CORE__PLUGINS_FOLDER", None)
    if plugins is not None:
        env["AIRFLOW__CORE__PLUGINS_FOLDER"] = plugins
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

    return DagBag(dag_folder=str(DAGS_FOLDER / "falkirk_pipelines.py")).dags[
        "falkirk_reference_rollback"]


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory):
    """The reference pipeline's failure-free run on the embedded defaults, validated as it
    runs (reference_runs.held_run), made once per session; its broker stays up. Its
    outputs are ``golden``; tests/test_checks.py checks, breaks and reruns its epochs
    (after the other tests took ``golden``, which it does not change)."""
    from reference_runs import held_run

    with held_run(tmp_path_factory.mktemp("golden")) as run:
        yield run


@pytest.fixture(scope="session")
def golden(reference_run):
    """What every run with faults must end equal to: the failure-free run's outputs."""
    outputs, sent = reference_run.golden, reference_run.golden_sent
    # Without a failure every answer is sent once, in generation 0.
    assert sent["responses"]["resent"] == 0 and sent["responses"]["messages"] > 0
    # The run did real work: every output has rows (dead letters too: 1% malformed).
    for name in ("purchases", "interactions", "item_popularity", "user_community",
                 "query_stats", "dead_letters", "topic:responses"):
        assert outputs[name], name
    return dict(outputs)
