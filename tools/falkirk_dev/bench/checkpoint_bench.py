"""Checkpoint store benchmark: incremental checkpoint bytes against full snapshots.

Run: ``python -m falkirk_dev.bench.checkpoint_bench [KEYS] [CHURN] [CHECKPOINTS]`` (defaults:
200,000 keys, 1% churn, 5 checkpoints). Checkpoint 0 saves the whole state (the first base);
each later one changes ``churn`` of the keys (80% updated, 10% deleted, 10% new keys) and saves
only the delta. Per checkpoint it prints the bytes written next to the bytes a full Parquet
snapshot of the same state takes, and their ratio. Goal: ≥ 20× smaller at 1% churn, the point
of incremental checkpoints for a lazy or eager region with a large state. It then times
restoring the latest checkpoint and checks it equals the state.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from falkirk.state.checkpoints import CheckpointStore, diff, full_snapshot_bytes

GOAL = 20.0
VALUE_SCHEMA = pa.schema([("label", pa.int64()), ("size", pa.int64()), ("updated", pa.float64())])


def _keys(ids: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise("k", pc.cast(pa.array(ids), pa.string()), "")


def initial_state(keys: int, rng: np.random.Generator) -> pa.Table:
    """``keys`` rows: key ``k<i>``, a small label, a size and a timestamp-like double."""
    return pa.table(
        {
            "key": _keys(np.arange(keys)),
            "label": pa.array(rng.integers(0, 50, keys)),
            "size": pa.array(rng.integers(0, 1_000_000, keys)),
            "updated": pa.array(rng.random(keys) * 1e9),
        }
    )


def churn_state(
    state: pa.Table, fraction: float, next_id: int, rng: np.random.Generator
) -> tuple[pa.Table, int]:
    """A new state with ``fraction`` of the keys touched: 80% updated, 10% deleted, 10% new."""
    n = state.num_rows
    touched = max(1, int(n * fraction))
    n_del = touched // 10
    n_new = touched // 10
    n_upd = touched - n_del - n_new
    picked = rng.choice(n, size=n_upd + n_del, replace=False)
    updated, deleted = picked[:n_upd], picked[n_upd:]

    keep = np.ones(n, dtype=bool)
    keep[deleted] = False
    size = state["size"].to_numpy().copy()
    stamp = state["updated"].to_numpy().copy()
    size[updated] = rng.integers(0, 1_000_000, n_upd)
    stamp[updated] = rng.random(n_upd) * 1e9
    changed = state.set_column(2, "size", pa.array(size)).set_column(3, "updated", pa.array(stamp))
    fresh = pa.table(
        {
            "key": _keys(np.arange(next_id, next_id + n_new)),
            "label": pa.array(rng.integers(0, 50, n_new)),
            "size": pa.array(rng.integers(0, 1_000_000, n_new)),
            "updated": pa.array(rng.random(n_new) * 1e9),
        }
    )
    return pa.concat_tables([changed.filter(pa.array(keep)), fresh]), next_id + n_new


def main(keys: int = 200_000, churn: float = 0.01, checkpoints: int = 5) -> dict[str, float]:
    rng = np.random.default_rng(7)
    root = tempfile.mkdtemp(prefix="falkirk-checkpoint-bench-")
    try:
        store = CheckpointStore(f"{root}/state", VALUE_SCHEMA)
        state = initial_state(keys, rng)
        next_id = keys
        previous: pa.Table | None = None
        ratios: list[float] = []
        saves: list[float] = []
        print(f"state {keys:,} keys, churn {churn:.1%} per checkpoint, delta-rs, local disk")
        print(
            f"{'ckpt':>4} {'rows':>8} {'tombst':>7} {'incremental B':>14} {'full snapshot B':>16}"
            f" {'ratio':>7} {'diff ms':>8} {'save ms':>8}"
        )
        for checkpoint in range(checkpoints + 1):
            if checkpoint:
                state, next_id = churn_state(state, churn, next_id, rng)
            t0 = time.perf_counter()
            changed, deleted = diff(previous, state)
            t1 = time.perf_counter()
            info = store.save(checkpoint, changed, deleted)
            t2 = time.perf_counter()
            full = full_snapshot_bytes(state)
            ratio = full / info.bytes if info.bytes else float("inf")
            if checkpoint:  # checkpoint 0 is the first full base
                ratios.append(ratio)
                saves.append(t2 - t1)
            print(
                f"{checkpoint:>4} {info.upserts:>8,} {info.tombstones:>7,} {info.bytes:>14,}"
                f" {full:>16,} {ratio:>6.1f}x {(t1 - t0) * 1000:>8.1f} {(t2 - t1) * 1000:>8.1f}"
            )
            previous = state

        t0 = time.perf_counter()
        restored = store.restore(checkpoints)
        restore_s = time.perf_counter() - t0
        assert restored.equals(state.sort_by("key")), "restore differs from the state"
        t0 = time.perf_counter()
        first = store.restore(0)
        restore_first_s = time.perf_counter() - t0
        assert first.num_rows == keys
        worst = min(ratios) if ratios else float("inf")
        verdict = "ok" if worst >= GOAL else "BELOW GOAL"
        mean_save = sum(saves) / len(saves) if saves else 0.0
        print(f"mean incremental save {mean_save * 1000:.1f} ms")
        print(
            f"restore latest (checkpoint {checkpoints}, {restored.num_rows:,} keys) "
            f"{restore_s * 1000:.1f} ms; restore checkpoint 0 {restore_first_s * 1000:.1f} ms"
        )
        print(f"smallest ratio {worst:.1f}x (goal >= {GOAL:.0f}x: {verdict})")
        return {"min_ratio": worst, "save_s": mean_save, "restore_s": restore_s}
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    args = sys.argv[1:4]
    main(*(conv(a.replace("_", "")) for conv, a in zip((int, float, int), args, strict=False)))
