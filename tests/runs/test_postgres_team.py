"""A team's server database under load (issue 21): two collector processes (``python -m workbench
collect``) and two reader processes (the app's data path: ``RunStore().arms``, ``arm_metrics`` and
the Compare page's ``viz.tables.verdict``) on one real PostgreSQL, while 8 runs write their event
streams live.

What is under test is the store and the collector path, not training: each run is a small
process that appends its events to its own ``events.jsonl`` with the engine's ``EventWriter``
(in bursts of 5 steps 50 ms apart, so the collectors race on the same bytes), registered
as a local run exactly as the queue registers one (claimed, then its pid / process group / start
time as the handle). Six runs finish, one reports ``failed`` with its error, one dies without a
final status (the collectors must call it ``lost``). Then: every step of every run stored exactly
once with the values its file holds, each status right, and the arms view and verdict table the
same from both readers (and from this process)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from tests.test_cli import REPO
from workbench.engine.events import read_events
from workbench.runs import RunStore, Settings
from workbench.runs.launchers.local import RUN_ID_ENV, _start_time
from workbench.runs.settings import save_settings

STEPS = 40
ARMS = {"fast": 1.0, "slow": 0.6}  # arm -> slope of its reward over the run
SEEDS = 4
ENDINGS = {"slow-s3": "failed", "fast-s3": "lost"}  # every other run finishes
TOTAL_ROWS = 7 * STEPS + STEPS // 2  # the lost run stops half-way

# One run's process: wait for the start file, then write STEPS metrics lines (bursts of 5, 50 ms
# apart) and a final status; "lost" stops half-way without one.
WRITER = """
import os, sys, time
from pathlib import Path
from workbench.engine.events import EventWriter
run_dir, go, slope, seed, ending = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
steps = int(sys.argv[6])
while not go.exists():
    time.sleep(0.01)
events = EventWriter(run_dir)
events.emit("status", 0, status="starting")
events.emit("status", 0, status="running")
for step in range(steps):
    if ending == "lost" and step == steps // 2:
        os._exit(0)
    events.emit("metrics", step, metrics={"reward": slope * step / steps + 0.01 * seed, "kl": 0.001 * step})
    if step % 5 == 4:
        time.sleep(0.05)
if ending == "failed":
    events.emit("status", steps - 1, status="failed", error="RuntimeError: the reward server went away")
else:
    events.emit("status", steps - 1, status="finished")
"""

# An app process: read the arms and the verdict table over and over while the runs are live, and
# once the stop file exists, print what it finally sees as JSON (and how many of its reads saw
# the runs part-way).
READER = """
import json, sys, time
from pathlib import Path
from workbench.runs import RunStore
from workbench.viz.tables import verdict
stop = Path(sys.argv[1])

def view():
    store = RunStore()
    arms = store.arms("team")
    frame = store.arm_metrics([r.id for runs in arms.values() for r in runs])
    try:
        table = verdict(frame, "reward", 0.25)
        tables = [table.arms.to_json(orient="split"), table.pairs.to_json(orient="split")]
    except ValueError as err:  # nothing logged yet
        tables = [str(err)]
    arms_view = {arm: [[r.id, r.seed, r.status, r.last_step, r.reward, r.error] for r in runs] for arm, runs in arms.items()}
    return {"arms": arms_view, "verdict": tables, "rows": len(frame)}

print("ready", view()["rows"], flush=True)
live = 0  # views that saw some of the rows but not all: read while the runs were writing
while not stop.exists():
    rows = view()["rows"]
    live += 0 < rows < int(sys.argv[2])
print(json.dumps({**view(), "live_reads": live}))
"""


def _start_run(store: RunStore, home: Path, run_id: str, go: Path, slope: float, seed: int, ending: str,
               env: dict) -> subprocess.Popen:
    """The run's process, registered as the queue registers a local run: claimed, then its handle."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(home / "runs" / run_id), str(go), str(slope), str(seed),
                             ending, str(STEPS)], cwd=REPO, env={**env, RUN_ID_ENV: run_id}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    start, deadline = None, time.monotonic() + 30
    while start is None and time.monotonic() < deadline:  # the process may still be exec'ing
        start = _start_time(proc.pid)
    assert store.claim_queued(run_id)
    store.update_run(run_id, handle={"pid": proc.pid, "pgid": proc.pid, "start_time": start})
    return proc


def test_two_collectors_and_two_readers_on_one_postgres_with_8_live_runs(tmp_path, postgres_url):
    home, go, stop = tmp_path / "home", tmp_path / "go", tmp_path / "stop"
    home.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "WORKBENCH_HOME": str(home), "WORKBENCH_DB": postgres_url}
    save_settings(Settings(cpu_slots=8, gpu_slots=0), home)
    store = RunStore(postgres_url)
    ids = [f"{arm}-s{seed}" for arm in ARMS for seed in range(SEEDS)]
    store.create_runs([dict(run_id=i, name=i.split("-")[0], algorithm="grpo", total_steps=STEPS, target="local",
                            launcher="local", host="localhost", created_by="t", run_dir=str(home / "runs" / i),
                            group="team", arm=i.split("-")[0], recipe_yaml=f"name: x\ntrain:\n  seed: {i[-1]}\n")
                       for i in ids])
    writers = []
    for run_id in ids:
        (home / "runs" / run_id).mkdir(parents=True)
        arm, seed = run_id.split("-s")
        writers.append(_start_run(store, home, run_id, go, ARMS[arm], int(seed), ENDINGS.get(run_id, "finished"), env))
    background = lambda argv: subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,  # noqa: E731
                                               stderr=subprocess.PIPE, text=True)
    collectors = [background([sys.executable, "-m", "workbench", "collect", "--interval", "0.05"]) for _ in range(2)]
    readers = [background([sys.executable, "-c", READER, str(stop), str(TOTAL_ROWS)]) for _ in range(2)]
    try:
        assert [r.stdout.readline() for r in readers] == ["ready 0\n"] * 2  # up, and nothing written yet
        go.touch()
        deadline = time.monotonic() + 150
        while any(r.active for r in store.runs()):
            assert time.monotonic() < deadline, [(r.id, r.status, r.last_step) for r in store.runs()]
            assert all(c.poll() is None for c in collectors), [c.communicate() for c in collectors]
            time.sleep(0.2)
    finally:
        stop.touch()
        for proc in collectors:
            proc.terminate()
        seen = [json.loads(r.communicate(timeout=120)[0] or "null") for r in readers]
        for proc in collectors:
            proc.communicate(timeout=30)
        for proc in writers:
            proc.kill()
            proc.wait()
    assert [w.returncode for w in writers] == [0] * 8, [w.stderr.read() for w in writers]

    # every step once, with the values in its file; each status right
    for run_id in ids:
        run = store.get_run(run_id)
        written = [e for e in read_events(Path(run.run_dir)) if e["kind"] == "metrics"]
        stored = store.metrics([run_id])
        assert stored.step.tolist() == [e["step"] for e in written] == list(
            range(STEPS // 2 if run_id == "fast-s3" else STEPS)), run_id
        assert stored.reward.tolist() == [e["metrics"]["reward"] for e in written]
        assert stored.time.tolist() == [e["time"] for e in written]
        expected = ENDINGS.get(run_id, "finished")
        assert (run.status, run.last_step, run.skipped_events) == (expected, len(written) - 1, 0), run_id
        if expected == "failed":
            assert run.error == "RuntimeError: the reward server went away"
        elif expected == "lost":
            assert "without a final status event" in run.error
        else:
            assert run.error is None and run.reward == written[-1]["metrics"]["reward"]

    # both app processes read while the runs were live, and finally see the same arms and verdicts
    assert all(s is not None and s["live_reads"] > 0 for s in seen), seen
    assert seen[0]["arms"] == seen[1]["arms"] and seen[0]["verdict"] == seen[1]["verdict"]
    assert seen[0]["rows"] == seen[1]["rows"] == TOTAL_ROWS
    arms = seen[0]["arms"]
    assert {arm: [(r[1], r[2]) for r in runs] for arm, runs in arms.items()} == {
        "fast": [(0, "finished"), (1, "finished"), (2, "finished"), (3, "lost")],
        "slow": [(0, "finished"), (1, "finished"), (2, "finished"), (3, "failed")]}
    summary = pd.read_json(io.StringIO(seen[0]["verdict"][0]), orient="split")
    assert summary.set_index("arm").seeds.to_dict() == {"fast": 4, "slow": 4}
    pairs = pd.read_json(io.StringIO(seen[0]["verdict"][1]), orient="split")
    assert (pairs.A.tolist(), pairs.B.tolist()) == (["fast"], ["slow"]) and pairs["A − B"].iloc[0] > 0
