"""The event stream under faults (issue 17): events.jsonl replaced by `cp` + `mv` (a new inode) or
truncated in place mid-run, with real trainers and the real collector; a run that dies without a
final event keeps the cause its log shows."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runs.test_local import _steps_in_events, _wait_for
from tests.test_cli import REPO
from workbench.engine.events import EVENTS_FILE, EventWriter, read_events
from workbench.recipe import load_recipe
from workbench.runs import RunStore, Settings, launch, sync, wait
from workbench.runs.launchers import LAUNCHERS
from workbench.runs.launchers.base import UnreadableLine, log_cause, parse_events, read_file_events
from workbench.runs.launchers.local import _start_time
from workbench.runs.authz import local_principal

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
    run_id = launch(load_recipe("grpo", [f"train.steps={STEPS}", "logging.diagnostics_sequences=1"]), principal=local_principal(), store=store)
    _wait_for(lambda: store.get_run(run_id)["last_step"] >= 2, store, timeout=180)
    run = store.get_run(run_id)
    pgid, path = run["handle"]["pgid"], Path(run["run_dir"]) / EVENTS_FILE
    os.killpg(pgid, signal.SIGSTOP)
    try:
        sync(store)
        written = _steps_in_events(run["run_dir"])[-1]
        fault(path)
        sync(store)  # the collector meets the fault while the writer is paused: its warning is exact
    finally:
        os.killpg(pgid, signal.SIGCONT)
    assert written < STEPS - 1, written  # steps were left to write after the fault: the writer had to follow it
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


def test_the_writer_follows_a_file_moved_over_its_path(tmp_path):
    """EventWriter itself: after `cp` + `mv` over events.jsonl, the next event goes to the file the
    path names now, not to the unlinked inode it had open."""
    writer = EventWriter(tmp_path)
    writer.emit("metrics", 0, metrics={"reward": 0.1})
    _replace_by_copy(writer.path)
    writer.emit("metrics", 1, metrics={"reward": 0.2})
    writer.close()
    assert [e["step"] for e in read_events(tmp_path)] == [0, 1]


@pytest.mark.parametrize("scheme", ["local", "slurm"])
def test_every_launcher_reading_a_local_run_dir_notices_a_replaced_file(tmp_path, scheme):
    """The slurm launcher read the shared run dir without the stored inode: a `cp` + `mv` of
    events.jsonl whose bytes agree at the offset went unnoticed there (one shared reader now)."""
    path = tmp_path / EVENTS_FILE
    path.write_bytes(_metrics_line(0) + _metrics_line(1))
    launcher = LAUNCHERS.get(scheme)(scheme, Settings())
    run = {"id": "r", "run_dir": str(tmp_path), "events_offset": 0, "events_inode": None}
    first = launcher.read_events(run)
    run.update(events_offset=first.offset, events_inode=first.inode)
    _replace_by_copy(path)
    again = launcher.read_events(run)
    assert again.warning and "new inode" in again.warning, again
    assert [e["step"] for e in again.events] == [0, 1] and again.inode != first.inode


FRAME = '  File "/x/workbench/engine/trainer.py", line 10, in train\n    step()\n'


@pytest.mark.parametrize("log, cause", [
    # a handled, logged exception, then the fatal one of a class with any name
    (f"Traceback (most recent call last):\n{FRAME}ValueError: retrying\nstep 3\n"
     f"Traceback (most recent call last):\n{FRAME}mylib.Boom: the disk went away\n", "mylib.Boom: the disk went away"),
    # a handled, logged exception, then a kill that cut the fatal traceback short: nothing to go on
    (f"Traceback (most recent call last):\n{FRAME}ValueError: retrying\nstep 3\nTraceback (most recent call last):\n{FRAME}",
     ""),
    # an exception-shaped line printed after the traceback is not its final line
    (f"Traceback (most recent call last):\n{FRAME}OSError: [Errno 28] No space left on device\n"
     "RuntimeError: ignored by the logger\n", "OSError: [Errno 28] No space left on device"),
    # accelerate's re-raise of its worker's exit: the worker's traceback says why
    (None, "OSError: [Errno 28] No space left on device"),
    ("step 0\nValueError: printed, no traceback\n", ""),
])
def test_the_cause_is_the_last_tracebacks_final_line(tmp_path, log, cause):
    path = tmp_path / "stdout.log"
    path.write_text(ENOSPC_LOG if log is None else log)
    assert log_cause(path) == cause


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


def _full_disk() -> None:
    """preexec_fn: every write that grows a file fails (EFBIG, SIGXFSZ ignored), as on a full disk;
    SQLite then cannot create the WAL index (``-shm``) a reader needs."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def _two_runs(store: RunStore) -> list[str]:
    for run_id in ("r1", "r2"):
        store.create_run(run_id=run_id, name="grpo", algorithm="grpo", recipe_yaml="name: grpo\n", total_steps=3,
                         target="local", launcher="local", host="localhost", created_by="t", run_dir=f"/x/{run_id}")
        store.set_status(run_id, "finished")
    return ["r1", "r2"]


def test_runs_list_reads_the_store_on_a_full_disk(fresh_home):
    """Every read opened a connection with `PRAGMA synchronous`, which opens the WAL index first:
    on a full disk that failed before the immutable fallback could run, and `runs list` ended
    `error: ... disk I/O error`, exit 2. Now it lists the runs with one warning line."""
    ids = _two_runs(RunStore())
    out = subprocess.run([sys.executable, "-m", "workbench", "runs", "list"], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "WORKBENCH_HOME": str(fresh_home), "PYTHONPATH": str(REPO)},
                         timeout=120, preexec_fn=_full_disk)
    assert out.returncode == 0, out.stderr
    assert [line.split()[0] for line in out.stdout.splitlines()[1:]] == ids[::-1]
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: run store ") and "immutable" in lines[0], out.stderr


def test_a_full_disk_read_is_warned_once_per_store(tmp_path):
    """The app's collector reads four times a second: the fallback is logged once per RunStore,
    not on every read."""
    _two_runs(RunStore(tmp_path / "runs.db"))
    code = ("import logging, resource, signal, sys\nfrom workbench.runs import RunStore\n"
            "seen = []\nhandler = logging.Handler()\nhandler.emit = lambda record: seen.append(record.getMessage())\n"
            "logging.getLogger('workbench.runs.store').addHandler(handler)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))\n"
            "a = RunStore(sys.argv[1])\nrows = [len(a.runs()) for _ in range(10)]\nb = RunStore(sys.argv[1])\nb.runs()\n"
            "print(len(seen), rows == [2] * 10, a.immutable_cause is not None)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "runs.db")], cwd=REPO, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert out.stdout.split() == ["2", "True", "True"], out.stderr
