"""A real SLURM cluster on this machine for the launcher and export tests.

Debian's SLURM 22.05 (``slurmctld``, ``slurmd``, ``munge``), started as child processes of the
test session in a temp dir: ``munged`` with a fresh key, ``slurmctld -D -i`` and two ``slurmd -D
-N NODE`` (SLURM's "multiple slurmd" mode: two nodes on one machine, so the multi-node sbatch
script really gets two nodes). The nodes are named after this machine's hostname and
``localhost``, names that resolve here, as the sbatch script uses node names as addresses. Each
node has 1 CPU and 1 (fake, file-backed) GPU: two slots, so a third job waits PENDING.

The default cluster has no accounting (``accounting_storage/none``: ``sacct`` fails with "Slurm
accounting storage is disabled"): the launcher must read a finished job's state from the
controller (``scontrol show job``, kept for MinJobAge = 300 s). ``start_cluster(accounting=True)``
adds SLURM's accounting as a site runs it: a MariaDB server (``mariadbd``, its own data folder and
port on 127.0.0.1) behind ``slurmdbd`` (``accounting_storage/slurmdbd``), and a short MinJobAge so
that the controller forgets a finished job within seconds and only ``sacct`` still knows how it
ended. Jobs run as root, with the submitter's environment (sbatch's default ``--export=ALL``);
clients reach the cluster through ``SLURM_CONF``.

If SLURM is missing it is installed with apt-get when running as root; otherwise the tests skip
locally and FAIL under ``CI=true`` (tests/helpers.py ``missing_component``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import apt_install, missing_component
from workbench.runs.launchers.slurm import scontrol_record  # the launcher's own reader of `scontrol show job -o`

PACKAGES = ("slurm-wlm", "slurmctld", "slurmd", "slurm-client", "munge")
PROGRAMS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
ACCOUNTING_PACKAGES = ("slurmdbd", "mariadb-server", "mariadb-client")
ACCOUNTING_PROGRAMS = ("slurmdbd", "mariadbd", "mariadb-install-db", "mariadb", "sacct", "sacctmgr")
DB_USER, DB_NAME = "slurm", "slurm_acct_db"
START_TIMEOUT_S = 30.0


def _missing(reason: str):
    missing_component(f"a SLURM cluster is required: {reason}")


def _installed(programs: tuple[str, ...] = PROGRAMS) -> bool:
    return all(shutil.which(p) or os.access(f"/usr/sbin/{p}", os.X_OK) for p in programs)


def ensure_slurm(accounting: bool = False) -> None:
    """SLURM's daemons and clients (and with ``accounting``, slurmdbd and MariaDB) are on this
    machine (installed with apt-get if root and missing)."""
    problem = apt_install(list(PACKAGES), _installed)
    if not problem and accounting:
        problem = apt_install(list(ACCOUNTING_PACKAGES), lambda: _installed(ACCOUNTING_PROGRAMS))
    if problem:
        _missing(problem)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class SlurmCluster:
    """A running cluster: its config, node names (in SLURM's order) and the daemons this fixture started."""

    workdir: Path
    conf: Path
    nodes: tuple[str, ...]
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """What a client needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """A SLURM client command against this cluster."""
        done = subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def job(self, job_id: str) -> dict[str, str]:
        """The controller's record of a job ({} once it has forgotten it)."""
        done = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        return scontrol_record(done.stdout) if done.returncode == 0 else {}

    def wait_job(self, job_id: str, predicate, timeout: float = 60.0, what: str = "the expected state") -> dict[str, str]:
        """Poll the job's record until ``predicate(record)``; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.job(job_id)
            if predicate(record):
                return record
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} did not reach {what} in {timeout} s: {record}")
            time.sleep(0.2)

    def node_states(self) -> dict[str, str]:
        """{node: state} as sinfo prints them (idle, alloc, down ...)."""
        done = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)  # {} while the controller starts
        return dict(line.split() for line in done.stdout.splitlines() if line.strip()) if done.returncode == 0 else {}

    def wait_idle(self, timeout: float = START_TIMEOUT_S) -> None:
        """Every node idle and no job in the queue (a clean cluster for the next test)."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states() if self._alive() else {}
            queue = self.run("squeue", "-h", "-o", "%i %T", check=False).stdout.strip()
            if states and set(states.values()) == {"idle"} and not queue:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the SLURM cluster is not idle after {timeout} s: nodes {states}, queue "
                                     f"{queue!r}; logs in {self.workdir / 'log'}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of every daemon's log (errors of the pmix plugin, missing here, left out)."""
        out = []
        for path in sorted((self.workdir / "log").glob("*.log")):
            kept = [line for line in path.read_text(errors="replace").splitlines() if "pmix" not in line]
            out.append(f"== {path.name}\n" + "\n".join(kept[-lines:]))
        return "\n".join(out)

    def _alive(self) -> bool:
        dead = {name: p.returncode for name, p in self.processes.items() if p.poll() is not None}
        if dead:
            logs = "\n".join(f"{p.name}: {p.read_text()[-800:]}" for p in sorted((self.workdir / "log").glob("*")))
            raise AssertionError(f"SLURM daemons exited: {dead}\n{logs}")
        return True

    def stop(self) -> None:
        """Cancel whatever still runs in the cluster, then stop the daemons this fixture started,
        newest first (nodes, controller, slurmdbd, MariaDB, munged last), each by its own process."""
        if self.processes.get("slurmctld") is not None and self.processes["slurmctld"].poll() is None:
            self.run("scancel", "--user", str(os.getuid()), check=False)
            deadline = time.monotonic() + 20
            while self.run("squeue", "-h", check=False).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.2)
        for name in reversed(list(self.processes)):
            process = self.processes.get(name)
            if process is None or process.poll() is not None:
                continue
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _config(d: Path, nodes: tuple[str, ...], hostname: str, dbd_port: int | None = None,
            min_job_age: int = 300) -> str:
    """slurm.conf: one default partition ``debug`` of ``nodes`` (1 CPU + 1 GPU each), everything
    under ``d``, its own ports, jobs requeued after a node failure; accounting through the slurmdbd
    at ``dbd_port`` (None: no accounting); a finished job kept by the controller ``min_job_age`` s."""
    lines = [
        "ClusterName=workbench-test",
        f"SlurmctldHost={hostname}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={free_port()}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={d / 'run' / 'munge.sock'}",
        f"StateSaveLocation={d / 'state'}",
        f"SlurmdSpoolDir={d / 'spool' / '%n'}",
        f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={d / 'run' / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={d / 'log' / 'slurmd-%n.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        *(["AccountingStorageType=accounting_storage/none"] if dbd_port is None else [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=localhost",
            f"AccountingStoragePort={dbd_port}",
            f"AccountingStoragePass={d / 'run' / 'munge.sock'}",  # slurmdbd's munge: this cluster's socket
        ]),
        f"MinJobAge={min_job_age}",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0",
        "ReturnToService=1",  # a node an admin set DOWN stays down until `state=resume`
        "JobRequeue=1",
        "KillWait=10",
        "GresTypes=gpu",
    ]
    for node in nodes:  # multiple slurmd: one port each, every node this machine (127.0.0.1)
        lines.append(f"NodeName={node} NodeHostname={hostname} NodeAddr=127.0.0.1 Port={free_port()} "
                     "CPUs=1 RealMemory=1000 Gres=gpu:1 State=UNKNOWN")
    lines.append(f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _dbd_config(d: Path, dbd_port: int, db_port: int, password: str) -> str:
    """slurmdbd.conf: slurmdbd on ``dbd_port`` storing into the MariaDB at 127.0.0.1:``db_port``."""
    return "\n".join([
        "AuthType=auth/munge",
        f"AuthInfo=socket={d / 'run' / 'munge.sock'}",
        "DbdHost=localhost",
        f"DbdPort={dbd_port}",
        "SlurmUser=root",
        f"LogFile={d / 'log' / 'slurmdbd.log'}",
        f"PidFile={d / 'run' / 'slurmdbd.pid'}",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={db_port}",
        f"StorageUser={DB_USER}",
        f"StoragePass={password}",
        f"StorageLoc={DB_NAME}",
    ]) + "\n"


def _wait_for(what: str, ready, cluster: "SlurmCluster", timeout: float = START_TIMEOUT_S) -> None:
    """Poll ``ready()`` until true (a daemon's socket, port or answer); AssertionError after ``timeout``
    or as soon as a daemon this fixture started has exited."""
    deadline = time.monotonic() + timeout
    while not ready():
        cluster._alive()
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not ready in {timeout} s")
        time.sleep(0.05)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_cluster(*, accounting: bool = False, node_count: int = 2, min_job_age: int = 300) -> SlurmCluster:
    """munged, slurmctld and ``node_count`` slurmd (1 or 2) in a fresh folder under /tmp (mode 0755
    up to /: munged refuses a socket in a folder others cannot enter, and pytest's temp folders are
    0700; removed by ``stop``); with ``accounting``, a MariaDB server and slurmdbd before the
    controller. Returns once every node is idle."""
    ensure_slurm(accounting)
    hostname = socket.gethostname()
    if hostname == "localhost":
        _missing("this machine's hostname is 'localhost'; the test cluster names its second node so")
    nodes = (hostname, "localhost")[:node_count]
    d = Path(tempfile.mkdtemp(prefix="workbench-slurm-"))
    d.chmod(0o755)
    for sub in ("run", "state", "spool", "log", "dev"):
        (d / sub).mkdir(parents=True, exist_ok=True)
        (d / sub).chmod(0o755)
    key_dir = d / "munge-key"
    key_dir.mkdir(mode=0o700)
    subprocess.run(["mungekey", "-c", "-k", str(key_dir / "munge.key")], check=True, capture_output=True)
    for node in nodes:
        (d / "spool" / node).mkdir()
    (d / "dev" / "gpu0").touch()  # the nodes' GPU: a file (task/none constrains no device)
    (d / "gres.conf").write_text(f"Name=gpu File={d / 'dev' / 'gpu0'}\n")
    dbd_port = free_port() if accounting else None
    conf = d / "slurm.conf"
    conf.write_text(_config(d, nodes, hostname, dbd_port, min_job_age))
    cluster = SlurmCluster(d, conf, nodes)
    log = d / "log"

    def daemon(name: str, argv: list[str]) -> None:
        cluster.processes[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=open(log / f"{name}.out", "wb"),
                                                   stderr=subprocess.STDOUT, env={**os.environ, **cluster.env})

    try:
        daemon("munged", ["munged", "-F", f"--key-file={key_dir / 'munge.key'}", f"--socket={d / 'run' / 'munge.sock'}",
                          f"--pid-file={d / 'run' / 'munged.pid'}", f"--log-file={log / 'munged.log'}",
                          f"--seed-file={d / 'run' / 'munge.seed'}"])
        _wait_for("munged's socket", (d / "run" / "munge.sock").exists, cluster)
        if dbd_port is not None:
            _start_accounting(cluster, daemon, dbd_port)
        daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(conf)])
        for node in nodes:
            daemon(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(conf)])
        cluster.wait_idle()
    except BaseException as err:
        cluster.stop()
        if isinstance(err, AssertionError):
            _missing(f"the test cluster did not start: {err}")
        raise
    return cluster


def _start_accounting(cluster: SlurmCluster, daemon, dbd_port: int) -> None:
    """MariaDB (a fresh data folder, TCP on 127.0.0.1 only, root through its own socket), a user
    for slurmdbd, then slurmdbd itself (its conf beside slurm.conf, mode 600 as it demands)."""
    d = cluster.workdir
    data, sock, db_port = d / "mariadb", d / "run" / "mariadb.sock", free_port()
    subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                    "--auth-root-authentication-method=socket", "--skip-test-db"],
                   check=True, capture_output=True, timeout=120)
    daemon("mariadbd", ["mariadbd", "--no-defaults", "--user=root", f"--datadir={data}", f"--socket={sock}",
                        f"--port={db_port}", "--bind-address=127.0.0.1", f"--pid-file={d / 'run' / 'mariadbd.pid'}",
                        "--skip-log-bin", "--innodb-buffer-pool-size=64M"])
    _wait_for("MariaDB's port", lambda: _port_open(db_port), cluster, timeout=60)
    password = os.urandom(12).hex()
    grant = (f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{password}'; "
             f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';")
    subprocess.run(["mariadb", "--no-defaults", f"--socket={sock}", "-u", "root", "-e", grant],
                   check=True, capture_output=True, timeout=60)
    dbd_conf = d / "slurmdbd.conf"
    dbd_conf.write_text(_dbd_config(d, dbd_port, db_port, password))
    dbd_conf.chmod(0o600)
    daemon("slurmdbd", ["slurmdbd", "-D"])  # reads slurmdbd.conf from SLURM_CONF's folder
    _wait_for("slurmdbd's port", lambda: _port_open(dbd_port), cluster, timeout=60)
