"""Real detached runs on this machine, end to end into a real SQLite store.

Every run here is a real `accelerate launch -m workbench train` process group started by the
local launcher; the tests only observe it (events file, /proc, the store).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.engine.events import read_events
from workbench.recipe import load_recipe
from workbench.runs import LaunchError, RunStore, Settings, cancel, launch, save_settings, sync, wait

QUICK = ["train.steps=4", "logging.samples_per_step=2", "logging.diagnostics_sequences=4"]


def _group_pids(pgid: int) -> list[tuple[int, str]]:
    """(pid, cmdline) of live processes in a process group."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[2]) == pgid and stat[0] != "Z":
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except (OSError, IndexError):
            continue
    return found


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
    run_id = launch(load_recipe("grpo", QUICK), tags=["smoke"], notes="first", created_by="ann", store=store)
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
    run_id = launch(load_recipe("grpo", ["train.steps=400"]), store=store)
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


def test_collector_restart_mid_run_gives_no_gap_and_no_duplicate(fresh_home):
    """Two collector processes (`python -m workbench collect`) started and killed mid-run, overlapping."""
    store = RunStore()
    run_id = launch(load_recipe("grpo", ["train.steps=60"]), store=store)
    env = dict(os.environ)
    collect = [sys.executable, "-m", "workbench", "collect", "--interval", "0.1"]
    first = subprocess.Popen(collect, env=env)
    deadline = time.monotonic() + 120
    while store.get_run(run_id)["last_step"] < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    second = subprocess.Popen(collect, env=env)  # both collect at once for a while
    time.sleep(1.0)
    first.kill()
    time.sleep(0.5)
    second.kill()
    assert wait(run_id, store=store, timeout_s=180) == "finished"
    frame = store.metrics([run_id])
    assert frame.step.tolist() == list(range(60)) == _steps_in_events(store.get_run(run_id)["run_dir"])


def test_cancel_sends_sigterm_and_the_run_records_cancelled(fresh_home):
    store = RunStore()
    run_id = launch(load_recipe("ppo", ["train.steps=1000"]), store=store)
    _wait_for(lambda: store.get_run(run_id)["last_step"] >= 1, store)
    cancel(run_id, store=store)
    run = store.get_run(run_id)
    assert run["status"] == "cancelled"
    statuses = [e["status"] for e in read_events(Path(run["run_dir"])) if e["kind"] == "status"]
    assert statuses[-1] == "cancelled"  # the trainer itself wrote it (SIGTERM, not SIGKILL)
    assert not _group_pids(run["handle"]["pgid"])


def test_queue_waits_for_a_free_cpu_slot(fresh_home):
    save_settings(Settings(cpu_slots=1))
    store = RunStore()
    first = launch(load_recipe("grpo", QUICK), store=store)
    second = launch(load_recipe("rloo", QUICK), store=store)
    assert store.get_run(second)["status"] == "queued" and not store.get_run(second)["handle"]
    assert wait(first, store=store, timeout_s=180) == "finished"
    assert wait(second, store=store, timeout_s=180) == "finished"
    assert store.get_run(second)["started_at"] >= store.get_run(first)["ended_at"]


def test_cancel_a_queued_run_never_starts_it(fresh_home):
    save_settings(Settings(cpu_slots=1))
    store = RunStore()
    first = launch(load_recipe("grpo", ["train.steps=400"]), store=store)
    second = launch(load_recipe("rloo", QUICK), store=store)
    cancel(second, store=store)
    cancel(first, store=store)
    assert store.get_run(second)["status"] == "cancelled" and not store.get_run(second)["handle"]
    assert store.get_run(first)["status"] == "cancelled"


def _cli(*args, home):
    env = dict(os.environ, WORKBENCH_HOME=str(home))
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, env=env, timeout=300)


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
    (["launch", "grpo", "--name", "../../etc"], "name='../../etc' is not allowed"),
    (["launch", "grpo", "--name", "x;rm -rf ~"], "name='x;rm -rf ~' is not allowed"),
    (["launch", "grpo", "--tag", "$(id)"], "tag='$(id)' is not allowed"),
    (["launch", "grpo", "--group", "a/../b"], "group='a/../b' is not allowed"),
    (["launch", "grpo", "--set", "sampling.num_generations=0"], "sampling.num_generations=0"),
    (["launch", "grpo", "--target", "ssh://nosuchhost"], "nosuchhost"),
    (["launch", "grpo", "--target", "ftp://x"], "target='ftp://x' is not allowed"),
    (["runs", "show", "../x"], "run id='../x' does not exist"),
])
def test_hostile_or_invalid_input_is_refused_and_changes_nothing(fresh_home, args, message):
    out = _cli(*args, home=fresh_home)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert RunStore().list_runs().empty
    assert not (fresh_home / "runs").exists() or not any((fresh_home / "runs").iterdir())


def test_unknown_target_raises_launch_error(fresh_home):
    with pytest.raises(LaunchError, match="target='gopher' is not allowed"):
        launch(load_recipe("grpo"), target="gopher", store=RunStore())
