"""The metrics cache (workbench.runs.metrics_cache) on real SQLite and the real PostgreSQL fixture:
after every kind of change a run's rows go through (steps appended, a resume that redoes steps, a
row below the last step, a run deleted) it returns exactly what the store returns, and it reads only
the rows past the ones it holds unless the run's metrics_generation moved."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import sqlalchemy as sa

from tests.ui.seed import add_run, metrics_event
from workbench.runs.metrics_cache import MetricsCache
from workbench.runs.schema import payloads, runs as runs_table


def _same(cache: MetricsCache, ids: list[str]) -> pd.DataFrame:
    """The cache's frames equal the store's, for metrics and arm_metrics; returns the metrics. Rows in
    the same order; columns may come in another (a metric first logged by a later step is last)."""
    got = cache.metrics(ids)
    pd.testing.assert_frame_equal(got, cache.store.metrics(ids), check_like=True)
    pd.testing.assert_frame_equal(cache.arm_metrics(ids), cache.store.arm_metrics(ids), check_like=True)
    return got


def _reward(frame: pd.DataFrame, run_id: str, step: int) -> float:
    return float(frame.loc[(frame["run_id"] == run_id) & (frame["step"] == step), "reward"].iloc[0])


def test_appends_resumes_late_rows_and_deletes_read_as_the_store(store):
    a = add_run(store, name="a", steps=3, group="g", seed=1)
    b = add_run(store, name="b", steps=2, group="g", seed=2, extra_metrics=lambda s: {"only_b": float(s)})
    empty = add_run(store, name="empty", steps=0, group="g", seed=3)
    cache = MetricsCache(store)
    ids = [b, a, empty]
    assert len(_same(cache, ids)) == 5

    store.ingest(a, [metrics_event(3, 103.0), metrics_event(4, 104.0)])
    store.ingest(empty, [metrics_event(0, 100.0, offset=0.5)])
    got = _same(cache, ids)
    assert len(got) == 8 and _reward(got, empty, 0) == 0.5

    # a resume at step 2 redoes steps 2..: the old rows' values must not survive in the cache
    store.ingest(a, [{"kind": "resume", "step": 2, "time": 110.0}, metrics_event(2, 111.0, offset=7.0)])
    got = _same(cache, ids)
    assert _reward(got, a, 2) == 7.02 and sorted(got.loc[got["run_id"] == a, "step"]) == [0, 1, 2]

    # a row below the last step (not an append) is read too
    store.ingest(b, [metrics_event(5, 120.0)])
    _same(cache, ids)
    store.ingest(b, [metrics_event(3, 121.0, offset=3.0)])
    assert _reward(_same(cache, ids), b, 3) == 3.03

    store.delete(b)
    assert set(_same(cache, [a, empty])["run_id"]) == {a, empty}
    assert set(cache.metrics(ids)["run_id"]) == {a, empty}  # a deleted run has no rows to draw


def test_only_rows_past_the_kept_ones_are_read_until_the_generation_moves(store):
    """A row changed behind the store's back (no generation bump) is not re-read: proof that a read
    decodes only new steps; bumping the run's metrics_generation makes the next read take it."""
    a = add_run(store, name="a", steps=3)
    cache = MetricsCache(store)
    assert _reward(cache.metrics([a]), a, 1) == 0.01
    metrics = payloads["metrics"]
    changed = metrics_event(1, 101.0, offset=9.0)["metrics"]
    with store._write() as conn:
        conn.execute(sa.update(metrics).where(metrics.c.run_id == a, metrics.c.step == 1)
                     .values(data=json.dumps(changed)))
    store.ingest(a, [metrics_event(3, 103.0)])
    kept = cache.metrics([a])
    assert _reward(kept, a, 1) == 0.01 and _reward(kept, a, 3) == 0.03
    with store._write() as conn:
        conn.execute(sa.update(runs_table).where(runs_table.c.id == a)
                     .values(metrics_generation=runs_table.c.metrics_generation + 1))
    assert _reward(cache.metrics([a]), a, 1) == 9.01


def test_runs_without_rows_that_gain_their_first_rows_read_as_the_store(store):
    """A page opened on a run launched a moment ago (no step yet) keeps an empty frame; the first
    steps appended to it come back as the store has them (step stays int64)."""
    fresh = add_run(store, name="fresh", steps=0, status="running")
    cache = MetricsCache(store)
    assert cache.metrics([fresh]).empty and cache.arm_metrics([fresh]).empty
    store.ingest(fresh, [metrics_event(0, 100.0), metrics_event(1, 101.0)])
    got = _same(cache, [fresh])
    assert got["step"].dtype == "int64" and list(got["step"]) == [0, 1]


def test_an_unknown_run_is_refused_like_the_store(store):
    from workbench.runs.records import RunError

    cache = MetricsCache(store)
    with pytest.raises(RunError, match="'nope'"):
        cache.arm_metrics(["nope"])
    assert cache.metrics(["nope"]).empty


def test_new_rows_of_more_runs_than_one_query_can_name_are_read(store):
    """metrics_after over 1,500 runs (SQLite refused one OR of that many terms: expression depth
    1,000): the batches return every run's new rows, in run id order."""
    a, b = add_run(store, name="a", steps=3), add_run(store, name="b", steps=2)
    after = {f"absent{i:04d}": 0 for i in range(1500)} | {a: 0, b: -1}
    got = store.metrics_after(after)
    assert list(zip(got["run_id"], got["step"])) == [(a, 1), (a, 2), (b, 0), (b, 1)]


def test_new_rows_of_runs_at_shared_and_different_steps_are_each_runs_rows_past_its_step(store):
    """metrics_after asks once per distinct step (runs stepping together share a condition): each
    run's rows past its own step come back, whether its step is shared, its own, before its first
    row or past its last, in run id then step order, as the store's frame has them."""
    ids = [add_run(store, name=f"r{i}", steps=steps) for i, steps in enumerate([5, 5, 4, 6, 3, 0])]
    after = dict(zip(ids, [2, 2, 0, 2, -1, 0]))  # three runs at step 2, one at 0, one before its first row
    after |= {add_run(store, name="done", steps=3): 9}  # past its last row: nothing
    got = store.metrics_after(after)
    whole = store.metrics(list(after))
    expected = whole[whole["step"] > whole["run_id"].map(after)].reset_index(drop=True)
    assert [(r, s) for r, s in zip(got["run_id"], got["step"])] == [(r, s) for r, s in zip(expected["run_id"], expected["step"])]
    assert len(got) == 2 + 2 + 3 + 3 + 3
    pd.testing.assert_frame_equal(got, expected, check_like=True)


def _merged(arms: pd.DataFrame, metrics: pd.DataFrame) -> pd.DataFrame:
    """arm_frame's definition: the inner merge on run_id, key columns first."""
    frame = arms.merge(metrics, on="run_id", how="inner")
    first = ["run_id", "arm", "seed", "step", "time"]
    return frame[first + [c for c in frame.columns if c not in first]].reset_index(drop=True)


def test_arm_frame_is_the_inner_merge_of_the_runs_arms_and_their_rows():
    """``arm_frame`` builds the merge by positions; it equals pandas' merge for runs in any order,
    runs without rows, rows of runs not asked for, unknown seeds, and no rows at all."""
    import numpy as np

    from workbench.runs.store import arm_frame

    rng = np.random.default_rng(7)
    for trial in range(30):
        ids = [f"r{i}" for i in range(int(rng.integers(1, 9)))]
        rows = [(i, s, float(s), *rng.normal(size=2)) for i in ids + ["other"] for s in range(int(rng.integers(0, 5)))]
        rng.shuffle(rows)
        metrics = pd.DataFrame(rows, columns=["run_id", "step", "time", "reward", "kl"])
        if trial % 5 == 0:
            metrics = pd.DataFrame(columns=["run_id", "step", "time"])  # no run has a row yet
        asked = list(rng.permutation(ids))
        arms = pd.DataFrame([(i, f"arm{k % 3}", None if k == 0 else k) for k, i in enumerate(asked)],
                            columns=["run_id", "arm", "seed"])
        pd.testing.assert_frame_equal(arm_frame(arms, metrics), _merged(arms, metrics))


def test_appended_rows_are_put_in_place_in_the_last_arm_frame(store, monkeypatch):
    """After steps are appended, the arm frame is the last one with the new rows put in place
    (only the new rows are matched to their arms) and equals the store's, in row order and column
    order: runs asked for in any order, a metric first logged by the new rows, a run's first rows."""
    import workbench.runs.metrics_cache as metrics_cache

    a = add_run(store, name="a", steps=3, group="g", seed=1)
    b = add_run(store, name="b", steps=2, group="g", seed=2)
    fresh = add_run(store, name="fresh", steps=0, group="g", seed=3)
    cache, ids = MetricsCache(store), [b, fresh, a]
    matched = []  # rows of each frame matched to its arms
    whole = metrics_cache.arm_frame
    monkeypatch.setattr(metrics_cache, "arm_frame", lambda arms, frame: matched.append(len(frame)) or whole(arms, frame))
    pd.testing.assert_frame_equal(cache.arm_metrics(ids), store.arm_metrics(ids))
    for step in (3, 4):
        store.ingest(a, [metrics_event(step, 100.0 + step)])
        store.ingest(b, [{**metrics_event(step, 100.0 + step), "metrics": {"reward": 0.5, "only_new": 1.0}}])
        store.ingest(fresh, [metrics_event(step, 100.0 + step)])
        pd.testing.assert_frame_equal(cache.arm_metrics(ids), store.arm_metrics(ids))
    assert matched == [5, 3, 3]  # the whole frame once, then the three new rows of each append
    # what a caller does to its frame does not reach the next one
    mine = cache.arm_metrics(ids)
    mine["reward"] = -1.0
    del mine["kl"]
    store.ingest(a, [metrics_event(5, 105.0)])
    pd.testing.assert_frame_equal(cache.arm_metrics(ids), store.arm_metrics(ids))


def test_the_plain_frame_put_together_late_equals_the_store_after_any_number_of_reads(store, monkeypatch):
    """While only arm frames are asked for, each read's rows wait beside the kept frame and are put
    together when the plain frame is asked for, or after MAX_PENDING_READS reads: either way the
    frames equal the store's (rows, order, columns, dtypes), with a metric first logged by a later
    read, an integer-valued metric, a run's first rows, and the plain frame asked for midway."""
    import workbench.runs.metrics_cache as metrics_cache

    monkeypatch.setattr(metrics_cache, "MAX_PENDING_READS", 3)
    a = add_run(store, name="a", steps=2, group="g", seed=1)
    b = add_run(store, name="b", steps=0, group="g", seed=2)
    cache, ids = MetricsCache(store), [a, b]
    cache.arm_metrics(ids)
    put_together = []
    appended = metrics_cache._appended
    monkeypatch.setattr(metrics_cache, "_appended", lambda frame, reads: put_together.append(len(reads)) or appended(frame, reads))
    for step in range(2, 12):
        store.ingest(a, [metrics_event(step, 100.0 + step)])
        metrics = {"reward": 0.5, "count": step} | ({"late": float(step)} if step > 4 else {})
        store.ingest(b, [{**metrics_event(step, 100.0 + step), "metrics": metrics}])
        pd.testing.assert_frame_equal(cache.arm_metrics(ids), store.arm_metrics(ids))
        if step == 6:
            pd.testing.assert_frame_equal(cache.metrics(ids), store.metrics(ids))
    assert put_together == [4, 1, 4]  # after 4 reads (> 3), asked for at step 6 (1 read since), then 4 more
    pd.testing.assert_frame_equal(cache.metrics(ids), store.metrics(ids))
    assert put_together == [4, 1, 4, 1]  # the last read alone
