"""A real PostgreSQL server on 127.0.0.1 for the run-store tests (Debian's ``postgresql`` package).

The cluster lives in a temp dir under /tmp: ``initdb -A trust`` then ``pg_ctl start`` listening on a free
127.0.0.1 port with its socket in that dir, as the unprivileged ``postgres`` user when the tests run
as root (PostgreSQL refuses to run as root; the dir is handed to that user), as the current user
otherwise. ``fsync=off``: a test cluster is thrown away, and syncing made each test database
cost ~0.5 s. Each test gets a database of its own (``CREATE DATABASE``, ~0.1 s) so tests stay
independent; the server is started once per session and stopped at its end
(``pg_ctl stop -m immediate``: the cluster is thrown away, so nothing needs a clean checkpoint),
or by a detached watcher once the test process is gone (a session killed before its teardown).

If the server binaries are missing they are installed with apt-get when running as root;
otherwise the tests skip locally and FAIL under ``CI=true`` (``tests.helpers.missing_component``).
"""

from __future__ import annotations

import glob
import itertools
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import apt_install, missing_component
from tests.runs.sshd import free_port

SERVER_USER = "postgres"  # the Debian package's system user, who runs the server when we are root
SUPERUSER = "workbench"  # the cluster's superuser role the tests connect as


def _bin_dir() -> Path | None:
    """The newest installed server's bin dir (Debian: /usr/lib/postgresql/VERSION/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def ensure_postgres() -> Path:
    """The server's bin dir, installing Debian's ``postgresql`` with apt-get if root and it is missing."""
    bin_dir = _bin_dir()
    if bin_dir is not None:
        return bin_dir
    problem = apt_install(["postgresql"], lambda: _bin_dir() is not None)
    if problem:
        missing_component(f"PostgreSQL is required: {problem}")
    bin_dir = _bin_dir()
    return bin_dir


@dataclass
class PostgresServer:
    bin_dir: Path
    workdir: Path
    data_dir: Path
    port: int
    as_user: list[str]
    log: Path
    _names: itertools.count = field(default_factory=lambda: itertools.count())

    def url(self, database: str = "postgres", user: str = SUPERUSER) -> str:
        return f"postgresql+psycopg://{user}@127.0.0.1:{self.port}/{database}"

    def admin(self, sql: str, database: str = "postgres") -> None:
        """Run one statement as the superuser, outside a transaction (CREATE / DROP DATABASE)."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, dbname=database,
                             autocommit=True) as conn:
            conn.execute(sql)

    def new_database(self, prefix: str = "t") -> str:
        """A fresh, empty database; returns its URL."""
        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        self.admin(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        subprocess.run([*self.as_user, str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "-w",
                        "stop"], capture_output=True, timeout=60)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_postgres() -> PostgresServer:
    """initdb a cluster in a new temp dir under /tmp and start it on a free 127.0.0.1 port (~2 s).
    /tmp, not pytest's tmp_path: as root, the ``postgres`` user must be able to reach the dir."""
    bin_dir = ensure_postgres()
    workdir = Path(tempfile.mkdtemp(prefix="workbench-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # the server refuses root: run it as the package's postgres user
        if shutil.which("runuser") is None:
            missing_component("PostgreSQL tests as root need runuser (util-linux) to start the server as 'postgres'")
        shutil.chown(workdir, SERVER_USER, SERVER_USER)
        as_user = ["runuser", "-u", SERVER_USER, "--"]
    data_dir, log = workdir / "data", workdir / "server.log"
    init = subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data_dir), "-A", "trust", "-U", SUPERUSER,
                           "--no-sync", "-E", "UTF8", "--locale", "C"], capture_output=True, text=True, timeout=120)
    if init.returncode != 0:
        pytest.fail(f"initdb failed: {init.stderr[-2000:]}")
    port = free_port()
    options = (f"-p {port} -k {workdir} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off"
               " -c full_page_writes=off -c max_connections=200")
    start = subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-o", options, "-l", str(log),
                            "-w", "-t", "60", "start"], capture_output=True, text=True, timeout=90)
    server = PostgresServer(bin_dir, workdir, data_dir, port, as_user, log)
    if start.returncode != 0:
        server.stop()
        pytest.fail(f"pg_ctl start failed: {start.stderr[-1000:]} {log.read_text()[-2000:] if log.exists() else ''}")
    _stop_when_gone(server, os.getpid())
    return server


def _stop_when_gone(server: PostgresServer, pid: int) -> None:
    """A detached watcher that stops the server and removes its dir once process ``pid`` (this
    test session) is gone: a session killed before its teardown (a CI timeout, SIGKILL) must not
    leave a server running."""
    stop = shlex.join([*server.as_user, str(server.bin_dir / "pg_ctl"), "-D", str(server.data_dir), "-m", "immediate",
                       "-w", "stop"])
    watch = f"while kill -0 {pid} 2>/dev/null; do sleep 2; done; {stop}; rm -rf {shlex.quote(str(server.workdir))}"
    subprocess.Popen(["sh", "-c", watch], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
