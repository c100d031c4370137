"""The local queue under concurrent callers: real runs, a real store, several threads and processes
calling launch/sync/cancel at once (the app's collector, CLI collectors, a launching user)."""

import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

from tests.helpers import live_processes
from workbench.engine.events import read_events
from workbench.recipe import load_recipe
from workbench.runs import TERMINAL_STATUSES, RunStore, Settings, cancel, launch, sync
from workbench.runs.settings import save_settings  # unauthorised: tests set up homes with it
from workbench.runs.authz import local_principal

ONE_STEP = ["train.steps=1", "logging.samples_per_step=1", "logging.diagnostics_sequences=1"]


def _sync_until(home: str, stop: str) -> None:
    """A collector process: sync as fast as it can until the file ``stop`` exists."""
    os.environ["WORKBENCH_HOME"] = home
    store = RunStore()
    while not Path(stop).exists():
        sync(store)


class _Collectors:
    """Two collector threads in this process and two collector processes, all syncing at once."""

    def __init__(self, home: Path) -> None:
        self.stop_file = home / "stop-collectors"
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(2)]
        ctx = mp.get_context("spawn")
        self.procs = [ctx.Process(target=_sync_until, args=(str(home), str(self.stop_file))) for _ in range(2)]
        for worker in [*self.threads, *self.procs]:
            worker.start()

    def _loop(self) -> None:
        store = RunStore()
        while not self.stop.is_set():
            sync(store)

    def close(self) -> None:
        self.stop.set()
        self.stop_file.touch()
        for thread in self.threads:
            thread.join(120)
        for proc in self.procs:
            proc.join(120)
        assert [p.exitcode for p in self.procs] == [0, 0] and not any(t.is_alive() for t in self.threads)


def _all_ended(store, ids, timeout=400.0) -> None:
    deadline = time.monotonic() + timeout
    while any(store.get_run(i)["status"] not in TERMINAL_STATUSES for i in ids):
        assert time.monotonic() < deadline, [store.get_run(i)["status"] for i in ids]
        time.sleep(0.2)


def _statuses_written(run_dir) -> list[str]:
    return [e["status"] for e in read_events(Path(run_dir)) if e["kind"] == "status"]


def test_concurrent_launch_and_sync_start_each_queued_run_exactly_once(fresh_home, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CPU runs; collectors need not import torch
    save_settings(Settings(cpu_slots=1))
    collectors = _Collectors(fresh_home)
    try:
        ids: list[str] = []
        launchers = [threading.Thread(target=lambda n=n: ids.append(launch(load_recipe(n, ONE_STEP), principal=local_principal())))
                     for n in ("grpo", "rloo", "grpo")]
        for thread in launchers:
            thread.start()
        for thread in launchers:
            thread.join(120)
        store = RunStore()
        assert len(ids) == 3
        _all_ended(store, ids)
    finally:
        collectors.close()
    runs = sorted((store.get_run(i) for i in ids), key=lambda r: r["started_at"])
    for run in runs:
        # one trainer per run: a second start would append a second starting/running pair
        assert (run["status"], _statuses_written(run["run_dir"])) == ("finished", ["starting", "running", "finished"])
        assert [e["step"] for e in read_events(Path(run["run_dir"])) if e["kind"] == "metrics"] == [0]
    # cpu_slots=1: each run's trainer began only after the one before it had written its end
    spans = [[e["time"] for e in read_events(Path(r["run_dir"]))] for r in runs]
    assert all(later[0] > earlier[-1] for earlier, later in zip(spans, spans[1:]))


def _live(pgid: int) -> bool:
    return any(p["pgid"] == pgid for p in live_processes().values())


def test_cancel_of_a_queued_run_racing_with_its_start_leaves_nothing_running(fresh_home, monkeypatch):
    """While collectors race to start B (A's slot frees), B is cancelled: it ends cancelled, and if
    a collector had already claimed it, its process is stopped too."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    save_settings(Settings(cpu_slots=1))
    store = RunStore()
    first = launch(load_recipe("grpo", ["train.steps=400"]), principal=local_principal(), store=store)
    second = launch(load_recipe("rloo", ONE_STEP), principal=local_principal(), store=store)
    deadline = time.monotonic() + 300
    while store.get_run(first)["last_step"] < 0:
        assert time.monotonic() < deadline
        sync(store)
        time.sleep(0.2)
    collectors = _Collectors(fresh_home)
    try:
        cancels = [threading.Thread(target=cancel, args=(i,), kwargs={"grace_s": 5.0, "principal": local_principal()})
                   for i in (first, second)]
        for thread in cancels:
            thread.start()
        for thread in cancels:
            thread.join(120)
    finally:
        collectors.close()
    sync(store)
    a, b = store.get_run(first), store.get_run(second)
    assert (a["status"], b["status"]) == ("cancelled", "cancelled")
    assert not _live(a["handle"]["pgid"])
    assert not b["handle"] or not _live(b["handle"]["pgid"])
