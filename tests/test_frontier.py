"""The consistent-frontier solver on the worked examples, its validation and its CLI."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from falkirk.cli import main as cli_main
from falkirk.solver.frontier import Entry, Problem, ProblemError, Solver, check_plan, solve

PROBLEMS = Path(__file__).resolve().parents[1] / "plugins" / "falkirk" / "solver" / "problems"


def load(name: str) -> Problem:
    return Problem.load(PROBLEMS / f"{name}.json")


def plan_json(name: str) -> dict:
    return solve(load(name)).to_json()


# ---- the worked examples, each with the plan worked out by hand -------------------


def test_unlogged_chain_rolls_both_ends_back_together():
    # count (lazy) failed; its newest checkpoint is 3. parse feeds it through an
    # unlogged edge, so parse's live state has discarded records count would need:
    # parse must go back to 3 as well, and re-read its input topic after epoch 3.
    plan = plan_json("1_unlogged_chain")
    assert plan["frontiers"] == {"parse": 3, "count": 3}
    assert plan["replay"] == [
        {"edge": "events", "from": None, "to": "parse", "after": 3, "through": "top"}
    ]
    assert plan["rerun"] == [
        {"region": "parse", "after": 3, "through": 6},
        {"region": "count", "after": 3, "through": 5},
    ]


def test_logged_edge_lets_the_downstream_region_roll_back_alone_and_replay():
    plan = plan_json("2_logged_edge")
    assert plan["frontiers"] == {"ingest": "top", "popularity": 4}
    assert plan["replay"] == [
        {"edge": "purchases", "from": "ingest", "to": "popularity", "after": 4, "through": "top"}
    ]
    assert plan["rerun"] == [{"region": "popularity", "after": 4, "through": 5}]


def test_failed_eager_region_between_two_live_ones_moves_alone():
    plan = plan_json("3_failed_eager_between_live")
    assert plan["frontiers"] == {"source": "top", "totals": 6, "report": "top"}
    assert plan["replay"] == [
        {"edge": "a_out", "from": "source", "to": "totals", "after": 6, "through": "top"}
    ]
    assert plan["rerun"] == [{"region": "totals", "after": 6, "through": 6}]


def test_iterating_region_fed_by_epochs_projects_back_to_the_last_converged_epoch():
    # The newest checkpoint (4, 2) is mid-epoch: it projects to epoch 3 on the way out,
    # so stats (which had delivered epoch 4) must go back to 3; ingest stays live.
    plan = plan_json("4_iterating_region")
    assert plan["frontiers"] == {"ingest": "top", "communities": [4, 2], "stats": 3}
    # Epoch 4's interactions are already inside the checkpoint: replay starts after them.
    assert plan["replay"] == [
        {"edge": "interactions", "from": "ingest", "to": "communities",
         "after": [4, "inf"], "through": "top"}
    ]
    assert plan["rerun"] == [
        {"region": "communities", "after": [4, 2], "through": [5, 2]},
        {"region": "stats", "after": 3, "through": 4},
    ]


def test_garbage_collection_low_watermark():
    plan = plan_json("5_gc_low_watermark")
    # Nothing failed: everybody keeps its live state.
    assert set(plan["frontiers"].values()) == {"top"}
    assert plan["replay"] == [] and plan["rerun"] == []
    # As if all failed: communities can restore at most its checkpoint 6; stats has
    # delivered labels of epoch 7 that communities at 6 may send differently.
    assert plan["low_watermark"] == {"ingest": 8, "popularity": 7, "communities": 6, "stats": 6}


@pytest.mark.parametrize("path", sorted(PROBLEMS.glob("*.json")), ids=lambda p: p.stem)
def test_every_worked_example_plan_satisfies_every_constraint(path):
    problem = Problem.load(path)
    solver = Solver(problem)
    solver.run()
    chosen = {n: solver.at_keys[i][solver.idx[i]] for i, n in enumerate(solver.names)}
    assert check_plan(problem, chosen) == []


# ---- notification frontiers and caps ----------------------------------------------


def chain(n_src: int, n_dst: int, dst_frontiers: list[dict], dst_failed=False) -> dict:
    return {
        "regions": {
            "a": {"frontiers": [{"at": k, "projected": {"e": k}} for k in range(n_src)],
                  "live": {"projected": {"e": "top"}}},
            "b": {"failed": dst_failed, "frontiers": dst_frontiers,
                  "live": {"delivered": {"e": n_src}}},
        },
        "edges": {"e": {"from": "a", "to": "b", "logged": True}},
    }


def test_recorded_notification_frontier_constrains_the_receiver():
    # b's checkpoint at 2 had already acted on the notification of epoch 4 (n = 4), so
    # b at 2 needs a to be at 4 or more; a failed with its newest frontier at 3.
    data = chain(4, 0, [{"at": 2, "delivered": {"e": 2}, "notification": 4}], dst_failed=True)
    data["regions"]["a"]["failed"] = True
    plan = Problem.from_json(data)
    assert solve(plan).to_json()["frontiers"] == {"a": 3, "b": -1}
    data["regions"]["b"]["frontiers"][0]["notification"] = 3
    assert solve(Problem.from_json(data)).to_json()["frontiers"] == {"a": 3, "b": 2}


def test_at_most_caps_a_region_for_a_deliberate_rollback():
    data = chain(6, 0, [{"at": k, "delivered": {"e": k}} for k in range(6)])
    data["regions"]["b"]["at_most"] = 2
    assert solve(Problem.from_json(data)).to_json()["frontiers"] == {"a": "top", "b": 2}


# ---- incremental updates ----------------------------------------------------------


def test_new_checkpoint_raises_frontiers_incrementally_like_a_full_solve():
    problem = load("1_unlogged_chain")
    solver = Solver(problem)
    assert solver.frontiers()["count"].to_json() == 3
    entry = Entry(at=5, delivered={"records": 5}, state="checkpoint-5")  # epoch keys are ints
    solver.add_frontier("count", entry)
    got = {n: f.to_json() for n, f in solver.frontiers().items()}
    assert got == {"parse": 5, "count": 5}
    assert got == solve(problem).to_json()["frontiers"]  # problem now holds the checkpoint


def test_failure_and_progress_updates_match_a_full_solve():
    problem = load("5_gc_low_watermark")
    solver = Solver(problem)
    solver.fail("communities")
    assert {n: f.to_json() for n, f in solver.frontiers().items()} == (
        solve(problem).to_json()["frontiers"]
    )
    assert solver.frontiers()["communities"].to_json() == 6
    assert solver.frontiers()["stats"].to_json() == 6


def test_new_frontier_that_is_not_newer_is_refused():
    solver = Solver(load("1_unlogged_chain"))
    with pytest.raises(ProblemError, match="not after"):
        solver.add_frontier("count", Entry(at=2))


# ---- validation -------------------------------------------------------------------


def mutate(fn):
    data = json.loads((PROBLEMS / "4_iterating_region.json").read_text())
    fn(data)
    return data


BAD = {
    "unknown edge in a map": (
        lambda d: d["regions"]["stats"]["frontiers"][0]["delivered"].update({"nope": 1}),
        "region 'stats', frontiers[0].delivered: unknown edge 'nope'",
    ),
    "edge to an unknown region": (
        lambda d: d["edges"].update({"x": {"from": "ingest", "to": "ghost"}}),
        "edge 'x': \"to\" names unknown region 'ghost'",
    ),
    "mixed domains on an edge": (
        lambda d: d["regions"]["stats"]["frontiers"][1]["delivered"].update({"labels": [1, 0]}),
        "region 'stats', frontiers[1].delivered['labels']: expected an epoch",
    ),
    "declared edge domain differs": (
        lambda d: d["edges"]["labels"].update({"domain": "epoch.iteration"}),
        "edge 'labels': mixed domains",
    ),
    "non-monotone delivered": (
        lambda d: d["regions"]["stats"]["frontiers"][3]["delivered"].update({"labels": 0}),
        "region 'stats', frontiers[3].delivered['labels']: non-monotone",
    ),
    "non-monotone at": (
        lambda d: d["regions"]["stats"]["frontiers"][3].update({"at": 1}),
        "region 'stats', frontiers[3]: non-monotone",
    ),
    "malformed time": (
        lambda d: d["regions"]["communities"]["frontiers"][0].update({"at": "yesterday"}),
        "region 'communities', frontiers[0].at: expected an epoch.iteration time",
    ),
    "output edge used as input": (
        lambda d: d["regions"]["communities"]["frontiers"][0]["delivered"].update({"labels": 1}),
        "edge 'labels' (communities → stats) is not an input edge of region 'communities'",
    ),
    "unknown domain": (
        lambda d: d["regions"]["stats"].update({"domain": "weeks"}),
        "region 'stats': unknown domain 'weeks'",
    ),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_problems_are_refused_naming_the_place(case):
    fn, message = BAD[case]
    with pytest.raises(ProblemError) as err:
        Problem.from_json(mutate(fn), origin="p.json")
    assert message in str(err.value)
    assert str(err.value).startswith("p.json: ")


# ---- the CLI ----------------------------------------------------------------------


def test_cli_json_prints_exactly_one_object(capsys):
    assert cli_main(["plan", "--problem", str(PROBLEMS / "2_logged_edge.json"), "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out) == plan_json("2_logged_edge")
    assert out.count("\n") == 1


def test_cli_table_names_every_region_and_the_plan(capsys):
    assert cli_main(["plan", "--problem", str(PROBLEMS / "4_iterating_region.json")]) == 0
    out = capsys.readouterr().out
    for word in ("ingest", "communities", "stats", "replay", "rerun", "(4, 2)"):
        assert word in out


def test_cli_bad_input_is_one_clear_line_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(mutate(BAD["unknown edge in a map"][0])))
    broken = tmp_path / "broken.json"
    broken.write_text('{"regions": ')
    for path, words in ((bad, "unknown edge 'nope'"), (broken, "not valid JSON"),
                        (tmp_path / "missing.json", "cannot read")):
        run = subprocess.run([sys.executable, "-m", "falkirk.cli", "plan", "--problem",
                              str(path), "--json"], capture_output=True, text=True)
        assert run.returncode == 2
        assert run.stdout == ""
        assert words in run.stderr and "Traceback" not in run.stderr


def test_cli_plan_imports_neither_spark_nor_airflow():
    code = (
        "import sys; from falkirk.cli import main; "
        f"main(['plan', '--problem', {str(PROBLEMS / '1_unlogged_chain.json')!r}, '--json']); "
        "print([m for m in sys.modules if m.split('.')[0] in ('pyspark', 'airflow')])"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip().splitlines()[-1] == "[]"


def test_examples_verb_solves_every_worked_example(capsys):
    assert cli_main(["examples", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    expected = sorted(p.stem for p in PROBLEMS.glob("*.json"))
    assert [json.loads(x)["example"] for x in lines] == expected


def test_problem_is_not_changed_by_solving():
    problem = load("3_failed_eager_between_live")
    before = copy.deepcopy(problem.to_json())
    solve(problem)
    assert problem.to_json() == before


def test_incremental_update_reaches_regions_that_lowered_each_other():
    # k (failed at 3) lowers i to 3, i lowers j to 2, j then lowers i to 2 and i lowers k:
    # i and j now hold each other down. New checkpoints at k must still let both rise.
    k = [{"at": t, "projected": {"ki": t}, "discarded": {"ki": t}} for t in range(4)]
    i = [{"at": t, "delivered": {"ki": t}, "projected": {"ij": t}, "discarded": {"ij": t}}
         for t in range(6)]
    j = [{"at": t, "delivered": {"ij": t}} for t in (2, 5)]
    problem = Problem.from_json({
        "regions": {
            "k": {"failed": True, "frontiers": k},
            "i": {"frontiers": i, "live": {"delivered": {"ki": 6}, "projected": {"ij": "top"},
                                           "discarded": {"ij": "top"}}},
            "j": {"frontiers": j, "live": {"delivered": {"ij": 6}}},
        },
        "edges": {"ki": {"from": "k", "to": "i"}, "ij": {"from": "i", "to": "j"}},
    })
    solver = Solver(problem)
    assert {n: f.to_json() for n, f in solver.frontiers().items()} == {"k": 2, "i": 2, "j": 2}
    for t in (4, 5):
        solver.add_frontier("k", Entry(at=t, projected={"ki": t}, discarded={"ki": t}))
    assert {n: f.to_json() for n, f in solver.frontiers().items()} == {"k": 5, "i": 5, "j": 5}


def test_live_progress_is_solved_incrementally_like_a_full_solve():
    # report (live) delivers b_out beyond what a restored totals could resend: when its
    # progress is known, the incremental solver lowers it exactly as a full solve would.
    problem = load("3_failed_eager_between_live")
    solver = Solver(problem)
    assert solver.frontiers()["report"].is_top
    solver.update_live("report", Entry(at=problem.regions["report"].live.at,
                                       delivered={"b_out": 8}))
    got = {n: f.to_json() for n, f in solver.frontiers().items()}
    assert got["report"] == 6
    assert got == solve(Problem.from_json(problem.to_json())).to_json()["frontiers"]


def test_an_incremental_update_pays_for_no_garbage_collection_and_no_index_build():
    """A large problem holds millions of objects: one full collection of them costs ~0.45 s
    (the benchmark's worst update was 457 ms, its median 0.2 ms), and the first update
    used to build the problem's adjacency (~20 ms). Updates pause the collector and the
    adjacency is built with the index. Forced here: the collector would run at every
    allocation, so any collection inside an update is seen."""
    import gc

    from falkirk_dev.bench.solver_bench import new_checkpoint, random_problem

    problem = random_problem(300, 900, 10, seed=3)  # the benchmark's graph, smaller
    solver = Solver(problem)
    solver.frontiers()
    assert problem._adj is not None  # built with the index, not by the first update
    region = sorted(problem.regions)[7]
    entry = new_checkpoint(problem, region, 10)
    collections: list[str] = []
    inner = {"_add_frontier", "refresh", "_changed", "_descendants", "_drain", "_limit",
             "_check_monotone", "_build"}

    def seen(phase: str, info: dict) -> None:
        """A collection that starts inside the solver's work (not in the call's first
        allocations, before the pause: those can happen anywhere)."""
        import sys

        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_name in inner:
                collections.append(f"generation {info['generation']} in "
                                   f"{frame.f_code.co_name}")
                return
            frame = frame.f_back

    threshold = gc.get_threshold()
    gc.callbacks.append(seen)
    gc.set_threshold(1, 1, 1)  # a collection at every allocation the collector sees
    try:
        solver.add_frontier(region, entry)
        solver.fail(region)
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(seen)
    assert collections == []
    assert {n: f.to_json() for n, f in solver.frontiers().items()} == solve(
        problem).to_json()["frontiers"]
