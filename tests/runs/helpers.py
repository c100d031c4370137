"""Helpers shared by the run-layer tests: a home whose only CPU slot is held (launches queue,
nothing trains), and following a remote run through the real ``sync`` until it reaches a state."""

from __future__ import annotations

import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from workbench.runs import Principal, RunStore, Settings, sync
from workbench.runs.launchers.local import _start_time
from workbench.runs.records import Run
from workbench.runs.settings import save_settings

BLOCKER = "blocker"  # the id of the run that holds the slot


@contextmanager
def held_cpu_slot(home: Path, canceller: Principal) -> Iterator[RunStore]:
    """The default store (the caller has set ``WORKBENCH_HOME`` to ``home``, and ``WORKBENCH_DB``
    for a server database) of a home with one CPU slot, held by a live ``sleep`` posing as a running local run
    ``blocker``. On exit every other active run is cancelled by ``canceller`` and the sleep killed."""
    save_settings(Settings(cpu_slots=1, gpu_slots=0))
    store = RunStore()
    store.create_run(run_id=BLOCKER, name=BLOCKER, algorithm="grpo", recipe_yaml="name: blocker\n", total_steps=1,
                     target="local", launcher="local", host="localhost", created_by="t", run_dir=str(home / "nowhere"))
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        store.update_run(BLOCKER, handle={"pid": sleeper.pid, "pgid": sleeper.pid, "start_time": _start_time(sleeper.pid)})
        store.set_status(BLOCKER, "running")
        yield store
        from workbench.runs import cancel

        for run in store.runs(["queued", "starting", "running"]):
            if run.id != BLOCKER:
                cancel(run.id, principal=canceller, store=store, grace_s=1.0)
    finally:
        sleeper.kill()
        sleeper.wait()


def sync_until(store: RunStore, settings: Settings, run_id: str, predicate: Callable[[Run], object],
               timeout: float = 240.0, poll_s: float = 0.2) -> Run:
    """Sync (the real collector pass) until ``predicate(run)`` holds; the run. Fails at once if the
    run ends before that (naming its status and error), or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sync(store, settings)
        run = store.get_run(run_id)
        if predicate(run):
            return run
        assert not run.terminal, f"run ended {run.status}: {run.error}"
        time.sleep(poll_s)
    raise AssertionError(f"timed out; run is {store.get_run(run_id)}")
