"""Where the run store lives and what differs between its two backends (SQLite, PostgreSQL).

The store (``workbench.runs.store``) is one implementation on SQLAlchemy Core; everything that
depends on the backend is a small named function here, chosen by the dialect's name:

- ``store_url``: ``WORKBENCH_DB`` (a SQLAlchemy URL) when set, else the SQLite file under the
  workbench home; ``postgresql://`` means psycopg 3;
- ``engine_for``: one engine per URL and process. SQLite: a fresh connection per use (as the
  store has always done: the last connection to close checkpoints the WAL, which the full-disk
  fallback relies on), a 30 s busy timeout, and transactions begun by the store itself
  (``BEGIN IMMEDIATE`` for a write: the write lock up front, no upgrade deadlock). PostgreSQL: a
  pool of connections, checked before use;
- ``insert_ignoring_duplicates``: ``INSERT ... ON CONFLICT DO NOTHING`` of either dialect;
- ``serialize_writers``: what makes a check-then-insert atomic (SQLite: the ``BEGIN IMMEDIATE``
  already holds the file's write lock; PostgreSQL: a transaction-scoped advisory lock);
- ``session_lock``: a lock shared by every process using the store (``flock`` on a file beside
  the SQLite file; ``pg_advisory_lock`` on PostgreSQL), released if the holder dies.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

from workbench.home import workbench_home
from workbench.runs.records import RunError

DB_ENV = "WORKBENCH_DB"
STORE_FILE = "runs.db"
SQLITE_TIMEOUT_S = 30.0  # a writer waits this long for another writer's lock before StoreError
ALLOWED_URLS = "sqlite:///PATH or postgresql[+psycopg]://USER[:PASSWORD]@HOST[:PORT]/DATABASE"


class StoreError(RunError):
    """The store cannot be used (read-only, unreadable, disk full, locked too long, server down, bad
    URL); the message names the file or the URL (never its password)."""


def store_url(location: str | os.PathLike | None = None) -> URL:
    """The store's URL: ``location`` (a path: a SQLite file; a string with ``://``: a URL), else
    ``WORKBENCH_DB``, else ``runs.db`` under the workbench home. StoreError (one line naming the
    source, the URL without its password, and what is allowed) for anything else."""
    if location is None:
        value = os.environ.get(DB_ENV, "").strip()
        if not value:
            return sqlite_url(workbench_home() / STORE_FILE)
        return parse_store_url(value, source=DB_ENV)
    if isinstance(location, str) and "://" in location:
        return parse_store_url(location, source="store URL")
    return sqlite_url(Path(location))


def sqlite_url(path: Path) -> URL:
    return URL.create("sqlite", database=str(path))


def parse_store_url(value: str, *, source: str) -> URL:
    """A SQLAlchemy URL of a backend the store supports; ``postgresql://`` is psycopg 3's."""
    try:
        url = make_url(value)
    except ArgumentError:
        raise StoreError(f"{source}={_masked(value)!r} is not a database URL; allowed: {ALLOWED_URLS}") from None
    driver = url.drivername
    if driver in ("postgresql", "postgres", "postgresql+psycopg"):
        url = url.set(drivername="postgresql+psycopg")
        if not url.database:
            raise StoreError(f"{source}={_safe(url)!r} names no database; allowed: {ALLOWED_URLS}")
        return url
    if driver in ("sqlite", "sqlite+pysqlite"):
        if not url.database or url.database == ":memory:":
            raise StoreError(f"{source}={_safe(url)!r} names no file (an in-memory store would be lost); "
                             f"allowed: {ALLOWED_URLS}")
        return sqlite_url(Path(url.database))
    raise StoreError(f"{source}={_safe(url)!r} is not allowed (driver {driver!r}); allowed: {ALLOWED_URLS}")


def _safe(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _masked(value: str) -> str:
    """A string that is not even a URL, with anything between ``//`` and ``@`` hidden."""
    head, sep, rest = value.partition("://")
    return f"{head}{sep}***@{rest.rsplit('@', 1)[1]}" if sep and "@" in rest else value


def display_url(url: URL) -> str:
    """The URL as it may be shown or logged (``***`` for the password)."""
    return _safe(url)


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL; None for a server database."""
    return Path(url.database) if url.get_backend_name() == "sqlite" else None


# -- engines -----------------------------------------------------------------------------------------
_engines: dict[tuple, Engine] = {}
_engines_lock = threading.Lock()
WRITE = "workbench_write"  # execution option: this connection's transaction will write


def engine_for(url: URL, *, immutable: bool = False) -> Engine:
    """The engine of ``url`` in this process (made once; a forked child makes its own).
    ``immutable``: SQLite only, a read that takes no lock and needs no WAL index (full disk)."""
    key = (_safe(url), url.password, immutable, os.getpid())
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _ENGINE_MAKERS[url.get_backend_name()](url, immutable)
            _engines[key] = engine
    return engine


def _sqlite_engine(url: URL, immutable: bool) -> Engine:
    path = Path(url.database)

    def connect() -> sqlite3.Connection:
        target, uri = (f"{path.absolute().as_uri()}?immutable=1", True) if immutable else (str(path), False)
        return sqlite3.connect(target, uri=uri, timeout=SQLITE_TIMEOUT_S, isolation_level=None,
                               check_same_thread=False)

    engine = sa.create_engine("sqlite://", creator=connect, poolclass=NullPool)

    @sa.event.listens_for(engine, "begin")
    def begin(conn: Connection) -> None:
        """The store begins SQLite's transactions itself (pysqlite's own handling defers BEGIN
        until the first write, which would make a read-then-write transaction upgrade its lock)."""
        if conn.get_execution_options().get(WRITE):
            conn.exec_driver_sql("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across app crashes
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:  # a reader sets nothing that touches the file: on a full disk that would fail first
            conn.exec_driver_sql("BEGIN")

    return engine


def _postgres_engine(url: URL, immutable: bool) -> Engine:
    return sa.create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=20,
                            connect_args={"connect_timeout": 10, "application_name": "workbench"})


_ENGINE_MAKERS = {"sqlite": _sqlite_engine, "postgresql": _postgres_engine}


def dispose_engines() -> None:
    """Close every pooled connection of this process (tests dropping a database; shutdown)."""
    with _engines_lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


# -- what the dialects spell differently -------------------------------------------------------------
_INSERTS = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


def insert_ignoring_duplicates(conn: Connection, table: sa.Table):
    """``INSERT ... ON CONFLICT DO NOTHING`` (SQLite's ``INSERT OR IGNORE``) for ``table``; its
    result's ``rowcount`` says whether the row was new (SQLAlchemy keeps it for an INSERT only when asked)."""
    return _INSERTS[conn.dialect.name](table).on_conflict_do_nothing().execution_options(preserve_rowcount=True)


def lock_key(name: str) -> int:
    """A stable signed 64-bit key for a PostgreSQL advisory lock named ``name``."""
    return int.from_bytes(hashlib.blake2b(f"workbench:{name}".encode(), digest_size=8).digest(), "big", signed=True)


def serialize_writers(conn: Connection, name: str) -> None:
    """Inside a write transaction: no other transaction calling this with ``name`` runs until this
    one ends. SQLite: nothing to do (``BEGIN IMMEDIATE`` holds the only write lock). PostgreSQL:
    ``pg_advisory_xact_lock``, released at commit or rollback."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(lock_key(name))))


@contextmanager
def session_lock(url: URL, name: str) -> Iterator[None]:
    """An exclusive lock named ``name`` shared by every process and thread using the store;
    the kernel (SQLite's ``flock``) or the server (a closed session) releases it if the holder dies."""
    path = sqlite_path(url)
    if path is not None:
        lock_path = path.with_name(f"{path.name}.{name}.lock")
        try:
            f = open(lock_path, "a")
        except OSError as err:
            raise StoreError(f"run store lock {lock_path} cannot be used: {err}") from err
        with f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        return
    # its own connection, in autocommit: a session lock, not an open transaction held for minutes
    with engine_for(url).connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        key = lock_key(name)
        conn.execute(sa.select(sa.func.pg_advisory_lock(key)))
        try:
            yield
        finally:
            conn.execute(sa.select(sa.func.pg_advisory_unlock(key)))
