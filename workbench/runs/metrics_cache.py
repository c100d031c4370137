"""Decoded metric rows kept between reads: a page that redraws runs as they train decodes only the
steps ingested since its last read.

Reading 30 runs x 1,000 steps of metrics from the store (query + JSON decode) took ~0.6 s of every
arms-view render after new steps arrived, although each run had gained one row. A run's rows change
in two ways only: a row past its last step is appended (ingest, in step order), or rows are
rewritten (a resume drops the steps it redoes; a row below the last step), which bumps the run's
``metrics_generation`` (``workbench.runs.store``). So per set of runs read together this keeps the
decoded frame with the runs' generations and last steps; a read asks the store for the generations
(one small query), reads everything again when one moved or a run is new to the set, and otherwise
only the rows past each run's last step (one query, one decode). The arm frame of the last read
takes the new rows in place, and the plain frame is put together only when asked for (``_Kept``).
The result equals ``RunStore.metrics`` / ``arm_metrics`` (tested on SQLite and PostgreSQL).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import pandas as pd

from workbench.runs.ingest import INT64_MIN
from workbench.runs.store import RunStore, arm_frame

MAX_KEPT_SETS = 8  # sets of runs whose frames stay decoded (least recently read dropped first)
MAX_TRIES = 3  # reads tried while generations move during them; then one plain read


# Rows read since a kept frame was last put together, at most: then (or when someone asks for the
# frame) it is made again with all of them. The arms view asks only for the arm frame, which follows
# the new rows by itself; the plain frame, re-sorted on every read, was a copy of 30,000 rows per redraw.
MAX_PENDING_READS = 64


class _Kept:
    """The ``RunStore.metrics`` frame of a set of runs as of one read: the runs' generations when it
    was read, each run's last step in it (INT64_MIN: no row yet), and the frame as ``base`` (a frame
    put together) plus ``pending`` (the rows of each read since, in read order), put together when
    ``frame`` is first asked for. ``new``: the last read's rows, and ``after``: the ``token`` of the
    ``_Kept`` they were appended to (None: read whole), which an arm frame of that one follows."""

    __slots__ = ("generations", "last_steps", "base", "pending", "new", "after", "token", "_frame")

    def __init__(self, generations: dict[str, int], last_steps: dict[str, int], base: pd.DataFrame,
                 pending: tuple[pd.DataFrame, ...] = (), new: pd.DataFrame | None = None, after: object | None = None):
        self.generations, self.last_steps, self.base, self.pending = generations, last_steps, base, pending
        self.new, self.after, self.token = new, after, object()
        self._frame = None if pending else base

    @property
    def frame(self) -> pd.DataFrame:
        """``base`` with the ``pending`` rows appended (made once, on first use; callers hold the
        cache's lock)."""
        if self._frame is None:
            self._frame = _appended(self.base, self.pending)
        return self._frame

    def appended(self, generations: dict[str, int], new: pd.DataFrame) -> "_Kept":
        """This read with the rows ``new`` (past each run's last step) appended."""
        pending = (*self.pending, new)
        base = self.base
        if self._frame is not None and self.pending:  # already put together: start from that
            base, pending = self._frame, (new,)
        if len(pending) > MAX_PENDING_READS:
            base, pending = _appended(base, pending), ()
        return _Kept(generations, {**self.last_steps, **_last_steps(new)}, base, pending, new, self.token)


@dataclass(frozen=True)
class _ArmKept:
    """``arm_frame(arms, frame)`` of the read whose ``_Kept.token`` is ``source``, and each run's
    rows in it (R,), runs in ``arms``' order."""

    arms: pd.DataFrame
    source: object
    frame: pd.DataFrame
    counts: np.ndarray


class MetricsCache:
    """``metrics`` / ``arm_metrics`` of a ``RunStore``, reading only the rows added since the last
    read of the same runs. Thread-safe (Streamlit sessions share one per store)."""

    def __init__(self, store: RunStore, max_sets: int = MAX_KEPT_SETS):
        self.store = store
        self.max_sets = max_sets
        self._kept: OrderedDict[tuple[str, ...], _Kept] = OrderedDict()
        self._arm_kept: OrderedDict[tuple[str, ...], _ArmKept] = OrderedDict()  # keyed by the ids in order
        self._lock = threading.RLock()

    def metrics(self, run_ids: Iterable[str]) -> pd.DataFrame:
        """``RunStore.metrics(run_ids)``: one row per (run, step), in run id then step order (a copy:
        the caller may change it)."""
        return self._frame(run_ids).copy()

    def arm_metrics(self, run_ids: Iterable[str]) -> pd.DataFrame:
        """``RunStore.arm_metrics(run_ids)`` (RunError naming a run id that does not exist): a new
        frame each call. After rows were appended to the frame of the last call (same runs, same
        arms), the new rows are put in place in that frame (``_arm_appended``) rather than the
        whole frame matched to its arms again."""
        run_ids = list(run_ids)
        arms = self.store.run_arms(run_ids)
        with self._lock:
            kept = self._kept_of(run_ids)
            last = self._arm_kept.pop(tuple(run_ids), None)
            if last is not None and last.source is kept.token and last.arms.equals(arms):
                made = last  # nothing read since
            elif (last is not None and kept.after is not None and last.source is kept.after
                    and last.arms.equals(arms)):
                made = _arm_appended(last, arm_frame(arms, kept.new), kept.token)
            else:
                made = _arm_kept(arms, kept.frame, kept.token)
            self._arm_kept[tuple(run_ids)] = made
            while len(self._arm_kept) > self.max_sets:
                self._arm_kept.popitem(last=False)
            # the kept frame is the next call's start: the caller gets its own frame object (shallow;
            # with copy-on-write a change the caller makes copies what it changes)
            return made.frame.copy(deep=False)

    def _frame(self, run_ids: Iterable[str]) -> pd.DataFrame:
        with self._lock:
            return self._kept_of(run_ids).frame

    def _kept_of(self, run_ids: Iterable[str]) -> _Kept:
        key = tuple(sorted(set(run_ids)))
        with self._lock:
            for _ in range(MAX_TRIES):
                kept = self._read(key, self._kept.pop(key, None))
                if kept is not None:
                    break
            else:
                kept = _read_all(self.store, key, self.store.metrics_generations(key))
            self._kept[key] = kept
            while len(self._kept) > self.max_sets:
                self._kept.popitem(last=False)
            return kept

    def _read(self, key: tuple[str, ...], kept: _Kept | None) -> _Kept | None:
        """``kept`` brought up to date (None: a generation moved while reading; try again)."""
        generations = self.store.metrics_generations(key)
        if kept is None or kept.generations != generations:
            fresh = _read_all(self.store, key, generations)
        else:
            new = self.store.metrics_after(kept.last_steps)
            fresh = kept if not len(new) else kept.appended(generations, new)
        return fresh if self.store.metrics_generations(key) == generations else None


def _read_all(store: RunStore, key: tuple[str, ...], generations: dict[str, int]) -> _Kept:
    frame = store.metrics(key)
    return _Kept(generations, {**dict.fromkeys(generations, INT64_MIN), **_last_steps(frame)}, frame)


def _last_steps(frame: pd.DataFrame) -> dict[str, int]:
    """run id -> its last step in ``frame``."""
    return {str(k): int(v) for k, v in frame.groupby("run_id", sort=False)["step"].max().items()}


def _appended(frame: pd.DataFrame, reads: tuple[pd.DataFrame, ...]) -> pd.DataFrame:
    """``frame`` with the rows of ``reads`` (each past its runs' last steps before it, in read order)
    in the store's order (run id, then step): what appending the reads one by one gives. An empty
    ``frame`` (its runs had no row yet) is left out: its object columns would make ``step`` an object
    column; the first read then takes its place."""
    if not len(frame):
        frame, reads = reads[0], reads[1:]
    if not reads:
        return frame
    new = reads[0] if len(reads) == 1 else pd.concat(reads, ignore_index=True)
    # every new row is past its run's last kept step: ordering the rows by run keeps each run's
    # kept rows, then its new ones, in step order (a sort by run id and step took ~15 ms per render)
    both = pd.concat([frame, new], ignore_index=True)
    run, _ = pd.factorize(both["run_id"], sort=True)
    return both.take(np.argsort(run, kind="stable")).reset_index(drop=True)


def _arm_kept(arms: pd.DataFrame, frame: pd.DataFrame, source: object) -> _ArmKept:
    made = arm_frame(arms, frame)
    return _ArmKept(arms, source, made, _run_counts(arms, made))


def _run_counts(arms: pd.DataFrame, made: pd.DataFrame) -> np.ndarray:
    """Rows of each run of ``arms`` in the arm frame ``made`` (its rows grouped by run in ``arms``'
    order): (R,) int."""
    codes, distinct = pd.factorize(made["run_id"], sort=False)
    at = pd.Index(arms["run_id"]).get_indexer(distinct)
    return np.bincount(at[codes], minlength=len(arms)) if len(codes) else np.zeros(len(arms), dtype=np.intp)


def _arm_appended(last: _ArmKept, new: pd.DataFrame, source: object) -> _ArmKept:
    """``arm_frame(arms, frame)`` where ``frame`` (the read ``source`` names) is ``last``'s with
    rows appended whose arm frame is ``new``: each run's kept rows, then its new ones, runs in ``arms``' order; run
    positions from the kept counts (no string of the 30,000 rows hashed again, one take).
    Equals the whole match (tests/runs/test_metrics_cache.py)."""
    if not len(new):
        return _ArmKept(last.arms, source, last.frame.copy(), last.counts)
    counts = _run_counts(last.arms, new)
    runs = np.arange(len(last.arms))
    run = np.r_[np.repeat(runs, last.counts), np.repeat(runs, counts)]
    both = pd.concat([last.frame, new], ignore_index=True) if len(last.frame) else new
    made = both.take(np.argsort(run, kind="stable")).reset_index(drop=True)
    return _ArmKept(last.arms, source, made, last.counts + counts)
