"""Real detached runs on this machine, end to end into a real SQLite store.

Every run here is a real `accelerate launch -m workbench train` process group started by the
local launcher; the tests only observe it (events file, /proc, the store).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import live_processes
from workbench.engine.events import read_events
from workbench.recipe import load_recipe
from workbench.runs import TERMINAL_STATUSES, LaunchError, RunStore, Settings, cancel, launch, sync, wait
from workbench.runs.settings import save_settings  # unauthorised: tests set up homes with it
from workbench.runs.authz import Principal, local_principal

QUICK = ["train.steps=4", "logging.samples_per_step=2", "logging.diagnostics_sequences=4"]


def _group_pids(pgid: int) -> list[tuple[int, str]]:
    """(pid, cmdline) of live processes in a process group."""
    return [(pid, p["cmdline"]) for pid, p in live_processes().items() if p["pgid"] == pgid]


def _wait_for(predicate, store, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sync(store)
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("condition not reached in time")


def _steps_in_events(run_dir) -> list[int]:
    return [e["step"] for e in read_events(Path(run_dir)) if e["kind"] == "metrics"]


def test_detached_run_lands_in_the_store(fresh_home):
    store = RunStore()
    assert store.path == fresh_home / "runs.db"
    run_id = launch(load_recipe("grpo", QUICK), tags=["smoke"], notes="first", principal=Principal("ann", "admin", "test"), store=store)
    assert wait(run_id, store=store, timeout_s=180) == "finished"
    run = store.get_run(run_id)
    assert (run["created_by"], run["tags"], run["target"], run["last_step"], run["error"]) == ("ann", ["smoke"], "local", 3, None)
    frame = store.metrics([run_id])
    assert frame.step.tolist() == [0, 1, 2, 3]
    events = [e for e in read_events(Path(run["run_dir"])) if e["kind"] == "metrics"]
    assert frame.reward.tolist() == [e["metrics"]["reward"] for e in events]  # the store holds exactly what the run wrote
    assert set(store.samples(run_id).step) == {0, 1, 2, 3}
    assert len(store.diagnostics(run_id, 0)["ratio"]) == 4
    _wait_for(lambda: not _group_pids(run["handle"]["pgid"]), store, timeout=30)  # the process group exits
    assert (Path(run["run_dir"]) / "exit_code").read_text().strip() == "0"


def test_kill_9_mid_run_fails_and_keeps_every_step(fresh_home):
    store = RunStore()
    run_id = launch(load_recipe("grpo", ["train.steps=400"]), principal=local_principal(), store=store)
    _wait_for(lambda: store.get_run(run_id)["last_step"] >= 3, store)
    pgid = store.get_run(run_id)["handle"]["pgid"]
    trainer = [pid for pid, cmd in _group_pids(pgid) if "-m workbench train" in cmd and "accelerate" not in cmd]
    assert len(trainer) == 1, _group_pids(pgid)
    os.kill(trainer[0], signal.SIGKILL)
    assert wait(run_id, store=store, timeout_s=60) == "failed"
    run = store.get_run(run_id)
    written = _steps_in_events(run["run_dir"])
    assert store.metrics([run_id]).step.tolist() == written == list(range(len(written)))
    # accelerate's launcher exits 1 and names the signal its worker died of
    assert len(written) >= 4 and run["error"].startswith("trainer process exited with code 1") and "SIGKILL" in run["error"]


def _launcher_parent(run: dict) -> int:
    """The `accelerate launch` process of a run (the trainer's parent, the wrapper's child)."""
    table = live_processes()
    found = [pid for pid, p in table.items()
             if p["ppid"] == run["handle"]["pid"] and p["cmdline"].split()[1:3] == ["-m", "accelerate.commands.launch"]]
    assert len(found) == 1, [(pid, p["cmdline"]) for pid, p in table.items() if p["pgid"] == run["handle"]["pgid"]]
    return found[0]


@pytest.mark.parametrize("victim", ["launcher", "wrapper"])
def test_kill_9_of_the_launcher_or_wrapper_is_followed_to_the_trainers_last_step(fresh_home, victim):
    """kill -9 of `accelerate launch` (the trainer's parent) or of the run's wrapper: the trainer
    goes on alone. The run is followed until its last process is gone: every step the trainer
    wrote lands in the store, and the final status is the one the trainer itself recorded."""
    steps = 24
    store = RunStore()
    run_id = launch(load_recipe("grpo", [f"train.steps={steps}"]), principal=local_principal(), store=store)
    _wait_for(lambda: store.get_run(run_id)["last_step"] >= 2, store)
    run = store.get_run(run_id)
    os.kill(_launcher_parent(run) if victim == "launcher" else run["handle"]["pid"], signal.SIGKILL)
    assert wait(run_id, store=store, timeout_s=300) == "finished"
    run = store.get_run(run_id)
    written = _steps_in_events(run["run_dir"])
    assert written == list(range(steps))  # the trainer did run to its end after the kill
    assert store.metrics([run_id]).step.tolist() == written and run["last_step"] == steps - 1
    assert [e["status"] for e in read_events(Path(run["run_dir"])) if e["kind"] == "status"][-1] == "finished"
    _wait_for(lambda: not _group_pids(run["handle"]["pgid"]), store, timeout=60)  # then nothing of the run is left
    exit_code = Path(run["run_dir"]) / "exit_code"
    # the wrapper outlived the trainer and recorded how its launcher ended; a killed wrapper records nothing
    assert (exit_code.read_text().strip() == "137") if victim == "launcher" else not exit_code.exists()


def test_collector_restart_mid_run_gives_no_gap_and_no_duplicate(fresh_home):
    """Two collector processes (`python -m workbench collect`) started and killed mid-run,
    overlapping; a third (`collect --once`) after the run ended picks up exactly the rest.
    This process never syncs, so every row in the store came from those collectors."""
    steps = 40
    store = RunStore()
    run_id = launch(load_recipe("grpo", [f"train.steps={steps}"]), principal=local_principal(), store=store)
    run_dir = Path(store.get_run(run_id)["run_dir"])
    collect = [sys.executable, "-m", "workbench", "collect", "--interval", "0.1"]
    first = subprocess.Popen(collect)
    deadline = time.monotonic() + 180
    while store.get_run(run_id)["last_step"] < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert store.get_run(run_id)["last_step"] >= 5  # the first collector ingested
    second = subprocess.Popen(collect)  # both collect at once for a while
    time.sleep(1.0)
    first.kill()
    time.sleep(0.5)
    second.kill()
    first.wait()
    second.wait()
    while not any(e["kind"] == "status" and e["status"] in TERMINAL_STATUSES for e in read_events(run_dir)):
        assert time.monotonic() < deadline + 180, "the run did not end"
        time.sleep(0.2)
    once = subprocess.run([*collect[:4], "--once"], capture_output=True, text=True, timeout=120)
    assert once.returncode == 0, once.stderr
    assert store.get_run(run_id)["status"] == "finished"
    assert store.metrics([run_id]).step.tolist() == list(range(steps)) == _steps_in_events(run_dir)


def test_cancel_sends_sigterm_and_the_run_records_cancelled(fresh_home):
    store = RunStore()
    run_id = launch(load_recipe("ppo", ["train.steps=1000"]), principal=local_principal(), store=store)
    _wait_for(lambda: store.get_run(run_id)["last_step"] >= 1, store)
    cancel(run_id, principal=local_principal(), store=store)
    run = store.get_run(run_id)
    assert run["status"] == "cancelled"
    statuses = [e["status"] for e in read_events(Path(run["run_dir"])) if e["kind"] == "status"]
    assert statuses[-1] == "cancelled"  # the trainer itself wrote it (SIGTERM, not SIGKILL)
    assert not _group_pids(run["handle"]["pgid"])
    # the wrapper outlived the SIGTERM and recorded how the trainer ended
    assert (Path(run["run_dir"]) / "exit_code").read_text().strip().isdigit()


def _descendants(root: int) -> dict[int, str]:
    """{pid: start time} of every live descendant of ``root`` (any session)."""
    table = live_processes()
    found, todo = {}, [root]
    while todo:
        parent = todo.pop()
        for pid, proc in table.items():
            if proc["ppid"] == parent and pid not in found:
                found[pid] = proc["start"]
                todo.append(pid)
    return found


def _still_running(procs: dict[int, str]) -> list[int]:
    """The pids of ``procs`` still alive as the same processes (start time guards pid reuse)."""
    table = live_processes()
    return [pid for pid, start in procs.items() if pid in table and table[pid]["start"] == start]


def test_cancel_kills_two_process_workers_in_their_own_sessions(fresh_home):
    """torch elastic starts the ranks with start_new_session=True: outside the run's process group.
    With no grace the cancel escalates at once, and must still reach both ranks."""
    store = RunStore()
    run_id = launch(load_recipe("grpo", ["train.steps=1000"]), num_processes=2, principal=local_principal(), store=store)
    _wait_for(lambda: store.get_run(run_id)["last_step"] >= 0, store, timeout=300)
    run = store.get_run(run_id)
    procs = _descendants(run["handle"]["pid"])
    pgid = run["handle"]["pgid"]
    ranks = [pid for pid in procs if os.getsid(pid) != pgid]
    assert len(ranks) == 2, procs  # the two ranks, each its own session
    cancel(run_id, principal=local_principal(), store=store, grace_s=0.0)
    left = _still_running(procs)
    for pid in left:  # never leave a 1000-step run behind a failed test
        os.kill(pid, signal.SIGKILL)
    assert left == [] and not _group_pids(pgid)
    assert store.get_run(run_id)["status"] == "cancelled"


def test_queue_waits_for_a_free_cpu_slot(fresh_home):
    save_settings(Settings(cpu_slots=1))
    store = RunStore()
    first = launch(load_recipe("grpo", QUICK), principal=local_principal(), store=store)
    second = launch(load_recipe("rloo", QUICK), principal=local_principal(), store=store)
    assert store.get_run(second)["status"] == "queued" and not store.get_run(second)["handle"]
    assert wait(first, store=store, timeout_s=180) == "finished"
    assert wait(second, store=store, timeout_s=180) == "finished"
    assert store.get_run(second)["started_at"] >= store.get_run(first)["ended_at"]


def test_cancel_a_queued_run_never_starts_it(fresh_home):
    save_settings(Settings(cpu_slots=1))
    store = RunStore()
    first = launch(load_recipe("grpo", ["train.steps=400"]), principal=local_principal(), store=store)
    second = launch(load_recipe("rloo", QUICK), principal=local_principal(), store=store)
    cancel(second, principal=local_principal(), store=store)
    cancel(first, principal=local_principal(), store=store)
    assert store.get_run(second)["status"] == "cancelled" and not store.get_run(second)["handle"]
    assert store.get_run(first)["status"] == "cancelled"


def _cli(*args, home):
    env = dict(os.environ, WORKBENCH_HOME=str(home))
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, env=env, timeout=300)


def test_cli_launched_runs_outlive_the_command_and_cancel_from_the_cli(fresh_home):
    short = _cli("launch", "grpo", "--set", "train.steps=2", home=fresh_home)  # no --wait: returns at once
    long = _cli("launch", "ppo", "--set", "train.steps=1000", home=fresh_home)
    assert short.returncode == 0 and long.returncode == 0, short.stderr + long.stderr
    short_id, long_id = short.stdout.strip(), long.stdout.strip()
    store = RunStore()
    _wait_for(lambda: store.get_run(long_id)["last_step"] >= 0, store, timeout=300)
    cancelled = _cli("runs", "cancel", long_id, home=fresh_home)
    assert (cancelled.returncode, cancelled.stdout.strip()) == (0, "cancelled"), cancelled.stderr
    assert wait(short_id, store=store, timeout_s=300) == "finished"  # its launching command is long gone
    listed = {s: _cli("runs", "list", "--status", s, home=fresh_home).stdout for s in ("cancelled", "finished", "running")}
    assert long_id in listed["cancelled"] and short_id not in listed["cancelled"]
    assert short_id in listed["finished"] and long_id not in listed["finished"]
    assert listed["running"].strip() == "no runs"


def test_cli_reports_broken_settings_without_a_traceback(fresh_home):
    (fresh_home / "settings.yaml").write_text("cpu_slots: -1\n")
    for args in (["runs", "list"], ["collect", "--once"], ["launch", "grpo"]):
        out = _cli(*args, home=fresh_home)
        assert out.returncode == 2 and out.stderr.startswith("error: ") and "cpu_slots" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


def test_cli_launch_wait_list_show_and_delete(fresh_home):
    out = _cli("launch", "grpo", "rloo", "--set", "train.steps=2", "--group", "cmp", "--wait", home=fresh_home)
    assert out.returncode == 0, out.stderr
    ids = out.stdout.split()
    assert len(ids) == 2 and ids[0].startswith("grpo-") and ids[1].startswith("rloo-")
    store = RunStore()
    runs = [store.get_run(i) for i in ids]
    seeds = {load_recipe(str(Path(r["run_dir"]) / "recipe.yaml")).train.seed for r in runs}
    assert {r["group"] for r in runs} == {"cmp"} and len(seeds) == 1
    listing = _cli("runs", "list", "--group", "cmp", home=fresh_home)
    assert all(i in listing.stdout for i in ids) and "finished" in listing.stdout
    shown = _cli("runs", "show", ids[0], home=fresh_home)
    assert json.loads(shown.stdout.split("--- recipe ---")[0])["status"] == "finished"
    logs = _cli("runs", "logs", ids[0], home=fresh_home)
    assert "step 1: reward=" in logs.stdout
    assert _cli("runs", "delete", ids[0], home=fresh_home).returncode == 0
    assert not Path(runs[0]["run_dir"]).exists()
    assert list(RunStore().list_runs().id) == [ids[1]]


@pytest.mark.parametrize("args, message", [
    (["launch", "grpo", "--name", "../../etc"], "name='../../etc': character '/' is not allowed"),
    (["launch", "grpo", "--name", "x\ny"], "name='x\\ny': character '\\n' is not allowed"),
    (["launch", "grpo", "--name", "x" * 65], "1-64 characters"),
    (["launch", "grpo", "--tag", "$(id)"], "tag='$(id)' is not allowed"),
    (["launch", "grpo", "--group", "a/../b"], "group='a/../b' is not allowed"),
    (["launch", "grpo", "--set", "sampling.num_generations=0"], "sampling.num_generations=0"),
    (["launch", "grpo", "--target", "ssh://nosuchhost"], "nosuchhost"),
    (["launch", "grpo", "--target", "ftp://x"], "target='ftp://x' is not allowed"),
    (["runs", "show", "../x"], "run id='../x' does not exist"),
    (["runs", "list", "--status", "weird"], "status='weird' is not allowed"),
])
def test_hostile_or_invalid_input_is_refused_and_changes_nothing(fresh_home, args, message):
    out = _cli(*args, home=fresh_home)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert RunStore().list_runs().empty
    assert not (fresh_home / "runs").exists() or not any((fresh_home / "runs").iterdir())


def test_a_run_name_is_a_label_and_its_id_and_directory_are_its_slug(fresh_home):
    """A name with shell characters is kept verbatim as the run's label (SQL parameters, quoted in
    scripts); the run id and directory are its slug inside the workbench home."""
    out = _cli("launch", "grpo", "--name", "x;rm -rf ~ $(id)", "--set", "train.steps=1", home=fresh_home)
    assert out.returncode == 0, out.stderr
    run = RunStore().get_run(out.stdout.strip())
    assert run["name"] == "x;rm -rf ~ $(id)"
    assert re.fullmatch(r"x-rm--rf-id-\d{8}-\d{6}-[0-9a-f]{4}", run["id"]), run["id"]
    assert Path(run["run_dir"]).parent == fresh_home / "runs" and Path(run["run_dir"]).name == run["id"]
    _cli("runs", "cancel", run["id"], home=fresh_home)


def test_unknown_target_raises_launch_error(fresh_home):
    with pytest.raises(LaunchError, match="target='gopher' is not allowed"):
        launch(load_recipe("grpo"), target="gopher", principal=local_principal(), store=RunStore())


def _without_root_overrides() -> None:
    """preexec_fn: a child that obeys file permission bits even as root. Root bypasses them through
    CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH; dropped from the bounding set before exec, an exec'd
    root process no longer has them (uid 0 gets the bounding set as its capabilities). Needs
    CAP_SETPCAP, which root has unless the container removed it."""
    if os.geteuid() != 0:
        return
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP needs CAP_SETPCAP")


def test_read_only_store_is_one_line_error_exit_2_and_leaves_nothing(fresh_home, tmp_path):
    """runs.db chmod 444 (made binding for root too, see _without_root_overrides): `launch` used to
    print a traceback and leave a run directory; `collect --once` said "ingested 0 rows", exit 0."""
    store = RunStore()
    run_dir = fresh_home / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "events.jsonl").write_text(json.dumps({"kind": "metrics", "step": 0, "time": 1.0, "metrics": {}}) + "\n")
    store.create_run(run_id="r1", name="grpo", algorithm="grpo", recipe_yaml="name: grpo\n", total_steps=4, target="local",
                     launcher="local", host="localhost", created_by="ann", run_dir=str(run_dir))
    sleeper = subprocess.Popen(["sleep", "300"])
    from workbench.runs.launchers.local import _start_time

    store.update_run("r1", handle={"pid": sleeper.pid, "pgid": sleeper.pid, "start_time": _start_time(sleeper.pid)})
    store.set_status("r1", "running")
    os.chmod(store.path, 0o444)
    env = dict(os.environ, WORKBENCH_HOME=str(fresh_home))
    try:
        for args in (["launch", "grpo", "--set", "train.steps=2"], ["collect", "--once"]):
            try:
                out = subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, env=env,
                                     timeout=300, preexec_fn=_without_root_overrides)
            except subprocess.SubprocessError as err:
                from tests.helpers import missing_component

                missing_component(f"cannot run a child that obeys file permissions as root: {err}")
            assert out.returncode == 2, (args, out.stdout, out.stderr)
            assert out.stderr.startswith(f"error: run store {store.path} is read-only") and out.stderr.count("\n") == 1, out.stderr
            assert "ingested" not in out.stdout
    finally:
        sleeper.kill()
        sleeper.wait()
        os.chmod(store.path, 0o644)
    assert sorted(p.name for p in (fresh_home / "runs").iterdir()) == ["r1"]  # no stray run directory
    assert list(store.list_runs().id) == ["r1"] and store.get_run("r1")["last_step"] == -1
