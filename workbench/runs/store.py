"""The run store: SQLAlchemy Core over a SQLite file (WAL) under the workbench home, or over a
PostgreSQL database a team shares (``WORKBENCH_DB=postgresql://...``). One implementation for
both: what the backends spell differently is in ``workbench.runs.database``, the tables in
``workbench.runs.schema``, the migrations in ``workbench.runs.migrations`` (Alembic, run on open).

Tables: ``runs`` (one row per run, with its recipe, status, launcher handle and how far its event
stream has been ingested), ``metrics`` / ``samples`` / ``diagnostics`` / ``lens`` (one row per
(run, step), payload as JSON), ``audit`` (who did what, when, from where). A run's ``arm`` labels
its recipe minus its seed (``grpo · eps_high=0.28``), ``seed`` is its ``train.seed`` and ``sweep``
the swept values that make its arm: the runs of one arm in a group differ only in their seed (see
``arms`` and ``arm_metrics``). Ingest is idempotent by (run, step, kind): rows are keyed by it and
the byte offset of the event stream advances in the same transaction as the rows it covers
(compare-and-set on the offset), so a restarted or duplicated collector neither loses nor repeats
a step, on either backend.

An event the store cannot use (a line that is not JSON, not a JSON object, a step that is not
an integer, a number the store cannot hold or that is not finite, an unknown status, a payload of
the wrong type) is skipped and counted in ``runs.skipped_events``, and named in ``runs.warnings``:
one bad line must not stop the stream behind it.

A store that cannot be written (read-only file or folder, disk full, a server that is down or
refuses) raises ``StoreError`` naming the file or the URL (never its password), before anything
else is changed. Reading never writes: opening a store whose schema is current (Alembic's ``HEAD``)
only reads, and on a full disk, where SQLite cannot create the WAL's shared-memory file a reader
needs, a read falls back to an ``immutable`` connection when the WAL holds nothing (then the main
file is the whole store). So ``runs list`` keeps working while the disk is full.

Seeds are unique per arm: a partial UNIQUE index on (grp, arm, seed) and ``create_runs``, which
checks the group and inserts every run of a launch in one write transaction that no other
``create_runs`` interleaves with (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: an advisory lock), so
two launches at once can never claim the same seed. A file made before the index that already
holds such duplicates stays usable: the index is left out (``RunStore.duplicate_seeds`` names the
pairs, and ``runs list`` warns of them; ``compare`` gives no verdict for their group at all) and
created on the first open after they are gone.

SQLite: every call opens its own short-lived connection (Streamlit serves each browser session from
its own thread, and several collectors may write at once); WAL lets readers run beside one writer
and a 30 s busy timeout queues writers. PostgreSQL: a pool per process, READ COMMITTED; every
compare-and-set is one UPDATE whose WHERE is re-checked on the row after a concurrent writer commits.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import orjson
import pandas as pd
import sqlalchemy as sa
import yaml
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Row

from workbench.runs import migrate
from workbench.runs.database import (DB_ENV, STORE_FILE, WRITE, StoreError, display_url, engine_for, insert_ignoring_duplicates,
                                     serialize_writers, session_lock, sqlite_path, store_url)
from workbench.runs.ingest import INT64_MAX, INT64_MIN, Event, Ignored, Rejected, check_event, is_int, is_number
from workbench.runs.records import (ACTIVE_STATUSES, AUDIT_ACTIONS, MAX_AUDIT_DETAIL, RESUMABLE_STATUSES, RUN_FIELDS,
                                    STATUSES, TERMINAL_STATUSES, AuditEntry, NewRun, Run, RunError)
from workbench.runs.schema import UNIQUE_SEED_INDEX, api_tokens, audit, payloads, runs as runs_table

__all__ = ["ACTIVE_STATUSES", "INT64_MAX", "INT64_MIN", "RESUMABLE_STATUSES", "STATUSES", "TERMINAL_STATUSES", "NewRun", "Run",
           "RunError", "RunStore", "StoreError", "default_store"]

PAYLOAD_KINDS = ("metrics", "samples", "diagnostics")  # kinds stored one row per (run, step)
MIGRATION_LOCK = "migrate"  # serialises schema changes on open
CREATE_LOCK = "create_runs"  # serialises check-and-insert of new runs (PostgreSQL; SQLite's BEGIN IMMEDIATE does it)
_JSON_COLUMNS = ("tags", "launch", "handle", "warnings", "sweep")
MAX_WARNINGS = 20  # distinct warnings kept per run (a stream of bad lines must not grow the row without bound)
MAX_AUDIT_ENTRIES = 100_000  # most entries one audit_entries call returns
_EMPTY_HANDLE = "{}"
RUN_COLUMNS = ["id", "name", "algorithm", "arm", "seed", "status", "target", "launcher", "host", "created_by",
               "created_at", "started_at", "ended_at", "group", "tags", "notes", "last_step", "total_steps", "reward",
               "error", "run_dir"]
log = logging.getLogger(__name__)
MAX_OR_TERMS = 200  # run conditions per query of metrics_after (SQLite's expression depth is 1,000)
ARM_KEY_COLUMNS = ["run_id", "arm", "seed", "step"]  # the long frame's keys (workbench.analysis.stats.RUN_KEY_COLUMNS)
R = runs_table.c


def _store_error(where: str, err: BaseException) -> StoreError:
    """One line naming the file or URL, what the database or the OS said, and what to do."""
    reason = " ".join((str(getattr(err, "orig", None) or err) or type(err).__name__).split())
    if "readonly" in reason or "read-only" in reason or isinstance(err, PermissionError):
        return StoreError(f"run store {where} is read-only ({reason}); make the file and its folder writable "
                          "for this user, or set WORKBENCH_HOME to a writable folder")
    return StoreError(f"run store {where} cannot be used: {reason}")


def _is_store_failure(err: sa_exc.DBAPIError) -> bool:
    """Whether a database error is the store's (file, server, permissions), not a query's logic
    (an IntegrityError is the caller's: a seed already taken)."""
    if isinstance(err, (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.InternalError)):
        return True
    if isinstance(err, sa_exc.ProgrammingError):  # PostgreSQL: permission denied (SQLSTATE 42501)
        return getattr(err.orig, "sqlstate", None) == "42501"
    # SQLite's plain DatabaseError: "file is not a database", "malformed"
    return type(err) is sa_exc.DatabaseError


def _status_rank(status: str) -> int:
    """Status only moves forward (queued < starting < running < terminal) and a terminal status is
    final, so replayed events never turn a finished run back into a running one."""
    return {"queued": 0, "starting": 1, "running": 2}.get(status, 3)


def default_store(home: Path | None = None) -> RunStore:
    """The store everything uses unless told otherwise: ``WORKBENCH_DB`` when set, else the SQLite
    file of ``home`` (default: the workbench home), i.e. ``RunStore()`` for that home."""
    if home is None or os.environ.get(DB_ENV, "").strip():
        return RunStore()
    return RunStore(Path(home) / STORE_FILE)


class RunStore:
    """All runs of one store: ``RunStore()`` is the default (``WORKBENCH_DB``, else ``runs.db``
    under the workbench home); ``RunStore(path)`` another SQLite file; ``RunStore(url)`` a database
    by SQLAlchemy URL (``postgresql://USER@HOST/DB`` or ``sqlite:///PATH``)."""

    def __init__(self, location: Path | str | None = None) -> None:
        self.url = store_url(location)
        self.path: Path | None = sqlite_path(self.url)
        """The SQLite file (None for a server database)."""
        self.immutable_cause: str | None = None
        """Why a read of this instance fell back to an immutable connection (None: none has)."""
        self._where = str(self.path) if self.path is not None else display_url(self.url)
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise _store_error(self._where, err) from err
        with self._read() as conn:  # a current store is only read: opening must work on a full disk
            needs_migration = self._needs_migration(conn)
        if needs_migration:
            self._migrate()

    # -- schema --------------------------------------------------------------------------------
    def _needs_migration(self, conn: Connection) -> bool:
        """Behind the newest revision, or lacking the unique seed index where it can now be made."""
        if migrate.current_revision(conn) != migrate.HEAD:
            return True
        return not (_has_unique_seed_index(conn) or _has_duplicate_seeds(conn))

    def _migrate(self) -> None:
        """Alembic to HEAD, then the seed index where an older file's duplicates have gone: one
        write transaction under the migration lock (two processes opening at once: the second
        finds nothing left to do)."""
        if self.path is not None:
            with self._session() as conn:  # a new file becomes WAL (outside any transaction; it persists)
                try:
                    conn.connection.driver_connection.execute("PRAGMA journal_mode=WAL").fetchall()
                except sqlite3.Error as err:
                    raise _store_error(self._where, err) from err
        with self._write() as conn:
            serialize_writers(conn, MIGRATION_LOCK)
            if migrate.current_revision(conn) != migrate.HEAD:
                migrate.upgrade(conn)
            if not _has_unique_seed_index(conn) and not _has_duplicate_seeds(conn):
                _unique_seed_index().create(conn)

    # -- connections ---------------------------------------------------------------------------
    @contextmanager
    def _session(self, *, write: bool = False, immutable: bool = False) -> Iterator[Connection]:
        """A connection; a failure of the store itself (not of a query's logic) becomes StoreError.
        ``write``: its transaction will write (SQLite: ``BEGIN IMMEDIATE``, ``synchronous=NORMAL``)."""
        try:
            with engine_for(self.url, immutable=immutable).connect() as conn:
                if write:
                    conn.execution_options(**{WRITE: True})
                yield conn
        except sa_exc.DBAPIError as err:
            if not _is_store_failure(err):
                raise
            raise _store_error(self._where, err) from err

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        """A connection for reading only. A SQLite WAL reader needs the ``-shm`` file, which SQLite
        creates (32 KiB) when no other connection has it open: on a full disk that fails with a
        disk I/O error. Then, if the ``-wal`` file is absent or empty (every commit is in the main
        file: the last connection checkpointed it), the file is read ``immutable`` (no lock, no
        shared memory); with WAL content the error stands (an immutable read would miss it).
        The fallback is logged once per instance (``immutable_cause``): the app's collector reads
        four times a second."""
        if self.path is None:
            with self._session() as conn:
                yield conn
            return
        cause = None
        with self._session() as conn:
            try:
                conn.exec_driver_sql("SELECT 1 FROM sqlite_master LIMIT 1").all()  # opens the WAL index
            except sa_exc.OperationalError as err:
                if not (_disk_full_error(err.orig) and _wal_is_empty(self.path)):
                    raise
                cause = " ".join(str(err.orig).split()) or type(err.orig).__name__
            else:
                yield conn
        if cause is not None:
            if self.immutable_cause is None:
                self.immutable_cause = cause
                log.warning("run store %s cannot open its WAL index (%s; disk full?): reading the file as it is on "
                            "disk (immutable); nothing new is recorded until it can be written", self.path, cause)
            with self._session(immutable=True) as conn:
                yield conn

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """One write transaction: committed if the block ends normally, rolled back otherwise."""
        with self._session(write=True) as conn:
            with conn.begin():
                yield conn

    @property
    def identity(self) -> str:
        """The store file or URL (no password): per-store caches (collectors, alive checks) are keyed by it."""
        return self._where

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.url.get_backend_name()

    def is_open(self) -> bool:
        """False once the home holding the SQLite file is gone (a collector of it stops); a server
        database is always open (a pass that cannot reach it fails and is retried)."""
        return self.path is None or self.path.parent.exists()

    def check_writable(self) -> None:
        """StoreError now if the store cannot be written (a no-op UPDATE still needs write access),
        so a command fails before it changes anything rather than half-way."""
        with self._write() as conn:
            conn.execute(sa.update(runs_table).where(sa.false()).values(id=R.id))

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
        with self._write() as conn:
            serialize_writers(conn, CREATE_LOCK)
            if check is not None:
                check({g: _arms_of([_record(r) for r in conn.execute(sa.select(runs_table).where(R.grp == g)
                                                                     .order_by(R.created_at, R.id))], g)
                       for g in groups})
            now = time.time()  # + i microseconds: creation order is the given order
            for i, r in enumerate(runs):
                arm, seed = r.arm or r.name, recipe_seed(r.recipe_yaml)
                if r.group and seed is not None and conn.execute(  # also where an older file lacks the index
                        sa.select(R.id).where(R.grp == r.group, R.arm == arm, R.seed == seed)).first():
                    raise _seed_taken(r.group, arm, seed)
                try:
                    conn.execute(sa.insert(runs_table).values(
                        id=r.run_id, name=r.name, algorithm=r.algorithm, status="queued", target=r.target,
                        launcher=r.launcher, host=r.host, created_by=r.created_by, created_at=now + i * 1e-6,
                        grp=r.group, tags=json.dumps(list(r.tags)), notes=r.notes, recipe=r.recipe_yaml,
                        run_dir=r.run_dir, launch=json.dumps(r.launch), total_steps=r.total_steps, arm=arm,
                        seed=seed, sweep=json.dumps(r.sweep)))
                except sa_exc.IntegrityError as err:
                    if not _is_seed_conflict(err):
                        raise
                    raise _seed_taken(r.group, arm, seed) from None
        return [r.run_id for r in runs]

    def duplicate_seeds(self) -> list[dict[str, Any]]:
        """(group, arm, seed, run ids) wherever runs of one arm share a seed: only in a file made
        before seeds were unique (see migration 0001); ``compare`` gives their group no verdict, and
        ``runs list`` names them in a warning line."""
        with self._read() as conn:
            rows = conn.execute(sa.select(R.grp, R.arm, R.seed, R.id).where(R.grp.is_not(None), R.seed.is_not(None))
                                .order_by(R.grp, R.arm, R.seed, R.created_at, R.id)).all()
        by_key: dict[tuple, list[str]] = {}
        for row in rows:
            by_key.setdefault((row.grp, row.arm, row.seed), []).append(row.id)
        return [{"group": g, "arm": a, "seed": s, "ids": ids} for (g, a, s), ids in by_key.items() if len(ids) > 1]

    def get_run(self, run_id: str) -> Run:
        """The run's row as a ``Run`` (``group``, parsed ``tags`` / ``handle`` / ``launch``)."""
        with self._read() as conn:
            row = conn.execute(sa.select(runs_table).where(R.id == run_id)).first()
        if row is None:
            raise RunError(f"run id={run_id!r} does not exist; `python -m workbench runs list` shows the runs")
        return _record(row)

    def runs(self, statuses: Iterable[str] | None = None) -> list[Run]:
        """Runs, oldest first (optionally only some statuses)."""
        query = sa.select(runs_table).order_by(R.created_at, R.id)
        if statuses is not None:
            query = query.where(R.status.in_(tuple(statuses)))
        with self._read() as conn:
            return [_record(r) for r in conn.execute(query)]

    def list_runs(self, status: str | None = None, group: str | None = None, tag: str | None = None) -> pd.DataFrame:
        """Runs, newest first, as a DataFrame with columns ``RUN_COLUMNS``."""
        if status is not None and status not in STATUSES:
            raise RunError(f"status={status!r} is not allowed; one of: {', '.join(STATUSES)}")
        rows = [r for r in self.runs([status] if status else None)
                if (group is None or r.group == group) and (tag is None or tag in r.tags)]
        return runs_frame(rows[::-1])

    def groups(self) -> pd.DataFrame:
        created = sa.func.min(R.created_at).label("created_at")
        query = (sa.select(R.grp.label("group"), sa.func.count().label("runs"), created).where(R.grp.is_not(None))
                 .group_by(R.grp).order_by(created.desc()))
        with self._read() as conn:
            rows = conn.execute(query).all()
        return pd.DataFrame([dict(r._mapping) for r in rows], columns=["group", "runs", "created_at"])

    def arms(self, group: str) -> dict[str, list[Run]]:
        """arm -> its runs (each with ``seed``) in the group: arms in order of their first
        run, runs by seed then creation. ``{}`` for a group without runs."""
        return _arms_of(self.runs(), group)

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Set columns of a run (JSON columns take Python objects; ``group`` is the ``grp`` column)."""
        settable = sorted(set(R.keys()) - {"id"})
        columns = {("grp" if k == "group" else k): v for k, v in fields.items()}
        unknown = sorted(set(columns) - set(settable))
        if unknown or not columns:
            raise RunError(f"run fields {unknown or '(none)'} cannot be set; columns: {', '.join(settable)}")
        values = {k: _column_value(k, v) for k, v in columns.items()}
        with self._write() as conn:
            changed = conn.execute(sa.update(runs_table).where(R.id == run_id).values(**values)).rowcount
        if not changed:
            self.get_run(run_id)  # raises the "does not exist" RunError

    # -- the local queue: claims are compare-and-set, so a run starts once however many callers race
    @contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """An exclusive lock shared by every process and thread using this store (``flock`` on
        ``runs.db.NAME.lock`` beside a SQLite file; a PostgreSQL advisory lock); released by the
        kernel or the server if the holder dies."""
        try:
            with session_lock(self.url, name):
                yield
        except sa_exc.DBAPIError as err:
            if not _is_store_failure(err):
                raise
            raise _store_error(self._where, err) from err

    def claim_queued(self, run_id: str) -> bool:
        """queued -> starting, only if the run is still queued, unstarted and not being cancelled.
        True: this caller won and must start it (and record the handle)."""
        with self._write() as conn:
            return conn.execute(
                sa.update(runs_table)
                .where(R.id == run_id, R.status == "queued", R.handle == _EMPTY_HANDLE, R.cancel_requested == 0)
                .values(status="starting", started_at=sa.func.coalesce(R.started_at, time.time()))).rowcount == 1

    def cancel_queued(self, run_id: str, error: str = "cancelled before it started") -> bool:
        """queued -> cancelled, only if nobody has claimed it yet. True: it never starts."""
        with self._write() as conn:
            return conn.execute(
                sa.update(runs_table).where(R.id == run_id, R.status == "queued", R.handle == _EMPTY_HANDLE)
                .values(status="cancelled", cancel_requested=1, error=error, ended_at=time.time())).rowcount == 1

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
        with self._write() as conn:
            for table in payloads.values():
                conn.execute(sa.delete(table).where(table.c.run_id == run_id))
            conn.execute(sa.delete(runs_table).where(R.id == run_id))

    def reopen(self, run_id: str, launch: dict[str, Any]) -> None:
        """A failed, cancelled or lost run back to ``queued`` (same id, row, run dir and ingested
        events), to be started again with ``launch``; compare-and-set, so two resumes of one run
        start it once. RunError for a run in any other status."""
        with self._write() as conn:
            reopened = conn.execute(
                sa.update(runs_table).where(R.id == run_id, R.status.in_(RESUMABLE_STATUSES))
                .values(status="queued", handle=_EMPTY_HANDLE, launch=json.dumps(launch), cancel_requested=0,
                        error=None, ended_at=None)).rowcount
        if not reopened:
            status = self.get_run(run_id).status  # raises for an unknown id
            raise RunError(f"run {run_id} is {status}; only {', '.join(RESUMABLE_STATUSES)} runs can be resumed")

    def set_status(self, run_id: str, status: str, *, error: str | None = None) -> bool:
        """Move a run's status forward (never backwards; see ``_status_rank``). True if it changed."""
        if status not in STATUSES:
            raise RunError(f"status={status!r} is not allowed; one of: {', '.join(STATUSES)}")
        with self._write() as conn:
            return _apply_status(conn, run_id, status, error, time.time())

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
        with self._write() as conn:
            if offset is not None:
                where = [R.id == run_id, R.events_offset == offset[0]]
                values: dict[str, Any] = {"events_offset": offset[1]}
                if inode is not None:
                    where.append(R.events_inode.is_not_distinct_from(inode[0]))
                    if inode[1] is not None:
                        values["events_inode"] = inode[1]
                if not conn.execute(sa.update(runs_table).where(*where).values(**values)).rowcount:
                    return 0
            for event in events:
                outcome = _ingest_one(conn, run_id, event)
                if isinstance(outcome, str):
                    bad.append(outcome)
                else:
                    new += outcome
            if bad:
                conn.execute(sa.update(runs_table).where(R.id == run_id)
                             .values(skipped_events=R.skipped_events + len(bad)))
                noun = "event was" if len(bad) == 1 else "events were"
                _add_warning(conn, run_id, f"{len(bad)} {noun} skipped; first: {bad[0]}")
            if warning:
                _add_warning(conn, run_id, warning)
        return new

    # -- API tokens (workbench.runs.tokens; only a SHA-256 of each secret is stored) ---------------
    def add_token(self, record: "TokenRecord") -> None:
        """Insert one token row (the caller made the id and the hash; the secret never comes here)."""
        with self._write() as conn:
            conn.execute(sa.insert(api_tokens).values(**dataclasses.asdict(record)))

    def tokens(self) -> list["TokenRecord"]:
        """Every token, newest first (hashes included; callers never show them)."""
        from workbench.runs.tokens import TokenRecord
        with self._read() as conn:
            rows = conn.execute(sa.select(api_tokens).order_by(api_tokens.c.created_at.desc())).mappings()
            return [TokenRecord(**row) for row in rows]

    def token_by_hash(self, secret_sha256: str) -> "TokenRecord | None":
        """The token whose secret hashes to ``secret_sha256``, or None."""
        from workbench.runs.tokens import TokenRecord
        with self._read() as conn:
            row = conn.execute(sa.select(api_tokens).where(api_tokens.c.secret_sha256 == secret_sha256)).mappings().first()
        return None if row is None else TokenRecord(**row)

    def set_token_time(self, token_id: str, column: str, at: float) -> bool:
        """Set ``last_used_at`` or ``revoked_at`` (revoking only an unrevoked token); True when a row changed."""
        if column not in ("last_used_at", "revoked_at"):
            raise ValueError(f"column={column!r} is not allowed; one of: last_used_at, revoked_at")
        query = sa.update(api_tokens).where(api_tokens.c.id == token_id).values({column: float(at)})
        if column == "revoked_at":
            query = query.where(api_tokens.c.revoked_at.is_(None))
        with self._write() as conn:
            return conn.execute(query).rowcount == 1

    # -- the audit log -------------------------------------------------------------------------
    def record_audit(self, entry: AuditEntry) -> None:
        """Append one entry (its action one of ``AUDIT_ACTIONS``; ``detail`` one line, cut at
        ``MAX_AUDIT_DETAIL`` characters)."""
        insert = audit_entry_insert(entry)
        with self._write() as conn:
            conn.execute(insert)

    def audit_entries(self, *, limit: int = 1000, since: float | None = None, actor: str | None = None,
                      action: str | None = None) -> list[AuditEntry]:
        """The audit log, newest first: at most ``limit`` entries, optionally only those at or
        after ``since`` (unix time), by ``actor`` or of ``action``."""
        if not is_int(limit) or not 1 <= limit <= MAX_AUDIT_ENTRIES:
            raise RunError(f"limit={limit!r} is not allowed; a whole number from 1 to {MAX_AUDIT_ENTRIES}")
        if action is not None and action not in AUDIT_ACTIONS:
            raise RunError(f"action={action!r} is not allowed; one of: {', '.join(AUDIT_ACTIONS)}")
        query = sa.select(audit).order_by(audit.c.at.desc(), audit.c.id.desc()).limit(limit)
        if since is not None:
            if not is_number(since):
                raise RunError(f"since={since!r} is not allowed; a unix time in seconds")
            query = query.where(audit.c.at >= float(since))
        if actor is not None:
            query = query.where(audit.c.actor == actor)
        if action is not None:
            query = query.where(audit.c.action == action)
        with self._read() as conn:
            rows = conn.execute(query).all()
        return [AuditEntry(at=r.at, actor=r.actor, role=r.role, auth=r.auth, action=r.action, target=r.target,
                           detail=r.detail, address=r.address) for r in rows]

    # -- queries for plots ---------------------------------------------------------------------
    def metrics(self, run_ids: Iterable[str]) -> pd.DataFrame:
        """One row per (run, step): ``run_id``, ``step``, ``time`` and every logged metric."""
        return _metrics_frame(self._payload_rows("metrics", list(run_ids)))

    def metrics_after(self, after: Mapping[str, int]) -> pd.DataFrame:
        """``metrics`` of the runs in ``after`` (run id -> step), each at steps past its step only."""
        table = payloads["metrics"]
        items = sorted(after.items())
        rows: list[Row] = []
        with self._read() as conn:  # batches: SQLite refuses an OR of ~1,000 terms (expression depth)
            for start in range(0, len(items), MAX_OR_TERMS):  # runs in id order: the batches' rows follow each other
                rows += conn.execute(sa.select(table.c.run_id, table.c.step, table.c.time, table.c.data)
                                     .where(_past_steps(table, items[start:start + MAX_OR_TERMS]))
                                     .order_by(table.c.run_id, table.c.step)).all()
        return _metrics_frame(rows)

    def metrics_generations(self, run_ids: Iterable[str]) -> dict[str, int]:
        """run id -> its ``metrics_generation`` (bumped whenever its metric rows change other than
        by a row past its last step), for the runs of ``run_ids`` that exist."""
        run_ids = list(run_ids)
        if not run_ids:
            return {}
        with self._read() as conn:
            return dict(conn.execute(sa.select(R.id, R.metrics_generation).where(R.id.in_(run_ids))).all())

    def arm_metrics(self, run_ids: Iterable[str]) -> pd.DataFrame:
        """The long frame of ``workbench.analysis``: one row per (run, step) with ``run_id``, ``arm``,
        ``seed``, ``step``, ``time`` and every logged metric (NaN where a run did not log it)."""
        run_ids = list(run_ids)
        return arm_frame(self.run_arms(run_ids), self.metrics(run_ids))

    def run_arms(self, run_ids: Iterable[str]) -> pd.DataFrame:
        """``run_id``, ``arm``, ``seed`` of ``run_ids`` in their order, read in one query (a
        ``get_run`` per run cost ~3 ms each: 30 runs took 0.1 s of every arms-view render).
        RunError naming the first id that does not exist."""
        run_ids = list(run_ids)
        with self._read() as conn:
            found = {r.id: (r.arm, r.seed) for r in conn.execute(sa.select(R.id, R.arm, R.seed).where(R.id.in_(run_ids)))}
        if missing := [i for i in run_ids if i not in found]:
            raise RunError(f"run id={missing[0]!r} does not exist; `python -m workbench runs list` shows the runs")
        return pd.DataFrame([(i, *found[i]) for i in run_ids], columns=["run_id", "arm", "seed"])

    def runs_by_id(self, run_ids: Iterable[str]) -> list[Run]:
        """``get_run`` of each of ``run_ids``, in their order, in one query (RunError for an id that
        does not exist)."""
        run_ids = list(run_ids)
        with self._read() as conn:
            found = {r.id: _record(r) for r in conn.execute(sa.select(runs_table).where(R.id.in_(run_ids)))}
        if missing := [i for i in run_ids if i not in found]:
            raise RunError(f"run id={missing[0]!r} does not exist; `python -m workbench runs list` shows the runs")
        return [found[i] for i in run_ids]

    def samples(self, run_id: str, step: int | None = None) -> pd.DataFrame:
        rows = self._payload_rows("samples", [run_id], step)
        records = [{"run_id": r.run_id, "step": r.step, **s} for r in rows for s in json.loads(r.data)]
        columns = ["run_id", "step", "prompt", "completion", "reward", "advantage", "length", "truncated"]
        # then the columns reward functions logged with log_extra (TRL's extra completion columns)
        columns += list(dict.fromkeys(k for record in records for k in record if k not in columns))
        return pd.DataFrame.from_records(records, columns=columns) if records else pd.DataFrame(columns=columns)

    def _payload_steps(self, kind: str, run_id: str) -> list[int]:
        """The steps at which ``run_id`` logged a ``kind`` payload, ascending (no payload read)."""
        table = payloads[kind]
        with self._read() as conn:
            return list(conn.execute(sa.select(table.c.step).where(table.c.run_id == run_id).distinct()
                                     .order_by(table.c.step)).scalars().all())  # fetched at once, not row by row

    def diagnostic_steps(self, run_id: str) -> list[int]:
        return self._payload_steps("diagnostics", run_id)

    def sample_steps(self, run_id: str) -> list[int]:
        """The steps with logged samples (a page lists them, then reads one step's: a long run's
        samples of every step were read and decoded on every redraw)."""
        return self._payload_steps("samples", run_id)

    def diagnostics(self, run_id: str, step: int) -> dict[str, Any]:
        rows = self._payload_rows("diagnostics", [run_id], step)
        if not rows:
            raise RunError(f"run {run_id!r} has no diagnostics at step={step}; steps with diagnostics: "
                           f"{self.diagnostic_steps(run_id)[:20]}")
        return json.loads(rows[0].data)

    def lens(self, run_id: str) -> list[dict[str, Any]]:
        """Same-batch lens payloads of a run, by step (see workbench/engine/lens.py)."""
        return [{"step": r.step, **json.loads(r.data)} for r in self._payload_rows("lens", [run_id])]

    def _payload_rows(self, table_name: str, run_ids: list[str], step: int | None = None) -> list[Row]:
        if not run_ids:
            return []
        table = payloads[table_name]
        query = sa.select(table.c.run_id, table.c.step, table.c.time, table.c.data).where(table.c.run_id.in_(run_ids))
        if step is not None:
            query = query.where(table.c.step == step)
        with self._read() as conn:
            return conn.execute(query.order_by(table.c.run_id, table.c.step)).all()


def runs_frame(rows: list[Run]) -> pd.DataFrame:
    """``rows`` as ``list_runs``' frame: one row each, in the given order, columns ``RUN_COLUMNS``."""
    if not rows:  # object columns, as a frame of no rows always had
        return pd.DataFrame(columns=RUN_COLUMNS).astype({"seed": "Int64"})
    columns = {c: [getattr(r, c) for r in rows] for c in RUN_COLUMNS}
    # a run of an older file may have no known seed: <NA>, not 0.0 (built as Int64 at once: an
    # astype of the frame afterwards was two thirds of this function, called ~5 times a redraw)
    columns["seed"] = pd.array(columns["seed"], dtype="Int64")
    return pd.DataFrame(columns, columns=RUN_COLUMNS)


def arm_frame(arms: pd.DataFrame, metrics: pd.DataFrame) -> pd.DataFrame:
    """``RunStore.arm_metrics``' frame from ``run_arms`` (run_id, arm, seed; one row per run) and
    ``metrics`` rows: ``run_id``, ``arm``, ``seed``, ``step``, ``time``, then the metrics; runs in
    ``arms``' order, each run's rows in ``metrics``' order, runs ``arms`` lacks left out.

    The inner merge of ``arms`` with ``metrics`` on ``run_id``, made by positions: each row's run
    looked up among the few runs of ``arms`` and the rows taken in one stable order (pandas' merge
    hashed 30,000 run ids against 30 and took ~25 ms of every arms-view render)."""
    first = [*ARM_KEY_COLUMNS, "time"]
    if (list(arms.columns) != first[:3] or not arms["run_id"].is_unique
            or {"arm", "seed"} & set(metrics.columns) or "run_id" not in metrics.columns):
        frame = arms.merge(metrics, on="run_id", how="inner")  # what the positions below stand for
        return frame[first + [c for c in frame.columns if c not in first]].reset_index(drop=True)
    # (N,) each row's run in arms, -1: none; the N ids hashed once by factorize, the few distinct
    # ones looked up (get_indexer on the N ids took 2.4 ms for 30 runs x 1,000 steps)
    codes, distinct = pd.factorize(metrics["run_id"], sort=False)
    run = np.where(codes >= 0, pd.Index(arms["run_id"]).get_indexer(distinct)[codes], -1)
    kept = np.flatnonzero(run >= 0)
    order = kept[np.argsort(run[kept], kind="stable")]  # by run in arms' order, then as in metrics
    values = metrics[first[3:] + [c for c in metrics.columns if c not in first]]
    return pd.concat([arms.take(run[order]).reset_index(drop=True),
                      values.take(order).reset_index(drop=True)], axis=1)


def _past_steps(table: sa.Table, after: list[tuple[str, int]]) -> sa.ColumnElement[bool]:
    """The rows of each run of ``after`` (run id, step) past its step: one condition per distinct
    step, ``run_id IN (...) AND step > s`` (runs stepping together share one: a condition per run
    made 30 runs' statement cost more to build than to run)."""
    runs_at: dict[int, list[str]] = {}
    for run_id, step in after:
        runs_at.setdefault(int(step), []).append(run_id)
    return sa.or_(*(sa.and_(table.c.run_id.in_(ids), table.c.step > step) for step, ids in runs_at.items()))


def _metrics_frame(rows: list[Row]) -> pd.DataFrame:
    """Metric rows (run_id, step, time, data) as one frame: ``run_id``, ``step``, ``time``, then a
    column per metric any row logged (NaN where a row did not)."""
    if not rows:
        return pd.DataFrame(columns=["run_id", "step", "time"])
    # one JSON array decoded at once and the key columns built apart: per-row json.loads and
    # dict merging took ~40% of reading 30 runs x 1,000 steps
    values = pd.DataFrame.from_records(decode_json_array([r.data for r in rows]))
    keys = pd.DataFrame({"run_id": [r.run_id for r in rows],
                         "step": pd.Series([r.step for r in rows], dtype="int64"),
                         "time": [r.time for r in rows]})
    return pd.concat([keys, values.drop(columns=[c for c in keys.columns if c in values.columns])], axis=1)


def decode_json_array(texts: list[str]) -> list[Any]:
    """The JSON texts ``texts`` decoded as one array, by orjson (~3x the standard library's speed:
    decoding was half of reading 30 runs x 1,000 steps of metrics). Text orjson refuses (``NaN``,
    ``Infinity``, which ``json.dumps`` writes and a store of an older version may hold) is decoded by
    the standard library, as before. An integer beyond 64 bits (ingest refuses it; an older store may
    hold one) orjson reads as the nearest float, the value a metric column of floats holds anyway."""
    array = "[" + ",".join(texts) + "]"
    try:
        return orjson.loads(array)
    except orjson.JSONDecodeError:
        return json.loads(array)


def audit_entry_insert(entry: AuditEntry) -> sa.Insert:
    """The INSERT of one audit entry (its action one of ``AUDIT_ACTIONS``, else RunError; each
    field one line, cut to its limit), for a caller's own transaction (``RunStore.record_audit``;
    ``dbtools.copy_database`` records the copy in the transaction that writes it)."""
    if entry.action not in AUDIT_ACTIONS:
        raise RunError(f"action={entry.action!r} is not allowed; one of: {', '.join(AUDIT_ACTIONS)}")
    return sa.insert(audit).values(
        at=float(entry.at), actor=_one_line(entry.actor, 200), role=_one_line(entry.role, 50),
        auth=_one_line(entry.auth, 200), action=entry.action, target=_one_line(entry.target, MAX_AUDIT_DETAIL),
        detail=_one_line(entry.detail, MAX_AUDIT_DETAIL), address=_one_line(entry.address, 200))


def _unique_seed_index() -> sa.Index:
    """The partial unique index on (grp, arm, seed) of ``schema.runs``."""
    return next(i for i in runs_table.indexes if i.name == UNIQUE_SEED_INDEX)


def _has_unique_seed_index(conn: Connection) -> bool:
    return sa.inspect(conn).has_index("runs", UNIQUE_SEED_INDEX)


def _has_duplicate_seeds(conn: Connection) -> bool:
    """Two runs of one group and arm with the same seed (only a file made before the index)."""
    return conn.execute(sa.select(R.grp).where(R.grp.is_not(None), R.seed.is_not(None))
                        .group_by(R.grp, R.arm, R.seed).having(sa.func.count() > 1).limit(1)).first() is not None


def _is_seed_conflict(err: sa_exc.IntegrityError) -> bool:
    """The unique (grp, arm, seed) index refused the insert (SQLite names the columns, PostgreSQL the index)."""
    message = str(err.orig)
    return "runs.grp" in message or UNIQUE_SEED_INDEX in message


def _disk_full_error(err: BaseException) -> bool:
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


def _one_line(text: Any, limit: int) -> str:
    """``text`` as one line of at most ``limit`` characters (an audit field)."""
    line = " ".join(str(text or "").split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _column_value(column: str, value: Any) -> Any:
    """A value as its runs column holds it: JSON text for the JSON columns, an int for a flag
    (PostgreSQL refuses a boolean for an integer column)."""
    if column in _JSON_COLUMNS:
        return json.dumps(value)
    if isinstance(value, bool):
        return int(value)
    return value


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


def _record(row: Row) -> Run:
    """A ``runs`` row as a Run (JSON columns parsed; ``grp`` is ``group``)."""
    columns = row._asdict()  # a plain dict: a lookup in the row's own mapping cost ~1 us (31 per run)
    values = {}
    for name in RUN_FIELDS:
        column = _COLUMN_OF.get(name, name)
        if column not in columns:
            continue
        value = columns[column]
        values[name] = json.loads(value) if column in _JSON_COLUMNS else value
    values["cancel_requested"] = bool(values.get("cancel_requested"))
    return Run(**values)


def _locked_run(conn: Connection, run_id: str, *columns: sa.Column) -> Row | None:
    """``columns`` of the run's row, locked until the transaction ends (PostgreSQL ``FOR UPDATE``;
    SQLite's write transaction already excludes other writers)."""
    return conn.execute(sa.select(*columns).where(R.id == run_id).with_for_update()).first()


def _add_warning(conn: Connection, run_id: str, message: str) -> None:
    """Append ``message`` to the run's warnings (kept once, at most ``MAX_WARNINGS``)."""
    row = _locked_run(conn, run_id, R.warnings)
    if row is None:
        return
    warnings = json.loads(row.warnings)
    if message not in warnings and len(warnings) < MAX_WARNINGS:
        conn.execute(sa.update(runs_table).where(R.id == run_id).values(warnings=json.dumps(warnings + [message])))


def _apply_status(conn: Connection, run_id: str, status: str, error: str | None, when: float) -> bool:
    row = _locked_run(conn, run_id, R.status)
    if row is None:
        return False
    current = row.status
    if _status_rank(status) < _status_rank(current) or current in TERMINAL_STATUSES:
        return False
    values: dict[str, Any] = {"status": status}
    if error is not None:
        values["error"] = error
    if status in TERMINAL_STATUSES:
        values["ended_at"] = when
    if status == "starting":
        values["started_at"] = sa.func.coalesce(R.started_at, when)
    conn.execute(sa.update(runs_table).where(R.id == run_id).values(**values))
    return current != status


# -- ingest: each event is checked by workbench.runs.ingest, then written by the writer of its kind --------
# The statements of the ingest path are built once, with bound parameters: building and keying a
# statement per event cost more than running it (profiled: ingest took twice the raw-sqlite3 time).
_INSERTS: dict[tuple[str, str], Any] = {}  # (dialect, table) -> its insert-ignoring-duplicates


def _insert_payload(conn: Connection, table: str, run_id: str, step: int, when: float, data: Any) -> int:
    key = (conn.dialect.name, table)
    insert = _INSERTS.get(key)
    if insert is None:
        insert = _INSERTS[key] = insert_ignoring_duplicates(conn, payloads[table])
    return conn.execute(insert, {"run_id": run_id, "step": step, "time": when, "data": json.dumps(data)}).rowcount


_NEWEST = R.last_step <= sa.bindparam("step", type_=R.last_step.type)  # SET reads the row as it was
# a row below the last step is not an append: readers that keep decoded rows must re-read the run
_METRICS_UPDATE = (sa.update(runs_table).where(R.id == sa.bindparam("run_id"))
                   .values(last_step=sa.case((_NEWEST, sa.bindparam("step", type_=R.last_step.type)), else_=R.last_step),
                           reward=sa.case((_NEWEST, sa.bindparam("reward", type_=R.reward.type)), else_=R.reward),
                           metrics_generation=sa.case((_NEWEST, R.metrics_generation),
                                                      else_=R.metrics_generation + 1)))


def _write_status(conn: Connection, run_id: str, event: Event) -> int:
    return int(_apply_status(conn, run_id, event.payload["status"], event.payload["error"], event.time))


def _write_error(conn: Connection, run_id: str, event: Event) -> int:
    conn.execute(sa.update(runs_table).where(R.id == run_id).values(error=event.payload["error"]))
    return 0


def _write_metrics(conn: Connection, run_id: str, event: Event) -> int:
    data = event.payload["metrics"]
    added = _insert_payload(conn, "metrics", run_id, event.step, event.time, data)
    if added:
        reward = float(data["reward"]) if is_number(data.get("reward")) else None
        conn.execute(_METRICS_UPDATE, {"run_id": run_id, "step": event.step, "reward": reward})
    return added


def _write_resume(conn: Connection, run_id: str, event: Event) -> int:
    """A resumed attempt restarts at ``step``: the rows of that step and later came from the attempt
    before it (which died past its checkpoint) and are dropped, so the resumed attempt's rows are
    the only ones (an insert that ignores duplicates would keep the old values). ``last_step`` and
    ``reward`` go back to the last kept step. In a replay of the stream from the start, the attempt
    before may already have left a final status; the resume makes the run active again."""
    for table in payloads.values():
        conn.execute(sa.delete(table).where(table.c.run_id == run_id, table.c.step >= event.step))
    metrics = payloads["metrics"]
    last = conn.execute(sa.select(metrics.c.step, metrics.c.data).where(metrics.c.run_id == run_id)
                        .order_by(metrics.c.step.desc()).limit(1)).first()
    reward = json.loads(last.data).get("reward") if last is not None else None
    conn.execute(sa.update(runs_table).where(R.id == run_id).values(
        last_step=last.step if last is not None else -1, reward=float(reward) if is_number(reward) else None,
        metrics_generation=R.metrics_generation + 1))
    conn.execute(sa.update(runs_table).where(R.id == run_id, R.status.in_(TERMINAL_STATUSES))
                 .values(status="running", ended_at=None, error=None))
    for warning in event.payload["warnings"]:  # e.g. a damaged checkpoint the resume skipped
        _add_warning(conn, run_id, warning)
    return 1


def _payload_writer(table: str, key: str | None = None) -> Callable[[Connection, str, Event], int]:
    """A writer of one (run, step) row of ``table``: the payload's ``key`` (None: all of it)."""
    return lambda conn, run_id, event: _insert_payload(conn, table, run_id, event.step, event.time,
                                                       event.payload if key is None else event.payload[key])


WRITERS: dict[str, Callable[[Connection, str, Event], int]] = {
    "resume": _write_resume,
    "status": _write_status,
    "error": _write_error,
    "metrics": _write_metrics,
    "samples": _payload_writer("samples", "samples"),
    "diagnostics": _payload_writer("diagnostics"),
    "lens": _payload_writer("lens"),
}


def _ingest_one(conn: Connection, run_id: str, raw: Any) -> int | str:
    """Check and apply one event: 1 if it added a row or changed the status, 0 if not (a replay,
    a kind of a newer engine), or the reason it was refused (nothing written)."""
    checked = check_event(raw, time.time())
    if isinstance(checked, Rejected):
        return checked.reason
    if isinstance(checked, Ignored):
        return 0
    return WRITERS[checked.kind](conn, run_id, checked)
