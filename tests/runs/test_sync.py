"""The collector (`sync`) on a real SQLite store with real event files and real (exited) processes:
it never gets stuck on one bad run, and gives runs that cannot go on a final status."""

import json
import subprocess

import pytest

from workbench.runs import RunStore, Settings, cancel, delete, launch, sync
from workbench.runs.launchers import ConfigError, target_scheme
from workbench.runs.launchers.local import _start_time
from workbench.runs.service import alive_check_due, launcher_for, usable_gpus


def _exited_process_handle() -> dict:
    """Handle of a real process that has ended (started, its start time read, killed, reaped)."""
    proc = subprocess.Popen(["sleep", "30"])
    start = _start_time(proc.pid)
    proc.kill()
    proc.wait()
    return {"pid": proc.pid, "pgid": proc.pid, "start_time": start}


def _running_run(store, run_id, run_dir, lines, *, target="local", handle=None):
    run_dir.mkdir(parents=True, exist_ok=True)
    if lines is not None:
        (run_dir / "events.jsonl").write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    store.create_run(run_id=run_id, name="grpo", algorithm="grpo", recipe_yaml="name: grpo\n", total_steps=4,
                     target=target, launcher=target_scheme(target), host="localhost", created_by="ann", run_dir=str(run_dir))
    store.update_run(run_id, handle=handle or _exited_process_handle())
    store.set_status(run_id, "running")


STARTED = [{"kind": "status", "step": 0, "time": 1.0, "status": "starting"},
           {"kind": "status", "step": 0, "time": 1.0, "status": "running"}]


def _metrics(step):
    return {"kind": "metrics", "step": step, "time": 2.0 + step, "metrics": {"reward": step / 4}}


def test_vanished_process_without_a_final_event_is_lost_with_its_reason(tmp_path):
    store = RunStore(tmp_path / "runs.db")
    _running_run(store, "r1", tmp_path / "r1", [*STARTED, _metrics(0), _metrics(1)])
    sync(store, Settings())
    run = store.get_run("r1")
    assert (run["status"], run["error"], run["last_step"]) == (
        "lost", "the run's process ended without a final status event", 1)


def test_one_broken_run_does_not_stop_the_others_and_bad_lines_are_skipped(tmp_path):
    """r1's event file is unreadable (a directory); r2's has malformed lines between good ones."""
    store = RunStore(tmp_path / "runs.db")
    (tmp_path / "r1" / "events.jsonl").mkdir(parents=True)
    _running_run(store, "r1", tmp_path / "r1", None)
    bad = ['[1, 2]', '"text"', '{"kind": "metrics", "step": null, "metrics": {}}', '{"kind": "status", "step": 1, "status": "paused"}']
    _running_run(store, "r2", tmp_path / "r2", [*STARTED, _metrics(0), *bad, _metrics(1)])
    sync(store, Settings())
    r1, r2 = store.get_run("r1"), store.get_run("r2")
    assert r1["status"] == "running"  # logged; retried next pass
    assert (r2["status"], r2["last_step"], r2["skipped_events"]) == ("lost", 1, 4)
    assert store.metrics(["r2"]).step.tolist() == [0, 1]


def test_run_on_an_ssh_host_removed_from_settings_is_lost(tmp_path):
    store = RunStore(tmp_path / "runs.db")
    handle = {"host": "gone", "remote_dir": "/srv/wb/runs/r1", "pgid": 4242, "pid": 4242}
    _running_run(store, "r1", tmp_path / "r1", [], target="ssh://gone", handle=handle)
    with pytest.raises(ConfigError, match="unknown ssh host 'gone'"):
        launcher_for("ssh://gone", Settings())
    _running_run(store, "r2", tmp_path / "r2", [], target="ssh://gone", handle=handle)
    cancel("r2", store=store, settings=Settings())  # nothing can stop it now: lost, and deletable
    sync(store, Settings())
    for run_id in ("r1", "r2"):
        run = store.get_run(run_id)
        assert run["status"] == "lost" and "unknown ssh host 'gone'" in run["error"]
    delete("r2", store=store, settings=Settings())
    assert list(store.list_runs().id) == ["r1"]


@pytest.mark.parametrize("last, now, every, due", [
    (None, 100.0, 5.0, True),   # never checked
    (100.0, 104.9, 5.0, False),
    (100.0, 105.0, 5.0, True),
    (100.0, 100.0, 0.0, True),  # local: every pass
])
def test_alive_check_throttle(last, now, every, due):
    assert alive_check_due(last, now, every) is due


@pytest.mark.parametrize("gpu_slots, usable", [(None, [0, 1, 2]), (2, [0, 1]), (0, []), (5, [0, 1, 2])])
def test_gpu_slots_are_the_first_visible_devices(gpu_slots, usable):
    assert usable_gpus(gpu_slots, [0, 1, 2]) == usable


def test_run_needing_more_gpus_than_exist_fails_at_once(tmp_path, monkeypatch):
    from workbench.recipe import load_recipe

    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    store = RunStore()
    run_id = launch(load_recipe("grpo"), num_processes=2, store=store, settings=Settings())
    run = store.get_run(run_id)
    assert (run["status"], run["handle"]) == ("failed", {})
    assert run["error"] == ("this run needs 2 GPUs (one per process) but only 1 can be used here "
                            "(gpu_slots=None, visible: [0]); launch it with at most 1 processes")
