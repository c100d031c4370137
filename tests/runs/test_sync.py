"""The collector (`sync`) on a real SQLite store with real event files and real (exited) processes:
it never gets stuck on one bad run, and gives runs that cannot go on a final status."""

import json
import os
import subprocess
import sys

import pytest

from workbench.runs import RunStore, Settings, cancel, delete, launch, sync
from workbench.runs.launchers import ConfigError, target_scheme
from workbench.runs.launchers.local import _start_time
from workbench.runs.service import alive_check_due, launcher_for, usable_gpus
from workbench.runs.authz import local_principal


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
    cancel("r2", principal=local_principal(), store=store, settings=Settings())  # nothing can stop it now: lost, and deletable
    sync(store, Settings())
    for run_id in ("r1", "r2"):
        run = store.get_run(run_id)
        assert run["status"] == "lost" and "unknown ssh host 'gone'" in run["error"]
    delete("r2", principal=local_principal(), store=store, settings=Settings())
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
    run_id = launch(load_recipe("grpo"), num_processes=2, principal=local_principal(), store=store, settings=Settings())
    run = store.get_run(run_id)
    assert (run["status"], run["handle"]) == ("failed", {})
    assert run["error"] == ("this run needs 2 GPUs (one per process) but only 1 can be used here "
                            "(gpu_slots=None, visible: [0]); launch it with at most 1 processes")


@pytest.fixture
def live_process():
    """A real process that keeps running until the test kills it (or the test ends)."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def _handle(proc: subprocess.Popen) -> dict:
    return {"pid": proc.pid, "pgid": proc.pid, "start_time": _start_time(proc.pid)}


OUT_OF_RANGE = [  # lines json.loads accepts but SQLite (or a finite metric) cannot hold
    '{"kind": "metrics", "step": 12345678901234567890123, "time": 3.0, "metrics": {"reward": 0.5}}',
    '{"kind": "metrics", "step": 1, "time": 3.0, "metrics": {"reward": 12345678901234567890123}}',
    '{"kind": "metrics", "step": 1, "time": 3.0, "metrics": {"reward": 1e999}}',
    '{"kind": "metrics", "step": 1, "time": 3.0, "metrics": {"reward": 0.5, "kl": NaN}}',
    '{"kind": "metrics", "step": 1, "time": 3.0, "metrics": {"reward": 0.5, "x": [1, {"y": -9223372036854775809}]}}',
    '{"kind": "samples", "step": 1, "time": 3.0, "samples": [{"completion": "2", "reward": -Infinity}]}',
    '{"kind": "status", "step": 1, "time": 1e400, "status": "failed"}',
]


def test_numbers_sqlite_cannot_hold_are_skipped_counted_and_the_stream_goes_on(tmp_path, live_process):
    """A step of 12345678901234567890123 used to raise OverflowError in every ingest pass: nothing
    behind it landed and the run stayed `running` forever. Every number of every event is checked."""
    store = RunStore(tmp_path / "runs.db")
    edge = {"kind": "metrics", "step": 2**63 - 1, "time": 4.0, "metrics": {"reward": -1.5, "n": -(2**63)}}  # still fits
    _running_run(store, "r1", tmp_path / "r1", [*STARTED, _metrics(0), *OUT_OF_RANGE, _metrics(2), edge],
                 handle=_handle(live_process))
    sync(store, Settings())
    run = store.get_run("r1")
    assert (run["status"], run["skipped_events"], run["last_step"], run["reward"]) == ("running", 7, 2**63 - 1, -1.5)
    assert store.metrics(["r1"]).step.tolist() == [0, 2, 2**63 - 1] and store.samples("r1").empty
    assert run["warnings"] == ["7 events were skipped; first: number 12345678901234567890123 is out of range or not "
                               "finite (kind='metrics')"]
    live_process.kill()
    live_process.wait()
    sync(store, Settings())
    assert store.get_run("r1")["status"] == "lost"  # not stuck


def test_a_shrunk_or_replaced_events_file_is_read_again_and_reported(tmp_path, live_process):
    """The file shrinks below the ingested offset (truncated, then the trainer appends), or is
    replaced by a longer one: the lines written since are not lost, and the run says what happened.
    A line that is not JSON is skipped and counted like any other bad event."""
    store = RunStore(tmp_path / "runs.db")
    events = tmp_path / "r1" / "events.jsonl"
    _running_run(store, "r1", tmp_path / "r1", [*STARTED, *map(_metrics, range(5))], handle=_handle(live_process))
    sync(store, Settings())
    ingested = store.get_run("r1")["events_offset"]
    assert ingested == events.stat().st_size and store.get_run("r1")["last_step"] == 4
    events.write_text("".join(json.dumps(_metrics(s)) + "\n" for s in (5, 6)) + '{"kind": "metrics", "st\n')
    shrunk = events.stat().st_size
    assert shrunk < ingested
    sync(store, Settings())
    run = store.get_run("r1")
    assert store.metrics(["r1"]).step.tolist() == list(range(7)) and run["events_offset"] == shrunk
    assert run["skipped_events"] == 1
    assert run["warnings"] == [
        "1 event was skipped; first: not a JSON object: <line that is not JSON: b'{\"kind\": \"metrics\", \"st'>",
        f"events.jsonl shrank from {ingested} bytes ingested to {shrunk} bytes (truncated or replaced); "
        "read again from the start"]
    longer = {**_metrics(7), "metrics": {"reward": 1.75, "pad": "x" * shrunk}}  # byte shrunk-1 is no newline now
    events.write_text(json.dumps(longer) + "\n")
    assert events.read_bytes()[shrunk - 1:shrunk] != b"\n"
    sync(store, Settings())
    run = store.get_run("r1")
    assert store.metrics(["r1"]).step.tolist() == list(range(8)) and (run["last_step"], run["reward"]) == (7, 1.75)
    assert run["warnings"][-1] == f"events.jsonl was rewritten before byte {shrunk} (replaced); read again from the start"


def test_the_run_layer_imports_no_torch(tmp_path):
    """Listing, showing and collecting runs go through the store, the collector and the launchers:
    none of them may import torch (seconds per command). A queued run makes sync look for GPUs."""
    code = ("import sys\n"
            "from workbench.runs import RunStore, Settings, sync\n"
            f"store = RunStore({str(tmp_path / 'runs.db')!r})\n"
            "store.create_run(run_id='q1', name='grpo', algorithm='grpo', recipe_yaml='name: grpo\\n', total_steps=4,"
            " target='local', launcher='local', host='localhost', created_by='ann', run_dir='/nonexistent')\n"
            "store.update_run('q1', cancel_requested=1)\n"  # queued and being cancelled: never started
            "sync(store, Settings())\n"
            "store.list_runs(); store.get_run('q1')\n"
            "print(sorted(m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
