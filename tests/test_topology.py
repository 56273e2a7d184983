"""Pipeline declarations: a valid one loads; each mistake is refused naming its place."""

from __future__ import annotations

import copy
import json

import pytest

from falkirk.model.topology import Pipeline, TopologyError

SMALL = {
    "pipeline": "small",
    "settings": {"epoch_seconds": 10, "origin_ms": 1704067200000, "app": {"top_n": 5}},
    "regions": {
        "ingest": {"regime": "ephemeral", "job": "jobs/ingest.py"},
        "popularity": {"regime": "batch", "job": "jobs/popularity.py"},
        "communities": {"regime": "lazy", "domain": "epoch.iteration", "checkpoint_every": 3,
                        "job": "jobs/communities.py"},
        "stats": {"regime": "eager", "job": "jobs/communities.py"},
    },
    "edges": {
        "events": {"kind": "kafka", "to": "ingest", "topic": "events", "partitions": 3},
        "purchases": {"kind": "delta", "from": "ingest", "to": "popularity", "table": "purchases"},
        "interactions": {"kind": "delta", "from": "ingest", "to": "communities",
                         "table": "interactions"},
        "labels": {"kind": "unlogged", "from": "communities", "to": "stats"},
        "feedback": {"kind": "delta", "from": "communities", "to": "communities",
                     "table": "feedback"},
    },
}


def test_a_valid_declaration_loads():
    p = Pipeline.from_dict(SMALL)
    assert p.regions["communities"].iterating and p.regions["communities"].keeps_state
    assert not p.regions["ingest"].keeps_state
    assert [e.name for e in p.in_edges("communities")] == ["interactions", "feedback"]
    assert p.edges["purchases"].logged and not p.edges["labels"].logged
    assert p.edge_domain(p.edges["interactions"]) == "epoch.iteration"
    assert p.edge_domain(p.edges["labels"]) == "epoch"


def broken(path: list, value) -> dict:
    data = copy.deepcopy(SMALL)
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


CASES = {
    "unknown region on an edge": (
        broken(["edges", "purchases", "to"], "populrity"),
        "edge 'purchases': 'to' names unknown region 'populrity'"),
    "cycle without an iterating region": (
        broken(["edges", "back"], {"kind": "delta", "from": "popularity", "to": "ingest",
                                   "table": "back"}),
        "a cycle without an iterating region: ingest → popularity → ingest"),
    "ephemeral region with state": (
        broken(["regions", "ingest", "stateful"], True),
        "region 'ingest': an ephemeral region keeps no state"),
    "lazy region without an interval": (
        broken(["regions", "communities", "checkpoint_every"], KeyError),
        "region 'communities': a lazy region needs checkpoint_every"),
    "unknown regime": (
        broken(["regions", "stats", "regime"], "careful"),
        "region 'stats': regime must be one of"),
    "unlogged edge across jobs": (
        broken(["regions", "stats", "job"], "jobs/stats.py"),
        "edge 'labels': an unlogged edge passes records inside one Spark job"),
    "kafka edge without topic": (
        broken(["edges", "events", "topic"], KeyError),
        "edge 'events': a kafka edge needs its topic"),
    "no settings": (
        broken(["settings"], KeyError),
        "settings: missing: declare at least epoch_seconds and origin_ms"),
    "no epoch length (it would default silently)": (
        broken(["settings", "epoch_seconds"], KeyError),
        "settings.epoch_seconds: field required"),
    "an epoch of 0 s": (
        broken(["settings", "epoch_seconds"], 0),
        "settings.epoch_seconds: input should be greater than 0 (got 0)"),
    "an epoch length in words": (
        broken(["settings", "epoch_seconds"], "ten"),
        "settings.epoch_seconds: input should be a valid number (got 'ten')"),
    "an origin that is not a whole number": (
        broken(["settings", "origin_ms"], 1.5),
        "settings.origin_ms: input should be a valid integer (got 1.5)"),
    "unknown on_failure": (
        broken(["settings", "checks"], {"on_failure": "panic"}),
        "settings.checks.on_failure: input should be 'quarantine' or 'rollback' (got 'panic')"),
    "bad pandas_max_rows": (
        broken(["settings", "checks"], {"pandas_max_rows": -1}),
        "settings.checks.pandas_max_rows: input should be greater than or equal to 0"),
    "misspelt checks key": (
        broken(["settings", "checks"], {"hodl": True}),
        "settings.checks.hodl: unknown setting (did you mean 'hold'?"),
    "a table written by two regions": (
        broken(["edges", "more"], {"kind": "delta", "from": "popularity",
                                   "table": "purchases"}),
        "table 'purchases': written by regions ['ingest', 'popularity']"),
    "unknown read mode": (
        broken(["edges", "purchases", "read"], "tail"),
        "edge 'purchases': read must be one of snapshot, appends, got 'tail'"),
    "appends of a kafka edge": (
        broken(["edges", "events", "read"], "appends"),
        "edge 'events': read: appends is how a region reads a delta edge; this edge is kafka"),
    "unknown key": (
        broken(["regions", "stats", "checkpoint_evry"], 2),
        "region 'stats': unknown keys ['checkpoint_evry']"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_invalid_declarations_are_refused_with_the_place(case):
    data, message = CASES[case]
    with pytest.raises(TopologyError) as err:
        Pipeline.from_dict(data, origin="small.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("small.yaml: ")


def write_table_schemas(folder, data: dict) -> None:
    """Beside the declaration: an empty file for every job it names and a one-column
    schema for every Delta table."""
    for spec in data["regions"].values():
        (folder / spec["job"]).parent.mkdir(parents=True, exist_ok=True)
        (folder / spec["job"]).write_text("")
    (folder / "schemas" / "tables").mkdir(parents=True)
    for e in data["edges"].values():
        if e["kind"] == "delta":
            (folder / "schemas" / "tables" / f"{e['table']}.json").write_text(
                json.dumps({"fields": [{"name": "epoch", "type": "int64"}]}))


def test_a_declaration_file_naming_a_missing_job_is_refused(tmp_path):
    import yaml

    data = broken(["regions", "stats", "job"], "jobs/nowhere.py")
    data["edges"].pop("labels")  # else the unlogged edge across jobs is refused first
    (tmp_path / "jobs").mkdir()
    for job in ("ingest", "popularity", "communities"):
        (tmp_path / "jobs" / f"{job}.py").write_text("")
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(TopologyError, match=r"region 'stats': job file jobs/nowhere.py not "
                                            r"found"):
        Pipeline.load(path)


def test_every_path_a_declaration_names_is_relative_to_its_folder(tmp_path, monkeypatch):
    import yaml

    data = broken(["regions", "stats", "job"], "jobs/mine.py")
    data["edges"].pop("labels")
    write_table_schemas(tmp_path, data)
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path.parent)  # not where the current directory is
    pipe = Pipeline.load(path)
    assert pipe.folder == tmp_path
    assert pipe.job_path("jobs/mine.py") == tmp_path / "jobs" / "mine.py"
    assert pipe.job_path("jobs/ingest.py") == tmp_path / "jobs" / "ingest.py"
    assert pipe.schema_roots == (tmp_path / "schemas",)
    (tmp_path / "jobs" / "popularity.py").unlink()  # no fallback elsewhere (a checkout)
    with pytest.raises(TopologyError, match=f"job file jobs/popularity.py not found "
                                            f"\\(looked in {tmp_path}\\)"):
        Pipeline.load(path)


def test_invariants_are_a_file_the_declaration_names_and_loads_by_region(tmp_path):
    """A pipeline's cross-region checks come from its own file: a missing file is refused
    at load, a region the pipeline lacks is refused when the checks load, and a pipeline
    that declares none has none (nothing is looked up by pipeline name)."""
    import yaml

    from falkirk.quality.invariants import CheckError, load_invariants

    assert load_invariants(Pipeline.from_dict(SMALL)) == {}
    with pytest.raises(TopologyError, match="invariants: expected the path of a Python file"):
        Pipeline.from_dict({**SMALL, "invariants": "checks.txt"})
    data = {**copy.deepcopy(SMALL), "invariants": "mine/invariants.py"}
    write_table_schemas(tmp_path, data)
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(TopologyError, match="invariants file mine/invariants.py not found"):
        Pipeline.load(path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "invariants.py").write_text(
        "def totals_match(v, row, logs):\n    return 't', True, {}, [], 1\n\n"
        "INVARIANTS = {'stats': [totals_match]}\n")
    pipe = Pipeline.load(path)
    [(name, fn)] = load_invariants(pipe)["stats"]
    assert name == "totals_match" and fn(None, None, None) == ("t", True, {}, [], 1)
    (tmp_path / "mine" / "other.py").write_text("INVARIANTS = {'nowhere': []}\n")
    data["invariants"] = "mine/other.py"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(CheckError, match=r"names regions \['nowhere'\] that pipeline 'small'"):
        load_invariants(Pipeline.load(path))


def test_settings_keep_the_applications_own_keys_under_app():
    p = Pipeline.from_dict(SMALL)
    assert p.app == {"top_n": 5} and p.settings["epoch_seconds"] == 10
    assert p.checks_setting("on_failure") == "quarantine"  # the declared default


def test_a_misspelt_setting_is_refused_with_the_key_it_most_likely_meant():
    data = copy.deepcopy(SMALL)
    data["settings"] = {"epoch_second": 10, "origin_ms": 0}
    with pytest.raises(TopologyError) as err:
        Pipeline.from_dict(data, origin="sensors/pipeline.yaml")
    message = str(err.value)
    assert message.startswith("sensors/pipeline.yaml: ")
    assert "settings.epoch_second: unknown setting (did you mean 'epoch_seconds'? the " \
           "pipeline's own settings go under settings.app)" in message
    assert "settings.epoch_seconds: field required" in message
    data["settings"] = {"epoch_seconds": 10, "origin_ms": 0, "top_n": 5}
    with pytest.raises(TopologyError, match=r"settings.top_n: unknown setting \(the "):
        Pipeline.from_dict(data)
    data["settings"] = {"epoch_seconds": 10, "origin_ms": 0, "checks": {"hlod": True}}
    with pytest.raises(TopologyError, match=r"settings.checks.hlod: unknown setting \(did "
                                            r"you mean 'hold'\? known: hold, on_failure"):
        Pipeline.from_dict(data)


def _folder(root, data: dict, types: dict[str, str] | None = None):
    """A pipeline folder under ``root`` with empty jobs and one-column table schemas."""
    import yaml

    folder = root / data["pipeline"]
    (folder / "jobs").mkdir(parents=True)
    (folder / "schemas" / "tables").mkdir(parents=True)
    for spec in data["regions"].values():
        (folder / spec["job"]).write_text("")
    for e in data["edges"].values():
        if e["kind"] == "delta":
            typ = (types or {}).get(e["table"], "int64")
            (folder / "schemas" / "tables" / f"{e['table']}.json").write_text(
                json.dumps({"fields": [{"name": "epoch", "type": typ}]}))
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(data))
    return folder


def test_a_column_type_no_table_can_have_is_refused_when_the_declaration_loads(tmp_path):
    data = copy.deepcopy(SMALL)
    data["edges"].pop("labels")
    data["regions"]["stats"]["job"] = "jobs/stats.py"
    folder = _folder(tmp_path, data, {"purchases": "float64"})
    with pytest.raises(TopologyError) as err:
        Pipeline.load(folder)
    assert str(err.value) == (
        f"{folder / 'pipeline.yaml'}: edge 'purchases': "
        f"{folder / 'schemas' / 'tables' / 'purchases.json'}: field 'epoch' has unknown type "
        "'float64' (known: string, int32, int64, double, bool, timestamp[us, tz=UTC])")


def test_pipeline_takes_a_declared_name_or_a_folder_whatever_the_current_directory_holds(
        tmp_path, monkeypatch):
    """The guide's layout: ~/pipelines/sensors/ declared through FALKIRK_PIPELINES, and
    the user working in ~/pipelines, where ``sensors`` is also a folder."""
    from falkirk.model.topology import load_pipeline

    data = copy.deepcopy(SMALL)
    data["pipeline"] = "sensors"
    data["edges"].pop("labels")
    data["regions"]["stats"]["job"] = "jobs/stats.py"
    folder = _folder(tmp_path, data)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FALKIRK_PIPELINES", str(tmp_path))
    assert load_pipeline("sensors").source == str(folder / "pipeline.yaml")
    assert load_pipeline("sensors/").name == "sensors"
    assert load_pipeline(str(folder)).name == "sensors"
    assert load_pipeline(folder / "pipeline.yaml").name == "sensors"
    monkeypatch.setenv("FALKIRK_PIPELINES", "")  # not declared: the folder still loads
    assert load_pipeline("sensors").name == "sensors"
    (tmp_path / "empty").mkdir()
    with pytest.raises(TopologyError, match="empty: a folder without a pipeline.yaml"):
        load_pipeline("empty")
    with pytest.raises(TopologyError, match="unknown pipeline 'nowhere': not a declared name"):
        load_pipeline("nowhere")


def test_pipelines_outside_the_checkout_are_found_and_each_is_checked(tmp_path):
    """$FALKIRK_PIPELINES: a pipeline folder (its own jobs and schemas) and a broken file
    are listed beside the checkout's reference pipeline; the broken one names its error."""
    import os
    import subprocess
    import sys

    import yaml

    folder = tmp_path / "pipelines"
    small = folder / "small"
    (small / "jobs").mkdir(parents=True)
    (small / "schemas" / "tables").mkdir(parents=True)
    data = copy.deepcopy(SMALL)
    data["edges"].pop("labels")
    data["regions"]["stats"]["job"] = "jobs/stats.py"
    for spec in data["regions"].values():
        (small / spec["job"]).write_text("")
    for e in data["edges"].values():
        if e["kind"] == "delta":
            (small / "schemas" / "tables" / f"{e['table']}.json").write_text(
                json.dumps({"fields": [{"name": "epoch", "type": "int64"}]}))
    (small / "pipeline.yaml").write_text(yaml.safe_dump(data))
    broken = {**copy.deepcopy(data), "pipeline": "broken"}
    for spec in broken["regions"].values():  # its jobs are small's, but one
        spec["job"] = f"small/{spec['job']}"
    broken["regions"]["ingest"]["job"] = "jobs/nowhere.py"
    (folder / "broken.yaml").write_text(yaml.safe_dump(broken))
    run = subprocess.run([sys.executable, "-m", "falkirk.cli", "pipelines", "--json"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "FALKIRK_PIPELINES": str(folder)})
    assert run.returncode == 1, run.stderr  # one of them is broken
    found = json.loads(run.stdout)
    assert found["small"] == {"file": str(small / "pipeline.yaml"), "error": None}
    assert found["reference"]["error"] is None
    assert "region 'ingest': job file jobs/nowhere.py not found" in found["broken"]["error"]
