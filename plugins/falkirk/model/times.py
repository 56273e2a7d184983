"""Logical time domains and frontiers.

Every region receives records stamped with a time in its own domain (see
docs/model.md). A frontier is a downward-closed set of times; we only
need the ones that are "everything up to t", plus bottom (nothing) and top
(everything a live region has done).

Frontiers are compared through *keys*: plain Python values whose ``<=`` is the
domain's order, with bottom and top folded in as the least and greatest values.
The solver works on keys directly (it runs on graphs of 10,000 regions); the
:class:`Frontier` wrapper is the public face with comparison, join and meet.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from falkirk.errors import FalkirkError

INF = math.inf


class TimeError(FalkirkError, ValueError):
    """A time that does not belong to the domain it was given in."""


class Domain(ABC):
    """A time domain: parses times, orders them, and joins/meets frontiers."""

    name: str
    total: bool = True  # totally ordered: the solver can bisect and returns the greatest choice
    bottom: Any
    top: Any

    def parse(self, value: Any) -> Any:
        """Parse a JSON time (or "top", or -1 for bottom) into a key."""
        if value == "top":
            return self.top
        if isinstance(value, int) and not isinstance(value, bool) and value == -1:
            return self.bottom
        return self._parse_time(value)

    @abstractmethod
    def _parse_time(self, value: Any) -> Any:
        """Parse a JSON time that is neither bottom nor top."""

    def dump(self, key: Any) -> Any:
        """The JSON form of a key: -1 for bottom, "top" for top."""
        if key == self.bottom:
            return -1
        if key == self.top:
            return "top"
        return self._dump_time(key)

    def _dump_time(self, key: Any) -> Any:
        return key

    def leq(self, a: Any, b: Any) -> bool:
        return a <= b

    def join(self, a: Any, b: Any) -> Any:
        return a if self.leq(b, a) else b

    def meet(self, a: Any, b: Any) -> Any:
        return a if self.leq(a, b) else b

    def describe(self, key: Any) -> str:
        if key == self.bottom:
            return "⊥"
        if key == self.top:
            return "⊤"
        return self._describe_time(key)

    def _describe_time(self, key: Any) -> str:
        return str(key)

    def __repr__(self) -> str:
        return f"<domain {self.name}>"

    # Domains are singletons compared by identity: copies and pickles stay the same object.
    def __copy__(self) -> Domain:
        return self

    def __deepcopy__(self, memo: dict) -> Domain:
        return self

    def __reduce__(self) -> tuple:
        return (domain, (self.name,))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class EpochDomain(Domain):
    """Epochs 0, 1, 2, …; key = the epoch, bottom = -1, top = +inf."""

    name = "epoch"
    bottom = -1
    top = INF

    def _parse_time(self, value: Any) -> int:
        if _is_int(value) and value >= 0:
            return value
        if isinstance(value, list):
            raise TimeError(
                f"expected an epoch (an integer ≥ 0, -1 or \"top\"), got {value!r}, "
                "which is an epoch.iteration time: mixed domains"
            )
        if isinstance(value, dict):
            raise TimeError(
                f"expected an epoch (an integer ≥ 0, -1 or \"top\"), got {value!r}, "
                "which is an offsets time: mixed domains"
            )
        raise TimeError(f"expected an epoch (an integer ≥ 0, -1 or \"top\"), got {value!r}")


class IterationDomain(Domain):
    """(epoch, iteration) pairs ordered lexicographically.

    The iteration may be infinite: (k, inf) means "epoch k has converged", which is
    how an epoch projects into an iterating region. JSON: ``[k, i]`` or ``[k, "inf"]``.
    """

    name = "epoch.iteration"
    bottom = (-1, -1)
    top = (INF, INF)

    def _parse_time(self, value: Any) -> tuple[int, float]:
        if (
            isinstance(value, list)
            and len(value) == 2
            and _is_int(value[0])
            and value[0] >= 0
            and ((_is_int(value[1]) and value[1] >= 0) or value[1] == "inf")
        ):
            return (value[0], INF if value[1] == "inf" else value[1])
        hint = ""
        if _is_int(value):
            hint = ", which is an epoch time: mixed domains"
        elif isinstance(value, dict):
            hint = ", which is an offsets time: mixed domains"
        raise TimeError(
            "expected an epoch.iteration time ([epoch, iteration] with integers ≥ 0, the "
            f"iteration may be \"inf\"), -1 or \"top\", got {value!r}{hint}"
        )

    def _dump_time(self, key: tuple[int, float]) -> list:
        return [key[0], "inf" if key[1] == INF else key[1]]

    def _describe_time(self, key: tuple[int, float]) -> str:
        return f"({key[0]}, {'∞' if key[1] == INF else key[1]})"


class Offsets:
    """Per-partition Kafka positions: partition -> next offset to read.

    The frontier ``{p: o}`` holds every record of partition p below offset o, so the
    empty vector is bottom. Ordered partition by partition (a partial order).
    """

    __slots__ = ("items", "_hash")

    def __init__(self, positions: Mapping[str, int] | Iterable[tuple[str, int]] = ()):
        pairs = positions.items() if isinstance(positions, Mapping) else positions
        self.items: tuple[tuple[str, int], ...] = tuple(
            sorted((str(p), int(o)) for p, o in pairs if int(o) > 0)
        )
        self._hash = hash(self.items)

    def get(self, partition: str) -> int:
        for p, o in self.items:
            if p == partition:
                return o
        return 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.items)

    def __le__(self, other: Any) -> bool:
        if other is OFFSETS_TOP:
            return True
        if not isinstance(other, Offsets):
            return NotImplemented
        theirs = dict(other.items)
        return all(o <= theirs.get(p, 0) for p, o in self.items)

    def __ge__(self, other: Any) -> bool:
        if isinstance(other, Offsets):
            return other <= self
        return NotImplemented

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Offsets) and self.items == other.items

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Offsets({dict(self.items)})"


class _OffsetsTop:
    """Top of the offsets domain: above every vector."""

    def __le__(self, other: Any) -> bool:
        return other is self

    def __ge__(self, other: Any) -> bool:
        return True

    def __repr__(self) -> str:
        return "Offsets(top)"


OFFSETS_TOP = _OffsetsTop()


class OffsetsDomain(Domain):
    """Per-partition offsets; JSON: ``{"0": 120, "1": 98}`` (next offset per partition)."""

    name = "offsets"
    total = False
    bottom = Offsets()
    top = OFFSETS_TOP

    def _parse_time(self, value: Any) -> Offsets:
        if isinstance(value, dict) and all(
            isinstance(p, str) and _is_int(o) and o >= 0 for p, o in value.items()
        ):
            return Offsets(value)
        hint = ""
        if _is_int(value):
            hint = ", which is an epoch time: mixed domains"
        elif isinstance(value, list):
            hint = ", which is an epoch.iteration time: mixed domains"
        raise TimeError(
            "expected offsets ({\"partition\": next offset ≥ 0, …}), -1 or \"top\", "
            f"got {value!r}{hint}"
        )

    def dump(self, key: Any) -> Any:
        if key is OFFSETS_TOP:
            return "top"
        return key.as_dict() if key.items else -1

    def leq(self, a: Any, b: Any) -> bool:
        if a is OFFSETS_TOP:
            return b is OFFSETS_TOP
        return a <= b

    def join(self, a: Any, b: Any) -> Any:
        if a is OFFSETS_TOP or b is OFFSETS_TOP:
            return OFFSETS_TOP
        merged = dict(a.items)
        for p, o in b.items:
            merged[p] = max(merged.get(p, 0), o)
        return Offsets(merged)

    def meet(self, a: Any, b: Any) -> Any:
        if a is OFFSETS_TOP:
            return b
        if b is OFFSETS_TOP:
            return a
        theirs = dict(b.items)
        return Offsets({p: min(o, theirs.get(p, 0)) for p, o in a.items})

    def _describe_time(self, key: Offsets) -> str:
        return "{" + ", ".join(f"{p}:{o}" for p, o in key.items) + "}"


EPOCH = EpochDomain()
ITERATION = IterationDomain()
OFFSETS = OffsetsDomain()
DOMAINS: dict[str, Domain] = {d.name: d for d in (EPOCH, ITERATION, OFFSETS)}


def domain(name: str) -> Domain:
    try:
        return DOMAINS[name]
    except KeyError:
        raise TimeError(
            f"unknown time domain {name!r} (known: {', '.join(DOMAINS)})"
        ) from None


def time_of(domain_name: str, epoch: int) -> Any:
    """The JSON time a region of ``domain_name`` logs once epoch ``epoch`` is done."""
    return [epoch, "inf"] if DOMAINS[domain_name] is ITERATION else epoch


def is_whole_epoch(time: Any) -> bool:
    """Whether a logged JSON time is a finished epoch (:func:`time_of`), not an
    iteration inside one."""
    return not isinstance(time, list) or time[1] == "inf"


def epoch_of_key(domain_name: str, key: Any) -> int:
    """The last epoch wholly inside a frontier key (-1 for none)."""
    dom = DOMAINS[domain_name]
    if key == dom.bottom:
        return -1
    if dom is ITERATION:
        return key[0] if key[1] == INF else key[0] - 1
    return key


@dataclass(frozen=True)
class Frontier:
    """A frontier in one domain: bottom, everything up to a time, or top."""

    domain: Domain
    key: Any

    @classmethod
    def bottom(cls, dom: Domain) -> Frontier:
        return cls(dom, dom.bottom)

    @classmethod
    def top(cls, dom: Domain) -> Frontier:
        return cls(dom, dom.top)

    @classmethod
    def parse(cls, dom: Domain, value: Any) -> Frontier:
        return cls(dom, dom.parse(value))

    @property
    def is_bottom(self) -> bool:
        return self.key == self.domain.bottom

    @property
    def is_top(self) -> bool:
        return self.key == self.domain.top

    def _same(self, other: Frontier) -> None:
        if other.domain is not self.domain:
            raise TimeError(
                f"cannot compare a {self.domain.name} frontier with a {other.domain.name} one"
            )

    def __le__(self, other: Frontier) -> bool:
        self._same(other)
        return self.domain.leq(self.key, other.key)

    def __ge__(self, other: Frontier) -> bool:
        return other <= self

    def __lt__(self, other: Frontier) -> bool:
        return self <= other and self.key != other.key

    def __gt__(self, other: Frontier) -> bool:
        return other < self

    def __or__(self, other: Frontier) -> Frontier:
        """Join: the union of two frontiers."""
        self._same(other)
        return Frontier(self.domain, self.domain.join(self.key, other.key))

    def __and__(self, other: Frontier) -> Frontier:
        """Meet: the intersection of two frontiers."""
        self._same(other)
        return Frontier(self.domain, self.domain.meet(self.key, other.key))

    def to_json(self) -> Any:
        return self.domain.dump(self.key)

    def __str__(self) -> str:
        return self.domain.describe(self.key)


@dataclass(frozen=True)
class EpochRange:
    """The offsets one epoch took from its source: [start, end) per partition."""

    epoch: int
    start: Offsets
    end: Offsets


class EpochRanges:
    """Translates between a source's offsets and the epochs cut from it.

    A region that reads a topic directly logs, per epoch, the offset range it took
    from each partition; offsets frontiers then map to epoch frontiers and back.
    """

    def __init__(self, ranges: Iterable[EpochRange]):
        self.ranges = sorted(ranges, key=lambda r: r.epoch)
        for before, after in zip(self.ranges, self.ranges[1:], strict=False):
            if after.epoch != before.epoch + 1:
                raise TimeError(f"epoch ranges skip from {before.epoch} to {after.epoch}")
            if before.end != after.start:
                raise TimeError(
                    f"epoch {after.epoch} starts at {after.start!r}, not where epoch "
                    f"{before.epoch} ended ({before.end!r}): a gap or an overlap"
                )

    def epoch_of(self, offsets: Offsets) -> int:
        """The latest epoch whose whole range lies inside ``offsets`` (-1: none)."""
        done = -1
        for r in self.ranges:
            if not r.end <= offsets:
                break
            done = r.epoch
        return done

    def offsets_of(self, epoch: int) -> Offsets:
        """Where a source restarts after epoch ``epoch`` (bottom for -1)."""
        if epoch < 0:
            return OFFSETS.bottom
        for r in self.ranges:
            if r.epoch == epoch:
                return r.end
        raise TimeError(f"no offsets were logged for epoch {epoch}")


def project(src: Domain, dst: Domain, key: Any) -> Any:
    """The default projection π_e of a frontier of ``src`` onto an edge into ``dst``.

    Epoch to epoch: k. An epoch into an iterating region: (k, ∞), the whole epoch.
    An iterating region's (k, i) back into epochs: k once epoch k has converged
    (i = ∞), else k - 1. Bottom and top project to bottom and top.
    """
    if key == src.bottom:
        return dst.bottom
    if key == src.top:
        return dst.top
    if src is dst:
        return key
    if src is EPOCH and dst is ITERATION:
        return (key, INF)
    if src is ITERATION and dst is EPOCH:
        epoch, iteration = key
        return epoch if iteration == INF else epoch - 1
    raise TimeError(f"no projection from {src.name} onto {dst.name}")


def shift(dom: Domain, key: Any, epochs: int) -> Any:
    """``key`` moved by whole epochs (bottom when it moves below epoch 0).

    A side input read "as of the previous epoch" is an edge with a delay: its records
    carry the sender's epochs, and the receiver at epoch e has delivered those up to
    e - delay.
    """
    if key == dom.bottom or key == dom.top or not epochs:
        return key
    if dom is EPOCH:
        return key + epochs if key + epochs >= 0 else dom.bottom
    if dom is ITERATION:
        epoch = key[0] + epochs
        return (epoch, INF) if epoch >= 0 else dom.bottom
    raise TimeError(f"cannot shift {dom.name} times by epochs")
