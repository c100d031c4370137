"""Schema migrations (Alembic, run when a store is opened) on both backends: a new store gets
exactly the schema the store's queries use, a store at an older revision (a SQLite file made before
Alembic by the workbench itself; a PostgreSQL schema at revision 0001) migrates to the head with
its data intact, processes opening a new store at once migrate it once, and a bad WORKBENCH_DB is
one line, exit 2, without the password."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.test_cli import REPO, assert_one_line_error, cli
from workbench.analysis.stats import final_window_scores
from workbench.runs import RunError, RunStore
from workbench.runs import migrate
from workbench.runs.database import StoreError, engine_for, store_url
from workbench.runs.records import AuditEntry
from workbench.runs.schema import UNIQUE_SEED_INDEX, metadata

BEFORE_ALEMBIC = Path(__file__).with_name("data") / "store_before_alembic.sql"


def _row(run_id: str, seed: int, group: str = "g", arm: str = "grpo") -> dict:
    return dict(run_id=run_id, name=arm, algorithm=arm, recipe_yaml=f"name: {arm}\ntrain:\n  seed: {seed}\n",
                total_steps=3, target="local", launcher="local", host="localhost", created_by="t", run_dir="/x",
                group=group, arm=arm)


def test_head_is_alembics_head():
    from alembic.script import ScriptDirectory

    assert ScriptDirectory.from_config(migrate.alembic_config()).get_current_head() == migrate.HEAD


def _same_default(context, inspected_column, metadata_column, inspected, metadata_default, rendered) -> bool | None:
    """Alembic reports an empty-string server default as changed on SQLite (the database says
    ``('')``, the metadata renders ``''``): the same text, once quotes and parentheses are off, is
    the same default; anything else is left to Alembic's comparison."""
    def bare(text):
        return None if text is None else str(text).strip("()").strip("'")

    return False if inspected is not None and bare(inspected) == bare(rendered) else None


def test_a_new_store_gets_exactly_the_schema_the_store_queries(store):
    """Alembic's own comparison of the migrated database with ``schema.metadata``: no table,
    column, type, nullability, default or index differs."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    with engine_for(store.url).connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": _same_default})
        assert compare_metadata(context, metadata) == []
        assert migrate.current_revision(conn) == migrate.HEAD
        if conn.dialect.name == "postgresql":  # REAL is 4 bytes there: every float column must be DOUBLE PRECISION
            types = dict(conn.execute(sa.text("SELECT table_name || '.' || column_name, data_type FROM "
                                              "information_schema.columns WHERE table_schema = 'public'")).all())
            assert "real" not in types.values() and types["runs.created_at"] == "double precision"
            assert types["runs.events_offset"] == "bigint" and types["metrics.step"] == "bigint"


def test_a_store_file_made_before_alembic_opens_and_migrates(tmp_path):
    """A file the workbench made before its migrations were Alembic's (PRAGMA user_version 2, see
    the dump's header): every run, row and index survives; the audit table is added."""
    path = tmp_path / "runs.db"
    with sqlite3.connect(path) as db:
        db.executescript(BEFORE_ALEMBIC.read_text())
    store = RunStore(path)
    with engine_for(store.url).connect() as conn:
        assert migrate.current_revision(conn) == migrate.HEAD
        assert sa.inspect(conn).has_index("runs", UNIQUE_SEED_INDEX)
    assert sorted(r.id for r in store.runs()) == ["grpo-s0", "grpo-s1", "lone", "rloo-s0", "rloo-s1"]
    arms = store.arms("g")
    assert {arm: [r.seed for r in runs] for arm, runs in arms.items()} == {"grpo": [0, 1], "rloo": [0, 1]}
    run = store.get_run("grpo-s1")
    assert (run.status, run.last_step, run.tags, run.events_offset, run.events_inode, run.launch) == (
        "finished", 3, ["old"], 1234, "1:2", {"num_processes": 1})
    assert run.reward == pytest.approx(0.51)
    lone = store.get_run("lone")
    assert (lone.status, lone.error, lone.skipped_events, lone.handle, lone.notes) == (
        "failed", "ValueError: boom", 1, {"pid": 7}, "kept")
    assert lone.warnings and "skipped" in lone.warnings[0]
    frame = store.arm_metrics([r.id for runs in arms.values() for r in runs])
    assert len(frame) == 16 and set(frame.columns) >= {"reward", "kl"}
    scores = final_window_scores(frame, "reward", 0.25)
    assert scores.set_index("run_id").loc["rloo-s0", "score"] == pytest.approx(0.3)
    assert store.samples("grpo-s0").completion.tolist() == ["2"]
    assert store.diagnostics("rloo-s1", 3)["region_names"] == ["trust"]
    assert store.lens("grpo-s0") == [{"step": 3, "cosine": {"grpo": 1.0}}]
    with pytest.raises(RunError, match="already has arm 'grpo' with seed 1"):
        store.create_runs([_row("again", 1)])
    store.record_audit(AuditEntry(at=1.0, actor="ann", role="admin", auth="local OS user", action="delete", target="x"))
    assert [e.actor for e in store.audit_entries()] == ["ann"]
    with sqlite3.connect(path) as db:  # older code reading this file still finds it current
        assert db.execute("PRAGMA user_version").fetchone()[0] == 2
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_store_at_revision_0001_migrates_to_head(store_location):
    """A store left at the first revision by an older workbench (the PostgreSQL schema a team
    created before the audit log; the same on SQLite) migrates on open, its runs kept."""
    url = store_url(store_location)
    engine = engine_for(url)
    with engine.connect().execution_options(workbench_write=True) as conn, conn.begin():
        migrate.upgrade(conn, "0001")
    with engine.connect() as conn:
        assert migrate.current_revision(conn) == "0001"
        assert not sa.inspect(conn).has_table("audit")
    with engine.begin() as conn:  # a run as the older workbench wrote it
        conn.execute(sa.text("INSERT INTO runs (id, name, algorithm, status, target, launcher, host, created_by,"
                             " created_at, grp, recipe, run_dir, total_steps, arm, seed) VALUES ('old', 'grpo', 'grpo',"
                             " 'finished', 'local', 'local', 'localhost', 'ann', 1.5, 'g', 'name: grpo', '/x', 3,"
                             " 'grpo', 0)"))
        conn.execute(sa.text("INSERT INTO metrics VALUES ('old', 0, 2.25, '{\"reward\": 0.125}')"))
    store = RunStore(store_location)
    with engine.connect() as conn:
        assert migrate.current_revision(conn) == migrate.HEAD
    run = store.get_run("old")
    assert (run.created_at, run.seed, run.status) == (1.5, 0, "finished")
    assert store.metrics(["old"]).to_dict("records") == [{"run_id": "old", "step": 0, "time": 2.25, "reward": 0.125}]
    store.record_audit(AuditEntry(at=2.0, actor="bob", role="member", auth="oidc", action="launch", target="old"))
    assert store.audit_entries()[0].target == "old"


def test_processes_opening_a_new_store_at_once_migrate_it_once(store_location, tmp_path):
    """Three processes open the same new store at the same moment (each says it is ready, then
    waits for a start file): each opens it, the schema is made once, and each can write."""
    start = tmp_path / "go"
    code = ("import sys, time, pathlib\nfrom workbench.runs.store import RunStore\n"
            "go = pathlib.Path(sys.argv[2])\nprint('ready', flush=True)\nwhile not go.exists(): time.sleep(0.002)\n"
            "store = RunStore(sys.argv[1])\n"
            "store.create_run(run_id=sys.argv[3], name='r', algorithm='grpo', recipe_yaml='name: r', total_steps=1,"
            " target='local', launcher='local', host='localhost', created_by='t', run_dir='/x')\nprint('ok')")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(store_location), str(start), f"r{i}"], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    assert [p.stdout.readline() for p in procs] == ["ready\n"] * 3
    start.touch()
    results = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in procs]
    assert [r[:2] for r in results] == [(0, "ok\n")] * 3, results
    store = RunStore(store_location)
    assert sorted(r.id for r in store.runs()) == ["r0", "r1", "r2"]
    with engine_for(store.url).connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM alembic_version")).scalar() == 1


def test_a_bad_workbench_db_from_the_cli_is_one_line_exit_2_without_the_password(tmp_path, monkeypatch):
    """A server that is not there (nothing listens on port 1): one line naming the URL, password hidden."""
    monkeypatch.setenv("WORKBENCH_DB", "postgresql://ann:s3cret@127.0.0.1:1/runs")
    res = cli(tmp_path, "runs", "list")
    assert_one_line_error(res, "run store postgresql+psycopg://ann:***@127.0.0.1:1/runs cannot be used", "refused")
    assert "s3cret" not in res.stderr


@pytest.mark.parametrize("value, shown", [
    ("mysql://ann:s3cret@db.example/runs", "WORKBENCH_DB='mysql://ann:***@db.example/runs' is not allowed (driver 'mysql')"),
    ("postgresql://ann:s3cret@db.example", "WORKBENCH_DB='postgresql+psycopg://ann:***@db.example' names no database"),
    ("sqlite://", "WORKBENCH_DB='sqlite://' names no file"),
    ("ann:s3cret@db", "WORKBENCH_DB='ann:s3cret@db' is not a database URL"),  # no scheme: nothing says what is secret
    ("x://ann:s3cret@db/runs", "WORKBENCH_DB='x://ann:***@db/runs' is not allowed"),
])
def test_a_bad_workbench_db_names_the_variable_and_what_is_allowed(monkeypatch, value, shown):
    monkeypatch.setenv("WORKBENCH_DB", value)
    with pytest.raises(StoreError) as err:
        RunStore()
    message = str(err.value)
    assert "\n" not in message and message.startswith(shown), message
    assert message.endswith("allowed: sqlite:///PATH or postgresql[+psycopg]://USER[:PASSWORD]@HOST[:PORT]/DATABASE")


def test_workbench_db_chooses_the_default_store(tmp_path, monkeypatch, postgres_url):
    """``RunStore()`` (what every command and page opens) is the SQLite file of the home unless
    WORKBENCH_DB names another store; ``postgresql://`` means psycopg 3."""
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))
    monkeypatch.delenv("WORKBENCH_DB", raising=False)
    assert RunStore().path == tmp_path / "runs.db"
    monkeypatch.setenv("WORKBENCH_DB", postgres_url.replace("postgresql+psycopg://", "postgresql://"))
    store = RunStore()
    assert store.path is None and store.backend == "postgresql" and store.url.drivername == "postgresql+psycopg"
    store.create_runs([_row("pg", 0)])
    assert [r.id for r in RunStore(postgres_url).runs()] == ["pg"] and not RunStore(tmp_path / "runs.db").runs()
