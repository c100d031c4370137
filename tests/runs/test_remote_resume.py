"""`runs resume` and the Resume button continue runs launched on an SSH host and on SLURM.

Real components: an OpenSSH server on 127.0.0.1 (tests/runs/sshd.py) whose "host" is this
machine, and a real SLURM cluster on this machine (tests/slurm_cluster.py: slurmctld, two slurmd).
Each run (tiny model, 1 thread, 5 steps, a checkpoint after steps 1 and 3) stalls inside step 3,
after the checkpoint of step 1 and step 2's events, and is stopped there (kill -9 of the remote
trainer; scancel of the job; its node set DOWN, after which SLURM requeues the job). The resume
(the user's, or the requeued job's own) continues at step 2 in the same run: the store holds every
step once, with the resumed attempt's values, and the metrics and final parameters equal an
uninterrupted run's exactly (1 CPU thread).
"""

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from streamlit import config

from tests.engine.stalling_rewards import STALL_ENV, STALL_ONCE_ENV
from tests.engine.test_checkpoint import STALLING, _final_digest, _metrics_by_step
from tests.helpers import home_with_tiny_model, live_processes
from tests.runs.sshd import free_port
from tests.runs.helpers import sync_until
from tests.runs.test_ssh import sshd  # noqa: F401  (the fixture: a real sshd on 127.0.0.1)
from tests.ui.conftest import page
from workbench.engine.checkpoint import list_checkpoints
from workbench.engine.events import read_events
from workbench.recipe import load_recipe
from workbench.runs import LaunchError, RunError, RunStore, Settings, SlurmDefaults, launch, resume, sync, wait
from workbench.runs.launchers import ssh
from workbench.runs.settings import save_settings
from workbench.runs.authz import local_principal

ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = ["train.steps=5", "checkpoint.every=2", "task=arithmetic_four", STALLING]
STALL_STEP = "3"  # the first attempt sleeps inside step 3: after the step-1 checkpoint and step 2's events


# -- the uninterrupted run both resumed runs must equal ----------------------------------------------
@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model_dir):
    """(metrics by step without timings, final parameter digest) of the same recipe run straight."""
    home = home_with_tiny_model(tmp_path_factory.mktemp("straight_home"), tiny_model_dir)
    recipe = home / "recipe.yaml"
    recipe.write_text(load_recipe("grpo", OVERRIDES).to_yaml())
    run_dir = home / "straight"
    env = {**os.environ, "WORKBENCH_HOME": str(home), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop(STALL_ENV, None)
    done = subprocess.run([sys.executable, "-m", "workbench", "train", str(recipe), "--run-dir", str(run_dir)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return _metrics_by_step(run_dir), _final_digest(run_dir)


def _stored_metrics(store: RunStore, run_id: str) -> list[tuple[int, dict]]:
    """Every metrics row of the run in the SQLite file, in step order, without the timings."""
    with sqlite3.connect(store.path) as db:
        rows = db.execute("SELECT step, data FROM metrics WHERE run_id = ? ORDER BY step", (run_id,)).fetchall()
    return [(step, {k: v for k, v in json.loads(data).items() if not k.startswith("perf/") or k == "perf/tokens"})
            for step, data in rows]


def _assert_resumed_equals_uninterrupted(store, run_id, run_dir: Path, uninterrupted) -> None:
    """One `resume` at step 2 from the step-1 checkpoint; the store has steps 0-4 once each, equal
    (every metric, exactly) to the uninterrupted run's, as are the events and the final parameters."""
    metrics, digest = uninterrupted
    events = read_events(run_dir)
    resumes = [e for e in events if e["kind"] == "resume"]
    assert [(e["step"], Path(e["checkpoint"]).name) for e in resumes] == [(2, "step-00000001")]
    after = events[events.index(resumes[0]):]
    assert [e["step"] for e in after if e["kind"] == "metrics"] == [2, 3, 4]
    assert _metrics_by_step(run_dir) == metrics
    assert _stored_metrics(store, run_id) == sorted(metrics.items())
    assert _final_digest(run_dir) == digest
    run = store.get_run(run_id)
    assert (run["status"], run["last_step"], run["error"]) == ("finished", 4, None)
    assert [r["id"] for r in store.runs()] == [run_id]  # the same row, no second run


@pytest.fixture
def app(monkeypatch):
    """The app as `make app` serves it (127.0.0.1, no password: no sign-in)."""
    monkeypatch.delenv("WORKBENCH_PASSWORD", raising=False)
    old = config.get_option("server.address")
    config.set_option("server.address", "127.0.0.1")
    yield
    config.set_option("server.address", old)


def _resume_button(run_id: str):
    at = page("runs_page").run()
    at.selectbox(key="runs_selected").select(run_id).run()
    return at, at.button(key=f"runs_resume:{run_id}")


def _cli(*args, home: Path):
    env = {**os.environ, "WORKBENCH_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop(STALL_ENV, None)
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)


# -- SSH -----------------------------------------------------------------------------------------------
@pytest.fixture
def host(sshd, tmp_path, tiny_model_dir):
    """host(stall) -> Settings with ssh host 'testhost' = this machine over sshd, its own workbench
    home; ``stall``: the host's setup line makes the trainer sleep inside step 3."""
    remote_home = home_with_tiny_model(tmp_path / "remote_home", tiny_model_dir)
    workdir = tmp_path / "remote_workdir"

    def settings(stall: bool) -> Settings:
        setup = (f"export WORKBENCH_HOME={shlex.quote(str(remote_home))} PYTHONPATH={shlex.quote(str(ROOT))} "
                 "OMP_NUM_THREADS=1" + (f" {STALL_ENV}={STALL_STEP}" if stall else ""))
        return Settings(ssh_hosts={"testhost": sshd.host_entry(workdir=str(workdir), python=sys.executable, setup=setup)})

    yield settings
    ssh.stop_followers()


def _remote_trainer(pgid: int) -> int:
    """Pid of the remote trainer (``python -m workbench train``, not accelerate's launcher) in the
    run's process group: this machine is the host."""
    found = [pid for pid, p in live_processes().items()
             if p["pgid"] == pgid and "-m workbench train" in p["cmdline"] and "accelerate" not in p["cmdline"]]
    assert len(found) == 1, found
    return found[0]


def test_ssh_run_killed_after_a_checkpoint_resumes_on_the_host_and_equals_an_uninterrupted_run(
        host, fresh_home, app, uninterrupted):
    stalling, fixed = host(stall=True), host(stall=False)
    save_settings(fixed)  # what `runs resume` reads: the host's setup no longer stalls
    store = RunStore()
    run_id = launch(load_recipe("grpo", OVERRIDES), target="ssh://testhost", principal=local_principal(), store=store, settings=stalling,
                    trust_local_imports=True)  # as the CLI: the test's own reward module
    first = store.get_run(run_id)["handle"]
    remote_dir = Path(first["remote_dir"])
    sync_until(store, stalling, run_id, lambda r: r["last_step"] >= 2 and list_checkpoints(remote_dir))
    time.sleep(0.5)  # asleep in step 3's reward now: it cannot reach the next checkpoint
    os.kill(_remote_trainer(first["pgid"]), signal.SIGKILL)
    assert wait(run_id, store=store, settings=stalling, poll_s=0.2, timeout_s=120) == "failed"
    assert [s for s, _ in _stored_metrics(store, run_id)] == [0, 1, 2]
    assert [s for s, _ in list_checkpoints(remote_dir)] == [1]
    offset_at_failure = store.get_run(run_id)["events_offset"]
    log_at_failure = (remote_dir / "stdout.log").read_bytes()
    _, button = _resume_button(run_id)  # offered for the remote run; its checkpoints are on the host
    assert not button.disabled and button.help == (f"Continue this run on ssh host 'testhost' from its newest "
                                                   f"checkpoint in {remote_dir}/checkpoints (none there: from step 0)")

    out = _cli("runs", "resume", run_id, home=fresh_home)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == \
        f"{run_id}: starting, continuing at step 2 (checkpoint {remote_dir / 'checkpoints' / 'step-00000001'})"
    run = store.get_run(run_id)
    second = run["handle"]
    assert second["remote_dir"] == str(remote_dir) and second["pgid"] != first["pgid"]  # a new wrapper, same dir
    assert run["launch"]["resume"] is True and run["events_offset"] == offset_at_failure

    followers = set()
    on_step = lambda r: followers.add(ssh.follower_pid(run_id))  # noqa: E731
    assert wait(run_id, store=store, settings=fixed, poll_s=0.2, timeout_s=300, on_step=on_step) == "finished"
    assert followers - {None}, "the resumed attempt's events were not streamed by a follower"
    _assert_resumed_equals_uninterrupted(store, run_id, remote_dir, uninterrupted)
    # read on from the byte offset it had: nothing skipped, nothing read twice, mirror byte-identical
    remote_bytes = (remote_dir / "events.jsonl").read_bytes()
    assert store.get_run(run_id)["events_offset"] == len(remote_bytes)
    assert (Path(run["run_dir"]) / "events.jsonl").read_bytes() == remote_bytes
    log = (remote_dir / "stdout.log").read_bytes()  # the resumed attempt appends to the first one's output
    assert log.startswith(log_at_failure) and f"finished: {remote_dir}".encode() in log[len(log_at_failure):]
    assert _exit_code(remote_dir) == "0\n"


def _exit_code(remote_dir: Path, timeout: float = 30.0) -> str:
    """The wrapper's exit_code file once written (the final event comes before the process exits)."""
    deadline = time.monotonic() + timeout
    while not (remote_dir / "exit_code").is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    return (remote_dir / "exit_code").read_text()


def test_ssh_resume_is_refused_while_the_attempt_before_still_runs_and_when_the_host_is_down(host, fresh_home, sshd):
    """A run the store thinks failed but whose process group still runs on the host: refused there
    (two trainers must never append to one event stream). An unreachable host: refused, nothing changed."""
    settings = host(stall=False)
    store = RunStore()
    sleeper = subprocess.Popen(["sleep", "120"], start_new_session=True)  # the "attempt before": its own group
    remote_dir = Path(fresh_home) / "fake_remote"
    remote_dir.mkdir()
    (remote_dir / "recipe.yaml").write_text("name: grpo\n")
    (remote_dir / "pgid").write_text(f"{sleeper.pid}\n")
    try:
        run_id = store.create_run(run_id="gone-1", name="r", algorithm="grpo", recipe_yaml="name: grpo\n",
                                  total_steps=5, target="ssh://testhost", launcher="ssh", host="testhost",
                                  created_by="t", run_dir=str(fresh_home / "runs" / "gone-1"))
        store.update_run(run_id, handle={"remote_dir": str(remote_dir), "pgid": 999999999})  # the store lost track
        store.set_status(run_id, "lost", error="gone")
        lost = store.get_run(run_id)
        down = Settings(ssh_hosts={"testhost": settings.ssh_hosts["testhost"].model_copy(update={"port": free_port()})})
        with pytest.raises(LaunchError, match="cannot tell now whether its processes on ssh://testhost have ended"):
            resume(run_id, principal=local_principal(), store=store, settings=down)
        assert store.get_run(run_id) == lost  # nothing changed

        with pytest.raises(LaunchError, match=rf"remote command failed \(exit 4\): process group {sleeper.pid} of "
                                              "the run is still running"):
            resume(run_id, principal=local_principal(), store=store, settings=settings)
        run = store.get_run(run_id)
        assert run["status"] == "failed" and run["error"].startswith("resume failed: ")
        assert (remote_dir / "pgid").read_text() == f"{sleeper.pid}\n" and not (remote_dir / "run.sh").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


# -- SLURM ---------------------------------------------------------------------------------------------
SLURM = Settings(slurm=SlurmDefaults(partition="debug", account="lab", nodes=1, gpus_per_node=1, time="00:10:00"))


@pytest.fixture
def cluster(slurm_cluster, monkeypatch, fresh_home):
    slurm_cluster.wait_idle()
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the job imports the stalling reward from tests/
    save_settings(SLURM)  # what the app reads
    yield slurm_cluster
    slurm_cluster.run("scancel", "--user", str(os.getuid()), check=False)


def test_slurm_job_cancelled_after_a_checkpoint_resumes_from_the_button_as_a_new_job_of_the_same_run(
        cluster, app, monkeypatch, uninterrupted):
    store = RunStore()
    monkeypatch.setenv(STALL_ENV, STALL_STEP)  # inherited by the first job only
    run_id = launch(load_recipe("grpo", OVERRIDES), target="slurm", principal=local_principal(), store=store, settings=SLURM,
                    trust_local_imports=True)
    run_dir = Path(store.get_run(run_id)["run_dir"])
    sync_until(store, SLURM, run_id, lambda r: r["last_step"] >= 2 and list_checkpoints(run_dir))
    time.sleep(0.5)
    first_job = store.get_run(run_id)["handle"]["job_id"]
    # TERM (the trainer stops without a final status: WORKBENCH_SIGTERM=interrupt), state CANCELLED
    assert subprocess.run(["scancel", first_job], capture_output=True).returncode == 0
    assert wait(run_id, store=store, settings=SLURM, poll_s=0.2, timeout_s=120) == "cancelled"
    assert [s for s, _ in _stored_metrics(store, run_id)] == [0, 1, 2]
    monkeypatch.delenv(STALL_ENV)

    at, button = _resume_button(run_id)
    checkpoint = run_dir / "checkpoints" / "step-00000001"
    assert not button.disabled and button.help == f"Continue this run at step 2, from its checkpoint {checkpoint}"
    button.click().run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    run = store.get_run(run_id)
    handle = run["handle"]
    assert handle["job_id"] != first_job and handle["previous_job_ids"] == [first_job]  # new job, same run
    script = Path(handle["script"]).read_text()
    assert '-m workbench train --resume "${RUN_DIR}"' in script and "#SBATCH --open-mode=append" in script.splitlines()
    assert run["status"] == "starting" and run["launch"]["resume"] is True

    assert wait(run_id, store=store, settings=SLURM, poll_s=0.2, timeout_s=300) == "finished"
    _assert_resumed_equals_uninterrupted(store, run_id, run_dir, uninterrupted)
    assert store.get_run(run_id)["handle"]["job_id"] == handle["job_id"]
    with pytest.raises(RunError, match=f"run {run_id} is finished; only failed, cancelled, lost runs can be resumed"):
        resume(run_id, principal=local_principal(), store=store, settings=SLURM)


def test_slurm_job_requeued_after_its_node_went_down_continues_the_run_from_its_checkpoint(
        cluster, monkeypatch, fresh_home, uninterrupted):
    """The job's node goes DOWN inside step 3: SLURM sends TERM to the job's steps (the trainer
    stops without a final status), requeues the job (JobRequeue=1) and runs the same script again
    under the same job id with SLURM_RESTART_COUNT=1; the script then resumes the run from its
    newest checkpoint. The store follows it all as one run: never cancelled or failed, every step
    once, equal to an uninterrupted run."""
    store = RunStore()
    monkeypatch.setenv(STALL_ENV, STALL_STEP)  # the requeued job keeps this environment:
    monkeypatch.setenv(STALL_ONCE_ENV, str(fresh_home / "stalled-once"))  # only the first attempt stalls
    run_id = launch(load_recipe("grpo", OVERRIDES), target="slurm", principal=local_principal(), store=store, settings=SLURM,
                    trust_local_imports=True)
    run_dir = Path(store.get_run(run_id)["run_dir"])
    sync_until(store, SLURM, run_id, lambda r: r["last_step"] >= 2 and list_checkpoints(run_dir))
    time.sleep(0.5)
    job_id = store.get_run(run_id)["handle"]["job_id"]
    node = cluster.job(job_id)["NodeList"]
    cluster.run("scontrol", "update", f"nodename={node}", "state=down", "reason=workbench-test")
    try:
        requeued = cluster.wait_job(job_id, lambda j: j.get("JobState") == "PENDING" and j.get("Restarts") == "1",
                                    what="PENDING after a requeue")
        assert requeued["Requeue"] == "1"
        deadline = time.monotonic() + 30  # the first attempt's trainer ends on SLURM's TERM
        while _trainer_of(run_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _trainer_of(run_dir)
        for _ in range(3):  # the collector keeps following: the job is alive (PENDING), the run goes on
            sync(store, SLURM)
        run = store.get_run(run_id)
        assert (run["status"], run["error"]) == ("running", None)
        # no final status was written (TERM from SLURM is not the user's cancel)
        assert [e["status"] for e in read_events(run_dir) if e["kind"] == "status"] == ["starting", "running"]
        # SLURM holds a requeued job back for ~2 minutes (its BeginTime); an admin may start it now.
        # It starts on the other node: this one stays DOWN until an admin resumes it.
        cluster.run("scontrol", "update", f"jobid={job_id}", "StartTime=now")
        second = cluster.wait_job(job_id, lambda j: j.get("JobState") == "RUNNING", what="RUNNING again")
        assert second["NodeList"] != node and second["Restarts"] == "1"
    finally:
        cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    try:
        assert wait(run_id, store=store, settings=SLURM, poll_s=0.2, timeout_s=300) == "finished"
    except TimeoutError as err:
        raise AssertionError(f"{err}; job {cluster.job(job_id)}; stdout.log: "
                             f"{(run_dir / 'stdout.log').read_text()[-3000:]}; {cluster.log_tail()}") from None
    _assert_resumed_equals_uninterrupted(store, run_id, run_dir, uninterrupted)
    assert store.get_run(run_id)["handle"]["job_id"] == job_id  # the same job, run a second time
    log = (run_dir / "stdout.log").read_text()  # both attempts' output (--open-mode=append)
    assert log.index("run directory: ") < log.index("requeued (restart 1): continuing the run in") < \
        log.index(f"finished: {run_dir}")


def _trainer_of(run_dir: Path) -> list[int]:
    """Pids of live trainers of ``run_dir`` (the accelerate launcher and ``-m workbench train``)."""
    return [pid for pid, p in live_processes().items() if str(run_dir) in p["cmdline"] and "workbench" in p["cmdline"]]

