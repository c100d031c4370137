"""Administering a store's database: its status, an explicit upgrade, and a copy to another store.

A team that starts on one machine's SQLite file and grows moves its history to the server
database with ``copy``; an admin checks and upgrades a database with ``status`` / ``upgrade``
(``python -m workbench db ...``, ``workbench.runs.cli``).

- ``database_status``: the backend, the URL without its password, the database's Alembic revision
  against the code's, and the rows of every table. Reads only (a missing SQLite file is not made).
- ``upgrade_database``: the migrations to head, under the store's migration lock (what opening a
  store does, made explicit); idempotent.
- ``copy_database``: every table of ``schema.metadata`` (discovered, not listed), parents first,
  in batches, read from one snapshot of the source and written in ONE transaction on the target,
  ids kept (metrics stay attached to their runs, audit entries keep their order), then the
  target's sequences moved past the copied ids (PostgreSQL), then one ``db_copy`` audit entry
  naming who copied what. A target that already holds a row is refused before anything is
  written; so is a float the target cannot hold exactly (SQLite stores NaN as NULL).
  With ``runs_to`` (``--runs-to DIR``, a workbench home) each run's directory is COPIED too, to
  ``DIR/runs/RUN_ID``, and the copied rows point there (``workbench.runs.runcopy``): refusals
  first (a run still active, a directory missing here, a target folder that exists, a link out
  of a run directory, ``DIR`` not writable), then the folders copied into a staging folder of
  ``DIR/runs``, the rows in their transaction, and only after the commit the folders renamed
  into place; a row copy that fails removes the staged folders. The source is only read.

Who may: reading the status is anyone's; ``upgrade`` and ``copy`` need ``authz.RULES["database"]``
(admin) where a server database is involved: the CLI's principal for that store
(``roles.cli_principal``: admin on a local SQLite file, ``roles.cli_roles`` on a server).
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection

from workbench.runs import migrate
from workbench.runs.authz import Principal, authorize
from workbench.runs.database import (WRITE, StoreError, display_url, engine_for, parse_store_url, serialize_writers,
                                     sqlite_path, sqlite_url, store_url)
from workbench.runs.records import AuditEntry, RunError
from workbench.runs.runcopy import (Staged, check_all_copied, check_runs_home, place_run_dirs, plan_run_dirs,
                                    remove_staged, rewrite_run_row, stage_run_dirs)
from workbench.runs.schema import metadata, runs

COPY_BATCH_ROWS = 2000  # rows read and inserted at once: bounded memory for a store of millions of steps
COPY_LOCK = "copy"  # a second copy into the same target waits, then finds it no longer empty
MAX_BATCH_ROWS = 1_000_000


@dataclass(frozen=True)
class DatabaseStatus:
    """What ``db status`` shows: ``revision`` None for an empty database (or no file yet);
    ``rows`` per table of the schema, None where the table does not exist (yet)."""

    backend: str
    url: str
    exists: bool
    revision: str | None
    head: str
    rows: dict[str, int | None]

    @property
    def current(self) -> bool:
        return self.revision == self.head


@dataclass(frozen=True)
class CopyReport:
    """What ``db copy`` did: rows copied per table, and how long it took; with ``runs_to``, the run
    directories copied, their bytes, and the folder that holds them (``runs_dir``, else None)."""

    source: str
    target: str
    rows: dict[str, int]
    seconds: float
    run_dirs: int = 0
    run_bytes: int = 0
    runs_dir: str | None = None


def resolve_url(value: str | None, *, field: str) -> URL:
    """``value`` (a URL, or a path: a SQLite file) as the store's URL, else the default store
    (``WORKBENCH_DB``, else the home's ``runs.db``); StoreError naming ``field`` if it is not allowed."""
    if value is None:
        return store_url()
    if "://" in value:
        return parse_store_url(value, source=field)
    if not value.strip():
        raise StoreError(f"{field}='' is not allowed; a database URL or the path of a SQLite file")
    return sqlite_url(Path(value))


def _missing_sqlite_file(url: URL) -> Path | None:
    """The SQLite file of ``url`` when it does not exist (None: it exists, or a server database)."""
    path = sqlite_path(url)
    return path if path is not None and not path.exists() else None


@contextmanager
def _connection(url: URL, *, write: bool = False) -> Iterator[Connection]:
    """A connection to ``url``; a failure of the database (unreachable, unreadable) is StoreError
    naming the URL without its password."""
    from sqlalchemy import exc as sa_exc

    try:
        with engine_for(url).connect() as conn:
            if write:
                conn.execution_options(**{WRITE: True})
            yield conn
    except sa_exc.DBAPIError as err:  # unreachable, not a database (a text file), refused (permissions): one line
        reason = " ".join(str(getattr(err, "orig", None) or err).split())
        raise StoreError(f"database {display_url(url)} cannot be used: {reason}") from err


def _row_counts(conn: Connection) -> dict[str, int | None]:
    """Rows of every table of the schema (None: the table does not exist)."""
    present = set(sa.inspect(conn).get_table_names())
    return {t.name: (conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one() if t.name in present else None)
            for t in metadata.sorted_tables}


def database_status(url: URL) -> DatabaseStatus:
    """The database's backend, revision and rows per table; reads only."""
    shown = display_url(url)
    if _missing_sqlite_file(url) is not None:
        return DatabaseStatus(url.get_backend_name(), shown, False, None, migrate.HEAD,
                              {t.name: None for t in metadata.sorted_tables})
    with _connection(url) as conn:
        return DatabaseStatus(url.get_backend_name(), shown, True, migrate.current_revision(conn), migrate.HEAD,
                              _row_counts(conn))


def check_may_administer(principal: Principal, *urls: URL) -> None:
    """PermissionDenied unless ``principal`` may upgrade or copy where a server database is among ``urls``."""
    if any(sqlite_path(url) is None for url in urls):
        authorize(principal, "database")


def upgrade_database(url: URL, principal: Principal) -> tuple[str | None, str]:
    """Migrate the store at ``url`` to head (nothing to do when it is there); (revision before,
    revision after). A SQLite file that does not exist is refused (a typo must not make a new store)."""
    from workbench.runs.store import RunStore, audit_entry_insert

    check_may_administer(principal, url)
    missing = _missing_sqlite_file(url)
    if missing is not None:
        raise StoreError(f"--url={str(missing)!r}: no such store file; a store is made by opening it "
                         "(any command), or give the path of an existing one")
    before = database_status(url).revision
    RunStore(url.render_as_string(hide_password=False))  # opening migrates, under the migration lock
    after = database_status(url).revision
    if before != after:
        with _connection(url, write=True) as conn, conn.begin():
            conn.execute(audit_entry_insert(_entry(principal, "db_upgrade", display_url(url),
                                                   f"{before or 'none'} -> {after}")))
    return before, after


def _entry(principal: Principal, action: str, target: str, detail: str) -> AuditEntry:
    return AuditEntry(at=time.time(), actor=principal.owner, role=principal.role, auth=principal.auth, action=action,
                      target=target, detail=detail, address=principal.address)


def _same_database(a: URL, b: URL) -> bool:
    path_a, path_b = sqlite_path(a), sqlite_path(b)
    if path_a is not None or path_b is not None:
        return path_a is not None and path_b is not None and path_a.resolve() == path_b.resolve()
    return (a.host, a.port or 5432, a.database) == (b.host, b.port or 5432, b.database)


def _held_rows(conn: Connection) -> dict[str, int]:
    """Tables of the schema that hold rows, with their counts (empty: the database may be copied into)."""
    return {name: n for name, n in _row_counts(conn).items() if n}


def _refuse_non_empty(held: dict[str, int], target: URL) -> None:
    if held:
        counts = ", ".join(f"{name} {n}" for name, n in held.items())
        raise RunError(f"--to={display_url(target)!r} already holds rows ({counts}); a copy goes only into an empty "
                       "store: give a new database or file, or drop this one's tables first")


def copy_database(source: URL, target: URL, principal: Principal, *, batch_rows: int = COPY_BATCH_ROWS,
                  runs_to: Path | str | None = None) -> CopyReport:
    """Copy every row of every table of the store at ``source`` into the empty store at ``target``
    (either backend), and with ``runs_to`` (a workbench home) every run's directory to
    ``runs_to/runs/RUN_ID``; see the module docstring. Nothing is written to the target unless the
    whole copy commits (a SQLite file this call made, and the folders it copied, are removed again)."""
    from workbench.runs.store import RunStore

    if not (isinstance(batch_rows, int) and 1 <= batch_rows <= MAX_BATCH_ROWS):
        raise RunError(f"batch_rows={batch_rows!r} is not allowed; a whole number from 1 to {MAX_BATCH_ROWS}")
    if _same_database(source, target):
        raise RunError(f"--from and --to are the same store ({display_url(source)}); name two different ones")
    check_may_administer(principal, source, target)
    home = None if runs_to is None else check_runs_home(runs_to)
    missing = _missing_sqlite_file(source)
    if missing is not None:
        raise StoreError(f"--from={str(missing)!r}: no such store file")
    if not _missing_sqlite_file(target):
        with _connection(target) as conn:
            _refuse_non_empty(_held_rows(conn), target)
    RunStore(source.render_as_string(hide_password=False))  # the source at head: its tables are the schema's
    plan = None if home is None else plan_run_dirs(_source_runs(source), home)  # refusals: nothing written yet
    made_file = _missing_sqlite_file(target)
    started = time.monotonic()
    staged = None
    try:
        staged = None if plan is None else stage_run_dirs(plan)  # folders first: the rows name their identities
        RunStore(target.render_as_string(hide_password=False))  # the target's schema at head (it holds no rows)
        rows = _copy_rows(source, target, principal, batch_rows, staged)
    except BaseException:
        if staged is not None:
            remove_staged(staged)
        if made_file is not None:
            for leftover in (made_file, *(made_file.with_name(made_file.name + s) for s in ("-wal", "-shm"))):
                leftover.unlink(missing_ok=True)
        raise
    if staged is None:
        return CopyReport(display_url(source), display_url(target), rows, time.monotonic() - started)
    place_run_dirs(staged)  # only now: a folder in place is one whose row is committed
    return CopyReport(display_url(source), display_url(target), rows, time.monotonic() - started,
                      len(staged.plan.moves), staged.bytes, str(staged.plan.runs_root))


def _source_runs(source: URL) -> list[dict]:
    """What the plan of the run directories reads of each source run: id, status, run_dir."""
    with _connection(source) as conn:
        query = sa.select(runs.c.id, runs.c.status, runs.c.run_dir).order_by(runs.c.id)
        return [dict(row) for row in conn.execute(query).mappings()]


def _copy_rows(source: URL, target: URL, principal: Principal, batch_rows: int,
               staged: Staged | None) -> dict[str, int]:
    """The copy proper: one read snapshot of the source, one write transaction on the target; with
    ``staged`` run directories, the runs rows pointed at them."""
    from workbench.runs.store import audit_entry_insert

    copied: dict[str, int] = {}
    rewrites = {} if staged is None else {runs.name: lambda row: rewrite_run_row(staged, row)}
    with _connection(source) as src, _connection(target, write=True) as dst:
        if src.dialect.name == "postgresql":  # every table read from one snapshot, while collectors write
            src = src.execution_options(isolation_level="REPEATABLE READ")
        with src.begin(), dst.begin():
            serialize_writers(dst, COPY_LOCK)
            _refuse_non_empty(_held_rows(dst), target)  # a copy that ran meanwhile
            for table in metadata.sorted_tables:  # parents before children
                copied[table.name] = _copy_table(src, dst, table, batch_rows, rewrites.get(table.name))
            if staged is not None:
                check_all_copied(staged)
            reset_sequences(dst)
            detail = "; ".join(f"{name} {n}" for name, n in copied.items())
            if staged is not None:
                detail += (f"; run directories {len(staged.plan.moves)} ({staged.bytes} bytes) copied to "
                           f"{staged.plan.runs_root}")
            dst.execute(audit_entry_insert(_entry(principal, "db_copy", display_url(target),
                                                  f"from {display_url(source)}: {detail}")))
    return copied


def _copy_table(src: Connection, dst: Connection, table: sa.Table, batch_rows: int,
                rewrite: Callable[[dict], dict] | None = None) -> int:
    """Every row of ``table``, by primary key, ``batch_rows`` at a time, each through ``rewrite``
    when given; the number copied."""
    query = sa.select(*table.columns).order_by(*table.primary_key.columns)
    floats = [c.name for c in table.columns if isinstance(c.type, sa.Double)]
    check_nan = dst.dialect.name == "sqlite"
    total = 0
    result = src.execution_options(yield_per=batch_rows).execute(query)
    for batch in result.mappings().partitions(batch_rows):
        rows = [dict(row) for row in batch]
        if rewrite is not None:
            rows = [rewrite(row) for row in rows]
        if check_nan:
            _check_sqlite_holds(table, floats, rows)
        dst.execute(table.insert(), rows)
        total += len(rows)
    return total


def _check_sqlite_holds(table: sa.Table, floats: list[str], rows: list[dict]) -> None:
    """RunError naming the row and column of a NaN: SQLite would store it as NULL, not as NaN."""
    for row in rows:
        for name in floats:
            value = row[name]
            if isinstance(value, float) and math.isnan(value):
                key = ", ".join(f"{c.name}={row[c.name]!r}" for c in table.primary_key.columns)
                raise RunError(f"{table.name}.{name} of row {key} is NaN, which a SQLite store cannot hold (it "
                               "would read back NULL); copy into a PostgreSQL database, or clear that value first")


def reset_sequences(conn: Connection) -> None:
    """PostgreSQL: move the sequence behind every integer autoincrement key to past its largest
    copied id, so the next insert does not collide (explicit ids do not advance a sequence).
    SQLite needs nothing: an INTEGER PRIMARY KEY takes the largest id + 1."""
    if conn.dialect.name != "postgresql":
        return
    for table in metadata.sorted_tables:
        column = table.autoincrement_column
        if column is None:
            continue
        sequence = sa.func.pg_get_serial_sequence(table.name, column.name)
        largest = sa.select(sa.func.max(column)).scalar_subquery()
        # setval(seq, n, false): the next value is n; on an empty table n = 1
        conn.execute(sa.select(sa.func.setval(sequence, sa.func.coalesce(largest, 0) + 1, False)))
