"""Fixtures of the run-layer tests: the store on each backend (a SQLite file; a database on a real
PostgreSQL server started once per session, see ``tests/runs/postgres.py``)."""

from __future__ import annotations

import pytest

from tests.runs.postgres import start_postgres

BACKENDS = ("sqlite", "postgres")


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server for the whole session (skips locally, fails under CI=true, if missing)."""
    from workbench.runs.database import dispose_engines

    server = start_postgres()
    try:
        yield server
    finally:
        dispose_engines()
        server.stop()


@pytest.fixture
def postgres_url(postgres_server):
    """A fresh, empty database on the session's server (its pooled connections closed afterwards)."""
    from workbench.runs.database import dispose_engines

    yield postgres_server.new_database()
    dispose_engines()


@pytest.fixture(params=BACKENDS)
def store_location(request, tmp_path):
    """Where a store lives, once per backend: a SQLite file, or a PostgreSQL URL."""
    if request.param == "sqlite":
        return tmp_path / "runs.db"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def store(store_location):
    """A new, empty run store on each backend."""
    from workbench.runs import RunStore

    return RunStore(store_location)
