"""The slurm launcher reads how a job ended from SLURM's accounting once the controller has
forgotten it: a real cluster with ``slurmdbd`` on a MariaDB server (tests/slurm_cluster.py,
``accounting=True``) and MinJobAge = 2 s, so ``scontrol show job`` no longer knows a job a few
seconds after it ended (the controller purges on its own clock: up to a minute here) and only
``sacct`` does. This is the app that was down, or a collector that came back, after SLURM's
MinJobAge (300 s by default): without accounting such a run's ending could not be told.
"""

import os
import signal
import time
from pathlib import Path

import pytest

from tests.runs.test_slurm import QUICK, SETTINGS, follow, make_run, metric_steps, trainer_pid
from workbench.engine.events import read_events
from workbench.recipe import load_recipe
from workbench.runs import RunStore, launch, wait
from workbench.runs.authz import Principal
from workbench.runs.launchers.slurm import SlurmLauncher

FORGET_TIMEOUT_S = 150  # MinJobAge 2 s, purged by the controller's periodic pass


@pytest.fixture
def cluster(slurm_accounting_cluster, monkeypatch, fresh_home):
    slurm_accounting_cluster.wait_idle()
    monkeypatch.setenv("SLURM_CONF", str(slurm_accounting_cluster.conf))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield slurm_accounting_cluster
    slurm_accounting_cluster.run("scancel", "--user", str(os.getuid()), check=False)


def wait_forgotten(cluster, job_id: str) -> None:
    """Until the controller has no record of the job (``scontrol show job`` fails) and sacct has its final one."""
    deadline = time.monotonic() + FORGET_TIMEOUT_S
    while cluster.job(job_id) or cluster.run("squeue", "-h", "-j", job_id, check=False).stdout.strip():
        if time.monotonic() > deadline:
            raise AssertionError(f"the controller still holds job {job_id} after {FORGET_TIMEOUT_S} s: {cluster.job(job_id)}")
        time.sleep(1)


def sacct_row(cluster, job_id: str) -> str:
    return cluster.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobName,State,ExitCode").stdout.strip()


def test_a_killed_trainer_found_failed_after_the_controller_forgot_it(cluster, fresh_home):
    """Launched through the run service, the trainer SIGKILLed (no final event) while no collector
    runs; when the collector syncs again the controller has forgotten the job: the run is stored
    failed with the job's exit code (from sacct) and the last line of its log."""
    store = RunStore()
    run_id = launch(load_recipe("grpo", ["train.steps=10000", "logging.diagnostics_every=0"]), target="slurm",
                    store=store, settings=SETTINGS, principal=Principal("t", "admin", "test"))
    run = store.get_run(run_id)
    job_id = run.handle["job_id"]
    deadline = time.monotonic() + 300
    while not metric_steps(read_events(Path(run.run_dir))) and time.monotonic() < deadline:
        time.sleep(0.5)
    os.kill(trainer_pid(run.run_dir), signal.SIGKILL)
    wait_forgotten(cluster, job_id)
    assert cluster.run("scontrol", "show", "job", job_id, check=False).returncode != 0
    assert sacct_row(cluster, job_id) == f"{run_id}|FAILED|1:0"
    assert wait(run_id, store=store, settings=SETTINGS, timeout_s=60) == "failed"
    stored = store.get_run(run_id)
    assert stored.error.startswith(f"SLURM job {job_id} exited with code 1: subprocess.CalledProcessError: Command ")
    assert stored.error.endswith("died with <Signals.SIGKILL: 9>.")
    steps = list(store.metrics([run_id])["step"])
    assert steps and steps == list(range(len(steps)))  # every step the trainer wrote before it died, once


def test_a_finished_job_and_a_job_cancelled_while_pending_after_the_controller_forgot_them(cluster, fresh_home):
    """One slot: the first run takes it, the second waits PENDING and is cancelled there (no trainer
    ever ran: nothing but SLURM can say how it ended). Both forgotten by the controller: sacct's
    COMPLETED and CANCELLED, the launcher's states and statuses from them."""
    launcher = SlurmLauncher("slurm", SETTINGS)
    first = make_run(fresh_home, "grpo-20250101-000000-acc1", QUICK)
    first["handle"] = launcher.start(first)
    second = make_run(fresh_home, "grpo-20250101-000000-acc2", QUICK)
    second["handle"] = launcher.start(second)
    assert cluster.wait_job(second["handle"]["job_id"], lambda r: r.get("JobState") == "PENDING", what="PENDING")
    launcher.cancel(second)
    events = follow(launcher, first, lambda ev: any(e.get("status") == "finished" for e in ev))
    assert metric_steps(events) == [0, 1, 2]
    for run in (first, second):
        wait_forgotten(cluster, run["handle"]["job_id"])
    assert sacct_row(cluster, first["handle"]["job_id"]) == f"{first['id']}|COMPLETED|0:0"
    assert sacct_row(cluster, second["handle"]["job_id"]).startswith(f"{second['id']}|CANCELLED by ")
    assert (launcher.state(first), launcher.alive(first), launcher.exit_status(first)) == ("COMPLETED", False, (None, None))
    assert (launcher.state(second), launcher.alive(second)) == ("CANCELLED", False)
    assert launcher.exit_status(second) == (
        "cancelled", f"SLURM job {second['handle']['job_id']} ended CANCELLED; see stdout.log in the run directory")
    assert not Path(second["run_dir"], "events.jsonl").exists()  # its trainer never started
