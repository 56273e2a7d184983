"""Time domains and frontier values: order, join, meet, JSON, and offsets ↔ epochs."""

import pytest

from falkirk.model.times import (
    EPOCH,
    ITERATION,
    OFFSETS,
    EpochRange,
    EpochRanges,
    Frontier,
    Offsets,
    TimeError,
)


def test_epoch_frontiers_order_join_meet():
    bot, three, five, top = (Frontier.parse(EPOCH, v) for v in (-1, 3, 5, "top"))
    assert bot <= three <= five <= top
    assert three < five and not five <= three
    assert (three | five) == five and (three & five) == three
    assert (bot | three) == three and (top & three) == three
    assert bot.is_bottom and top.is_top
    assert [f.to_json() for f in (bot, three, top)] == [-1, 3, "top"]


def test_iteration_times_are_lexicographic_and_inf_means_converged():
    a, b, c = (Frontier.parse(ITERATION, v) for v in ([2, 7], [3, 0], [3, "inf"]))
    assert a < b < c
    assert (a | c) == c and (a & c) == a
    assert c.to_json() == [3, "inf"] and str(c) == "(3, ∞)"
    assert Frontier.bottom(ITERATION) < a and c < Frontier.top(ITERATION)


def test_offsets_are_partially_ordered_partition_by_partition():
    a = Frontier.parse(OFFSETS, {"0": 10, "1": 5})
    b = Frontier.parse(OFFSETS, {"0": 5, "1": 10})
    assert not a <= b and not b <= a  # incomparable
    assert (a | b).to_json() == {"0": 10, "1": 10}
    assert (a & b).to_json() == {"0": 5, "1": 5}
    assert Frontier.bottom(OFFSETS) <= a <= Frontier.top(OFFSETS)
    assert Frontier.parse(OFFSETS, {}).is_bottom  # nothing read in any partition


@pytest.mark.parametrize(
    "dom, value, words",
    [
        (EPOCH, [4, 1], "mixed domains"),
        (EPOCH, -3, "integer ≥ 0"),
        (EPOCH, "soon", "expected an epoch"),
        (ITERATION, 4, "mixed domains"),
        (ITERATION, [4], "expected an epoch.iteration"),
        (OFFSETS, 4, "mixed domains"),
        (OFFSETS, {"0": -1}, "expected offsets"),
    ],
)
def test_malformed_times_are_refused_with_the_reason(dom, value, words):
    with pytest.raises(TimeError, match=words):
        dom.parse(value)


def test_frontiers_of_different_domains_do_not_compare():
    with pytest.raises(TimeError, match="cannot compare"):
        _ = Frontier.parse(EPOCH, 1) <= Frontier.parse(ITERATION, [1, 0])


def test_epoch_ranges_translate_offsets_to_epochs_and_back():
    ranges = EpochRanges([
        EpochRange(0, Offsets({}), Offsets({"0": 4, "1": 2})),
        EpochRange(1, Offsets({"0": 4, "1": 2}), Offsets({"0": 9, "1": 2})),
        EpochRange(2, Offsets({"0": 9, "1": 2}), Offsets({"0": 9, "1": 7})),
    ])
    assert ranges.epoch_of(Offsets({})) == -1
    assert ranges.epoch_of(Offsets({"0": 9, "1": 3})) == 1  # epoch 2 not wholly read
    assert ranges.epoch_of(Offsets({"0": 100, "1": 100})) == 2
    assert ranges.offsets_of(1) == Offsets({"0": 9, "1": 2})
    assert ranges.offsets_of(-1) == Offsets({})


def test_epoch_ranges_refuse_gaps_and_overlaps():
    with pytest.raises(TimeError, match="gap or an overlap"):
        EpochRanges([
            EpochRange(0, Offsets({}), Offsets({"0": 4})),
            EpochRange(1, Offsets({"0": 5}), Offsets({"0": 9})),
        ])


def test_default_projections_between_domains():
    from falkirk.model.times import INF, project

    assert project(EPOCH, EPOCH, 4) == 4
    assert project(EPOCH, ITERATION, 4) == (4, INF)  # the whole epoch, converged
    assert project(ITERATION, EPOCH, (4, INF)) == 4  # converged: epoch 4 is fixed
    assert project(ITERATION, EPOCH, (4, 2)) == 3  # mid-iteration: only epoch 3 is
    assert project(ITERATION, EPOCH, (0, 2)) == EPOCH.bottom
    assert project(EPOCH, EPOCH, EPOCH.bottom) == EPOCH.bottom
    assert project(EPOCH, EPOCH, EPOCH.top) == EPOCH.top


def test_shift_moves_times_by_epochs_for_delayed_edges():
    from falkirk.model.times import INF, shift

    assert shift(EPOCH, 5, -1) == 4  # a side input as of e - 1
    assert shift(EPOCH, 0, -1) == EPOCH.bottom
    assert shift(EPOCH, EPOCH.top, -1) == EPOCH.top
    assert shift(ITERATION, (3, 2), -1) == (2, INF)


def test_an_epochs_logged_time_and_the_last_whole_epoch_of_a_frontier_key():
    """A region logs ``e`` (epoch domain) or ``[e, "inf"]`` (iteration: converged) once
    epoch e is done; only those are whole epochs, and a frontier key's last whole epoch
    reads back to e (an iteration key inside epoch e to e - 1; bottom to -1)."""
    from falkirk.model.times import domain, epoch_of_key, is_whole_epoch, time_of

    assert time_of("epoch", 4) == 4 and time_of("epoch.iteration", 4) == [4, "inf"]
    assert is_whole_epoch(4) and is_whole_epoch([4, "inf"]) and not is_whole_epoch([4, 2])
    for name in ("epoch", "epoch.iteration"):
        dom = domain(name)
        assert epoch_of_key(name, dom.parse(time_of(name, 4))) == 4
        assert epoch_of_key(name, dom.bottom) == -1
    assert epoch_of_key("epoch.iteration", domain("epoch.iteration").parse([4, 2])) == 3
