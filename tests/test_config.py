"""The one config object: the cluster profile's lake on an object store, Spark and delta-rs
pointed at the same store from one set of storage options, and credentials that never
reach a command line or the repository."""

from __future__ import annotations

import json

import pytest

from falkirk.config import ConfigError, load
from falkirk.io import jars
from falkirk.io.launch import launch_conf
from falkirk.local.run import LocalRun

KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


@pytest.fixture
def var(tmp_path, monkeypatch):
    monkeypatch.setenv("FALKIRK_VAR_DIR", str(tmp_path / "var"))
    for key in (*KEYS, "FALKIRK_S3_ENDPOINT", "FALKIRK_LAKE"):
        monkeypatch.delenv(key, raising=False)
    return tmp_path / "var"


def _write_credentials(var, access="k-file", secret="s-file"):
    path = var / "cluster" / "objectstore" / "credentials.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({KEYS[0]: access, KEYS[1]: secret}))
    return path


def test_spark_and_delta_rs_reach_the_same_store_and_no_secret_is_a_launch_setting(var):
    _write_credentials(var, secret="never-on-a-command-line")
    cfg = load("cluster")
    opts, conf = cfg.delta_storage_options, launch_conf(cfg)
    assert cfg.lake.startswith("s3://") and "AWS_S3_ALLOW_UNSAFE_RENAME" not in opts
    assert opts["AWS_CONDITIONAL_PUT"] == "etag"  # put-if-absent commits instead
    assert conf["spark.hadoop.fs.s3a.endpoint"] == opts["AWS_ENDPOINT_URL"]
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == opts["AWS_REGION"]
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"  # http:// here
    assert conf["spark.driver.extraClassPath"] == conf["spark.executor.extraClassPath"]
    assert {p.rsplit("/", 1)[-1] for p in conf["spark.driver.extraClassPath"].split(":")} == {
        p.rsplit("/", 1)[-1] for p in jars.jars("s3")}
    assert any("hadoop-aws-3.5.0" in p for p in jars.jars("s3"))  # pyspark's Hadoop
    assert not any("never-on-a-command-line" in v or "k-file" in v for v in conf.values())
    secret = cfg.s3a_settings(secrets=True)  # what the running driver sets (io.spark)
    assert (secret["fs.s3a.access.key"], secret["fs.s3a.secret.key"]) == (
        "k-file", "never-on-a-command-line")


def test_the_environment_names_a_remote_store_and_its_credentials(var, monkeypatch):
    _write_credentials(var)
    monkeypatch.setenv(KEYS[0], "k-env")
    monkeypatch.setenv(KEYS[1], "s-env")
    monkeypatch.setenv("FALKIRK_S3_ENDPOINT", "https://s3.example.internal")
    monkeypatch.setenv("FALKIRK_LAKE", "s3://team-lake/falkirk")
    cfg = load("cluster")
    opts = cfg.delta_storage_options
    assert (opts[KEYS[0]], opts[KEYS[1]]) == ("k-env", "s-env")  # the environment wins
    assert cfg.table("t") == "s3://team-lake/falkirk/t"
    assert launch_conf(cfg)["spark.hadoop.fs.s3a.endpoint"] == (
        "https://s3.example.internal")
    assert launch_conf(cfg)["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"


def test_missing_credentials_name_both_places_to_put_them(var):
    cfg = load("cluster")  # loads: bin/cluster up itself runs before any credentials exist
    with pytest.raises(ConfigError) as err:
        cfg.delta_storage_options  # noqa: B018 - what every table access goes through
    message = str(err.value)
    assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment" in message
    assert str(var / "cluster" / "objectstore" / "credentials.json") in message
    assert "bin/cluster up writes it" in message


def test_an_unreadable_credentials_file_is_named(var):
    path = _write_credentials(var)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="credentials.json: the object store's credentials "
                       "file is unreadable"):
        load("cluster")


def test_a_local_run_on_an_object_store_keeps_its_tables_under_a_prefix_of_its_own(var,
                                                                                    tmp_path):
    _write_credentials(var)
    cfg = load("cluster")
    first = LocalRun(tmp_path / "run-a", "reference")
    first.root.mkdir(parents=True)
    lake = first._lake(cfg)
    assert lake.startswith("s3://falkirk/lake/runs/run-a-")
    assert first._lake(cfg) == lake  # found again: the run reads its outputs back
    other = LocalRun(tmp_path / "run-b", "reference")
    other.root.mkdir(parents=True)
    assert other._lake(cfg) != lake
    assert LocalRun(tmp_path / "run-c", "reference")._lake(load("local")) == str(
        tmp_path / "run-c" / "lake")


def test_a_profile_scoped_setting_overrides_that_profile_only(monkeypatch):
    """FALKIRK_<PROFILE>_<FIELD> sets a field of one profile (the suite's engine port for
    the local profile, leaving the cluster's jobs applications of their own); it wins over
    FALKIRK_<FIELD>, which sets it for every profile."""
    from falkirk.config import load

    monkeypatch.setenv("FALKIRK_LOCAL_SPARK_REMOTE", "sc://127.0.0.1:4242")
    assert load("local").spark_remote == "sc://127.0.0.1:4242"
    assert load("cluster").spark_remote == ""
    monkeypatch.setenv("FALKIRK_SPARK_REMOTE", "sc://127.0.0.1:5151")
    assert load("local").spark_remote == "sc://127.0.0.1:4242"
    assert load("cluster").spark_remote == "sc://127.0.0.1:5151"
