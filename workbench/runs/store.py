"""The run store: one SQLite file (WAL) under the workbench home.

Tables: ``runs`` (one row per run, with its recipe, status, launcher handle and how far its event
stream has been ingested), ``metrics`` / ``samples`` / ``diagnostics`` (one row per (run, step),
payload as JSON). A run's ``arm`` labels its recipe minus its seed (``grpo · eps_high=0.28``), ``seed``
is its ``train.seed`` and ``sweep`` the swept values that make its arm: the runs of one arm in a
group differ only in their seed (see ``arms`` and ``arm_metrics``). Ingest is idempotent by (run, step, kind): rows are keyed by it and the byte
offset of the event stream advances in the same transaction as the rows it covers, so a restarted
or duplicated collector neither loses nor repeats a step.

An event the store cannot use (a line that is not JSON, not a JSON object, a step that is not
an integer, a number SQLite cannot hold or that is not finite, an unknown status, a payload of the
wrong type) is skipped and counted in ``runs.skipped_events``, and named in ``runs.warnings``: one
bad line must not stop the stream behind it.

A store file that cannot be written (read-only file or folder, disk full) raises ``StoreError``
naming the file, before anything else is changed. Reading never writes: opening a file whose
schema is current (``SCHEMA_VERSION`` in ``PRAGMA user_version``) only reads, and on a full disk,
where SQLite cannot create the WAL's shared-memory file a reader needs, a read falls back to an
``immutable`` connection when the WAL holds nothing (then the main file is the whole store). So
``runs list`` keeps working while the disk is full.

Seeds are unique per arm: a partial UNIQUE index on (grp, arm, seed) and ``create_runs``, which
checks the group and inserts every run of a launch in one write transaction, so two launches at
once can never claim the same seed. A file made before the index that already holds such
duplicates stays usable: the index is left out (``RunStore.duplicate_seeds`` names the pairs,
and ``runs list`` warns of them; ``compare`` gives no verdict for their group at all) and created
on the first open after they are gone.

Every call opens its own short-lived connection: Streamlit serves each browser session from its
own thread, and several collectors (app, CLI) may write at once; WAL lets readers run beside one
writer and ``busy_timeout`` queues writers.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pandas as pd
import yaml

from workbench.home import workbench_home
from workbench.runs.ingest import INT64_MAX, INT64_MIN, Event, Ignored, Rejected, check_event, is_int, is_number
from workbench.runs.records import (ACTIVE_STATUSES, RESUMABLE_STATUSES, RUN_FIELDS, STATUSES, TERMINAL_STATUSES, NewRun,
                                    Run, RunError)

__all__ = ["ACTIVE_STATUSES", "INT64_MAX", "INT64_MIN", "RESUMABLE_STATUSES", "STATUSES", "TERMINAL_STATUSES", "NewRun", "Run",
           "RunError", "RunStore", "StoreError"]

STORE_FILE = "runs.db"
PAYLOAD_KINDS = ("metrics", "samples", "diagnostics")  # kinds stored one row per (run, step)
PAYLOAD_TABLES = ("metrics", "samples", "diagnostics", "lens")  # every table keyed by (run, step)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    status TEXT NOT NULL,
    target TEXT NOT NULL,
    launcher TEXT NOT NULL,
    host TEXT NOT NULL,
    created_by TEXT NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    grp TEXT,
    tags TEXT NOT NULL DEFAULT '[]',
    notes TEXT NOT NULL DEFAULT '',
    recipe TEXT NOT NULL,
    run_dir TEXT NOT NULL,
    launch TEXT NOT NULL DEFAULT '{}',
    handle TEXT NOT NULL DEFAULT '{}',
    events_offset INTEGER NOT NULL DEFAULT 0,
    events_inode TEXT,
    last_step INTEGER NOT NULL DEFAULT -1,
    total_steps INTEGER NOT NULL,
    reward REAL,
    error TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    skipped_events INTEGER NOT NULL DEFAULT 0,
    warnings TEXT NOT NULL DEFAULT '[]',
    arm TEXT,
    seed INTEGER,
    sweep TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS runs_status ON runs(status);
CREATE INDEX IF NOT EXISTS runs_grp ON runs(grp);
CREATE TABLE IF NOT EXISTS metrics (run_id TEXT, step INTEGER, time REAL, data TEXT,
    PRIMARY KEY (run_id, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS samples (run_id TEXT, step INTEGER, time REAL, data TEXT,
    PRIMARY KEY (run_id, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS diagnostics (run_id TEXT, step INTEGER, time REAL, data TEXT,
    PRIMARY KEY (run_id, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS lens (run_id TEXT, step INTEGER, time REAL, data TEXT,
    PRIMARY KEY (run_id, step)) WITHOUT ROWID;
"""
_ADDED_COLUMNS = {"skipped_events": "INTEGER NOT NULL DEFAULT 0",  # columns newer than some existing files
                  "warnings": "TEXT NOT NULL DEFAULT '[]'",
                  "arm": "TEXT", "seed": "INTEGER", "sweep": "TEXT NOT NULL DEFAULT '{}'",
                  "events_inode": "TEXT"}
SCHEMA_VERSION = 2  # PRAGMA user_version of a file whose tables, columns and indexes are current
UNIQUE_SEED_INDEX = "runs_grp_arm_seed"
_UNIQUE_SEED_SQL = f"CREATE UNIQUE INDEX IF NOT EXISTS {UNIQUE_SEED_INDEX} ON runs(grp, arm, seed) WHERE grp IS NOT NULL"
_DUPLICATE_SEEDS_SQL = ("SELECT grp, arm, seed, GROUP_CONCAT(id, ' ') AS ids FROM runs WHERE grp IS NOT NULL"
                        " AND seed IS NOT NULL GROUP BY grp, arm, seed HAVING COUNT(*) > 1 ORDER BY grp, arm, seed")
_JSON_COLUMNS = ("tags", "launch", "handle", "warnings", "sweep")
MAX_WARNINGS = 20  # distinct warnings kept per run (a stream of bad lines must not grow the row without bound)
_EMPTY_HANDLE = "{}"
RUN_COLUMNS = ["id", "name", "algorithm", "arm", "seed", "status", "target", "launcher", "host", "created_by",
               "created_at", "started_at", "ended_at", "group", "tags", "notes", "last_step", "total_steps", "reward",
               "error", "run_dir"]
log = logging.getLogger(__name__)
ARM_KEY_COLUMNS = ["run_id", "arm", "seed", "step"]  # the long frame's keys (workbench.analysis.stats.RUN_KEY_COLUMNS)


class StoreError(RunError):
    """The store file cannot be used (read-only, unreadable, disk full, locked too long); names the file."""


def _store_error(path: Path, err: BaseException) -> StoreError:
    """One line naming the file, what SQLite or the OS said, and what to do."""
    reason = str(err) or type(err).__name__
    if "readonly" in reason or isinstance(err, PermissionError):
        return StoreError(f"run store {path} is read-only ({reason}); make the file and its folder writable "
                          "for this user, or set WORKBENCH_HOME to a writable folder")
    return StoreError(f"run store {path} cannot be used: {reason}")


def _status_rank(status: str) -> int:
    """Status only moves forward (queued < starting < running < terminal) and a terminal status is
    final, so replayed events never turn a finished run back into a running one."""
    return {"queued": 0, "starting": 1, "running": 2}.get(status, 3)


class RunStore:
    """All runs of one workbench home (``RunStore(path)`` for another file)."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else workbench_home() / STORE_FILE
        self.immutable_cause: str | None = None
        """Why a read of this instance fell back to an immutable connection (None: none has)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise _store_error(self.path, err) from err
        with self._read() as db:  # a current file is only read: opening must work on a full disk
            version = db.execute("PRAGMA user_version").fetchone()[0]
            indexed = _has_unique_seed_index(db)
            duplicates = not indexed and version >= SCHEMA_VERSION and bool(db.execute(_DUPLICATE_SEEDS_SQL).fetchone())
            self._columns = _columns(db)
        if version < SCHEMA_VERSION or not (indexed or duplicates):
            with self._connect(write=True) as db:
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(_SCHEMA)
                self._columns = _migrate(db)

    # -- connections ---------------------------------------------------------------------------
    @contextmanager
    def _connect(self, uri_query: str = "", *, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection; a failure of the file itself (not of a query's logic) becomes StoreError.
        ``write``: one that will write, with ``synchronous=NORMAL`` (WAL + NORMAL: durable across
        app crashes). A reader sets nothing that touches the file: that pragma loads the schema,
        which opens the WAL index, and on a full disk that fails before ``_read`` can fall back."""
        try:
            if uri_query:
                db = sqlite3.connect(f"{self.path.absolute().as_uri()}?{uri_query}", uri=True, timeout=30,
                                     isolation_level=None)
            else:
                db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        except sqlite3.Error as err:
            raise _store_error(self.path, err) from err
        try:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA busy_timeout=30000")
            if write:
                db.execute("PRAGMA synchronous=NORMAL")
            yield db
        except sqlite3.OperationalError as err:  # read-only, locked past the timeout, disk I/O, disk full
            raise _store_error(self.path, err) from err
        except sqlite3.DatabaseError as err:
            if type(err) is not sqlite3.DatabaseError:  # IntegrityError etc.: the caller's query, not the file
                raise
            raise _store_error(self.path, err) from err  # "file is not a database", "malformed"
        finally:
            db.close()

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A connection for reading only. A WAL reader needs the ``-shm`` file, which SQLite
        creates (32 KiB) when no other connection has it open: on a full disk that fails with a
        disk I/O error. Then, if the ``-wal`` file is absent or empty (every commit is in the main
        file: the last connection checkpointed it), the file is read ``immutable`` (no lock, no
        shared memory); with WAL content the error stands (an immutable read would miss it).
        The fallback is logged once per instance (``immutable_cause``): the app's collector reads
        four times a second."""
        cause = None
        with self._connect() as db:
            try:
                db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()  # opens the WAL index
            except sqlite3.OperationalError as err:
                if not (_disk_full_error(err) and _wal_is_empty(self.path)):
                    raise
                cause = str(err) or type(err).__name__
            else:
                yield db
        if cause is not None:
            if self.immutable_cause is None:
                self.immutable_cause = cause
                log.warning("run store %s cannot open its WAL index (%s; disk full?): reading the file as it is on "
                            "disk (immutable); nothing new is recorded until it can be written", self.path, cause)
            with self._connect("immutable=1") as db:
                yield db

    @property
    def identity(self) -> str:
        """The store file: per-store caches (collectors, alive checks) are keyed by it."""
        return str(self.path)

    def is_open(self) -> bool:
        """False once the home holding the file is gone: a collector of it stops."""
        return self.path.parent.exists()

    def check_writable(self) -> None:
        """StoreError now if the file cannot be written (a no-op UPDATE still needs write access),
        so a command fails before it changes anything rather than half-way."""
        with self._connect(write=True) as db:
            db.execute("UPDATE runs SET id = id WHERE 0")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE takes the write lock up front: no upgrade deadlock)."""
        with self._connect(write=True) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    # -- runs ----------------------------------------------------------------------------------
    def create_run(self, *, run_id: str, name: str, algorithm: str, recipe_yaml: str, total_steps: int,
                   target: str, launcher: str, host: str, created_by: str, run_dir: str, group: str | None = None,
                   tags: Iterable[str] = (), notes: str = "", launch: dict | None = None, arm: str | None = None,
                   sweep: dict[str, Any] | None = None) -> str:
        """Register a queued run (``NewRun``'s fields). ``arm`` defaults to the run's name; its seed
        is read from the recipe (``train.seed``), so the column cannot disagree with what the run
        trains with."""
        self.create_runs([NewRun(run_id=run_id, name=name, algorithm=algorithm, recipe_yaml=recipe_yaml,
                                 total_steps=total_steps, target=target, launcher=launcher, host=host,
                                 created_by=created_by, run_dir=run_dir, group=group, tags=tuple(tags), notes=notes,
                                 launch=dict(launch or {}), arm=arm, sweep=dict(sweep or {}))])
        return run_id

    def create_runs(self, runs: Iterable[NewRun | dict[str, Any]],
                    check: Callable[[dict[str, dict[str, list[Run]]]], None] | None = None) -> list[str]:
        """Register queued runs (each a ``NewRun``, or a dict of ``create_run``'s arguments) all or
        none, in ONE write transaction: ``check(arms)`` sees, for each group of these runs,
        ``arms(group)`` as it is inside that transaction and may raise to refuse; nobody else can
        add a run between the check and the inserts. A seed another run of the same group and arm
        already has is refused (RunError naming the seeds), by the check or by the unique index."""
        runs = [NewRun.of(r) for r in runs]
        groups = sorted({r.group for r in runs if r.group})
        with self._write() as db:
            if check is not None:
                check({g: _arms_of([_record(r) for r in db.execute("SELECT * FROM runs WHERE grp = ?"
                                                                   " ORDER BY created_at, id", (g,))], g)
                       for g in groups})
            now = time.time()  # + i microseconds: creation order is the given order
            for i, r in enumerate(runs):
                arm, seed = r.arm or r.name, recipe_seed(r.recipe_yaml)
                if r.group and seed is not None and db.execute(  # also where an older file lacks the index
                        "SELECT 1 FROM runs WHERE grp = ? AND arm = ? AND seed = ?", (r.group, arm, seed)).fetchone():
                    raise _seed_taken(r.group, arm, seed)
                try:
                    db.execute(
                        "INSERT INTO runs (id, name, algorithm, status, target, launcher, host, created_by, created_at,"
                        " grp, tags, notes, recipe, run_dir, launch, total_steps, arm, seed, sweep)"
                        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (r.run_id, r.name, r.algorithm, "queued", r.target, r.launcher, r.host, r.created_by,
                         now + i * 1e-6, r.group, json.dumps(list(r.tags)), r.notes, r.recipe_yaml, r.run_dir,
                         json.dumps(r.launch), r.total_steps, arm, seed, json.dumps(r.sweep)))
                except sqlite3.IntegrityError as err:
                    if "runs.grp" not in str(err):
                        raise
                    raise _seed_taken(r.group, arm, seed) from None
        return [r.run_id for r in runs]

    def duplicate_seeds(self) -> list[dict[str, Any]]:
        """(group, arm, seed, run ids) wherever runs of one arm share a seed: only in a file made
        before seeds were unique (see ``_migrate``); ``compare`` gives their group no verdict, and
        ``runs list`` names them in a warning line."""
        with self._read() as db:
            return [{"group": r["grp"], "arm": r["arm"], "seed": r["seed"], "ids": r["ids"].split()}
                    for r in db.execute(_DUPLICATE_SEEDS_SQL)]

    def get_run(self, run_id: str) -> Run:
        """The run's row as a ``Run`` (``group``, parsed ``tags`` / ``handle`` / ``launch``)."""
        with self._read() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunError(f"run id={run_id!r} does not exist; `python -m workbench runs list` shows the runs")
        return _record(row)

    def runs(self, statuses: Iterable[str] | None = None) -> list[Run]:
        """Runs, oldest first (optionally only some statuses)."""
        query, args = "SELECT * FROM runs", ()
        if statuses is not None:
            statuses = tuple(statuses)
            query += f" WHERE status IN ({','.join('?' * len(statuses))})"
            args = statuses
        with self._read() as db:
            return [_record(r) for r in db.execute(query + " ORDER BY created_at, id", args)]

    def list_runs(self, status: str | None = None, group: str | None = None, tag: str | None = None) -> pd.DataFrame:
        """Runs, newest first, as a DataFrame with columns ``RUN_COLUMNS``."""
        if status is not None and status not in STATUSES:
            raise RunError(f"status={status!r} is not allowed; one of: {', '.join(STATUSES)}")
        rows = [r for r in self.runs([status] if status else None)
                if (group is None or r.group == group) and (tag is None or tag in r.tags)]
        frame = pd.DataFrame([{c: getattr(r, c) for c in RUN_COLUMNS} for r in rows], columns=RUN_COLUMNS)
        frame = frame.astype({"seed": "Int64"})  # a run of an older file may have no known seed: <NA>, not 0.0
        return frame.iloc[::-1].reset_index(drop=True)

    def groups(self) -> pd.DataFrame:
        with self._read() as db:
            rows = db.execute("SELECT grp AS \"group\", COUNT(*) AS runs, MIN(created_at) AS created_at FROM runs"
                              " WHERE grp IS NOT NULL GROUP BY grp ORDER BY created_at DESC").fetchall()
        return pd.DataFrame([dict(r) for r in rows], columns=["group", "runs", "created_at"])

    def arms(self, group: str) -> dict[str, list[Run]]:
        """arm -> its runs (each with ``seed``) in the group: arms in order of their first
        run, runs by seed then creation. ``{}`` for a group without runs."""
        return _arms_of(self.runs(), group)

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Set columns of a run (JSON columns take Python objects; ``group`` is the ``grp`` column)."""
        fields = {("grp" if k == "group" else k): (json.dumps(v) if k in _JSON_COLUMNS else v) for k, v in fields.items()}
        unknown = sorted(set(fields) - (self._columns - {"id"}))
        if unknown or not fields:
            raise RunError(f"run fields {unknown or '(none)'} cannot be set; columns: {', '.join(sorted(self._columns - {'id'}))}")
        with self._write() as db:
            changed = db.execute(f"UPDATE runs SET {', '.join(f'{k} = ?' for k in fields)} WHERE id = ?",
                                 (*fields.values(), run_id)).rowcount
        if not changed:
            self.get_run(run_id)  # raises the "does not exist" RunError

    # -- the local queue: claims are compare-and-set, so a run starts once however many callers race
    @contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """An exclusive lock shared by every process and thread using this store file (``flock`` on
        ``runs.db.NAME.lock`` beside it; released by the kernel if the holder dies)."""
        path = self.path.with_name(f"{self.path.name}.{name}.lock")
        try:
            f = open(path, "a")
        except OSError as err:
            raise _store_error(path, err) from err
        with f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def claim_queued(self, run_id: str) -> bool:
        """queued -> starting, only if the run is still queued, unstarted and not being cancelled.
        True: this caller won and must start it (and record the handle)."""
        with self._write() as db:
            return db.execute("UPDATE runs SET status = 'starting', started_at = COALESCE(started_at, ?)"
                              " WHERE id = ? AND status = 'queued' AND handle = ? AND cancel_requested = 0",
                              (time.time(), run_id, _EMPTY_HANDLE)).rowcount == 1

    def cancel_queued(self, run_id: str, error: str = "cancelled before it started") -> bool:
        """queued -> cancelled, only if nobody has claimed it yet. True: it never starts."""
        with self._write() as db:
            return db.execute("UPDATE runs SET status = 'cancelled', cancel_requested = 1, error = ?, ended_at = ?"
                              " WHERE id = ? AND status = 'queued' AND handle = ?",
                              (error, time.time(), run_id, _EMPTY_HANDLE)).rowcount == 1

    def rename(self, run_id: str, name: str) -> None:
        from workbench.runs.names import check_run_name

        self.update_run(run_id, name=check_run_name(name))

    def set_tags(self, run_id: str, tags: Iterable[str]) -> None:
        from workbench.runs.names import check_tag

        self.update_run(run_id, tags=sorted({check_tag(t) for t in tags}))

    def set_notes(self, run_id: str, notes: str) -> None:
        self.update_run(run_id, notes=str(notes))

    def delete(self, run_id: str) -> None:
        """Forget a run and its rows (its run directory is removed by the service)."""
        self.get_run(run_id)
        with self._write() as db:
            for table in PAYLOAD_TABLES:
                db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            db.execute("DELETE FROM runs WHERE id = ?", (run_id,))

    def reopen(self, run_id: str, launch: dict[str, Any]) -> None:
        """A failed, cancelled or lost run back to ``queued`` (same id, row, run dir and ingested
        events), to be started again with ``launch``; compare-and-set, so two resumes of one run
        start it once. RunError for a run in any other status."""
        with self._write() as db:
            reopened = db.execute(
                "UPDATE runs SET status = 'queued', handle = ?, launch = ?, cancel_requested = 0, error = NULL,"
                f" ended_at = NULL WHERE id = ? AND status IN ({','.join('?' * len(RESUMABLE_STATUSES))})",
                (_EMPTY_HANDLE, json.dumps(launch), run_id, *RESUMABLE_STATUSES)).rowcount
        if not reopened:
            status = self.get_run(run_id).status  # raises for an unknown id
            raise RunError(f"run {run_id} is {status}; only {', '.join(RESUMABLE_STATUSES)} runs can be resumed")

    def set_status(self, run_id: str, status: str, *, error: str | None = None) -> bool:
        """Move a run's status forward (never backwards; see ``_status_rank``). True if it changed."""
        if status not in STATUSES:
            raise RunError(f"status={status!r} is not allowed; one of: {', '.join(STATUSES)}")
        with self._write() as db:
            return _apply_status(db, run_id, status, error, time.time())

    # -- ingest --------------------------------------------------------------------------------
    def ingest(self, run_id: str, events: list[Any], *, offset: tuple[int, int] | None = None,
               warning: str | None = None, inode: tuple[str | None, str | None] | None = None) -> int:
        """Store events; returns how many rows were new.

        ``offset=(old, new)``: the events are the stream's bytes [old, new). The offset moves only
        if it still equals ``old`` (compare-and-set), so two collectors reading the same bytes
        cannot both apply them (nor count their bad lines or their ``warning`` twice); the loser's
        rows are ignored by the primary keys anyway. ``inode=(old, new)``: the identity of the
        file those bytes were read from (``"dev:ino"``; see ``read_file_events``), part of the same
        compare-and-set. ``warning``: something the reader noticed about the stream (it shrank, it
        was replaced), kept in the run's ``warnings``.
        """
        new, bad = 0, []
        with self._write() as db:
            if offset is not None:
                old_inode, new_inode = inode if inode is not None else (None, None)
                moved = db.execute("UPDATE runs SET events_offset = ?, events_inode = COALESCE(?, events_inode)"
                                   " WHERE id = ? AND events_offset = ? AND (? = 0 OR events_inode IS ?)",
                                   (offset[1], new_inode, run_id, offset[0], int(inode is not None), old_inode)).rowcount
                if not moved:
                    return 0
            for event in events:
                outcome = _ingest_one(db, run_id, event)
                if isinstance(outcome, str):
                    bad.append(outcome)
                else:
                    new += outcome
            if bad:
                db.execute("UPDATE runs SET skipped_events = skipped_events + ? WHERE id = ?", (len(bad), run_id))
                noun = "event was" if len(bad) == 1 else "events were"
                _add_warning(db, run_id, f"{len(bad)} {noun} skipped; first: {bad[0]}")
            if warning:
                _add_warning(db, run_id, warning)
        return new

    # -- queries for plots ---------------------------------------------------------------------
    def metrics(self, run_ids: Iterable[str]) -> pd.DataFrame:
        """One row per (run, step): ``run_id``, ``step``, ``time`` and every logged metric."""
        rows = self._payload_rows("metrics", list(run_ids))
        if not rows:
            return pd.DataFrame(columns=["run_id", "step", "time"])
        # one JSON array decoded at once and the key columns built apart: per-row json.loads and
        # dict merging took ~40% of reading 30 runs x 1,000 steps
        values = pd.DataFrame.from_records(json.loads("[" + ",".join([r["data"] for r in rows]) + "]"))
        keys = pd.DataFrame({"run_id": [r["run_id"] for r in rows],
                             "step": pd.Series([r["step"] for r in rows], dtype="int64"),
                             "time": [r["time"] for r in rows]})
        return pd.concat([keys, values.drop(columns=[c for c in keys.columns if c in values.columns])], axis=1)

    def arm_metrics(self, run_ids: Iterable[str]) -> pd.DataFrame:
        """The long frame of ``workbench.analysis``: one row per (run, step) with ``run_id``, ``arm``,
        ``seed``, ``step``, ``time`` and every logged metric (NaN where a run did not log it)."""
        run_ids = list(run_ids)
        frame = self.metrics(run_ids)
        runs = pd.DataFrame([{"run_id": r.id, "arm": r.arm, "seed": r.seed} for r in map(self.get_run, run_ids)],
                            columns=["run_id", "arm", "seed"])
        frame = runs.merge(frame, on="run_id", how="inner")
        first = [*ARM_KEY_COLUMNS, "time"]
        return frame[first + [c for c in frame.columns if c not in first]].reset_index(drop=True)

    def samples(self, run_id: str, step: int | None = None) -> pd.DataFrame:
        rows = self._payload_rows("samples", [run_id], step)
        records = [{"run_id": r["run_id"], "step": r["step"], **s} for r in rows for s in json.loads(r["data"])]
        columns = ["run_id", "step", "prompt", "completion", "reward", "advantage", "length", "truncated"]
        # then the columns reward functions logged with log_extra (TRL's extra completion columns)
        columns += list(dict.fromkeys(k for record in records for k in record if k not in columns))
        return pd.DataFrame.from_records(records, columns=columns) if records else pd.DataFrame(columns=columns)

    def diagnostic_steps(self, run_id: str) -> list[int]:
        with self._read() as db:
            return [r[0] for r in db.execute("SELECT step FROM diagnostics WHERE run_id = ? ORDER BY step", (run_id,))]

    def diagnostics(self, run_id: str, step: int) -> dict[str, Any]:
        rows = self._payload_rows("diagnostics", [run_id], step)
        if not rows:
            raise RunError(f"run {run_id!r} has no diagnostics at step={step}; steps with diagnostics: "
                           f"{self.diagnostic_steps(run_id)[:20]}")
        return json.loads(rows[0]["data"])

    def lens(self, run_id: str) -> list[dict[str, Any]]:
        """Same-batch lens payloads of a run, by step (see workbench/engine/lens.py)."""
        return [{"step": r["step"], **json.loads(r["data"])} for r in self._payload_rows("lens", [run_id])]

    def _payload_rows(self, table: str, run_ids: list[str], step: int | None = None) -> list[sqlite3.Row]:
        if not run_ids:
            return []
        query = f"SELECT run_id, step, time, data FROM {table} WHERE run_id IN ({','.join('?' * len(run_ids))})"
        args: list[Any] = list(run_ids)
        if step is not None:
            query += " AND step = ?"
            args.append(step)
        with self._read() as db:
            return db.execute(query + " ORDER BY run_id, step", args).fetchall()


def _migrate(db: sqlite3.Connection) -> set[str]:
    """Add columns that files made by older versions lack, and the unique (group, arm, seed)
    index; returns the runs table's columns. Runs made before arms existed get their name as arm
    and their recipe's seed. Where the file already holds two runs with the same group, arm and
    seed (launched at once before the index existed), the index cannot be made: the file stays
    usable, the pairs are logged (``RunStore.duplicate_seeds``) and their group gets no verdict."""
    columns = _columns(db)
    for name, spec in _ADDED_COLUMNS.items():
        if name not in columns:
            try:
                db.execute(f"ALTER TABLE runs ADD COLUMN {name} {spec}")
            except sqlite3.OperationalError as err:  # another process added it meanwhile
                if "duplicate column" not in str(err):
                    raise
            columns.add(name)
    for row in db.execute("SELECT id, name, recipe FROM runs WHERE arm IS NULL").fetchall():  # idempotent
        db.execute("UPDATE runs SET arm = ?, seed = ? WHERE id = ? AND arm IS NULL",
                   (row["name"], recipe_seed(row["recipe"]), row["id"]))
    try:
        db.execute(_UNIQUE_SEED_SQL)
    except sqlite3.IntegrityError:
        pairs = [f"{r['grp']}/{r['arm']}/seed {r['seed']}: {r['ids']}" for r in db.execute(_DUPLICATE_SEEDS_SQL)]
        log.warning("run store: runs share a group, arm and seed, so seeds are not unique per arm there "
                    "(`compare` gives no verdict for such a group until all but one run of each seed are deleted): %s",
                    "; ".join(pairs[:10]))
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return columns


def _columns(db: sqlite3.Connection) -> set[str]:
    return {row["name"] for row in db.execute("PRAGMA table_info(runs)")}


def _has_unique_seed_index(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (UNIQUE_SEED_INDEX,)).fetchone() is not None


def _disk_full_error(err: sqlite3.Error) -> bool:
    """SQLite's "disk I/O error" (the ``-shm`` file cannot be grown) or "database or disk is full"."""
    name = getattr(err, "sqlite_errorname", "") or ""
    return name.startswith("SQLITE_IOERR") or name == "SQLITE_FULL" or "disk" in str(err)


def _wal_is_empty(path: Path) -> bool:
    """No ``-wal`` file, or an empty one: the main file holds every commit."""
    try:
        return path.with_name(path.name + "-wal").stat().st_size == 0
    except FileNotFoundError:
        return True
    except OSError:
        return False


def recipe_seed(recipe_yaml: str) -> int | None:
    """``train.seed`` of a stored recipe (0, the Recipe default, where the YAML does not set it);
    None for text that is not a recipe mapping. Read with PyYAML: listing runs must not validate."""
    try:
        data = yaml.safe_load(recipe_yaml)
    except yaml.YAMLError:
        return None
    train = data.get("train") if isinstance(data, dict) else None
    seed = (train or {}).get("seed", 0) if isinstance(train, (dict, type(None))) else None
    return seed if is_int(seed) else None


def _seed_taken(group: str, arm: str, seed: int) -> RunError:
    return RunError(f"group {group!r} already has arm {arm!r} with seed {seed}: a run with the same seed is a copy, "
                    "not a replicate; nothing was launched")


def _arms_of(runs: list[Run], group: str) -> dict[str, list[Run]]:
    """``RunStore.arms`` of runs (oldest first)."""
    by_arm: dict[str, list[Run]] = {}
    for run in runs:
        if run.group == group:
            by_arm.setdefault(run.arm, []).append(run)
    return {arm: sorted(runs, key=lambda r: (r.seed is None, r.seed or 0, r.created_at)) for arm, runs in by_arm.items()}


_COLUMN_OF = {"group": "grp"}  # Run field -> runs column, where they differ


def _record(row: sqlite3.Row) -> Run:
    """A ``runs`` row as a Run (JSON columns parsed; ``grp`` is ``group``)."""
    columns = set(row.keys())
    values = {}
    for name in RUN_FIELDS:
        column = _COLUMN_OF.get(name, name)
        if column not in columns:  # a column an older file lacks (only while it cannot be migrated)
            continue
        value = row[column]
        values[name] = json.loads(value) if column in _JSON_COLUMNS else value
    values["cancel_requested"] = bool(values.get("cancel_requested"))
    return Run(**values)


def _add_warning(db: sqlite3.Connection, run_id: str, message: str) -> None:
    """Append ``message`` to the run's warnings (kept once, at most ``MAX_WARNINGS``)."""
    row = db.execute("SELECT warnings FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        return
    warnings = json.loads(row["warnings"])
    if message not in warnings and len(warnings) < MAX_WARNINGS:
        db.execute("UPDATE runs SET warnings = ? WHERE id = ?", (json.dumps(warnings + [message]), run_id))


def _apply_status(db: sqlite3.Connection, run_id: str, status: str, error: str | None, when: float) -> bool:
    row = db.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        return False
    current = row["status"]
    if _status_rank(status) < _status_rank(current) or current in TERMINAL_STATUSES:
        return False
    ended = when if status in TERMINAL_STATUSES else None
    started = when if status == "starting" else None
    db.execute("UPDATE runs SET status = ?, error = COALESCE(?, error), ended_at = COALESCE(?, ended_at),"
               " started_at = COALESCE(started_at, ?) WHERE id = ?", (status, error, ended, started, run_id))
    return current != status


# -- ingest: each event is checked by workbench.runs.ingest, then written by the writer of its kind --------
def _insert_payload(db: sqlite3.Connection, table: str, run_id: str, step: int, when: float, data: Any) -> int:
    return db.execute(f"INSERT OR IGNORE INTO {table} VALUES (?,?,?,?)", (run_id, step, when, json.dumps(data))).rowcount


def _write_status(db: sqlite3.Connection, run_id: str, event: Event) -> int:
    return int(_apply_status(db, run_id, event.payload["status"], event.payload["error"], event.time))


def _write_error(db: sqlite3.Connection, run_id: str, event: Event) -> int:
    db.execute("UPDATE runs SET error = ? WHERE id = ?", (event.payload["error"], run_id))
    return 0


def _write_metrics(db: sqlite3.Connection, run_id: str, event: Event) -> int:
    data = event.payload["metrics"]
    added = _insert_payload(db, "metrics", run_id, event.step, event.time, data)
    if added:
        reward = data.get("reward") if is_number(data.get("reward")) else None
        db.execute("UPDATE runs SET last_step = MAX(last_step, ?), reward = CASE WHEN ? >= last_step THEN ? ELSE reward END"
                   " WHERE id = ?", (event.step, event.step, reward, run_id))
    return added


def _write_resume(db: sqlite3.Connection, run_id: str, event: Event) -> int:
    """A resumed attempt restarts at ``step``: the rows of that step and later came from the attempt
    before it (which died past its checkpoint) and are dropped, so the resumed attempt's rows are
    the only ones (``INSERT OR IGNORE`` would keep the old values). ``last_step`` and ``reward``
    go back to the last kept step. In a replay of the stream from the start, the attempt before
    may already have left a final status; the resume makes the run active again."""
    for table in PAYLOAD_TABLES:
        db.execute(f"DELETE FROM {table} WHERE run_id = ? AND step >= ?", (run_id, event.step))
    last = db.execute("SELECT step, data FROM metrics WHERE run_id = ? ORDER BY step DESC LIMIT 1", (run_id,)).fetchone()
    reward = json.loads(last["data"]).get("reward") if last is not None else None
    db.execute("UPDATE runs SET last_step = ?, reward = ? WHERE id = ?",
               (last["step"] if last is not None else -1, reward if is_number(reward) else None, run_id))
    db.execute("UPDATE runs SET status = 'running', ended_at = NULL, error = NULL WHERE id = ? AND status IN"
               f" ({','.join('?' * len(TERMINAL_STATUSES))})", (run_id, *TERMINAL_STATUSES))
    for warning in event.payload["warnings"]:  # e.g. a damaged checkpoint the resume skipped
        _add_warning(db, run_id, warning)
    return 1


def _payload_writer(table: str, key: str | None = None) -> Callable[[sqlite3.Connection, str, Event], int]:
    """A writer of one (run, step) row of ``table``: the payload's ``key`` (None: all of it)."""
    return lambda db, run_id, event: _insert_payload(db, table, run_id, event.step, event.time,
                                                     event.payload if key is None else event.payload[key])


WRITERS: dict[str, Callable[[sqlite3.Connection, str, Event], int]] = {
    "resume": _write_resume,
    "status": _write_status,
    "error": _write_error,
    "metrics": _write_metrics,
    "samples": _payload_writer("samples", "samples"),
    "diagnostics": _payload_writer("diagnostics"),
    "lens": _payload_writer("lens"),
}


def _ingest_one(db: sqlite3.Connection, run_id: str, raw: Any) -> int | str:
    """Check and apply one event: 1 if it added a row or changed the status, 0 if not (a replay,
    a kind of a newer engine), or the reason it was refused (nothing written)."""
    checked = check_event(raw, time.time())
    if isinstance(checked, Rejected):
        return checked.reason
    if isinstance(checked, Ignored):
        return 0
    return WRITERS[checked.kind](db, run_id, checked)
