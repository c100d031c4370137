"""The Ray launcher against a real one-node Ray cluster (``ray start --head``, tests/runs/rayhead.py).

Runs go through the real service (``launch`` / ``launch_group`` / ``sync`` / ``wait`` / ``cancel``
/ ``resume``) into a real SQLite store; each run is a job of Ray's Jobs API whose entrypoint is the
real trainer (tiny model, CPU). The head has 2 CPUs and each run reserves 1 (``ray.num_cpus``), so
a third run of a group waits PENDING in Ray's queue until a slot frees.
"""

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine.stalling_rewards import STALL_ENV
from tests.engine.test_checkpoint import STALLING
from tests.runs.helpers import sync_until
from tests.runs.rayhead import start_head
from tests.runs.sshd import free_port
from workbench.recipe import load_recipe
from workbench.runs import (ConfigError, LaunchError, RunStore, Settings, cancel, launch, launch_group, resume,
                            wait)
from workbench.runs.authz import local_principal
from workbench.runs.launchers import LAUNCHERS, ray_jobs
from workbench.runs.service import launcher_for
from workbench.runs.settings import RayCluster

ROOT = Path(__file__).resolve().parents[2]
ME = local_principal()


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """One real Ray head for the module (~3 s, ~630 MB), stopped at its end."""
    head = start_head(tmp_path_factory.mktemp("rayhead"))
    yield head
    ray_jobs.stop_followers()
    head.stop()


@pytest.fixture
def empty_home(tmp_path, monkeypatch):
    """A workbench home without the tiny model (for the tests that start no run)."""
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def store(fresh_home):
    yield RunStore()
    ray_jobs.stop_followers()


def cluster(head, **fields) -> Settings:
    """Settings whose ``ray`` section is this head, this interpreter, 1 CPU per run; the jobs can
    import this checkout's test helpers (reward functions) through the runtime_env."""
    env_vars = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **fields.pop("env_vars", {})}
    fields = {"address": head.address, "python": sys.executable, "num_cpus": 1, **fields}
    return Settings(ray=RayCluster(runtime_env={"env_vars": env_vars}, **fields))


def job_status_when_over(head, job_id: str, timeout: float = 60.0) -> str:
    """The Ray job's status once it is no longer PENDING or RUNNING."""
    deadline = time.monotonic() + timeout
    while (status := head.client().get_job_status(job_id)) in ("PENDING", "RUNNING") and time.monotonic() < deadline:
        time.sleep(0.2)
    return status


def events_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def metric_steps(events) -> list[int]:
    return [e["step"] for e in events if e["kind"] == "metrics"]


# -- targets and settings: one line naming the field, nothing left behind ------------------------------
def test_bad_targets_and_addresses_are_one_line_and_leave_nothing(empty_home):
    assert LAUNCHERS.get("ray") is ray_jobs.RayLauncher
    store = RunStore()
    for target, message in [
        ("ray", "target='ray' needs ray.address in settings (the Ray dashboard's HOST:PORT, e.g. 127.0.0.1:8265), "
                "or name the cluster in the target: ray://HOST:PORT"),
        ("ray://head node:8265", "target='ray://head node:8265' is not allowed; use ray://HOST:PORT with PORT the Ray "
                                 "dashboard's (Jobs API) port, 8265 by default (not Ray Client's 10001), or ray "
                                 "(ray.address in settings)"),
        ("ray://head:99999", "target='ray://head:99999' is not allowed; use ray://HOST:PORT"),
    ]:
        with pytest.raises(ConfigError) as err:
            launch(load_recipe("grpo"), target=target, store=store, settings=Settings(), principal=ME)
        assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert store.list_runs().empty and not (empty_home / "runs").exists()
    # the settings' address is checked where it is written, naming the field
    with pytest.raises(ValueError, match=r"ray.address='http://head:8265/api' is not allowed; use HOST:PORT, "
                                         r"http://HOST:PORT, https://HOST:PORT or ray://HOST:PORT"):
        Settings(ray={"address": "http://head:8265/api"})
    # and again by the launcher (settings built without validation reach a shell on the cluster)
    unchecked = Settings.model_construct(ray=RayCluster.model_construct(
        address="head:1", python="py\nreboot", workdir="", num_cpus=1, num_gpus=0, runtime_env={}))
    with pytest.raises(ConfigError,
                       match=r"^settings ray: python='py\\nreboot' is not allowed; a non-empty single-line"):
        launcher_for("ray", unchecked)
    # ray://HOST:PORT names the Jobs API (the dashboard's HTTP port); the port defaults to 8265
    assert launcher_for("ray://10.0.0.7", Settings()).url == "http://10.0.0.7:8265"
    https = Settings(ray={"address": "https://ray.example.org"})
    assert launcher_for("ray", https).url == "https://ray.example.org:8265"


def test_the_cli_refuses_a_bad_target_with_exit_2(empty_home):
    out = subprocess.run([sys.executable, "-m", "workbench", "launch", "grpo", "--target", "ray://a b"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2
    assert out.stderr.startswith("error: target='ray://a b' is not allowed; use ray://HOST:PORT")
    assert out.stderr.count("\n") == 1
    assert not (empty_home / "runs").exists()


def test_the_launch_page_offers_ray_through_the_registry(empty_home):
    from workbench.runs.settings import save_settings
    from workbench.runs.settings import load_settings
    from workbench.ui.launch_page import _targets, target_labels

    assert "ray" not in _targets()[0]  # no cluster configured: nothing to offer
    save_settings(Settings(ray={"address": "127.0.0.1:8265"}))
    targets, error = _targets()
    assert error is None and targets[0] == "local" and {"ray", "slurm"} <= set(targets)
    assert target_labels(load_settings())["ray"] == "Ray cluster (127.0.0.1:8265)"


def test_an_unreachable_head_is_unknown_not_dead(empty_home):
    launcher = launcher_for(f"ray://127.0.0.1:{free_port()}", Settings())
    run = {"id": "r-1", "run_dir": str(empty_home), "handle": {"job_id": "wb-r-1-1"}, "events_offset": 0}
    assert launcher.alive(run) is None  # the collector retries rather than declaring the run lost
    with pytest.raises(LaunchError, match=r"^Ray cluster at http://127.0.0.1:\d+ is unreachable while submitting run "
                                          r"r-1 \(ConnectionError\); check that its head runs and that the address "
                                          r"names its dashboard \(Jobs API\) port"):
        launcher.start({**run, "handle": None, "recipe": load_recipe("grpo").to_yaml(), "launch": {}})


def test_the_event_lines_of_a_log_are_the_events_file_whatever_the_chunks():
    """Ray sends a job's log in chunks of up to 10 lines or 20,000 characters, so a long event line
    (diagnostics) arrives cut; other output is interleaved. The event bytes are the file's."""
    events = [json.dumps({"kind": "metrics", "step": i, "time": 1.0, "metrics": {"x": "y" * (i * 9000)}})
              for i in range(5)]
    log = "".join(f"INFO job_manager.py -- Runtime env is setting up.\n@@wb {line}\nwarning: {i}\n"
                  for i, line in enumerate(events))
    file_bytes = "".join(line + "\n" for line in events).encode()
    for size in (13, 20000, len(log)):
        stream = ray_jobs._EventStream()
        for start in range(0, len(log), size):
            stream.feed(log[start:start + size])
        assert stream.take(0) == file_bytes
    assert stream.take(len(events[0]) + 1) == file_bytes[len(events[0]) + 1:]  # from the store's offset on
    assert stream.take(0) is None  # before what is kept: the caller reads the log again


def test_the_cause_of_an_entrypoint_that_dies_at_once_is_its_error_not_rays_preamble():
    """Ray writes "Running entrypoint for job ID: SCRIPT" through a buffered file it flushes after
    starting the entrypoint; an entrypoint that fails at once (a missing Python) can log its error
    first. Seen under load: the cause read "exec ... --stdout-events", the script's last line."""
    script = ray_jobs.entrypoint_script("/r", "/nonexistent/python", '"${WB_PYTHON}" -m workbench train',
                                        new_run=True, free_port=False)
    preamble = ray_jobs.ray_log_preamble("wb-7-1", script)
    error = "sh: 7: exec: /nonexistent/python: not found"
    for log in (f"{error}\n{preamble}", f"{preamble}{error}\n"):  # either order of the two writes
        assert ray_jobs.log_cause_text(log, preamble) == error
    assert ray_jobs.log_cause_text(f"{error}\n{preamble}") == 'exec "${WB_PYTHON}" -m workbench train'  # the bug
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 1\nZeroDivisionError: boom\n'
    assert ray_jobs.log_cause_text(preamble + traceback, preamble) == "ZeroDivisionError: boom"
    assert ray_jobs.log_cause_text(preamble, preamble) == ""  # nothing of the job's own: Ray's message decides


# -- the real cluster -------------------------------------------------------------------------------------
def test_runs_stream_every_step_once_and_failures_carry_their_cause(head, store, fresh_home, tmp_path):
    """Three runs at once. (1) A cluster-only run directory (ray.workdir): its events reach the store
    through the job's log alone; the log stream is dropped mid-run and the next read replays it
    from the stored offset. (2) A reward function that raises at step 2: the trainer reports it.
    (3) A python that does not exist on the cluster (no CPU reserved, so it does not wait for a
    slot): the job fails before any event, and its exit code and log say why."""
    settings = cluster(head, workdir=str(tmp_path / "cluster"), env_vars={"WORKBENCH_HOME": str(fresh_home)})
    recipe = load_recipe("grpo", ["train.steps=8", "logging.diagnostics_every=2"])
    run_id = launch(recipe, target=head.target, store=store, settings=settings, principal=ME)
    raising = launch(load_recipe("grpo", ["train.steps=6", "task=arithmetic_four",
                                          "reward_funcs=['tests.engine.faulty_rewards:raises_at_step_2']"]),
                     target="ray", store=store, settings=cluster(head), principal=ME, trust_local_imports=True)
    no_python = launch(load_recipe("grpo", ["train.steps=2"]), target="ray", store=store, principal=ME,
                       settings=cluster(head, python="/nonexistent/python", num_cpus=0))
    run = store.get_run(run_id)
    cluster_dir = tmp_path / "cluster" / "runs" / run_id
    assert run["handle"] == {"job_id": f"wb-{run_id}-1", "address": f"http://{head.address}",
                             "run_dir": str(cluster_dir), "events_base": 0}
    assert (run["launcher"], run["host"]) == ("ray", head.target.split("://")[1])
    info = head.client().get_job_info(f"wb-{run_id}-1")
    assert info.metadata == {"workbench_run": run_id}
    assert {k: info.runtime_env["env_vars"][k] for k in ("WORKBENCH_RUN_ID", "WORKBENCH_HOME", "PYTHONUNBUFFERED")} == {
        "WORKBENCH_RUN_ID": run_id, "WORKBENCH_HOME": str(fresh_home), "PYTHONUNBUFFERED": "1"}

    assert wait(no_python, store=store, settings=settings, poll_s=0.3, timeout_s=120) == "failed"
    run = store.get_run(no_python)
    assert run["error"].startswith(f"Ray job wb-{no_python}-1 on http://{head.address} failed (exit code 127): ")
    assert "/nonexistent/python" in run["error"] and "not found" in run["error"]
    job = head.client().get_job_info(f"wb-{no_python}-1")  # the preamble the cause leaves out is Ray's own
    assert ray_jobs.ray_log_preamble(job.submission_id, job.entrypoint) in head.client().get_job_logs(job.submission_id)

    run = sync_until(store, settings, run_id, lambda r: r["last_step"] >= 2)
    ray_jobs.stop_followers()  # the websocket following the log drops
    assert launcher_for(head.target, settings).alive(run) is True  # the job goes on without it
    assert wait(run_id, store=store, settings=settings, poll_s=0.3, timeout_s=240) == "finished"
    run = store.get_run(run_id)
    written = (cluster_dir / "events.jsonl").read_bytes()  # what the trainer wrote on the "cluster"
    assert metric_steps(events_of(cluster_dir / "events.jsonl")) == list(range(8))
    assert store.metrics([run_id]).step.tolist() == list(range(8))
    assert run["events_offset"] == len(written)  # nothing skipped, nothing read twice
    assert (Path(run["run_dir"]) / "events.jsonl").read_bytes() == written  # the local copy is byte-identical
    assert store.metrics([run_id]).reward.tolist() == [
        e["metrics"]["reward"] for e in events_of(cluster_dir / "events.jsonl") if e["kind"] == "metrics"]
    assert (cluster_dir / "final").is_dir() and (cluster_dir / "recipe.yaml").read_text() == recipe.to_yaml()
    assert job_status_when_over(head, f"wb-{run_id}-1") == "SUCCEEDED"  # the trainer's exit follows its last event
    again = launcher_for(head.target, settings).read_events(store.get_run(run_id))
    assert (again.events, again.offset) == ([], len(written))

    assert wait(raising, store=store, settings=settings, poll_s=0.3, timeout_s=240) == "failed"
    run = store.get_run(raising)
    assert "ZeroDivisionError: boom in the reward" in run["error"] and "raises_at_step_2" in run["error"]
    assert store.metrics([raising]).step.tolist() == [0, 1]  # the steps before the failure are kept


def test_group_queues_beyond_the_slots_cancel_frees_one_and_resume_continues(head, store):
    """3 seeds on 2 one-CPU slots: two run, the third waits PENDING in Ray's queue and starts when a
    cancel frees a slot. The cancelled run resumes as a new Ray job of the same run, from its
    checkpoint, to the end: every step once, in order."""
    stalling = cluster(head, env_vars={STALL_ENV: "3"})  # each attempt sleeps in step 3 (after the step-1 checkpoint)
    recipe = load_recipe("grpo", ["train.steps=5", "checkpoint.every=2", "task=arithmetic_four", STALLING,
                                  "logging.diagnostics_every=0"])
    ids = launch_group([recipe], group="ray-seeds", seeds=3, target="ray", store=store, settings=stalling, principal=ME,
                       trust_local_imports=True)
    first, second, third = ids
    launcher = launcher_for("ray", stalling)
    for run_id in (first, second):  # both slots busy: each has logged steps 0-2 and stalls in step 3
        sync_until(store, stalling, run_id, lambda r: r["last_step"] == 2)
    assert launcher.state(store.get_run(third)) == "PENDING"
    assert store.get_run(third)["last_step"] == -1 and store.metrics([third]).empty

    cancel(first, principal=ME, store=store, settings=stalling, grace_s=30)
    run = sync_until(store, stalling, first, lambda r: r.terminal)
    assert (run["status"], job_status_when_over(head, f"wb-{first}-1")) == ("cancelled", "STOPPED")
    local_events = events_of(Path(run["run_dir"]) / "events.jsonl")  # the trainer got SIGTERM and said so
    assert (local_events[-1]["kind"], local_events[-1]["status"]) == ("status", "cancelled")
    deadline = time.monotonic() + 60  # the freed slot takes the queued run
    while launcher.state(store.get_run(third)) == "PENDING" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert launcher.state(store.get_run(third)) == "RUNNING"
    for run_id in (second, third):  # the third is stopped while its trainer starts: Ray's STOPPED says cancelled
        cancel(run_id, principal=ME, store=store, settings=stalling, grace_s=30)
        assert sync_until(store, stalling, run_id, lambda r: r.terminal)["status"] == "cancelled"

    plain = cluster(head)  # the resumed attempt does not stall
    step, checkpoint = resume(first, principal=ME, store=store, settings=plain)
    assert step == 1 and checkpoint.name == "step-00000001"
    resumed = store.get_run(first)
    assert resumed["handle"]["job_id"] == f"wb-{first}-2" and resumed["handle"]["previous_job_ids"] == [f"wb-{first}-1"]
    assert resumed["handle"]["events_base"] > 0  # the new job's log starts where the store is
    assert wait(first, store=store, settings=plain, poll_s=0.3, timeout_s=240) == "finished"
    assert store.metrics([first]).step.tolist() == [0, 1, 2, 3, 4]
    events = events_of(Path(resumed["run_dir"]) / "events.jsonl")
    assert [e["step"] for e in events if e["kind"] == "resume"] == [2]
    assert store.get_run(first)["events_offset"] == (Path(resumed["run_dir"]) / "events.jsonl").stat().st_size


# -- Ray's token authentication ---------------------------------------------------------------------
def test_a_cluster_with_token_authentication_takes_the_token_file_and_refuses_without_it(store, tmp_path):
    """A head started with RAY_AUTH_MODE=token: without a token, and with a wrong one, the launch is
    refused in one line saying what to set, and no job reaches the cluster; a token file readable by
    others is refused before any request; with ray.token_file (chmod 600) a run trains to its end
    and the store has every step."""
    token = secrets.token_hex(32)
    (tmp_path / "secured").mkdir()
    secured = start_head(tmp_path / "secured", token=token)
    try:
        recipe = load_recipe("grpo", ["train.steps=2"])
        for token_file, reason in ((None, "Missing authentication token"), ("wrong", "Invalid authentication token")):
            fields = {}
            if token_file:
                (tmp_path / "wrong.token").write_text("x" * 64)
                (tmp_path / "wrong.token").chmod(0o600)
                fields["token_file"] = str(tmp_path / "wrong.token")
            with pytest.raises(LaunchError) as err:
                launch(recipe, target="ray", store=store, settings=cluster(secured, **fields), principal=ME)
            message = str(err.value)
            assert message.startswith(f"Ray cluster at http://{secured.address} refused the request while submitting run ")
            assert reason in message and "set ray.token_file in Settings" in message and "\n" not in message
            assert token not in message
        assert secured.client().list_jobs() == [j for j in secured.client().list_jobs() if j.entrypoint == "true"]
        assert store.list_runs().empty  # a target that cannot take the run leaves nothing in the store

        token_file = tmp_path / "ray.token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o644)
        with pytest.raises(ConfigError, match=rf"^ray.token_file='{token_file}' is readable by group or others; chmod 600 it"):
            launcher_for("ray", cluster(secured, token_file=str(token_file)))
        token_file.chmod(0o600)
        settings = cluster(secured, token_file=str(token_file))
        run_id = launch(recipe, target="ray", store=store, settings=settings, principal=ME)
        assert wait(run_id, store=store, settings=settings, poll_s=0.3, timeout_s=240) == "finished"
        assert store.metrics([run_id]).step.tolist() == [0, 1]
        assert job_status_when_over(secured, f"wb-{run_id}-1") == "SUCCEEDED"
    finally:
        ray_jobs.stop_followers()
        secured.stop()


def test_the_token_file_setting_is_a_path_never_a_token():
    with pytest.raises(ValueError, match=r"token_file='relative/token' is not allowed; an absolute path"):
        RayCluster(token_file="relative/token")
    assert RayCluster(token_file=" ~/.ray/auth_token ").token_file == "~/.ray/auth_token"


def test_a_two_process_run_is_one_job_whose_ranks_agree(head, store):
    """num_processes=2 on the cluster: one job reserving both CPUs runs ``accelerate launch`` with
    two processes on a free rendezvous port; the run finishes with every step once and both ranks
    end on the same parameters (their digests equal)."""
    settings = cluster(head, num_cpus=2)
    run_id = launch(load_recipe("grpo", ["train.steps=2"]), target="ray", num_processes=2, store=store,
                    settings=settings, principal=ME)
    assert wait(run_id, store=store, settings=settings, poll_s=0.3, timeout_s=300) == "finished"
    run = store.get_run(run_id)
    assert store.metrics([run_id]).step.tolist() == [0, 1]
    info = head.client().get_job_info(f"wb-{run_id}-1")
    assert "--num_processes 2" in info.entrypoint and "WB_PORT" in info.entrypoint
    run_dir = Path(run["run_dir"])
    assert (run_dir / "params.rank0.sha256").read_text() == (run_dir / "params.rank1.sha256").read_text()
