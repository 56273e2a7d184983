"""Property tests of the solver on random region graphs (hypothesis).

Small random problems in the totally ordered domains: every plan satisfies every
constraint, equals the greatest consistent choice found by brute force, is not
lowered by a new checkpoint, and the incremental solver agrees with a full solve.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from falkirk.solver.frontier import Entry, Problem, Solver, check_plan, solve

POOLS = {
    "epoch": [-1, 0, 1, 2, 3, 4],
    "epoch.iteration": [-1, [0, 0], [0, "inf"], [1, 1], [1, "inf"], [2, 0], [2, "inf"]],
}


@st.composite
def problems(draw) -> dict:
    n = draw(st.integers(1, 4))
    names = [f"r{i}" for i in range(n)]
    domains = {r: draw(st.sampled_from(sorted(POOLS))) for r in names}
    pairs = draw(st.lists(st.tuples(st.sampled_from(names), st.sampled_from(names))
                          .filter(lambda t: t[0] != t[1]), max_size=5))
    edges = {f"e{i}": {"from": a, "to": b, "logged": draw(st.booleans())}
             for i, (a, b) in enumerate(pairs)}
    if draw(st.booleans()):  # an input topic from outside
        edges["input"] = {"to": names[0], "logged": True}
    regions = {}
    for r in names:
        pool = POOLS[domains[r]]
        ats = sorted(draw(st.sets(st.integers(1, len(pool) - 1), max_size=3)))
        live = draw(st.booleans())
        length = len(ats) + live
        entries: list[dict] = [{"at": pool[i]} for i in ats] + ([{}] if live else [])

        def monotone(edge_pool: list, may_top: bool, length=length, live=live) -> list:
            idx = sorted(draw(st.lists(st.integers(0, len(edge_pool) - 1),
                                       min_size=length, max_size=length)))
            values = [edge_pool[i] for i in idx]
            if may_top and live and values and draw(st.booleans()):
                values[-1] = "top"
            return values

        for e, spec in edges.items():
            if spec.get("to") == r:
                for entry, v in zip(entries, monotone(pool, False), strict=True):
                    entry.setdefault("delivered", {})[e] = v
            if spec.get("from") == r:
                dst_pool = POOLS[domains[spec["to"]]]
                for key in ("projected", "discarded"):
                    for entry, v in zip(entries, monotone(dst_pool, True), strict=True):
                        entry.setdefault(key, {})[e] = v
        raw = {"domain": domains[r], "failed": draw(st.booleans()),
               "frontiers": entries[: len(ats)]}
        if live:
            raw["live"] = entries[-1]
        regions[r] = raw
    return {"regions": regions, "edges": edges}


def candidates(problem: Problem, all_failed: bool = False) -> dict[str, list]:
    out = {}
    for name, r in problem.regions.items():
        keys = [r.domain.bottom, *(f.at for f in r.frontiers)]
        if r.keeps_top and not all_failed:
            keys.append(r.domain.top)
        out[name] = keys
    return out


def brute_force(problem: Problem, all_failed: bool = False) -> list[dict]:
    cands = candidates(problem, all_failed)
    names = list(cands)
    check = problem.with_all_failed() if all_failed else problem
    return [dict(zip(names, combo, strict=True))
            for combo in itertools.product(*(cands[n] for n in names))
            if not check_plan(check, dict(zip(names, combo, strict=True)))]


def keys(frontiers) -> dict:
    return {n: f.key for n, f in frontiers.items()}


SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(problems())
def test_plan_satisfies_every_constraint(data):
    problem = Problem.from_json(data)
    plan = solve(problem)
    assert check_plan(problem, keys(plan.frontiers)) == []
    assert check_plan(problem.with_all_failed(), keys(plan.low_watermark)) == []


@SETTINGS
@given(problems())
def test_plan_is_the_greatest_consistent_choice(data):
    problem = Problem.from_json(data)
    chosen = keys(solve(problem).frontiers)
    consistent = brute_force(problem)
    assert consistent, "all-bottom is always consistent"
    for combo in consistent:
        for name, key in combo.items():
            assert problem.regions[name].domain.leq(key, chosen[name]), (name, combo, chosen)
    assert chosen in consistent


@SETTINGS
@given(problems())
def test_low_watermark_is_the_greatest_choice_with_every_region_failed(data):
    problem = Problem.from_json(data)
    wm = keys(solve(problem).low_watermark)
    for combo in brute_force(problem, all_failed=True):
        for name, key in combo.items():
            assert problem.regions[name].domain.leq(key, wm[name])


def a_new_frontier(problem: Problem, name: str, draw) -> Entry | None:
    """A frontier later than the region's newest, with metadata that keeps the chain monotone."""
    region = problem.regions[name]
    pool = [region.domain.parse(v) for v in POOLS[region.domain.name][1:]]
    last = region.frontiers[-1] if region.frontiers else Entry(at=region.domain.bottom)
    later = [t for t in pool if region.domain.leq(last.at, t) and t != last.at]
    if not later:
        return None
    # The previous frontier's metadata or the live state's: either stays monotone.
    model = region.live if region.live is not None and draw.draw(st.booleans()) else last
    return Entry(at=draw.draw(st.sampled_from(later)), delivered=dict(model.delivered),
                 projected=dict(model.projected), discarded=dict(model.discarded))


@SETTINGS
@given(problems(), st.data())
def test_new_checkpoints_never_lower_a_frontier_and_incremental_equals_full(data, draw):
    problem = Problem.from_json(data)
    solver = Solver(problem)
    monitor = Solver(problem, all_failed=True)
    before = keys(solver.frontiers())
    monitor.frontiers()
    updates = 0
    for name in draw.draw(st.lists(st.sampled_from(sorted(problem.regions)), min_size=1,
                                   max_size=4)):
        entry = a_new_frontier(problem, name, draw)
        if entry is None:
            continue
        solver.add_frontier(name, entry)  # appends to problem.regions[name].frontiers
        monitor.refresh(name)
        updates += 1
        after = keys(solver.frontiers())
        for n, key in before.items():
            assert problem.regions[n].domain.leq(key, after[n]), (n, before, after)
        before = after
    assume(updates)
    fresh = Problem.from_json(problem.to_json())
    assert keys(solver.frontiers()) == keys(Solver(fresh).frontiers())
    assert keys(monitor.frontiers()) == keys(Solver(fresh, all_failed=True).frontiers())


@SETTINGS
@given(problems(), st.data())
def test_failures_solved_incrementally_equal_a_full_solve(data, draw):
    problem = Problem.from_json(data)
    solver = Solver(problem)
    solver.frontiers()
    for name in draw.draw(st.lists(st.sampled_from(sorted(problem.regions)), max_size=3)):
        solver.fail(name)
    fresh = Problem.from_json(problem.to_json())
    assert keys(solver.frontiers()) == keys(Solver(fresh).frontiers())


@SETTINGS
@given(problems())
def test_problem_file_round_trips(data):
    problem = Problem.from_json(data)
    again = Problem.from_json(problem.to_json())
    assert again.to_json() == problem.to_json()
    assert solve(again).to_json() == solve(problem).to_json()


@st.composite
def pass_histories(draw) -> dict:
    """The small pipeline's epochs, each region's cut into passes at random: ingest and the
    agg+report job through the same epochs, agg checkpointing every 2 and report every
    epoch, as the loop logs them."""
    epochs = draw(st.integers(min_value=1, max_value=9))
    cuts = {job: sorted(draw(st.sets(st.integers(1, epochs - 1), max_size=epochs)))
            if epochs > 1 else [] for job in ("a", "b")}
    failed = draw(st.sets(st.sampled_from(["ingest", "agg", "report"]), min_size=1))
    return {"epochs": epochs, "cuts": cuts, "failed": sorted(failed)}


def _passes(epochs: int, cuts: list[int]) -> list[list[int]]:
    bounds = [0, *cuts, epochs]
    return [list(range(a, b)) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def _write(log, epochs: int, passes: dict[str, list[list[int]]]) -> None:
    """What the loop records: per pass, a ``running`` row of each epoch, then each
    epoch's own committed (or checkpointed) row with its input range and output version."""
    from tiny_pipeline import PIPE

    from falkirk.log.epochlog import EpochRecord

    jobs = {"a": ["ingest"], "b": ["agg", "report"]}
    for job, regions in jobs.items():
        for group in passes[job]:
            log.record(*(EpochRecord("tiny", r, e, 0, "running") for r in regions for e in group))
            rows = []
            for r in regions:
                for e in group:
                    due = PIPE.regions[r].regime_rules.checkpoint_due(PIPE.regions[r], e)
                    outs = {edge.name: {"table": edge.table, "version": e + 1}
                            for edge in PIPE.out_edges(r) if edge.kind == "delta"}
                    rows.append(EpochRecord(
                        "tiny", r, e, 0, "checkpointed" if due else "committed",
                        inputs={"src": {"from": {"0": e}, "to": {"0": e + 1}}}
                        if r == "ingest" else None, outputs=outs or None,
                        state_ref=f"checkpoint:{e}" if due else None))
            log.record(*rows)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pass_histories())
def test_a_log_written_in_passes_gives_the_plans_of_one_written_epoch_by_epoch(
        tmp_path_factory, data):
    """Passes are invisible to the solver and the rollback executor: each epoch of a pass
    has its own row, so a rollback may land on any of them (docs/model.md, "Passes")."""
    from dataclasses import replace

    from tiny_pipeline import PIPE

    from falkirk.config import load
    from falkirk.log.epochlog import EpochLog

    root = tmp_path_factory.mktemp("passes")
    epochs = data["epochs"]
    plans = []
    for passes in ({job: _passes(epochs, cuts) for job, cuts in data["cuts"].items()},
                   {job: [[e] for e in range(epochs)] for job in ("a", "b")}):
        log = EpochLog.from_config(replace(load(), lake=str(root / f"lake{len(plans)}")))
        _write(log, epochs, passes)
        plan = solve(log.problem(PIPE, failed=data["failed"]))
        plans.append((keys(plan.frontiers), plan.to_json()["replay"],
                      plan.to_json()["rerun"]))
    assert plans[0] == plans[1]
