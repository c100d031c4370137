"""``python -m workbench db status | upgrade | copy`` (issue 21): a team's SQLite store moved to a real
PostgreSQL server (``tests/runs/postgres.py``, one server for the session) and back, read through the
functions the UI and ``compare`` use; a non-empty target, a bad URL and a non-admin are refused in one
line with nothing written; the explicit upgrade of a store made before Alembic.

The source store is filled through the real store API and service: runs of a comparison group
ingested as events (with lines holding NaN and inf, which ingest skips and counts), samples,
diagnostics and lens payloads, and audit entries written by the service's actions.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from tests.runs.test_arms import _synthetic_group
from tests.runs.test_migrations import BEFORE_ALEMBIC
from tests.test_cli import REPO, assert_one_line_error
from workbench.runs import Principal, RunStore, Settings, edit_run
from workbench.runs.apitokens import create_token
from workbench.runs.authz import PermissionDenied, local_principal, local_user_name
from workbench.runs.database import dispose_engines, engine_for, store_url
from workbench.runs.dbtools import copy_database
from workbench.runs.migrate import HEAD
from workbench.runs.records import RunError
from workbench.runs.schema import metadata
from workbench.runs.service import record_event
from workbench.runs.settings import RoleMapping, save_settings

ALICE = Principal("alice", "member", "OpenID Connect", address="10.0.0.8")
ADMIN = Principal("root", "admin", "OpenID Connect", address="10.0.0.7")
TINY = 5e-324  # the smallest denormal double: a float column must hold it bit for bit
EXACT = 0.1 + 0.2  # 0.30000000000000004


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """``python -m workbench ARGV`` run by its ``main`` in this process (a subprocess costs seconds of
    imports each), with ``home`` as the workbench home and ``WORKBENCH_DB=db`` (None: unset): the
    exit code and what it printed, as ``subprocess.run`` gives them."""
    from workbench.cli import main

    def run(home: Path, *argv: str, db: str | None = None) -> SimpleNamespace:
        capsys.readouterr()
        with monkeypatch.context() as env:
            env.setenv("WORKBENCH_HOME", str(home))
            if db is None:
                env.delenv("WORKBENCH_DB", raising=False)
            else:
                env.setenv("WORKBENCH_DB", db)
            code = main(list(argv))
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    return run


def python_m_workbench(home: Path, *argv: str) -> subprocess.CompletedProcess:
    """The same through ``python -m workbench`` in a process of its own (once: the entry point)."""
    env = {**{k: v for k, v in os.environ.items() if k != "WORKBENCH_DB"}, "WORKBENCH_HOME": str(home),
           "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "workbench", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def _fill(store: RunStore) -> None:
    """Every table of the schema gets rows, through ingest and the service."""
    _synthetic_group(store)  # group g: two arms x three seeds of metrics events, finished; run "other"
    store.ingest("grpo-s0", [  # lines of events.jsonl as the collector parses them: NaN / inf are skipped and counted
        json.loads('{"kind": "metrics", "step": 20, "time": 21.0, "metrics": {"reward": NaN}}'),
        json.loads('{"kind": "metrics", "step": 21, "time": 22.0, "metrics": {"reward": Infinity}}'),
        {"kind": "samples", "step": 9, "time": 10.0, "samples": [{"prompt": "1+1", "completion": "2", "reward": 1.0}]},
        {"kind": "diagnostics", "step": 9, "time": 10.0, "ratio": [0.9, 1.1], "note": "ünïcode ✓"},
        {"kind": "lens", "step": 9, "time": 10.0, "tokens": ["a", "b"], "logprob": [-0.5, -1e-300]},
    ])
    store.ingest("other", [{"kind": "metrics", "step": 0, "time": 1.0, "metrics": {"reward": TINY, "kl": EXACT}}])
    edit_run("grpo-s1", principal=ADMIN, notes="best seed", tags=["keep"], store=store)
    record_event(ALICE, "sign_in", detail="oidc", store=store)
    record_event(ALICE, "sign_out", store=store)
    create_token(ADMIN, user="alice", role="member", days=30, label="laptop", store=store)  # its hash, never the secret


def _dump(url: str) -> dict[str, list[tuple]]:
    """Every row of every schema table, by primary key (the audit log without the copies' own entries)."""
    with engine_for(store_url(url)).connect() as conn:
        dump = {t.name: [tuple(r) for r in conn.execute(sa.select(t).order_by(*t.primary_key.columns))]
                for t in metadata.sorted_tables}
    dump["audit"] = [r for r in dump["audit"] if r[5] not in ("db_copy", "db_upgrade")]
    return dump


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, str]:
    """A workbench home whose settings make this OS user an admin of server databases (the CLI's
    role there), and a filled SQLite store in it."""
    home = tmp_path_factory.mktemp("home")
    save_settings(Settings(roles=RoleMapping(cli_roles={local_user_name(): "admin"})), home)
    path = home / "runs.db"
    _fill(RunStore(path))
    return home, f"sqlite:///{path}"


def test_sqlite_to_postgres_and_back_keeps_every_row_and_the_verdicts(run_cli, source, postgres_server, tmp_path):
    home, sqlite_url = source
    pg = postgres_server.new_database()
    pg_with_password = pg.replace("workbench@", "workbench:s3cret@")  # trust auth ignores it; no output shows it
    to_pg = python_m_workbench(home, "db", "copy", "--from", sqlite_url, "--to", pg_with_password, "--batch", "7")
    assert to_pg.returncode == 0, to_pg.stderr
    assert "s3cret" not in to_pg.stdout + to_pg.stderr and "workbench:***@" in to_pg.stdout
    back = tmp_path / "back.db"
    to_sqlite = run_cli(home, "db", "copy", "--from", pg, "--to", str(back))
    assert to_sqlite.returncode == 0, to_sqlite.stderr

    original = _dump(sqlite_url)
    assert all(original[t.name] for t in metadata.sorted_tables)  # every table was exercised
    assert _dump(pg) == original and _dump(f"sqlite:///{back}") == original  # ids, text, floats: exact
    lines = dict(line.split() for line in to_pg.stdout.splitlines()[1:])
    assert {t: int(n) for t, n in lines.items()} == {t: len(rows) for t, rows in original.items()}

    stores = [RunStore(sqlite_url), RunStore(pg), RunStore(back)]
    for store in stores:  # what the store says of the runs: the NaN / inf lines were skipped, floats exact
        run = store.get_run("grpo-s0")
        assert run.skipped_events == 2 and "not finite" in " ".join(run.warnings)
        other = store.get_run("other")
        assert other.reward == TINY and store.metrics(["other"])["kl"].tolist() == [EXACT]
        assert store.get_run("grpo-s1").notes == "best seed" and store.diagnostics("grpo-s0", 9)["note"] == "ünïcode ✓"
    # the arms view and the Compare page read arm_metrics (workbench/ui/compare_page.py): identical frames
    arms = [{arm: [r.id for r in runs] for arm, runs in s.arms("g").items()} for s in stores]
    assert arms[0] == arms[1] == arms[2] and len(arms[0]) == 2
    ids = [i for runs in arms[0].values() for i in runs]
    frames = [s.arm_metrics(ids) for s in stores]
    for frame in frames[1:]:
        assert frame.equals(frames[0])
    # the verdict table (`compare`, the same functions as the UI's verdict table), from either backend
    verdicts = [run_cli(home, "compare", "g", db=db) for db in (sqlite_url, pg, f"sqlite:///{back}")]
    assert verdicts[0].returncode == 0 and "reward" in verdicts[0].stdout, verdicts[0].stderr
    assert verdicts[0].stdout == verdicts[1].stdout == verdicts[2].stdout

    # the copy is in the target's audit log, as the CLI's principal; no password
    pg_store = stores[1]
    entry = pg_store.audit_entries(action="db_copy")[0]
    assert (entry.actor, entry.role, entry.auth, entry.address) == (local_user_name(), "admin", "local OS user", "")
    assert entry.detail.startswith(f"from {sqlite_url}: ") and "metrics 61" in entry.detail
    # sequences reset: new entries and runs land after the copied ids, no collision
    before = len(original["audit"]) + 1
    record_event(ADMIN, "sign_in", store=pg_store)
    pg_store.create_run(run_id="new-run", name="new", algorithm="grpo", recipe_yaml="name: new\n", total_steps=3,
                        target="local", launcher="local", host="localhost", created_by="t", run_dir="/nonexistent")
    assert pg_store.ingest("new-run", [{"kind": "metrics", "step": 0, "time": 1.0, "metrics": {"reward": 0.5}}]) == 1
    with engine_for(store_url(pg)).connect() as conn:
        audit_ids = conn.execute(sa.text("SELECT id FROM audit ORDER BY id")).scalars().all()
    assert audit_ids == list(range(1, before + 2))

    status = run_cli(home, "db", "status", "--url", pg_with_password)
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[:3] == ["backend   postgresql", f"url       {pg.replace('workbench@', 'workbench:***@')}",
                                              f"revision  {HEAD} (code's head {HEAD}: current)"]
    counts = dict(line.split() for line in status.stdout.splitlines()[3:])
    assert counts["runs"] == str(len(original["runs"]) + 1) and counts["audit"] == str(before + 1)


def test_a_target_that_holds_rows_is_refused_and_left_as_it_was(run_cli, source, postgres_server, tmp_path):
    home, sqlite_url = source
    pg = postgres_server.new_database()
    record_event(ALICE, "sign_in", store=RunStore(pg))
    before = _dump(pg)
    res = run_cli(home, "db", "copy", "--from", sqlite_url, "--to", pg)
    assert_one_line_error(res, f"--to='{pg}' already holds rows (audit 1)", "a copy goes only into an empty store")
    assert _dump(pg) == before
    full = tmp_path / "full.db"
    record_event(ALICE, "sign_in", store=RunStore(full))
    res = run_cli(home, "db", "copy", "--from", sqlite_url, "--to", str(full))
    assert_one_line_error(res, "already holds rows (audit 1)")
    assert len(RunStore(full).audit_entries()) == 1


def test_bad_input_is_one_line_and_leaves_nothing(run_cli, source, tmp_path):
    home, sqlite_url = source
    res = run_cli(home, "db", "copy", "--from", "mysql://bob:hunter2@db/runs", "--to", str(tmp_path / "a.db"))
    assert_one_line_error(res, "--from='mysql://bob:***@db/runs' is not allowed (driver 'mysql')",
                          "allowed: sqlite:///PATH or postgresql")
    assert "hunter2" not in res.stderr
    assert_one_line_error(run_cli(home, "db", "copy", "--from", sqlite_url), "db copy needs --from URL", "--to URL")
    assert_one_line_error(run_cli(home, "db", "copy", "--from", str(tmp_path / "nope.db"), "--to", str(tmp_path / "b.db")),
                          "--from=", "nope.db", "no such store file")
    assert_one_line_error(run_cli(home, "db", "copy", "--from", sqlite_url, "--to", sqlite_url), "the same store")
    assert_one_line_error(run_cli(home, "db", "status", "--to", "x"), "db status takes no --to; it takes: --url")
    assert_one_line_error(run_cli(home, "db", "copy", "--from", sqlite_url, "--to", str(tmp_path / "c.db"), "--batch", "0"),
                          "batch_rows=0 is not allowed")
    assert_one_line_error(run_cli(home, "db", "upgrade", "--url", str(tmp_path / "nope.db")), "no such store file")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_only_an_admin_copies_into_or_upgrades_a_server_database(run_cli, source, postgres_server, tmp_path):
    _, sqlite_url = source
    member_home = tmp_path / "member-home"  # no cli_roles: the CLI is a member on a server database
    member_home.mkdir()
    pg = postgres_server.new_database()
    for argv in (["copy", "--from", sqlite_url, "--to", pg], ["upgrade", "--url", pg]):
        res = run_cli(member_home, "db", *argv)
        assert_one_line_error(res, f"permission denied: database by {local_user_name()} (member, local OS user)",
                              "needs role admin")
    with engine_for(store_url(pg)).connect() as conn:
        assert sa.inspect(conn).get_table_names() == []  # not even the schema was made
    with pytest.raises(PermissionDenied):
        copy_database(store_url(sqlite_url), store_url(pg), ALICE)


def test_status_and_upgrade_of_a_store_made_before_alembic(run_cli, source, tmp_path):
    home, _ = source
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.executescript(BEFORE_ALEMBIC.read_text())
    status = run_cli(home, "db", "status", "--url", str(path))
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[2] == f"revision  - (code's head {HEAD}: behind: run `python -m workbench db upgrade`)"
    assert "  audit                 -" in status.stdout.splitlines()  # the table 0002 adds is not there yet
    assert "  api_tokens            -" in status.stdout.splitlines()  # nor 0003's
    up = run_cli(home, "db", "upgrade", "--url", str(path))
    assert (up.returncode, up.stdout) == (0, f"none -> {HEAD}\n"), up.stderr
    again = run_cli(home, "db", "upgrade", "--url", str(path))
    assert (again.returncode, again.stdout) == (0, f"{HEAD} -> {HEAD} (already at head)\n"), again.stderr
    entries = RunStore(path).audit_entries(action="db_upgrade")
    assert [(e.actor, e.role, e.detail) for e in entries] == [(local_user_name(), "admin", f"none -> {HEAD}")]
    # a command that does not train imports no torch (its own process: this one has torch loaded by other tests)
    code = (f"import sys\nfrom workbench.cli import main\ncode = main(['db', 'status', '--url', {str(path)!r}])\n"
            "print(code, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO),
                         "WORKBENCH_HOME": str(home)}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"revision  {HEAD} (code's head {HEAD}: current)" in out.stdout and out.stdout.splitlines()[-1] == "0 False"


def test_a_nan_stays_nan_between_postgres_databases_and_is_refused_by_sqlite(postgres_server, tmp_path):
    """PostgreSQL holds NaN in a float column; SQLite would read it back as NULL, so that copy is refused."""
    pg, other = postgres_server.new_database(), postgres_server.new_database()
    store = RunStore(pg)
    store.create_run(run_id="r", name="r", algorithm="grpo", recipe_yaml="name: r\n", total_steps=1, target="local",
                     launcher="local", host="localhost", created_by="t", run_dir="/nonexistent")
    store.update_run("r", reward=math.nan, started_at=math.inf)
    done = copy_database(store_url(pg), store_url(other), local_principal(), batch_rows=1)
    copied = RunStore(other).get_run("r")
    assert done.rows["runs"] == 1 and math.isnan(copied.reward) and copied.started_at == math.inf
    target = tmp_path / "nan.db"
    with pytest.raises(RunError, match=r"runs.reward of row id='r' is NaN, which a SQLite store cannot hold"):
        copy_database(store_url(pg), store_url(target), local_principal())
    assert list(tmp_path.iterdir()) == []  # the file the copy made is gone again
    dispose_engines()


def test_a_file_that_is_not_a_database_is_one_line_for_every_command(run_cli, source, tmp_path):
    """sqlite3 raises DatabaseError (not OperationalError) for such a file: each command says so in
    one line, exit 2, and neither changes the file nor leaves a target behind."""
    home, _ = source
    junk = tmp_path / "junk.db"
    junk.write_text("a text file, not a SQLite database\n")
    for argv in (("db", "status", "--url", str(junk)), ("db", "upgrade", "--url", str(junk)),
                 ("db", "copy", "--from", str(junk), "--to", str(tmp_path / "new.db"))):
        assert_one_line_error(run_cli(home, *argv), "junk.db cannot be used: file is not a database")
    assert junk.read_text() == "a text file, not a SQLite database\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.db"]


# -- db copy --runs-to DIR: run directories copied to another workbench home ------------------------------

RUN_IDS = ("r-cancelled", "r-failed", "r-finished")


def _tree(root: Path) -> dict[str, bytes | tuple[str, str]]:
    """Every entry under ``root``: a file's bytes, a link's target, a folder or a FIFO by its kind."""
    tree: dict[str, bytes | tuple[str, str]] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        tree[rel] = (("link", os.readlink(path)) if path.is_symlink() else ("dir", "") if path.is_dir()
                     else path.read_bytes() if path.is_file() else ("other", ""))
    return tree


def _team_store(home: Path, location: str | Path | None = None) -> str:
    """A store (default: ``home/runs.db``) with three ended runs, each with a real run directory
    under ``home/runs`` (recipe, events, log, a checkpoint with binary bytes and a relative link
    to it), a SLURM-like handle and a resume's previous handle naming paths inside it; the home's
    settings make this OS user an admin of server databases. Returns the store's URL."""
    from workbench.runs.launchers.base import file_identity

    save_settings(Settings(roles=RoleMapping(cli_roles={local_user_name(): "admin"})), home)
    url = str(location) if isinstance(location, str) else f"sqlite:///{location or home / 'runs.db'}"
    store = RunStore(url)
    for n, (run_id, status) in enumerate(zip(RUN_IDS, ("cancelled", "failed", "finished"))):
        run_dir = home.resolve() / "runs" / run_id
        (run_dir / "checkpoints" / "step-10").mkdir(parents=True)
        (run_dir / "recipe.yaml").write_text(f"name: {run_id}\n")
        (run_dir / "events.jsonl").write_text('{"kind": "metrics", "step": 0, "time": 1.0, "metrics": {"reward": 0.5}}\n')
        (run_dir / "stdout.log").write_text(f"step 0 of {run_id}\n" * (n + 1))
        (run_dir / "checkpoints" / "step-10" / "model.bin").write_bytes(bytes(range(256)) * (n + 3))
        os.symlink("step-10", run_dir / "checkpoints" / "latest")
        store.create_run(run_id=run_id, name=run_id, algorithm="grpo", recipe_yaml=f"name: {run_id}\n", total_steps=1,
                         target="slurm", launcher="slurm", host="login", created_by="t", run_dir=str(run_dir),
                         launch={"num_processes": 1, "resume": True,
                                 "previous_handle": {"job_id": "7", "script": f"{run_dir}/job.sbatch"}})
        store.update_run(run_id, handle={"job_id": "8", "script": f"{run_dir}/job.sbatch", "command": f"sbatch {run_dir}",
                                         "elsewhere": f"{run_dir}-other/x"},
                         events_inode=file_identity((run_dir / "events.jsonl").stat()))
        store.ingest(run_id, [{"kind": "metrics", "step": 0, "time": 1.0, "metrics": {"reward": 0.5}}])
        store.set_status(run_id, status)
    dispose_engines()
    return url


def _runs_rows(url: str) -> dict[str, dict]:
    with engine_for(store_url(url)).connect() as conn:
        return {r["id"]: dict(r) for r in conn.execute(sa.select(metadata.tables["runs"])).mappings()}


def _assert_copied(old_home: Path, old_url: str, new_home: Path, new_url: str, source_before: dict) -> None:
    """Every file byte-equal at DIR/runs/RUN_ID; the copied rows point there (and only the paths
    inside the old folder changed); the source's rows and folders are as they were; no staging left."""
    from workbench.runs.launchers.base import file_identity

    assert _dump(old_url) == source_before["rows"] and _tree(old_home / "runs") == source_before["tree"]
    old_rows, new_rows = _runs_rows(old_url), _runs_rows(new_url)
    assert sorted(new_rows) == list(RUN_IDS)
    assert sorted(p.name for p in (new_home / "runs").iterdir()) == list(RUN_IDS)  # no .db-copy-* left
    for run_id in RUN_IDS:
        old_dir, new_dir = old_home.resolve() / "runs" / run_id, new_home.resolve() / "runs" / run_id
        assert _tree(new_dir) == _tree(old_dir) and (new_dir / "checkpoints" / "latest" / "model.bin").is_file()
        old, new = old_rows[run_id], new_rows[run_id]
        assert new["run_dir"] == str(new_dir)
        handle, launch = json.loads(new["handle"]), json.loads(new["launch"])
        assert handle["script"] == f"{new_dir}/job.sbatch" and launch["previous_handle"]["script"] == f"{new_dir}/job.sbatch"
        # text that only mentions the path, and a sibling folder's path, are not paths into the run directory
        assert handle["command"] == f"sbatch {old_dir}" and handle["elsewhere"] == f"{old_dir}-other/x"
        assert new["events_inode"] == file_identity((new_dir / "events.jsonl").stat()) != old["events_inode"]
        unchanged = set(old) - {"run_dir", "handle", "launch", "events_inode"}
        assert {k: new[k] for k in unchanged} == {k: old[k] for k in unchanged}
    store = RunStore(new_url)  # what the store and the run's readers see at the new place
    assert store.get_run("r-finished").run_dir == str(new_home.resolve() / "runs" / "r-finished")
    assert store.metrics(["r-finished"])["reward"].tolist() == [0.5]


def _snapshot(home: Path, url: str) -> dict:
    return {"rows": _dump(url), "tree": _tree(home / "runs")}


def test_runs_to_copies_every_run_directory_to_sqlite_and_postgres(run_cli, postgres_server, tmp_path):
    home = tmp_path / "laptop"
    url = _team_store(home)
    before = _snapshot(home, url)
    new_home, target = tmp_path / "shared" / "team-home", tmp_path / "copy.db"  # neither exists yet: made
    res = run_cli(home, "db", "copy", "--from", url, "--to", str(target), "--runs-to", str(new_home))
    assert res.returncode == 0, res.stderr
    size = sum(len(v) for run_id in RUN_IDS for v in _tree(home / "runs" / run_id).values() if isinstance(v, bytes))
    assert res.stdout.splitlines()[-1] == f"run directories: 3 ({size} bytes) copied to {new_home.resolve() / 'runs'}"
    assert dict(line.split() for line in res.stdout.splitlines()[1:-1])["runs"] == "3"
    _assert_copied(home, url, new_home, f"sqlite:///{target}", before)
    entry = RunStore(target).audit_entries(action="db_copy")[0]
    assert f"run directories 3 ({size} bytes) copied to {new_home.resolve() / 'runs'}" in entry.detail

    pg, pg_home = postgres_server.new_database(), tmp_path / "server-home"
    pg_home.mkdir()
    (pg_home / "settings.yaml").write_text("{}\n")  # an existing home: its own files stay
    res = run_cli(home, "db", "copy", "--from", url, "--to", pg, "--runs-to", str(pg_home))
    assert res.returncode == 0, res.stderr
    _assert_copied(home, url, pg_home, pg, before)
    assert sorted(p.name for p in pg_home.iterdir()) == ["runs", "settings.yaml"]
    dispose_engines()


def _leave_running(home: Path, url: str) -> None:
    RunStore(url).create_run(run_id="r-running", name="r", algorithm="grpo", recipe_yaml="name: r\n", total_steps=1,
                             target="local", launcher="local", host="localhost", created_by="t",
                             run_dir=str(home.resolve() / "runs" / "r-finished"))
    RunStore(url).set_status("r-running", "running")


REFUSALS = {  # what is done to the source (home, url) or the target home; the CLI's --runs-to; the line's parts
    "active run": (_leave_running, None,
                   ["runs.status='running' of run 'r-running' is not allowed with --runs-to",
                    "its directory is still being written", "allowed: finished, failed, cancelled, lost",
                    "copy without --runs-to"]),
    "missing directory": (lambda home, url: shutil.rmtree(home / "runs" / "r-failed"), None,
                          ["runs.run_dir='", "r-failed' of run 'r-failed' is not a directory on this machine",
                           "copy without --runs-to"]),
    "target folder exists": (lambda home, url: (home.parent / "new" / "runs" / "r-finished").mkdir(parents=True), None,
                             ["--runs-to: '", "/new/runs/r-finished' (run 'r-finished') already exists",
                              "never overwrites a run directory"]),
    "link out of the run": (lambda home, url: os.symlink("/etc/passwd", home / "runs" / "r-cancelled" / "passwd"), None,
                            ["run 'r-cancelled': link '", "passwd' -> '/etc/passwd' leads outside its run directory",
                             "only relative links that stay inside it"]),
    "relative link out of the run": (
        lambda home, url: os.symlink("../r-failed/recipe.yaml", home / "runs" / "r-cancelled" / "x"), None,
        ["link '", "-> '../r-failed/recipe.yaml' leads outside its run directory"]),
    "fifo": (lambda home, url: os.mkfifo(home / "runs" / "r-finished" / "pipe"), None,
             ["run 'r-finished': '", "pipe' is not a file, folder or link"]),
    "a file as the home": (lambda home, url: (home.parent / "new").write_text("x"), None,
                           ["--runs-to='", "new' is not allowed: '", "new' is not a directory", "a workbench home"]),
    "under a file": (lambda home, url: (home.parent / "file").write_text("x"), "file/home",
                     ["--runs-to='", "file/home' is not allowed: '", "/file' is not a directory"]),
    "empty": (lambda home, url: None, "", ["--runs-to='' is not allowed"]),
    # what the read-only checks cannot see: the folders fail when made (the first, new/, is removed again)
    "a name too long": (lambda home, url: None, "new/" + "x" * 300,
                        ["--runs-to='", "is not allowed: '", "cannot be made or written there: File name too long",
                         "a workbench home is allowed"]),
    "a folder the system refuses": (lambda home, url: None, "/proc/workbench-home",
                                    ["--runs-to='/proc/workbench-home' is not allowed: '/proc/workbench-home/runs' "
                                     "cannot be made or written there: No such file or directory"]),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_runs_to_refusals_are_one_line_and_leave_nothing(run_cli, tmp_path, case):
    change, runs_to, parts = REFUSALS[case]
    home = tmp_path / "laptop"
    url = _team_store(home)
    change(home, url)
    before, around = _snapshot(home, url), sorted(p.name for p in tmp_path.iterdir())
    new_tree = _tree(tmp_path / "new") if (tmp_path / "new").is_dir() else None
    target = tmp_path / "copy.db"
    runs_to = str(tmp_path / ("new" if runs_to is None else runs_to)) if runs_to != "" else ""
    res = run_cli(home, "db", "copy", "--from", url, "--to", str(target), "--runs-to", runs_to)
    assert_one_line_error(res, *parts)
    assert sorted(p.name for p in tmp_path.iterdir()) == around  # no target file, no new home
    assert (_tree(tmp_path / "new") if (tmp_path / "new").is_dir() else None) == new_tree  # nothing added to one there
    assert _snapshot(home, url) == before


def test_runs_to_is_an_option_of_copy_only(run_cli, tmp_path):
    assert_one_line_error(run_cli(tmp_path, "db", "status", "--runs-to", str(tmp_path / "x")),
                          "db status takes no --runs-to; it takes: --url")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_failed_row_copy_leaves_no_copied_directory(postgres_server, tmp_path):
    """A NaN that a SQLite target refuses, after the folders were staged: the staging folder and the
    folders the copy made are removed; an existing home keeps only its own files."""
    home = tmp_path / "laptop"
    pg = _team_store(home, postgres_server.new_database())
    RunStore(pg).update_run("r-failed", reward=math.nan)
    new_home = tmp_path / "new"
    new_home.mkdir()
    (new_home / "settings.yaml").write_text("{}\n")
    for runs_to in (new_home, tmp_path / "made" / "home"):
        with pytest.raises(RunError, match=r"runs.reward of row id='r-failed' is NaN"):
            copy_database(store_url(pg), store_url(tmp_path / "copy.db"), local_principal(), runs_to=runs_to)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["laptop", "new"]
        assert sorted(p.name for p in new_home.iterdir()) == ["settings.yaml"]
    dispose_engines()


def test_a_run_added_during_the_copy_undoes_it(monkeypatch, tmp_path):
    """The rows are read again in the copy's snapshot: a run the plan did not see refuses the copy,
    and the staged folders go."""
    from workbench.runs import dbtools

    home = tmp_path / "laptop"
    url = _team_store(home)
    real_stage = dbtools.stage_run_dirs

    def stage_then_add(plan):
        staged = real_stage(plan)
        RunStore(url).create_run(run_id="late", name="late", algorithm="grpo", recipe_yaml="name: late\n", total_steps=1,
                                 target="local", launcher="local", host="localhost", created_by="t", run_dir="/x")
        return staged

    monkeypatch.setattr(dbtools, "stage_run_dirs", stage_then_add)
    with pytest.raises(RunError, match="run 'late' changed in the source during the copy"):
        copy_database(store_url(url), store_url(tmp_path / "copy.db"), local_principal(), runs_to=tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["laptop"]


def test_a_rename_that_fails_after_the_commit_says_what_is_where(monkeypatch, tmp_path):
    from workbench.runs import runcopy

    home = tmp_path / "laptop"
    url = _team_store(home)
    real_rename, calls = os.rename, []

    def rename_once(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise PermissionError(13, "Permission denied")
        real_rename(src, dst)

    monkeypatch.setattr(runcopy.os, "rename", rename_once)
    new_home = tmp_path / "new"
    with pytest.raises(runcopy.PlacementError) as err:
        copy_database(store_url(url), store_url(tmp_path / "copy.db"), local_principal(), runs_to=new_home)
    staging = next((new_home / "runs").glob(".db-copy-*"))
    message = str(err.value)
    assert "the rows were copied (committed)" in message and "run 'r-failed'" in message
    assert f"1 of 3 run directories are in place, the other 2 are in '{staging}'" in message
    assert sorted(p.name for p in staging.iterdir()) == ["r-failed", "r-finished"]
    assert sorted(_runs_rows(f"sqlite:///{tmp_path / 'copy.db'}")) == list(RUN_IDS)
