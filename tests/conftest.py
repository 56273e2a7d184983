"""Shared fixtures: one Spark session per test module, and a local broker."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def spark():
    """A local[2] Spark session, reused by every test of a module (cold start 5–8 s)."""
    from falkirk.spark import session

    s = session("falkirk-tests")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """One local Kafka-compatible broker (noida-db) for the whole test session."""
    from falkirk.broker import LocalBroker

    with LocalBroker(tmp_path_factory.mktemp("broker")) as b:
        yield b


@pytest.fixture
def world(tmp_path):
    """The small pipeline of tests/tiny_pipeline.py after a few epochs (no Spark)."""
    from tiny_pipeline import make_world

    return make_world(tmp_path)
