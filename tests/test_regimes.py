"""Each regime is one module that says what it saves, acknowledges and restores; the rest of
falkirk asks the regime instead of branching on its name."""

from __future__ import annotations

import re
from types import SimpleNamespace

from falkirk.config import REPO_ROOT
from falkirk.regimes import REGIMES, regime


def test_what_each_regime_restores_to_and_when_it_checkpoints():
    assert list(REGIMES) == ["ephemeral", "batch", "lazy", "eager"]
    assert regime("ephemeral").restorable == regime("batch").restorable == ("committed",)
    assert regime("lazy").restorable == ("checkpointed",)  # only its checkpoints
    assert regime("eager").restorable == ("committed", "checkpointed")
    assert [r.name for r in REGIMES.values() if r.keeps_state] == ["lazy", "eager"]
    assert [r.name for r in REGIMES.values() if r.runs_per_epoch] == ["batch"]
    every3 = SimpleNamespace(checkpoint_every=3, checkpoint_seconds=None)
    assert [e for e in range(9) if regime("lazy").checkpoint_due(every3, e)] == [2, 5, 8]
    assert all(regime("eager").checkpoint_due(every3, e) for e in range(9))
    assert not any(regime(n).checkpoint_due(every3, e) for n in ("ephemeral", "batch")
                   for e in range(9))


def test_a_lazy_region_checkpoints_by_time_as_well_as_by_epochs():
    timed = SimpleNamespace(checkpoint_every=None, checkpoint_seconds=30.0)
    lazy = regime("lazy")
    assert not lazy.checkpoint_due(timed, 4, since_s=29.9)
    assert lazy.checkpoint_due(timed, 4, since_s=30.0)
    both = SimpleNamespace(checkpoint_every=10, checkpoint_seconds=30.0)
    assert lazy.checkpoint_due(both, 9, since_s=1.0)  # the 10th epoch
    assert lazy.checkpoint_due(both, 3, since_s=31.0)  # 30 s since the last
    assert not lazy.checkpoint_due(both, 3, since_s=1.0)


def test_checkpoint_seconds_is_a_positive_number():
    import pytest

    from falkirk.model.topology import Pipeline, TopologyError

    def pipe(**region):
        return Pipeline.from_dict({
            "pipeline": "p", "settings": {"epoch_seconds": 1, "origin_ms": 0},
            "regions": {"r": {"regime": "lazy", **region}}})

    assert pipe(checkpoint_seconds=2.5).regions["r"].checkpoint_seconds == 2.5
    for bad in (0, -1, "ten", True):
        with pytest.raises(TopologyError, match="checkpoint_seconds must be a number > 0"):
            pipe(checkpoint_seconds=bad)


def test_each_regime_module_says_what_it_saves_acknowledges_and_restores():
    for name in REGIMES:
        text = (REPO_ROOT / "plugins" / "falkirk" / "regimes" / f"{name}.py").read_text()
        doc = text.split('"""')[1]
        for word in ("Saves:", "Acknowledges:", "Restores:"):
            assert word in doc, f"regimes/{name}.py: its docstring lacks {word!r}"


def test_nothing_outside_regimes_branches_on_a_regime_name():
    names = "|".join(REGIMES)
    branch = re.compile(rf"regime\s*(==|!=|in)\s*[(\[]?\s*[\"']({names})[\"']")
    for path in (REPO_ROOT / "plugins" / "falkirk").rglob("*.py"):
        if path.parent.name == "regimes":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not branch.search(line), f"{path.relative_to(REPO_ROOT)}:{n}: {line.strip()}"
