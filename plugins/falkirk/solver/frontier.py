"""The consistent-frontier solver (docs/model.md).

A *problem* lists, per region, the frontiers F(p) it can restore to, each with the
metadata the epoch log keeps for it: delivered N_e per input edge, projection π_e
and discarded D_e per output edge (times in the receiving region's domain). The
solver picks one frontier per region such that

1. f(p) ∈ F(p), and a failed region cannot keep ⊤;
2. D_e(f(p)) ⊆ f(q) on every edge e = p → q (q needs nothing p cannot resend);
3. N_e(f(q)) ⊆ π_e(f(p)) on every edge (q keeps nothing p may send differently);
4. where regions record processed-notification frontiers, n(q) ⊆ π_e(n(p)).

It runs the design's fixed point from the top with a work queue, so only regions
whose neighbours moved are looked at again. Each region's frontiers form a chain
and their metadata is monotone (the loader refuses anything else), so "the largest
frontier allowed by this edge" is a binary search. For totally ordered domains
the result is the greatest consistent choice.

The solver is incremental: after a new checkpoint (or a failure, or progress of a
live region) it re-solves only the regions whose value could change. It remembers
which neighbour last lowered each region ("blame"); a region can only rise again
if what lowered it rises, so a new checkpoint at p resets p and the regions whose
blame chain leads to p, and runs the queue from there.
"""

from __future__ import annotations

import gc
import json
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from falkirk.errors import FalkirkError
from falkirk.model.times import DOMAINS, Domain, Frontier, TimeError

__all__ = [
    "Edge",
    "Entry",
    "Plan",
    "Problem",
    "ProblemError",
    "Region",
    "Replay",
    "Rerun",
    "Solver",
    "low_watermark",
    "solve",
]


class ProblemError(FalkirkError, ValueError):
    """A problem that cannot be solved as given; the message names where it is wrong."""


def _failer(origin: str):
    def fail(where: str, what: str) -> ProblemError:
        return ProblemError(f"{origin}: {where}: {what}")

    return fail


@dataclass
class Entry:
    """One element of F(p) (or a live region's ⊤): where it is and what it fixes."""

    at: Any
    delivered: dict[str, Any] = field(default_factory=dict)
    projected: dict[str, Any] = field(default_factory=dict)
    discarded: dict[str, Any] = field(default_factory=dict)
    notification: Any = None  # processed-notification frontier n(f); None means n = f
    notification_projected: dict[str, Any] | None = None  # π_e(n(f)); None means π_e(f)
    state: str | None = None  # S(f): where the state at f is kept (informative)


@dataclass
class Region:
    name: str
    domain: Domain
    failed: bool = False
    frontiers: list[Entry] = field(default_factory=list)
    live: Entry | None = None
    current: Any = None  # the latest time it reached, if known (for the rerun list)
    regime: str | None = None
    at_most: Any = None  # a user's cap ("go back to epoch N"): no frontier above it

    @property
    def keeps_top(self) -> bool:
        return self.live is not None and not self.failed


@dataclass
class Edge:
    name: str
    src: str | None  # None: fed from outside the pipeline (a topic producers write)
    dst: str | None  # None: read outside the pipeline (clients)
    domain: Domain
    logged: bool = False


@dataclass
class Problem:
    regions: dict[str, Region]
    edges: dict[str, Edge]
    description: str = ""
    _adj: Any = field(default=None, init=False, repr=False, compare=False)

    # ---- loading and validation -------------------------------------------------

    @classmethod
    def load(cls, path: str | Path) -> Problem:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ProblemError(f"{path}: cannot read the problem file: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProblemError(
                f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
            ) from None
        return cls.from_json(data, origin=str(path))

    @classmethod
    def from_json(cls, data: Any, origin: str = "problem") -> Problem:
        """Build and validate a problem; every error names the region or edge at fault."""

        fail = _failer(origin)
        if not isinstance(data, dict):
            raise fail("top level", "expected an object with \"regions\" and \"edges\"")
        unknown = set(data) - {"regions", "edges", "description"}
        if unknown:
            raise fail("top level", f"unknown keys {sorted(unknown)}")
        raw_regions = data.get("regions")
        raw_edges = data.get("edges", {})
        if not isinstance(raw_regions, dict) or not raw_regions:
            raise fail("regions", "expected a non-empty object of regions")
        if not isinstance(raw_edges, dict):
            raise fail("edges", "expected an object of edges")

        regions: dict[str, Region] = {}
        for name, raw in raw_regions.items():
            where = f"region {name!r}"
            if not isinstance(raw, dict):
                raise fail(where, "expected an object")
            extra = set(raw) - {"failed", "domain", "frontiers", "live", "current", "regime",
                               "at_most"}
            if extra:
                raise fail(where, f"unknown keys {sorted(extra)}")
            dom_name = raw.get("domain", "epoch")
            if dom_name not in DOMAINS:
                raise fail(where, f"unknown domain {dom_name!r} (known: {', '.join(DOMAINS)})")
            failed = raw.get("failed", False)
            if not isinstance(failed, bool):
                raise fail(where, f"\"failed\" must be true or false, got {failed!r}")
            regions[name] = Region(
                name=name, domain=DOMAINS[dom_name], failed=failed, regime=raw.get("regime")
            )

        edges: dict[str, Edge] = {}
        for name, raw in raw_edges.items():
            where = f"edge {name!r}"
            if not isinstance(raw, dict):
                raise fail(where, "expected an object with \"from\" and \"to\"")
            extra = set(raw) - {"from", "to", "logged", "domain"}
            if extra:
                raise fail(where, f"unknown keys {sorted(extra)}")
            src, dst = raw.get("from"), raw.get("to")
            if src is None and dst is None:
                raise fail(where, "needs \"from\" or \"to\" (or both)")
            for end, label in ((src, "from"), (dst, "to")):
                if end is not None and end not in regions:
                    raise fail(where, f"\"{label}\" names unknown region {end!r}")
            logged = raw.get("logged", False)
            if not isinstance(logged, bool):
                raise fail(where, f"\"logged\" must be true or false, got {logged!r}")
            # Times on an edge are in the receiving region's domain.
            dom = regions[dst].domain if dst is not None else None
            if "domain" in raw:
                declared = DOMAINS.get(raw["domain"])
                if declared is None:
                    raise fail(where, f"unknown domain {raw['domain']!r}")
                if dom is not None and declared is not dom:
                    raise fail(
                        where,
                        f"mixed domains: declared {declared.name} but its receiving region "
                        f"{dst!r} is in {dom.name}",
                    )
                dom = declared
            if dom is None:
                dom = regions[src].domain
            edges[name] = Edge(name, src, dst, dom, logged)

        problem = cls(regions, edges, str(data.get("description", "")))
        for name, raw in raw_regions.items():
            region = regions[name]
            where = f"region {name!r}"
            raw_frontiers = raw.get("frontiers", [])
            if not isinstance(raw_frontiers, list):
                raise fail(where, "\"frontiers\" must be a list")
            for i, rf in enumerate(raw_frontiers):
                region.frontiers.append(
                    problem._entry(rf, region, f"{where}, frontiers[{i}]", fail, live=False)
                )
            if raw.get("live") is not None:
                region.live = problem._entry(
                    raw["live"], region, f"{where}, live", fail, live=True
                )
            for key in ("current", "at_most"):
                if raw.get(key) is not None:
                    try:
                        setattr(region, key, region.domain.parse(raw[key]))
                    except TimeError as exc:
                        raise fail(f"{where}, {key}", str(exc)) from None
            problem._check_monotone(region, fail)
        return problem

    def _entry(self, raw: Any, region: Region, where: str, fail, live: bool) -> Entry:
        if not isinstance(raw, dict):
            raise fail(where, "expected an object")
        allowed = {"at", "delivered", "projected", "discarded", "notification",
                   "notification_projected", "state"}
        extra = set(raw) - allowed
        if extra:
            raise fail(where, f"unknown keys {sorted(extra)}")
        dom = region.domain
        if live:
            at = dom.top
            if "at" in raw:
                raise fail(where, "a live entry is ⊤ by definition: give no \"at\"")
        else:
            if "at" not in raw:
                raise fail(where, "missing \"at\"")
            try:
                at = dom.parse(raw["at"])
            except TimeError as exc:
                raise fail(f"{where}.at", str(exc)) from None
            if at == dom.bottom or at == dom.top:
                raise fail(
                    f"{where}.at",
                    "must be a time: ⊥ is always available, ⊤ is the \"live\" entry",
                )

        def edge_map(key: str, inbound: bool) -> dict[str, Any] | None:
            if key not in raw:
                return None
            value = raw[key]
            if not isinstance(value, dict):
                raise fail(f"{where}.{key}", "expected an object of edge -> time")
            out = {}
            for edge_name, t in value.items():
                edge = self.edges.get(edge_name)
                if edge is None:
                    raise fail(f"{where}.{key}", f"unknown edge {edge_name!r}")
                end = edge.dst if inbound else edge.src
                if end != region.name:
                    direction = "an input" if inbound else "an output"
                    raise fail(
                        f"{where}.{key}",
                        f"edge {edge_name!r} ({edge.src} → {edge.dst}) is not {direction} "
                        f"edge of region {region.name!r}",
                    )
                try:
                    out[edge_name] = edge.domain.parse(t)
                except TimeError as exc:
                    raise fail(f"{where}.{key}[{edge_name!r}]", str(exc)) from None
            return out

        entry = Entry(
            at=at,
            delivered=edge_map("delivered", inbound=True) or {},
            projected=edge_map("projected", inbound=False) or {},
            discarded=edge_map("discarded", inbound=False) or {},
            notification_projected=edge_map("notification_projected", inbound=False),
            state=raw.get("state"),
        )
        if raw.get("notification") is not None:
            try:
                entry.notification = dom.parse(raw["notification"])
            except TimeError as exc:
                raise fail(f"{where}.notification", str(exc)) from None
            if not dom.leq(at, entry.notification):
                raise fail(f"{where}.notification", "must contain the frontier (n(f) ⊇ f)")
        return entry

    def _check_monotone(self, region: Region, fail, last_only: bool = False) -> None:
        """Later frontiers must contain earlier ones, and so must all their metadata.

        The solver's binary searches rely on it. ``last_only`` checks just the newest
        frontier against its neighbours in the chain (an incremental update).
        """
        chain = [Entry(at=region.domain.bottom), *region.frontiers]
        labels = ["⊥", *(f"frontiers[{i}]" for i in range(len(region.frontiers)))]
        if region.live is not None:
            chain.append(region.live)
            labels.append("live")
        ins, outs = self.in_edges(region.name), self.out_edges(region.name)
        first = len(region.frontiers) if last_only else 1
        for i in range(max(first, 1), len(chain)):
            self._check_pair(region, chain[i - 1], chain[i], labels[i - 1], labels[i],
                             ins, outs, fail)

    def _check_pair(self, region: Region, prev: Entry, cur: Entry, prev_label: str,
                    label: str, ins: list[str], outs: list[str], fail) -> None:
        dom = region.domain
        where = f"region {region.name!r}, {label}"
        if not dom.leq(prev.at, cur.at) or prev.at == cur.at:
            raise fail(where, f"non-monotone: its \"at\" is not after {prev_label}'s")
        for key, edge_names in (("delivered", ins), ("projected", outs), ("discarded", outs)):
            for e in edge_names:
                d = self.edges[e].domain
                a, b = getattr(prev, key).get(e, d.bottom), getattr(cur, key).get(e, d.bottom)
                if not d.leq(a, b):
                    raise fail(
                        f"{where}.{key}[{e!r}]",
                        f"non-monotone: {d.describe(b)} is smaller than "
                        f"{d.describe(a)} at {prev_label}",
                    )
        if not dom.leq(notification_of(prev), notification_of(cur)):
            raise fail(f"{where}.notification", f"non-monotone: smaller than at {prev_label}")
        for e in outs:
            d = self.edges[e].domain
            a, b = notification_projection(prev, e, d), notification_projection(cur, e, d)
            if not d.leq(a, b):
                raise fail(
                    f"{where}.notification_projected[{e!r}]",
                    f"non-monotone: smaller than at {prev_label}",
                )

    def to_json(self) -> dict:
        """The problem in the file format ``Problem.from_json`` reads (round-trips)."""

        def times(d: dict[str, Any]) -> dict[str, Any]:
            return {e: self.edges[e].domain.dump(k) for e, k in d.items()}

        def entry(en: Entry, live: bool) -> dict:
            out: dict[str, Any] = {} if live else {"at": dom.dump(en.at)}
            for key in ("delivered", "projected", "discarded"):
                if getattr(en, key):
                    out[key] = times(getattr(en, key))
            if en.notification is not None:
                out["notification"] = dom.dump(en.notification)
            if en.notification_projected is not None:
                out["notification_projected"] = times(en.notification_projected)
            if en.state is not None:
                out["state"] = en.state
            return out

        regions = {}
        for name, r in self.regions.items():
            dom = r.domain
            raw: dict[str, Any] = {"domain": dom.name, "failed": r.failed,
                                   "frontiers": [entry(f, False) for f in r.frontiers]}
            if r.regime is not None:
                raw["regime"] = r.regime
            if r.live is not None:
                raw["live"] = entry(r.live, True)
            for key in ("current", "at_most"):
                if getattr(r, key) is not None:
                    raw[key] = dom.dump(getattr(r, key))
            regions[name] = raw
        edges = {}
        for name, e in self.edges.items():
            raw = {"logged": e.logged}
            if e.src is not None:
                raw["from"] = e.src
            if e.dst is not None:
                raw["to"] = e.dst
            else:
                raw["domain"] = e.domain.name
            edges[name] = raw
        out = {"regions": regions, "edges": edges}
        if self.description:
            out["description"] = self.description
        return out

    # ---- graph helpers ----------------------------------------------------------

    def _adjacency(self) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        if self._adj is None or self._adj[2] != len(self.edges):
            ins: dict[str, list[str]] = {n: [] for n in self.regions}
            outs: dict[str, list[str]] = {n: [] for n in self.regions}
            for e in self.edges.values():
                if e.dst is not None:
                    ins[e.dst].append(e.name)
                if e.src is not None:
                    outs[e.src].append(e.name)
            self._adj = (ins, outs, len(self.edges))
        return self._adj[0], self._adj[1]

    def in_edges(self, region: str) -> list[str]:
        return self._adjacency()[0][region]

    def out_edges(self, region: str) -> list[str]:
        return self._adjacency()[1][region]

    def with_all_failed(self) -> Problem:
        """The same problem as if every region had failed (for the low watermark)."""
        regions = {
            n: Region(r.name, r.domain, True, r.frontiers, r.live, r.current, r.regime,
                      r.at_most)
            for n, r in self.regions.items()
        }
        return Problem(regions, self.edges, self.description)


def records_notifications(region: Region) -> bool:
    return any(f.notification is not None for f in region.frontiers) or (
        region.live is not None and region.live.notification is not None
    )


def notification_of(entry: Entry) -> Any:
    return entry.at if entry.notification is None else entry.notification


def notification_projection(entry: Entry, edge: str, dom: Domain) -> Any:
    source = entry.projected if entry.notification_projected is None else (
        entry.notification_projected
    )
    return source.get(edge, dom.bottom)


# ---- the plan ----------------------------------------------------------------------


@dataclass(frozen=True)
class Replay:
    """A logged edge sends q again its records after ``after`` through ``through``."""

    edge: str
    src: str | None  # None: an input topic from outside the pipeline, re-read from offsets
    dst: str
    after: Frontier
    through: Frontier

    def to_json(self) -> dict:
        return {"edge": self.edge, "from": self.src, "to": self.dst,
                "after": self.after.to_json(), "through": self.through.to_json()}


@dataclass(frozen=True)
class Rerun:
    """A region restarts after ``after`` and redoes its work through ``through``."""

    region: str
    after: Frontier
    through: Frontier | None  # None: as far as its input goes (progress unknown)

    def to_json(self) -> dict:
        return {"region": self.region, "after": self.after.to_json(),
                "through": None if self.through is None else self.through.to_json()}


@dataclass
class Plan:
    problem: Problem
    frontiers: dict[str, Frontier]
    replay: list[Replay]
    rerun: list[Rerun]
    low_watermark: dict[str, Frontier] | None = None
    entries: dict[str, Entry | None] = field(default_factory=dict)  # chosen F(p) element

    def to_json(self) -> dict:
        out = {
            "frontiers": {r: f.to_json() for r, f in self.frontiers.items()},
            "replay": [r.to_json() for r in self.replay],
            "rerun": [r.to_json() for r in self.rerun],
        }
        if self.low_watermark is not None:
            out["low_watermark"] = {r: f.to_json() for r, f in self.low_watermark.items()}
        return out


# ---- the solver --------------------------------------------------------------------


def _search(dom: Domain, cands: list[Entry], key, bound: Any, hi: int) -> int:
    """Largest i ≤ hi with key(cands[i]) ⊆ bound.

    The chain's metadata is monotone and cands[0] is ⊥ (always inside), so this is a
    binary search; it reads O(log |F(p)|) entries and needs no per-edge arrays. Most
    calls find the current candidate still allowed: that is checked first.
    """
    if dom.total:
        if key(cands[hi]) <= bound:
            return hi
        return bisect_right(cands, bound, 0, hi, key=key) - 1
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if dom.leq(key(cands[mid]), bound):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _getter(attr: str, edge: str, bottom: Any):
    """key(entry) = entry.<attr>[edge], ⊥ when the entry does not name the edge."""
    if attr == "notification_projected":
        return lambda c: (c.projected if c.notification_projected is None
                          else c.notification_projected).get(edge, bottom)
    if attr == "delivered":
        return lambda c: c.delivered.get(edge, bottom)
    if attr == "projected":
        return lambda c: c.projected.get(edge, bottom)
    if attr == "discarded":
        return lambda c: c.discarded.get(edge, bottom)
    raise ValueError(f"no metadata called {attr!r}")


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while the solver allocates.

    A large problem holds millions of small objects; every collection the solver's own
    allocations trigger walks all of them (measured: 0.9 s of a 1 s index build on the
    benchmark graph, and a full collection of ~0.45 s landing in one incremental update
    of a few hundred microseconds). The solver creates no reference cycles, so nothing is
    lost; updates (a new frontier, a failure, live progress) pause it too, so none of
    them pays for a collection the process owed.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Solver:
    """Greatest consistent frontiers by a work-queue fixed point, kept up to date."""

    def __init__(self, problem: Problem, all_failed: bool = False):
        with _gc_paused():
            self._index(problem, all_failed)

    def _index(self, problem: Problem, all_failed: bool) -> None:
        self.problem = problem
        self.all_failed = all_failed
        self.names = list(problem.regions)
        self.index = {n: i for i, n in enumerate(self.names)}
        n = len(self.names)
        # Per region: the candidate entries ⊥, F(p)…, ⊤ (when allowed), and their times.
        self.cands: list[list[Entry]] = [[] for _ in range(n)]
        self.at_keys: list[list] = [[] for _ in range(n)]
        # Regions that record processed-notification frontiers get constraint 4 on
        # their input edges; for the others notifications add nothing (design, 4).
        self.records_notifications = [False] * n
        # Per region: (edge domain, key functions, neighbour index or None).
        self.in_edges: list[list[tuple]] = [[] for _ in range(n)]
        self.out_edges: list[list[tuple]] = [[] for _ in range(n)]
        for e in problem.edges.values():
            s = None if e.src is None else self.index[e.src]
            d = None if e.dst is None else self.index[e.dst]
            b = e.domain.bottom
            delivered, projected = _getter("delivered", e.name, b), _getter("projected", e.name, b)
            discarded = _getter("discarded", e.name, b)
            notified = _getter("notification_projected", e.name, b)
            if d is not None:
                self.in_edges[d].append((e.name, e.domain, s, delivered, projected, notified))
            if s is not None:
                self.out_edges[s].append((e.name, e.domain, d, discarded))
        for i in range(n):
            self._build(i)
        # Built now, not in the first incremental update (whose checks look a region's
        # edges up by name): ~20 ms on the benchmark graph, paid once with the index.
        problem._adjacency()
        self.idx = [len(c) - 1 for c in self.cands]
        # Who lowered each region since it was last reset, and the reverse. Every cause
        # is kept, not just the latest: two regions can end up holding each other down
        # after a third lowered them first, and a new checkpoint at that third one must
        # still reach both.
        self.causes: list[set[int]] = [set() for _ in range(n)]
        self.blamed: list[set[int]] = [set() for _ in range(n)]
        self.queue: deque[int] = deque(range(n))
        self.queued = [True] * n
        self.evaluations = 0

    # ---- candidates -----------------------------------------------------------------

    def _build(self, i: int) -> None:
        region = self.problem.regions[self.names[i]]
        dom = region.domain
        cands = [Entry(at=dom.bottom), *region.frontiers]
        if region.keeps_top and not self.all_failed and region.at_most is None:
            cands.append(region.live)
        if region.at_most is not None:
            cands = [c for c in cands if dom.leq(c.at, region.at_most)]
        self.cands[i] = cands
        self.at_keys[i] = [c.at for c in cands]
        self.records_notifications[i] = records_notifications(region)

    def chosen(self, i: int) -> Entry:
        return self.cands[i][self.idx[i]]

    # ---- the fixed point ------------------------------------------------------------

    def _limit(self, i: int) -> tuple[int, int]:
        """The largest candidate of region i allowed by its neighbours now, and who binds."""
        limit, cause = self.idx[i], i
        idx, cands = self.idx, self.cands
        mine = cands[i]
        for _, dom, s, delivered, projected, notified in self.in_edges[i]:
            if s is None:
                continue
            theirs = cands[s][idx[s]]
            j = _search(dom, mine, delivered, projected(theirs), limit)
            if j < limit:
                limit, cause = j, s
            if self.records_notifications[i]:
                j = _search(dom, mine, notification_of, notified(theirs), limit)
                if j < limit:
                    limit, cause = j, s
        for _, dom, q, discarded in self.out_edges[i]:
            if q is None:
                continue
            j = _search(dom, mine, discarded, self.at_keys[q][idx[q]], limit)
            if j < limit:
                limit, cause = j, q
        return limit, cause

    def _push(self, i: int) -> None:
        if not self.queued[i]:
            self.queued[i] = True
            self.queue.append(i)

    def _push_neighbours(self, i: int) -> None:
        for edge in self.in_edges[i]:
            if edge[2] is not None:
                self._push(edge[2])
        for edge in self.out_edges[i]:
            if edge[2] is not None:
                self._push(edge[2])

    def _blame(self, i: int, cause: int) -> None:
        if cause != i:
            self.causes[i].add(cause)
            self.blamed[cause].add(i)

    def _reset(self, i: int) -> None:
        """Region i starts again from its greatest candidate, with no causes."""
        self.idx[i] = len(self.cands[i]) - 1
        for c in self.causes[i]:
            self.blamed[c].discard(i)
        self.causes[i].clear()
        self._push(i)

    def run(self) -> None:
        """Drain the work queue: lower regions until every constraint holds."""
        with _gc_paused():
            self._drain()

    def _drain(self) -> None:
        queue, queued = self.queue, self.queued
        while queue:
            i = queue.popleft()
            queued[i] = False
            self.evaluations += 1
            limit, cause = self._limit(i)
            if limit < self.idx[i]:
                self.idx[i] = limit
                self._blame(i, cause)
                self._push_neighbours(i)

    # ---- incremental updates --------------------------------------------------------

    def _descendants(self, i: int) -> set[int]:
        seen, stack = {i}, [i]
        while stack:
            for c in self.blamed[stack.pop()]:
                if c not in seen:
                    seen.add(c)
                    stack.append(c)
        return seen

    def _changed(self, i: int) -> None:
        """Region i's candidates changed: re-derive i and everything its value bound."""
        for a in self._descendants(i):
            self._reset(a)
        self._push_neighbours(i)

    def add_frontier(self, region: str, entry: Entry) -> None:
        """A region saved a new frontier (a checkpoint, a committed epoch): re-solve."""
        with _gc_paused():
            self._add_frontier(region, entry)

    def _add_frontier(self, region: str, entry: Entry) -> None:
        r = self.problem.regions[region]
        last = r.frontiers[-1].at if r.frontiers else r.domain.bottom
        if not r.domain.leq(last, entry.at) or last == entry.at:
            raise ProblemError(
                f"region {region!r}: new frontier {r.domain.describe(entry.at)} is not after "
                f"its latest one {r.domain.describe(last)}"
            )
        r.frontiers.append(entry)
        try:
            self.problem._check_monotone(r, _failer("new frontier"), last_only=True)
        except ProblemError:
            r.frontiers.pop()
            raise
        self.refresh(region)

    def refresh(self, region: str) -> None:
        """The region's entries changed in the problem (which another solver may share,
        as the live plan and the garbage-collection monitor do): re-solve from it."""
        with _gc_paused():
            i = self.index[region]
            self._build(i)
            self._changed(i)
            self.run()

    def fail(self, region: str) -> None:
        """A region failed: it loses ⊤, which can only lower frontiers."""
        with _gc_paused():
            i = self.index[region]
            self.problem.regions[region].failed = True
            self._build(i)
            self.idx[i] = min(self.idx[i], len(self.cands[i]) - 1)
            self._push(i)
            self._push_neighbours(i)
            self.run()

    def update_live(self, region: str, live: Entry) -> None:
        """A live region made progress: its ⊤ now carries new metadata."""
        with _gc_paused():
            r = self.problem.regions[region]
            old, r.live = r.live, live
            try:
                self.problem._check_monotone(r, _failer("live update"), last_only=True)
            except ProblemError:
                r.live = old
                raise
            self.refresh(region)

    # ---- results --------------------------------------------------------------------

    def frontiers(self) -> dict[str, Frontier]:
        self.run()
        return {
            n: Frontier(self.problem.regions[n].domain, self.at_keys[i][self.idx[i]])
            for i, n in enumerate(self.names)
        }

    def plan(self) -> Plan:
        frontiers = self.frontiers()
        problem = self.problem
        replay = []
        for e in problem.edges.values():
            if not e.logged or e.dst is None:
                continue
            q = self.index[e.dst]
            if frontiers[e.dst].is_top:
                continue
            # q restarts holding the records it had delivered at f(q): send what lies
            # after those, up to what p (restored) will never send again. The design page
            # says "outside f(q)"; N_e(f(q)) is the same for epochs and exact inside an
            # iterating region, whose frontier (k, i) already holds all of epoch k's input.
            got = self.chosen(q).delivered.get(e.name, e.domain.bottom)
            sent = (e.domain.top if e.src is None
                    else self.chosen(self.index[e.src]).projected.get(e.name, e.domain.bottom))
            if e.domain.leq(got, sent) and got != sent:
                replay.append(Replay(e.name, e.src, e.dst,
                                     Frontier(e.domain, got), Frontier(e.domain, sent)))
        rerun = []
        for n, f in frontiers.items():
            if f.is_top:
                continue
            region = problem.regions[n]
            through = None if region.current is None else Frontier(region.domain, region.current)
            rerun.append(Rerun(n, f, through))
        entries = {
            n: (None if frontiers[n].is_bottom else self.cands[i][self.idx[i]])
            for i, n in enumerate(self.names)
        }
        return Plan(problem, frontiers, replay, rerun, entries=entries)


def solve(problem: Problem, with_low_watermark: bool = True) -> Plan:
    """The greatest consistent frontiers, with the replay and rerun lists."""
    plan = Solver(problem).plan()
    if with_low_watermark:
        plan.low_watermark = low_watermark(problem)
    return plan


def low_watermark(problem: Problem) -> dict[str, Frontier]:
    """Solve as if every region had failed: no failure can roll a region below this."""
    return Solver(problem, all_failed=True).frontiers()


def check_plan(problem: Problem, frontiers: dict[str, Any]) -> list[str]:
    """Every constraint a choice of frontiers violates (empty: consistent).

    ``frontiers`` maps region -> key. Used by tests and by the executor as a last
    guard before it changes anything.
    """
    problems: list[str] = []
    chosen: dict[str, Entry] = {}
    for name, region in problem.regions.items():
        key = frontiers[name]
        dom = region.domain
        if region.at_most is not None and not dom.leq(key, region.at_most):
            problems.append(f"{name}: {dom.describe(key)} is above the requested cap")
        if key == dom.top:
            if not region.keeps_top:
                problems.append(f"{name}: chose ⊤ but it cannot keep its live state")
                continue
            chosen[name] = region.live
        elif key == dom.bottom:
            chosen[name] = Entry(at=dom.bottom)
        else:
            match = [f for f in region.frontiers if f.at == key]
            if not match:
                problems.append(f"{name}: {dom.describe(key)} is not in F({name})")
                continue
            chosen[name] = match[0]
    for e in problem.edges.values():
        if e.src not in chosen or e.dst not in chosen:
            continue
        d, p, q = e.domain, chosen[e.src], chosen[e.dst]
        disc = p.discarded.get(e.name, d.bottom)
        if not d.leq(disc, q.at):
            problems.append(f"{e.name}: discarded {d.describe(disc)} ⊄ f({e.dst})")
        got, proj = q.delivered.get(e.name, d.bottom), p.projected.get(e.name, d.bottom)
        if not d.leq(got, proj):
            problems.append(f"{e.name}: delivered {d.describe(got)} ⊄ π {d.describe(proj)}")
        nq, pn = notification_of(q), notification_projection(p, e.name, d)
        if records_notifications(problem.regions[e.dst]) and not d.leq(nq, pn):
            problems.append(f"{e.name}: notification {d.describe(nq)} ⊄ π(n) {d.describe(pn)}")
    return problems


def regions_in_order(problem: Problem) -> Iterable[str]:
    """Regions in a topological-ish order (sources first), for readable output."""
    indeg = {n: 0 for n in problem.regions}
    for e in problem.edges.values():
        if e.src is not None and e.dst is not None and e.src != e.dst:
            indeg[e.dst] += 1
    order, ready = [], [n for n in problem.regions if indeg[n] == 0]
    seen = set()
    while ready:
        n = ready.pop(0)
        if n in seen:
            continue
        seen.add(n)
        order.append(n)
        for e in problem.edges.values():
            if e.src == n and e.dst is not None and e.dst not in seen:
                indeg[e.dst] -= 1
                if indeg[e.dst] <= 0:
                    ready.append(e.dst)
    order.extend(n for n in problem.regions if n not in seen)
    return order
