"""The event stream under faults (issue 17): events.jsonl replaced by `cp` + `mv` (a new inode) or
truncated in place mid-run, with real trainers and the real collector; a run that dies without a
final event keeps the cause its log shows."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.runs.test_local import _steps_in_events, _wait_for
from workbench.engine.events import EVENTS_FILE, read_events
from workbench.recipe import load_recipe
from workbench.runs import RunStore, launch, sync, wait
from workbench.runs.launchers.base import UnreadableLine, parse_events, read_file_events
from workbench.runs.launchers.local import _start_time

STEPS = 12


def _replace_by_copy(path: Path) -> None:
    """`cp events.jsonl tmp && mv tmp events.jsonl`: same bytes, a new inode."""
    tmp = path.with_name("events.copy")
    shutil.copyfile(path, tmp)
    os.replace(tmp, path)


def _truncate_mid_line(path: Path) -> None:
    """Cut the file in place inside its last line (the next event is appended to the torn part)."""
    size = path.stat().st_size
    os.truncate(path, size - 7)


@pytest.mark.parametrize("fault, warning", [(_replace_by_copy, "replaced by another file (a new inode)"),
                                            (_truncate_mid_line, "shrank from")])
def test_events_file_replaced_or_truncated_mid_run_loses_no_step(fresh_home, fault, warning):
    """A `cp` + `mv` of events.jsonl used to lose every later step (the trainer kept writing the
    unlinked inode, the collector kept reading the copy) and record the finished run `lost`; a
    truncation in place lost the step appended to the torn line. The trainer is paused (SIGSTOP)
    while the file is changed, so what happens is exact: the collector has every line so far."""
    store = RunStore()
    run_id = launch(load_recipe("grpo", [f"train.steps={STEPS}", "logging.diagnostics_sequences=1"]), store=store)
    _wait_for(lambda: store.get_run(run_id)["last_step"] >= 2, store, timeout=180)
    run = store.get_run(run_id)
    pgid, path = run["handle"]["pgid"], Path(run["run_dir"]) / EVENTS_FILE
    os.killpg(pgid, signal.SIGSTOP)
    try:
        sync(store)
        fault(path)
    finally:
        os.killpg(pgid, signal.SIGCONT)
    assert wait(run_id, store=store, timeout_s=300) == "finished"
    run = store.get_run(run_id)
    assert store.metrics([run_id]).step.tolist() == list(range(STEPS))  # every step, once
    assert run["last_step"] == STEPS - 1 and run["error"] is None
    assert any(warning in w for w in run["warnings"]), run["warnings"]
    assert _steps_in_events(run["run_dir"])[-1] == STEPS - 1  # the trainer wrote on into the file the path names


def _metrics_line(step: int) -> bytes:
    return json.dumps({"kind": "metrics", "step": step, "time": 1.0, "metrics": {"reward": 0.5}}).encode() + b"\n"


def test_reader_detects_a_new_inode_even_when_the_bytes_agree(tmp_path):
    path = tmp_path / EVENTS_FILE
    path.write_bytes(_metrics_line(0) + _metrics_line(1))
    first = read_file_events(path, 0)
    assert [e["step"] for e in first.events] == [0, 1] and first.warning is None
    _replace_by_copy(path)
    with open(path, "ab") as f:
        f.write(_metrics_line(2))
    again = read_file_events(path, first.offset, first.inode)
    assert [e["step"] for e in again.events] == [0, 1, 2] and again.inode != first.inode
    assert "new inode" in again.warning
    same = read_file_events(path, again.offset, again.inode)
    assert same.events == [] and same.warning is None


def test_a_torn_line_with_an_event_appended_gives_the_event():
    """Every way a line can be torn (cut after any byte) and have a whole event appended."""
    whole = _metrics_line(7)
    for cut in range(1, len(whole) - 1):
        chunk = parse_events(whole[:cut] + _metrics_line(8), 0)
        assert isinstance(chunk.events[0], UnreadableLine) and chunk.events[1]["step"] == 8, cut
    assert parse_events(b"garbage\n", 0).events == [UnreadableLine(b"garbage")]


def _dead_run(store: RunStore, run_dir: Path, log: str) -> str:
    """A local run whose process has ended without a final status event and without an exit code
    (its wrapper could not write one: the disk was full), with ``log`` as its stdout.log."""
    run_dir.mkdir(parents=True)
    (run_dir / EVENTS_FILE).write_bytes(_metrics_line(0))
    (run_dir / "stdout.log").write_text(log)
    store.create_run(run_id=run_dir.name, name="grpo", algorithm="grpo", recipe_yaml="name: grpo\n", total_steps=5,
                     target="local", launcher="local", host="localhost", created_by="t", run_dir=str(run_dir))
    proc = subprocess.Popen(["true"])
    start = _start_time(proc.pid)
    store.update_run(run_dir.name, handle={"pid": proc.pid, "pgid": proc.pid, "start_time": start or "0"})
    proc.wait()
    store.set_status(run_dir.name, "running")
    return run_dir.name


ENOSPC_LOG = """step 0 reward=0.5
Traceback (most recent call last):
  File "/x/workbench/engine/trainer.py", line 10, in train
    self.events.emit("metrics", step, metrics=metrics)
OSError: [Errno 28] No space left on device
Traceback (most recent call last):
  File "/x/accelerate/commands/launch.py", line 5, in simple_launcher
subprocess.CalledProcessError: Command '['python', '-m', 'workbench', 'train']' returned non-zero exit status 1.
"""


def test_a_run_that_died_on_a_full_disk_ends_failed_with_the_cause(fresh_home):
    store = RunStore()
    full = _dead_run(store, fresh_home / "runs" / "full", ENOSPC_LOG)
    silent = _dead_run(store, fresh_home / "runs" / "silent", "step 0 reward=0.5\n")
    for _ in range(3):
        sync(store)
    run = store.get_run(full)
    assert (run["status"], run["last_step"]) == ("failed", 0)
    assert run["error"].endswith("OSError: [Errno 28] No space left on device"), run["error"]
    silent_run = store.get_run(silent)
    assert silent_run["status"] == "lost" and "without a final status event" in silent_run["error"]
