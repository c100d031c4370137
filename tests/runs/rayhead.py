"""A real one-node Ray cluster on 127.0.0.1 for the Ray launcher tests (PyPI ``ray[default]``).

``ray start --head --block`` runs as a child of the test process in its own session, with its own
ports and ``--temp-dir`` (DESIGN: "Real team infrastructure"); ``stop`` terminates it (Ray then
stops every process it started) and kills its process group if anything is left. ``ray stop`` is
never used: it kills every Ray process on the machine, not only this cluster's.

If ``ray`` (with its Jobs API, ``ray[default]``) is not installed the tests skip locally and
FAIL under ``CI=true`` (``make test`` installs it from requirements-dev.txt).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import missing_component
from tests.runs.sshd import free_port

HEAD_CPUS = 2  # slots for two one-CPU runs: a third waits PENDING


@dataclass
class RayHead:
    process: subprocess.Popen
    dashboard_port: int
    temp_dir: Path
    log: Path
    token: str | None = None  # the cluster's token when it runs with Ray's token authentication

    @property
    def address(self) -> str:
        """The Jobs API address as the workbench's ``ray.address`` takes it."""
        return f"127.0.0.1:{self.dashboard_port}"

    @property
    def target(self) -> str:
        return f"ray://127.0.0.1:{self.dashboard_port}"

    def client(self):
        from ray.job_submission import JobSubmissionClient

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        return JobSubmissionClient(f"http://{self.address}", headers=headers)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # `ray start --block` stops the cluster it started
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # anything of its session that is left
        except ProcessLookupError:
            pass
        if self.process.poll() is None:
            self.process.wait(timeout=10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def ray_executable() -> str:
    """The ``ray`` command of this interpreter's environment (missing: skip, or fail under CI)."""
    try:
        import ray.job_submission  # noqa: F401
    except ImportError as err:
        missing_component(f"ray[default] is required for the Ray launcher tests ({err}): "
                          "pip install 'ray[default]==2.60.0' -c constraints.txt (make test installs it)")
    path = Path(sys.executable).with_name("ray")
    if not path.exists():
        missing_component(f"the `ray` command is not beside {sys.executable}; reinstall ray[default]")
    return str(path)


def start_head(workdir: Path, env: dict[str, str] | None = None, token: str | None = None) -> RayHead:
    """Start a head with ``HEAD_CPUS`` CPUs on free 127.0.0.1 ports (its log in ``workdir``); return
    once its Jobs API answers. ``token``: the head runs with Ray's token authentication
    (RAY_AUTH_MODE=token) and this token; only requests that carry it are answered."""
    if token is not None:
        env = {**(env or {}), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    ray = ray_executable()
    # Ray's sockets live under --temp-dir/session_<date>_<pid>/sockets/: a pytest tmp_path is too long
    # for them (AF_UNIX paths are at most 107 bytes), so the head gets a short folder of its own
    temp_dir = Path(tempfile.mkdtemp(prefix="wbray-", dir="/tmp"))
    dashboard, gcs, agent, client = free_port(), free_port(), free_port(), free_port()
    worker = free_port()  # a small worker port range of its own
    argv = [ray, "start", "--head", "--block", "--num-cpus", str(HEAD_CPUS), "--num-gpus", "0",
            "--node-ip-address", "127.0.0.1", "--port", str(gcs), "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(dashboard), "--dashboard-agent-listen-port", str(agent),
            "--ray-client-server-port", str(client), "--min-worker-port", str(worker),
            "--max-worker-port", str(worker + 100), "--include-dashboard=true", "--disable-usage-stats",
            "--temp-dir", str(temp_dir)]
    log = workdir / "ray-head.log"
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                               start_new_session=True, env={**os.environ, **(env or {})})
    head = RayHead(process, dashboard, temp_dir, log, token)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"`ray start --head` exited with {process.returncode}: {log.read_text()[-3000:]}")
        try:  # ready = a job runs: the dashboard answers before its agent takes jobs ("No available agent")
            client = head.client()
            job = client.submit_job(entrypoint="true")
            while client.get_job_status(job) in ("PENDING", "RUNNING") and time.monotonic() < deadline:
                time.sleep(0.2)
            if client.get_job_status(job) == "SUCCEEDED":
                return head
        except Exception:  # noqa: BLE001  (not up yet: the dashboard or its agent is still starting)
            time.sleep(0.5)
    head.stop()
    pytest.fail(f"the Ray head's Jobs API did not answer on {head.address} within 90 s: {log.read_text()[-3000:]}")
