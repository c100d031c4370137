"""Resume in the run layer: the store supersedes a crashed attempt's steps, re-opens a terminal run
once, and `runs resume RUN_ID` continues a real killed local run in the same row and run dir."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine.stalling_rewards import STALL_ENV
from tests.helpers import live_processes
from workbench.engine.checkpoint import FINAL_DIR, list_checkpoints
from workbench.engine.events import read_events
from workbench.recipe import load_recipe
from workbench.runs import RunError, RunStore, launch, sync, wait
from workbench.runs.launchers.base import parse_events
from workbench.runs.authz import local_principal

ROOT = Path(__file__).resolve().parents[2]


def _new_run(store: RunStore, run_id: str = "r1") -> str:
    return store.create_run(run_id=run_id, name="r", algorithm="grpo", recipe_yaml="name: r\n", total_steps=4,
                            target="local", launcher="local", host="localhost", created_by="t", run_dir="/nowhere")


def _lines(*events: str) -> bytes:
    return "".join(e + "\n" for e in events).encode()


CRASHED = _lines('{"kind": "status", "step": 0, "time": 1, "status": "starting"}',
                 '{"kind": "metrics", "step": 0, "time": 2, "metrics": {"reward": 0.1}}',
                 '{"kind": "metrics", "step": 1, "time": 3, "metrics": {"reward": 0.2}}',
                 '{"kind": "samples", "step": 1, "time": 3, "samples": [{"prompt": "old"}]}',
                 '{"kind": "metrics", "step": 2, "time": 4, "metrics": {"reward": 0.9}}',
                 '{"kind": "status", "step": 2, "time": 5, "status": "cancelled"}')
RESUMED = _lines('{"kind": "status", "step": 0, "time": 10, "status": "starting"}',
                 '{"kind": "resume", "step": 1, "time": 11, "checkpoint": "checkpoints/step-00000000"}',
                 '{"kind": "metrics", "step": 1, "time": 12, "metrics": {"reward": 0.25}}',
                 '{"kind": "samples", "step": 1, "time": 12, "samples": [{"prompt": "new"}]}')


def _stored(store, run_id):
    frame = store.metrics([run_id])
    return list(zip(frame.step, frame.time, frame.reward))


def test_resume_event_supersedes_the_crashed_attempts_later_steps(tmp_path):
    """Checkpoint after step 0; the attempt before logged steps 0-2 and was cancelled. The
    resumed attempt's `resume` at step 1 drops steps 1 and 2; its step 1 is stored, not the old one."""
    store = RunStore(tmp_path / "runs.db")
    run_id = _new_run(store)
    store.update_run(run_id, status="starting")  # reopened and started again
    store.ingest(run_id, parse_events(CRASHED[: CRASHED.index(b'{"kind": "status", "step": 2')], 0).events)
    assert _stored(store, run_id) == [(0, 2.0, 0.1), (1, 3.0, 0.2), (2, 4.0, 0.9)]
    store.ingest(run_id, parse_events(RESUMED, 0).events)
    assert _stored(store, run_id) == [(0, 2.0, 0.1), (1, 12.0, 0.25)]
    assert store.samples(run_id).prompt.tolist() == ["new"]
    run = store.get_run(run_id)
    assert (run["last_step"], run["reward"], run["status"]) == (1, 0.25, "starting")


def test_replaying_the_whole_stream_gives_the_same_rows(tmp_path):
    """A stream read again from byte 0 (a replaced file): the crashed attempt's lines, its final
    status, then the resumed attempt's; ingest in order ends where a live ingest ends."""
    store = RunStore(tmp_path / "runs.db")
    run_id = _new_run(store)
    for _ in range(2):  # twice: idempotent
        store.ingest(run_id, parse_events(CRASHED + RESUMED, 0).events)
        assert _stored(store, run_id) == [(0, 2.0, 0.1), (1, 12.0, 0.25)]
        assert store.get_run(run_id)["status"] == "running"  # the resume re-opened the cancelled attempt


def test_reopen_only_terminal_runs_and_only_once(tmp_path):
    store = RunStore(tmp_path / "runs.db")
    run_id = _new_run(store)
    with pytest.raises(RunError, match="run r1 is queued; only failed, cancelled, lost runs can be resumed"):
        store.reopen(run_id, {"resume": True})
    store.set_status(run_id, "lost", error="gone")
    store.update_run(run_id, handle={"pid": 1}, cancel_requested=1)
    store.reopen(run_id, {"num_processes": 1, "resume": True})
    run = store.get_run(run_id)
    assert (run["status"], run["handle"], run["error"], run["ended_at"], run["cancel_requested"], run["launch"]) == \
        ("queued", {}, None, None, 0, {"num_processes": 1, "resume": True})
    with pytest.raises(RunError, match="is queued"):
        store.reopen(run_id, {"resume": True})  # a second resume racing the first starts nothing
    store.set_status(run_id, "finished")
    with pytest.raises(RunError, match="is finished"):
        store.reopen(run_id, {"resume": True})
    with pytest.raises(RunError, match="does not exist"):
        store.reopen("nope", {})


def _cli(*args, home):
    env = {**os.environ, "WORKBENCH_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop(STALL_ENV, None)
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)


def test_runs_resume_continues_a_killed_local_run_in_the_same_row(fresh_home, monkeypatch):
    """A real detached run (checkpoint every 2 steps) stalls inside step 3 and its trainer is
    killed with SIGKILL: failed. `runs resume ID` queues it again with `train --resume`; it
    finishes in the same run dir and store row, every step stored once with the resumed values."""
    store = RunStore()
    monkeypatch.setenv(STALL_ENV, "3")  # inherited by the launched run only
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the run imports the stalling reward from tests/
    recipe = load_recipe("grpo", ["train.steps=5", "checkpoint.every=2", "task=arithmetic_four",
                                  "reward_funcs=['tests.engine.stalling_rewards:exact_match_stalling']"])
    run_id = launch(recipe, principal=local_principal(), store=store, trust_local_imports=True)  # as the CLI: the test's own reward module
    run_dir = Path(store.get_run(run_id)["run_dir"])
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (store.get_run(run_id)["last_step"] >= 2 and list_checkpoints(run_dir)):
        sync(store)
        assert store.get_run(run_id)["status"] in ("queued", "starting", "running"), store.get_run(run_id)["error"]
        time.sleep(0.2)
    time.sleep(0.5)
    pgid = store.get_run(run_id)["handle"]["pgid"]
    trainer = [pid for pid, p in live_processes().items()
               if p["pgid"] == pgid and "-m workbench train" in p["cmdline"] and "accelerate" not in p["cmdline"]]
    assert len(trainer) == 1
    os.kill(trainer[0], signal.SIGKILL)
    assert wait(run_id, store=store, timeout_s=60) == "failed"
    assert store.metrics([run_id]).step.tolist() == [0, 1, 2]
    crashed_step_2 = store.metrics([run_id]).time.tolist()[2]

    refused = _cli("runs", "resume", "no-such-run", home=fresh_home)
    assert refused.returncode == 2 and "run id='no-such-run' does not exist" in refused.stderr
    out = _cli("runs", "resume", run_id, home=fresh_home)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(f"continuing at step 2 (checkpoint {run_dir / 'checkpoints' / 'step-00000001'})")
    assert wait(run_id, store=store, timeout_s=240) == "finished"

    run = store.get_run(run_id)
    assert (run["run_dir"], run["last_step"], run["error"]) == (str(run_dir), 4, None)
    assert [r["id"] for r in store.runs()] == [run_id]  # the same row, no second run
    frame = store.metrics([run_id])
    events = read_events(run_dir)
    resumed = events[[e["kind"] for e in events].index("resume"):]
    resumed_metrics = {e["step"]: e for e in resumed if e["kind"] == "metrics"}
    assert frame.step.tolist() == [0, 1, 2, 3, 4] and sorted(resumed_metrics) == [2, 3, 4]
    assert frame.time.tolist()[2:] == [e["time"] for e in resumed_metrics.values()] and frame.time.tolist()[2] != crashed_step_2
    assert (run_dir / FINAL_DIR / "model.safetensors").is_file()
    again = _cli("runs", "resume", run_id, home=fresh_home)
    assert again.returncode == 2 and again.stderr.strip() == \
        f"error: run {run_id} is finished; only failed, cancelled, lost runs can be resumed"
