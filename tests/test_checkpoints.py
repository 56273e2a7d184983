"""Incremental checkpoint store: real delta-rs tables in tmp_path, no Spark."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

import falkirk.state.checkpoints as checkpoints_module
from falkirk.errors import FalkirkError
from falkirk.io.lake import read_table
from falkirk.state.checkpoints import (
    CheckpointConflictError,
    CheckpointDroppedError,
    CheckpointError,
    CheckpointStore,
    diff,
    full_snapshot_bytes,
)

VALUES = pa.schema([("label", pa.int64()), ("size", pa.int64()), ("updated", pa.float64())])
STATE = pa.schema([("key", pa.string()), *VALUES])
TESTS = Path(__file__).resolve().parent


def state(rows: dict[str, tuple[int | None, int | None, float | None]]) -> pa.Table:
    """A state table from key → (label, size, updated)."""
    keys = sorted(rows)
    return pa.table(
        {
            "key": keys,
            "label": [rows[k][0] for k in keys],
            "size": [rows[k][1] for k in keys],
            "updated": [rows[k][2] for k in keys],
        },
        schema=STATE,
    )


def states() -> list[tuple[int, pa.Table]]:
    """Checkpoint ids (epochs, with gaps like a lazy region) and the full state at each."""
    s: dict[str, tuple[int | None, int | None, float | None]] = {
        f"k{i:03d}": (i % 5, i * 10, i / 4) for i in range(40)
    }
    out = [(0, state(s))]
    s = dict(s)
    s["k001"] = (9, 11, 0.5)  # update
    s["k002"] = (None, 20, None)  # update to nulls
    s["k100"] = (1, 1, 1.0)  # insert
    del s["k003"], s["k004"]  # delete
    out.append((3, state(s)))
    out.append((6, state(s)))  # nothing changed
    s = dict(s)
    s["k003"] = (7, 7, 7.0)  # re-insert a deleted key
    del s["k100"]  # delete a key inserted after the first checkpoint
    s["k002"] = (2, 20, -0.0)  # back from nulls
    for i in range(10, 20):
        s[f"k{i:03d}"] = (0, 0, 0.0)
    out.append((9, state(s)))
    s = dict(s)
    for key in [k for k in s if k < "k030"]:
        del s[key]  # delete most of the state
    s["k200"] = (2, 2, 2.0)
    out.append((12, state(s)))
    s = {}  # everything deleted
    out.append((15, state(s)))
    s = {"k001": (1, 1, 1.0)}
    out.append((18, state(s)))
    return out


def save_all(store: CheckpointStore, seq: list[tuple[int, pa.Table]]) -> list[Any]:
    previous = None
    infos = []
    for checkpoint, current in seq:
        changed, deleted = diff(previous, current)
        infos.append(store.save(checkpoint, changed, deleted))
        previous = current
    return infos


def assert_same(restored: pa.Table, expected: pa.Table) -> None:
    assert restored.schema == STATE
    assert restored.equals(expected.sort_by("key").cast(STATE)), (
        restored.to_pydict(),
        expected.to_pydict(),
    )


def parquet_files(root: Path) -> set[str]:
    return {p.name for p in root.rglob("*.parquet") if "_delta_log" not in p.parts}


def table_files(uri: Path) -> set[str]:
    return table_files_at(uri, None)


def table_files_at(uri: Path, version: int | None) -> set[str]:
    return {Path(u).name for u in DeltaTable(str(uri), version=version).file_uris()}


# ---------------------------------------------------------------------------------------------
# diff


def test_diff_finds_inserts_updates_and_deletes_by_key() -> None:
    previous = state({"a": (1, 1, 1.0), "b": (2, 2, math.nan), "c": (3, 3, None), "d": (4, 4, 0.0)})
    current = state(
        {
            "a": (1, 1, 1.0),  # same
            "b": (2, 2, math.nan),  # same: NaN equals NaN bit for bit
            "c": (3, 3, 3.0),  # null → value
            "d": (4, 4, -0.0),  # -0.0 is not 0.0 (restores must be exact)
            "e": (5, 5, 5.0),  # new
        }
    )
    changed, deleted = diff(previous.slice(1), current)  # a previous state without "a"
    assert changed["key"].to_pylist() == ["a", "c", "d", "e"] and deleted == []
    changed, deleted = diff(previous, current.filter(pc.field("key") != "c"))
    assert changed["key"].to_pylist() == ["d", "e"] and deleted == ["c"]
    changed, deleted = diff(None, current)
    assert changed is current and deleted == []
    # column order may differ between the two states
    changed, deleted = diff(previous.select(["updated", "key", "size", "label"]), previous)
    assert changed.num_rows == 0 and deleted == []


def test_diff_rejects_duplicate_and_null_keys() -> None:
    dup = pa.table({"key": ["a", "a"], "label": [1, 2], "size": [1, 2], "updated": [1.0, 2.0]})
    with pytest.raises(CheckpointError, match="duplicate keys.*'a'"):
        diff(None, dup)
    nulls = pa.table({"key": ["a", None], "label": [1, 2], "size": [1, 2], "updated": [1.0, 2.0]})
    with pytest.raises(CheckpointError, match="null keys"):
        diff(None, nulls)


def test_diff_is_vectorised_for_200k_keys() -> None:
    n = 200_000
    keys = pc.binary_join_element_wise("k", pc.cast(pa.array(range(n)), pa.string()), "")
    previous = pa.table({"key": keys, "label": pa.array(range(n)), "size": pa.array(range(n))})
    size = pc.if_else(pc.equal(pc.bit_wise_and(previous["size"], 127), 0), -1, previous["size"])
    current = previous.set_column(2, "size", size).slice(0, n - 100)
    t0 = time.perf_counter()
    changed, deleted = diff(previous, current)
    elapsed = time.perf_counter() - t0
    assert changed.num_rows == len(range(0, n - 100, 128))
    assert len(deleted) == 100
    assert elapsed < 2.0, f"diff of {n} keys took {elapsed:.2f} s"


# ---------------------------------------------------------------------------------------------
# save and restore


def test_every_checkpoint_restores_exactly(tmp_path: Path) -> None:
    seq = states()
    store = CheckpointStore(str(tmp_path / "state"), VALUES)
    assert store.checkpoints() == [] and store.latest() is None
    save_all(store, seq)
    assert store.checkpoints() == [c for c, _ in seq]
    for checkpoint, expected in seq:
        assert_same(store.restore(checkpoint), expected)
    reopened = CheckpointStore(str(tmp_path / "state"), VALUES)  # state only in the table
    for checkpoint, expected in seq:
        assert_same(reopened.restore(checkpoint), expected)
    with pytest.raises(CheckpointError, match="no checkpoint 4 .*retained: 0, 3, 6"):
        store.restore(4)


def test_a_checkpoint_writes_only_the_changed_keys(tmp_path: Path) -> None:
    seq = states()
    uri = tmp_path / "state"
    store = CheckpointStore(str(uri), VALUES)
    infos = save_all(store, seq)
    rows = read_table(str(uri))
    previous = None
    for (checkpoint, current), info in zip(seq, infos, strict=True):
        changed, deleted = diff(previous, current)
        written = rows.filter(pc.field("checkpoint") == checkpoint)
        assert info.rows == written.num_rows == changed.num_rows + len(deleted)
        assert (info.upserts, info.tombstones) == (changed.num_rows, len(deleted))
        assert sorted(written.filter(pc.field("deleted"))["key"].to_pylist()) == sorted(deleted)
        assert info.version == store.version_of(checkpoint)
        assert (info.files == 0) == (info.bytes == 0) == (info.rows == 0)
        previous = current
    assert [i.rows for i in infos[1:3]] == [5, 0]  # 2 updates, 1 insert, 2 deletes; nothing
    # incremental bytes stay well under a full snapshot of a larger state
    assert 0 < infos[1].bytes <= full_snapshot_bytes(seq[1][1]) * 2


def test_restore_reads_only_the_files_of_its_version(tmp_path: Path) -> None:
    uri = tmp_path / "state"
    store = CheckpointStore(str(uri), VALUES)
    seq = states()[:4]
    save_all(store, seq)
    before_last = set(DeltaTable(str(uri), version=store.version_of(6)).file_uris())
    for path in set(DeltaTable(str(uri)).file_uris()) - before_last:
        os.remove(path)  # the files of checkpoint 9 only
    for checkpoint, expected in seq[:3]:
        assert_same(store.restore(checkpoint), expected)
    with pytest.raises(OSError):
        store.restore(9)


def test_save_validates_its_input(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "state"), VALUES)
    first = state({"a": (1, 1, 1.0)})
    store.save(5, first)
    with pytest.raises(CheckpointError, match="not after the latest one, 5"):
        store.save(5, first)
    with pytest.raises(CheckpointError, match="not after the latest one, 5"):
        store.save(4, first)
    with pytest.raises(CheckpointError, match="both changed and deleted"):
        store.save(6, first, ["a"])
    with pytest.raises(CheckpointError, match="missing \\['size'\\]"):
        store.save(6, first.drop(["size"]))
    with pytest.raises(CheckpointError, match="duplicate"):
        store.save(6, state({"b": (1, 1, 1.0)}), ["a", "a"])
    with pytest.raises(CheckpointError, match="clash"):
        CheckpointStore(str(tmp_path / "other"), pa.schema([("deleted", pa.bool_())]))
    with pytest.raises(CheckpointError, match="has schema"):
        CheckpointStore(str(tmp_path / "state"), pa.schema([("label", pa.string())]))
    assert issubclass(CheckpointError, FalkirkError)
    # columns in another order, int32 values: conformed to the store's schema
    info = store.save(
        6,
        first.select(["size", "key", "updated", "label"]).cast(
            pa.schema(
                [
                    ("size", pa.int32()),
                    ("key", pa.string()),
                    ("updated", pa.float64()),
                    ("label", pa.int64()),
                ]
            )
        ),
    )
    assert info.rows == 1 and store.checkpoints() == [5, 6]


def test_a_second_writer_cannot_commit_over_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer whose snapshot is stale fails instead of committing a manifest that would
    forget the other writer's checkpoint."""
    uri = str(tmp_path / "state")
    first, second = CheckpointStore(uri, VALUES), CheckpointStore(uri, VALUES)
    first.save(1, state({"a": (1, 1, 1.0)}))
    real = checkpoints_module.write_deltalake

    def racing(table: DeltaTable, data: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(checkpoints_module, "write_deltalake", real)
        second.save(2, state({"b": (2, 2, 2.0)}))  # lands after `table`'s snapshot
        real(table, data, **kwargs)

    monkeypatch.setattr(checkpoints_module, "write_deltalake", racing)
    with pytest.raises(CheckpointConflictError, match="one writer per checkpoint store"):
        first.save(3, state({"c": (3, 3, 3.0)}))
    assert first.checkpoints() == [1, 2]
    assert_same(first.restore(2), state({"a": (1, 1, 1.0), "b": (2, 2, 2.0)}))


# ---------------------------------------------------------------------------------------------
# A crash between the Parquet write and the commit


def crashing_writer(
    real: Callable[..., None], table_root: str, crash: Callable[[], None]
) -> Callable[..., None]:
    """A ``write_deltalake`` that streams the rows, waits until delta-rs has written Parquet
    data files into the table folder, then crashes before delta-rs can commit them."""

    def write(table: DeltaTable, data: pa.Table, **kwargs: Any) -> None:
        before = parquet_files(Path(table_root))

        def batches():
            yield from data.to_batches(max_chunksize=500)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not parquet_files(Path(table_root)) - before:
                time.sleep(0.005)
            crash()

        reader = pa.RecordBatchReader.from_batches(data.schema, batches())
        real(table, reader, target_file_size=4096, **kwargs)

    return write


def big_state(n: int, salt: int) -> pa.Table:
    return state({f"k{i:06d}": (salt, i, float(i * salt)) for i in range(n)})


def test_a_failure_before_the_commit_leaves_no_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = tmp_path / "state"
    store = CheckpointStore(str(uri), VALUES)
    seq = states()[:3]
    save_all(store, seq)
    files = parquet_files(uri)

    def fail() -> None:
        raise RuntimeError("simulated crash before the commit")

    real = checkpoints_module.write_deltalake
    monkeypatch.setattr(
        checkpoints_module, "write_deltalake", crashing_writer(real, str(uri), fail)
    )
    with pytest.raises(Exception, match="simulated crash"):
        store.save(7, big_state(20_000, 7))
    monkeypatch.setattr(checkpoints_module, "write_deltalake", real)

    assert parquet_files(uri) - files, "the data files should have been written"
    assert table_files(uri) == files  # none of them committed
    assert store.checkpoints() == [0, 3, 6]
    for checkpoint, expected in seq:
        assert_same(store.restore(checkpoint), expected)


def test_sigkill_between_data_write_and_commit(tmp_path: Path) -> None:
    """A real crash: the saving process is killed with SIGKILL once delta-rs has written data
    files for the checkpoint and before it commits them."""
    uri = tmp_path / "state"
    store = CheckpointStore(str(uri), VALUES)
    seq = states()[:3]
    save_all(store, seq)
    files = parquet_files(uri)
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(TESTS)!r})
        import falkirk.state.checkpoints as m
        from test_checkpoints import VALUES, big_state, crashing_writer
        store = m.CheckpointStore({str(uri)!r}, VALUES)
        kill = lambda: os.kill(os.getpid(), signal.SIGKILL)
        m.write_deltalake = crashing_writer(m.write_deltalake, {str(uri)!r}, kill)
        store.save(7, big_state(20_000, 7))
        print("not killed")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr)

    orphans = parquet_files(uri) - files
    assert orphans, "the killed save should have left data files"
    assert table_files(uri) == files
    assert store.checkpoints() == [0, 3, 6]
    for checkpoint, expected in seq:
        assert_same(store.restore(checkpoint), expected)

    # the store goes on: the same id saves, and retention vacuums the orphans
    changed, deleted = diff(seq[-1][1], big_state(100, 7))
    store.save(7, changed, deleted)
    assert_same(store.restore(7), big_state(100, 7))
    store.retain(6)
    assert not orphans & parquet_files(uri)
    assert_same(store.restore(7), big_state(100, 7))


# ---------------------------------------------------------------------------------------------
# Retention


def test_retain_compacts_drops_and_vacuums(tmp_path: Path) -> None:
    uri = tmp_path / "state"
    store = CheckpointStore(str(uri), VALUES)
    seq = states()
    save_all(store, seq)
    before = {c: store.restore(c) for c, _ in seq}
    files_before = parquet_files(uri)
    increments_after_9 = table_files_at(uri, store.version_of(18)) - table_files_at(
        uri, store.version_of(9)
    )

    info = store.retain(9)
    assert info.dropped == [0, 3, 6] and info.keep_from == 9
    assert info.base_rows == seq[3][1].num_rows
    assert store.checkpoints() == [9, 12, 15, 18]
    for checkpoint in store.checkpoints():
        assert_same(store.restore(checkpoint), before[checkpoint])
        assert store.version_of(checkpoint) == info.version

    files_after = parquet_files(uri)
    assert files_after == table_files(uri)  # nothing on disk beyond the live version
    assert len(files_after) < len(files_before)
    assert set(info.files_removed) == files_before - files_after
    # the increments of 12, 15 and 18 are still shared, not rewritten; 9 is one full base
    assert increments_after_9 and increments_after_9 <= files_after
    rows = read_table(str(uri))
    assert pc.min(rows["checkpoint"]).as_py() == 9
    base = rows.filter(pc.field("checkpoint") == 9)
    assert base.num_rows == seq[3][1].num_rows and not pc.any(base["deleted"]).as_py()

    for dropped in (0, 3, 6, 2):
        with pytest.raises(CheckpointDroppedError, match=f"checkpoint {dropped} .* is 9"):
            store.restore(dropped)
    with pytest.raises(CheckpointDroppedError, match="checkpoint 3 .* is 9"):
        store.retain(3)
    with pytest.raises(CheckpointError, match="no checkpoint 10"):
        store.retain(10)

    assert store.retain(9).dropped == []  # nothing older: no commit
    # checkpoints after a compaction are incremental again and restore exactly
    later = state({"k001": (1, 1, 1.0), "k500": (5, 5, 5.0)})
    changed, deleted = diff(seq[-1][1], later)
    assert store.save(21, changed, deleted).rows == 1
    assert_same(store.restore(21), later)

    # a second compaction, to the newest checkpoint, on a state that was empty before
    info = store.retain(21)
    assert info.dropped == [9, 12, 15, 18] and store.checkpoints() == [21]
    assert_same(store.restore(21), later)
    assert parquet_files(uri) == table_files(uri)
    assert len(parquet_files(uri)) == 1


def test_retains_keep_the_delta_log_as_long_as_the_retained_checkpoints_need(
        tmp_path: Path) -> None:
    """A store saved every epoch and retained now and then for hundreds of epochs keeps
    a log of a few retains' commits, not one file per save (Delta keeps 30 days of them:
    a store's log grew with every epoch), and every retained checkpoint still restores."""
    uri = tmp_path / "state"
    store = CheckpointStore(str(uri), VALUES)
    log = uri / "_delta_log"
    current = state({})
    expected: dict[int, pa.Table] = {}
    commits_at, removed = [], 0
    for c in range(120):
        after = state({**{k: (c, 1, 1.0) for k in [f"k{c % 7}", f"u{c}"]},
                       **{r["key"]: (r["label"], r["size"], r["updated"])
                          for r in current.to_pylist()}})
        changed, deleted = diff(current, after)
        store.save(c, changed, deleted)
        current, expected[c] = after, after
        if c % 10 == 9:  # a retain a while behind the newest save, as garbage collection asks
            info = store.retain(c - 5)
            assert info.dropped
            removed += len(info.log_files_removed)
            commits_at.append(len(list(log.glob("*.json"))))
    # the retains before the last two removed the log files older than their versions
    assert max(commits_at[2:]) <= 3 * 15, commits_at
    assert removed > 100
    assert not (log / f"{0:020}.json").exists()  # the first saves' commits went
    for c in store.checkpoints():
        assert_same(store.restore(c), expected[c])
    assert DeltaTable(str(uri)).version() > 120  # the latest version still loads
    assert DeltaTable(str(uri), version=store.version_of(114)).version() == \
        store.version_of(114)


def test_retain_of_an_empty_state(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "state"), VALUES)
    seq = states()
    save_all(store, seq)
    info = store.retain(15)  # everything deleted at 15
    assert info.base_rows == 0 and store.checkpoints() == [15, 18]
    assert store.restore(15).num_rows == 0
    assert_same(store.restore(18), seq[-1][1])


def test_truncate_after_a_rollback_then_the_same_ids_are_saved_again(tmp_path):
    value = pa.schema([("label", pa.int64())])
    store = CheckpointStore(str(tmp_path / "state"), value)
    states = {}
    previous = None
    for c in range(4):
        state = pa.table({"key": [f"k{i}" for i in range(5)],
                          "label": [i * 10 + c for i in range(5)]})
        changed, deleted = diff(previous, state)
        store.save(c, changed, deleted)
        states[c], previous = state, state
    assert store.truncate_after(1) == [2, 3]
    assert store.checkpoints() == [0, 1]
    assert store.restore(1).equals(states[1])
    again = CheckpointStore.open(str(tmp_path / "state"))
    assert again is not None and again.checkpoints() == [0, 1]
    other = pa.table({"key": ["k0", "k9"], "label": [-1, 99]})
    changed, deleted = diff(states[1], other)
    again.save(2, changed, deleted)  # the id 2 is free again
    assert again.restore(2).equals(other)
    assert again.restore(1).equals(states[1])
    assert CheckpointStore.open(str(tmp_path / "nothing")) is None
