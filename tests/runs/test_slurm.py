"""The slurm launcher against a real SLURM cluster (tests/slurm_cluster.py: munged, slurmctld and
two slurmd on this machine, 1 CPU + 1 GPU slot each, no accounting; the accounting path, sacct,
is tested in test_slurm_accounting.py).

The launcher, the sbatch script it writes and the trainer it starts are the real ones: sbatch
queues the script, slurmd runs it, and its srun step runs `accelerate launch -m workbench train`
on the CPU with the built-in tiny model. The job's state comes from squeue and, once it has left
the queue, from the controller's record (`scontrol show job`): this cluster has no accounting.
"""

import os
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest

from workbench.engine.events import read_events
from workbench.recipe import load_recipe
from workbench.runs import (LaunchError, RunStore, Settings, SlurmDefaults, launch, launch_planned, plan_runs,
                            wait)
from workbench.runs.launchers import LAUNCHERS
from workbench.runs.launchers.slurm import SlurmLauncher
from workbench.runs.authz import Principal

QUICK = ["train.steps=3", "logging.samples_per_step=2", "logging.diagnostics_sequences=2"]
SETTINGS = Settings(slurm=SlurmDefaults(partition="debug", account="lab", nodes=1, gpus_per_node=1, time="00:10:00"))


@pytest.fixture
def cluster(slurm_cluster, monkeypatch, fresh_home):
    """The session's cluster, idle, reached through SLURM_CONF; whatever a test left in it is
    cancelled afterwards."""
    slurm_cluster.wait_idle()
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield slurm_cluster
    slurm_cluster.run("scancel", "--user", str(os.getuid()), check=False)


def make_run(home: Path, run_id: str, overrides: list[str]) -> dict:
    run_dir = home / "runs" / run_id
    run_dir.mkdir(parents=True)
    return {"id": run_id, "run_dir": str(run_dir), "recipe": load_recipe("grpo", overrides).to_yaml(),
            "handle": None, "events_offset": 0, "launch": {}}


def follow(launcher, run, until, timeout=300.0) -> list[dict]:
    """Read events the way the collector does (from the stored offset) until ``until(events)``."""
    events, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        chunk = launcher.read_events(run)
        assert chunk.offset >= run["events_offset"]
        events += chunk.events
        run["events_offset"] = chunk.offset
        if until(events):
            return events
        time.sleep(0.2)
    raise AssertionError(f"not reached in {timeout} s; events so far: {[e['kind'] for e in events]}")


def metric_steps(events) -> list[int]:
    return [e["step"] for e in events if e["kind"] == "metrics"]


def job_processes(run_dir: str) -> list[str]:
    """Command lines of live processes working on this run (trainer, launchers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if run_dir in cmd and state != "Z":
                found.append(cmd)
    return found


def slurm_settings(**fields) -> Settings:
    return Settings(slurm=SlurmDefaults(**fields))


def srun_task(script: str) -> str:
    """The command each srun task of an sbatch script runs (the single-quoted ``bash -c`` argument)."""
    lines = script.splitlines()
    srun = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    return shlex.split(lines[srun + 1].strip())[2]


def test_script_follows_the_settings_layout():
    assert LAUNCHERS.get("slurm") is SlurmLauncher
    settings = slurm_settings(partition="a100", account="lab", nodes=2, gpus_per_node=4, time="02:00:00")
    run = {"id": "r-1", "run_dir": "/shared/runs/r-1", "recipe": load_recipe("grpo").to_yaml()}
    text = SlurmLauncher("slurm", settings).script(run)
    lines = text.splitlines()
    for line in ("#SBATCH --job-name=r-1", "#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --time=02:00:00",
                 "#SBATCH --partition=a100", "#SBATCH --account=lab", "#SBATCH --output=/shared/runs/r-1/stdout.log",
                 f"PYTHON={sys.executable}", "RUN_DIR=/shared/runs/r-1"):
        assert line in lines
    assert " --num_processes 8 --num_machines 2 " in srun_task(text)  # 2 nodes x 4 GPUs
    # no partition / account in the settings: no live #SBATCH line for them (the cluster's defaults)
    text = SlurmLauncher("slurm", slurm_settings(nodes=1, gpus_per_node=2)).script(run)
    assert not [line for line in text.splitlines() if line.startswith(("#SBATCH --partition", "#SBATCH --account"))]
    assert " --num_processes 2 --num_machines 1 " in srun_task(text)


def test_process_count_must_match_the_settings_layout():
    """The slurm target takes its processes from nodes x gpus_per_node; another count is refused, not ignored."""
    launcher = SlurmLauncher("slurm", slurm_settings(nodes=2, gpus_per_node=4))
    run = {"id": "r-2", "run_dir": "/shared/runs/r-2", "recipe": load_recipe("grpo").to_yaml()}
    with pytest.raises(LaunchError, match=r"^run r-2: num_processes=3 does not match the SLURM layout of the settings "
                                          r"\(slurm.nodes=2 x slurm.gpus_per_node=4 = 8 process\(es\)\)"):
        launcher.script({**run, "launch": {"num_processes": 3}})
    for fits in (1, 8):  # 1 is the launch default (no count chosen); 8 is the layout itself
        assert " --num_processes 8 " in srun_task(launcher.script({**run, "launch": {"num_processes": fits}}))


def test_job_runs_and_events_arrive(cluster, fresh_home):
    launcher = SlurmLauncher("slurm", SETTINGS)
    run = make_run(fresh_home, "grpo-20250101-000000-aaaa", QUICK)
    handle = launcher.start(run)
    run["handle"] = handle
    assert handle["job_id"].isdigit()
    assert handle == {"job_id": handle["job_id"], "cluster": None, "script": f"{run['run_dir']}/job.sbatch"}
    script = Path(handle["script"]).read_text().splitlines()
    for line in ("#SBATCH --job-name=grpo-20250101-000000-aaaa", "#SBATCH --partition=debug", "#SBATCH --account=lab",
                 "#SBATCH --time=00:10:00", "#SBATCH --gpus-per-node=1", f"#SBATCH --output={run['run_dir']}/stdout.log"):
        assert line in script
    # the controller queued that script with the settings' allocation
    job = cluster.job(handle["job_id"])
    assert (job["JobName"], job["Partition"], job["Account"], job["TimeLimit"]) == \
        ("grpo-20250101-000000-aaaa", "debug", "lab", "00:10:00")
    assert job["NumNodes"] in ("1", "1-1")  # '1-1' (min-max) while pending
    assert job["TresPerNode"] == "gres:gpu:1" and job["StdOut"] == f"{run['run_dir']}/stdout.log"
    assert launcher.alive(run) is True  # pending or running right after submission
    events = follow(launcher, run, lambda ev: any(e.get("status") == "finished" for e in ev))
    assert metric_steps(events) == [0, 1, 2]
    deadline = time.monotonic() + 60
    while launcher.alive(run) and time.monotonic() < deadline:  # the batch script exits after the trainer
        time.sleep(0.2)
    assert launcher.alive(run) is False
    assert launcher.state(run) == "COMPLETED"  # from `scontrol show job`: sacct has no accounting here
    assert cluster.run("sacct", "-j", handle["job_id"], check=False).returncode != 0
    assert launcher.exit_status(run) == (None, None)
    again = launcher.read_events(run)  # nothing new past the offset: no duplicate step
    assert (again.events, again.offset) == ([], Path(run["run_dir"], "events.jsonl").stat().st_size)
    log = Path(run["run_dir"], "stdout.log").read_text()
    assert "run directory: " + run["run_dir"] in log
    assert f"training nodes: {cluster.job(handle['job_id'])['NodeList']};" in log  # the node SLURM allocated


def test_cancel_terminates_the_trainer_cleanly(cluster, fresh_home):
    """scancel --signal=INT to the job's steps: the trainer records `cancelled` and exits; the job ends."""
    launcher = SlurmLauncher("slurm", SETTINGS)
    run = make_run(fresh_home, "grpo-20250101-000000-bbbb", ["train.steps=10000", "logging.diagnostics_every=0"])
    run["handle"] = launcher.start(run)
    follow(launcher, run, lambda ev: len(metric_steps(ev)) >= 2)
    launcher.cancel(run, grace_s=60)
    assert launcher.alive(run) is False
    events = read_events(Path(run["run_dir"]))
    steps = metric_steps(events)
    assert len(steps) >= 2 and steps == list(range(len(steps)))
    assert events[-1]["kind"] == "status" and events[-1]["status"] == "cancelled"
    assert events[-1]["error"] == "received SIGINT"
    assert job_processes(run["run_dir"]) == []


def test_cancel_escalates_to_scancel_after_the_grace(cluster, fresh_home):
    launcher = SlurmLauncher("slurm", SETTINGS)
    run = make_run(fresh_home, "grpo-20250101-000000-cccc", ["train.steps=10000", "logging.diagnostics_every=0"])
    run["handle"] = launcher.start(run)
    follow(launcher, run, lambda ev: len(metric_steps(ev)) >= 1)
    launcher.cancel(run, grace_s=0)  # no grace: INT, then the plain scancel at once (SLURM: TERM, KillWait, KILL)
    deadline = time.monotonic() + 30
    while launcher.alive(run) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert launcher.state(run) == "CANCELLED"
    status, error = launcher.exit_status(run)
    assert (status, error) == ("cancelled", f"SLURM job {run['handle']['job_id']} ended CANCELLED; see stdout.log in the run directory")
    deadline = time.monotonic() + 10
    while job_processes(run["run_dir"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job_processes(run["run_dir"]) == []


def test_through_the_run_service_into_the_store(cluster, fresh_home):
    """launch(target='slurm') -> sbatch -> the collector ingests every step exactly once."""
    store = RunStore()
    run_id = launch(load_recipe("grpo", QUICK), target="slurm", store=store, settings=SETTINGS, principal=Principal("t", "admin", "test"))
    assert wait(run_id, store=store, settings=SETTINGS, timeout_s=300) == "finished"
    run = store.get_run(run_id)
    assert (run["launcher"], run["last_step"]) == ("slurm", 2)
    assert cluster.job(run["handle"]["job_id"])["JobName"] == run_id
    assert list(store.metrics([run_id])["step"]) == [0, 1, 2]


def test_no_sbatch_is_a_clear_error_and_writes_nothing(tmp_path, monkeypatch, fresh_home):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    run = make_run(fresh_home, "grpo-20250101-000000-dddd", QUICK)
    with pytest.raises(LaunchError, match=r"`sbatch` is not on PATH: the slurm target submits with SLURM's sbatch"):
        SlurmLauncher("slurm", SETTINGS).start(run)
    assert list(Path(run["run_dir"]).iterdir()) == []


def test_refused_submission_and_bad_settings(cluster, fresh_home):
    """The cluster refuses an unknown partition: sbatch's own error, nothing queued."""
    run = make_run(fresh_home, "grpo-20250101-000000-eeee", QUICK)
    nowhere = Settings(slurm=SETTINGS.slurm.model_copy(update={"partition": "nosuch"}))
    with pytest.raises(LaunchError, match=r"^sbatch refused the job \(exit 1\): sbatch: error: invalid partition specified: nosuch"):
        SlurmLauncher("slurm", nowhere).start(run)
    assert cluster.run("squeue", "-h").stdout == ""
    # model_construct skips the settings' own validation: the sbatch options still refuse the value
    bad = Settings(slurm=SlurmDefaults.model_construct(partition="gpu; reboot"))
    with pytest.raises(LaunchError, match=r"cannot write the sbatch script: partition='gpu; reboot' is not allowed"):
        SlurmLauncher("slurm", bad).start(make_run(fresh_home, "grpo-20250101-000000-ffff", QUICK))


def test_unreachable_controller_is_unknown_not_dead(cluster, tmp_path, monkeypatch):
    """The cluster's config with the controller's port closed: squeue cannot ask, so the job is
    neither alive nor gone."""
    conf = tmp_path / "slurm.conf"
    lines = [f"SlurmctldPort={free_port()}" if line.startswith("SlurmctldPort=") else line
             for line in cluster.conf.read_text().splitlines()]
    conf.write_text("\n".join([*lines, "MessageTimeout=2"]) + "\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    run = {"id": "x", "run_dir": str(tmp_path), "handle": {"job_id": "12"}, "events_offset": 0}
    assert SlurmLauncher("slurm", SETTINGS).alive(run) is None


def test_submission_that_hangs_names_the_job_to_look_for(cluster, fresh_home):
    """sbatch may queue the job and then hang; the run is dropped locally, so the error says how to
    find it. The hang: the controller stopped (SIGSTOP) while sbatch waits for its answer."""
    run = make_run(fresh_home, "grpo-20250101-000000-gggg", QUICK)
    launcher = SlurmLauncher("slurm", SETTINGS)
    launcher.command_timeout = 0.5
    controller = cluster.processes["slurmctld"]
    controller.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(LaunchError) as err:
            launcher.start(run)
    finally:
        controller.send_signal(signal.SIGCONT)
    assert str(err.value) == (
        f"run grpo-20250101-000000-gggg: `sbatch --parsable {run['run_dir']}/job.sbatch` did not answer within 0.5 s; "
        "the job may have been submitted anyway (job name grpo-20250101-000000-gggg): check with "
        "`squeue --name=grpo-20250101-000000-gggg` and cancel it with `scancel --name=grpo-20250101-000000-gggg`")
    # the advice works: whatever the controller queued once it ran again goes with that scancel
    time.sleep(1)
    cluster.run("scancel", "--name=grpo-20250101-000000-gggg")
    cluster.wait_idle()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer_pid(run_dir: str) -> int | None:
    """pid of the training process itself (`python -m workbench train`, not accelerate's launcher)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if run_dir.encode() in argv and b"workbench" in argv and b"accelerate.commands.launch" not in argv:
                return int(entry.name)
    return None


def test_killed_trainer_reports_the_jobs_exit_code_and_last_log_line(cluster, fresh_home):
    """No final event (SIGKILL): the status comes from the job's ExitCode (the controller's record)
    and stdout.log, as for local runs."""
    launcher = SlurmLauncher("slurm", SETTINGS)
    run = make_run(fresh_home, "grpo-20250101-000000-hhhh", ["train.steps=10000", "logging.diagnostics_every=0"])
    run["handle"] = launcher.start(run)
    follow(launcher, run, lambda ev: len(metric_steps(ev)) >= 1)
    os.kill(trainer_pid(run["run_dir"]), signal.SIGKILL)
    deadline = time.monotonic() + 60
    while launcher.alive(run) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert launcher.state(run) == "FAILED"
    assert cluster.job(run["handle"]["job_id"])["ExitCode"] == "1:0"
    status, error = launcher.exit_status(run)
    # accelerate's launcher reports its worker's death and exits 1; the batch script passes that on
    assert status == "failed"
    assert error.startswith(f"SLURM job {run['handle']['job_id']} exited with code 1: subprocess.CalledProcessError: Command ")
    assert error.endswith("died with <Signals.SIGKILL: 9>.")


def test_arms_x_seeds_fill_the_slots_and_the_rest_waits(cluster, fresh_home):
    """Three seeds of one arm on a cluster with two slots (two nodes, 1 CPU + 1 GPU each): two jobs
    run, the third waits PENDING (Resources) and starts when a slot frees; every run finishes."""
    store = RunStore()
    planned = plan_runs(["grpo"], seeds=3, overrides=QUICK, target="slurm")
    ids = launch_planned(planned, principal=Principal("t", "admin", "test"), group="slots", target="slurm",
                         store=store, settings=SETTINGS)
    jobs = [store.get_run(run_id)["handle"]["job_id"] for run_id in ids]
    seen: dict[str, set] = {job: set() for job in jobs}
    deadline = time.monotonic() + 120
    while not all("RUNNING" in s for s in seen.values()) and time.monotonic() < deadline:
        states = {job: cluster.job(job) for job in jobs}
        for job, record in states.items():
            seen[job].add((record.get("JobState"), record.get("Reason")))
        running = [job for job, r in states.items() if r.get("JobState") == "RUNNING"]
        assert len(running) <= 2
        time.sleep(0.1)
    assert ("PENDING", "Resources") in seen[jobs[2]], seen
    for run_id in ids:
        assert wait(run_id, store=store, settings=SETTINGS, timeout_s=300) == "finished"
        assert list(store.metrics([run_id])["step"]) == [0, 1, 2]
    records = [cluster.job(job) for job in jobs]
    assert {r["NodeList"] for r in records[:2]} == set(cluster.nodes)  # one slot each
    assert records[2]["StartTime"] >= min(r["EndTime"] for r in records[:2])  # after a slot freed
    assert [store.get_run(i)["seed"] for i in ids] == [0, 1, 2]
