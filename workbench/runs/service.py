"""What the CLI and the UI call: launch, cancel, delete, and keep the store in step with the runs.

``sync`` is the collector: for every active run it ingests the new events its launcher can read,
starts queued local runs when a slot is free, and gives runs whose process is gone a final status
(from their last events, the wrapper's exit code, or ``lost``) so nothing stays "running" forever.
It is safe to call from several processes at once (see ``RunStore.ingest``).
"""

from __future__ import annotations

import getpass
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Iterable

from workbench.home import confined_path, workbench_home
from workbench.recipe import Recipe
from workbench.runs.launchers import LAUNCHERS, LaunchError, Launcher, target_scheme
from workbench.runs.names import check_group, check_run_name, check_tag, new_run_id
from workbench.runs.settings import Settings, load_settings
from workbench.runs.store import ACTIVE_STATUSES, TERMINAL_STATUSES, RunError, RunStore

RUNS_DIR = "runs"
CANCEL_GRACE_S = 10.0
# fields a comparison group forces to the first recipe's values, so curves are comparable
GROUP_SHARED_FIELDS = ("model", "task", "dataset", "sampling.prompts_per_step", "train.seed")


def launcher_for(target: str, settings: Settings | None = None) -> Launcher:
    """The launcher object of a target string ('local', 'ssh://NAME', 'slurm')."""
    scheme = target_scheme(target)
    if scheme not in LAUNCHERS:
        raise LaunchError(f"target={target!r} is not allowed; use one of: local, ssh://HOST (a host in settings), slurm")
    return LAUNCHERS.get(scheme)(target, settings or load_settings())


def _host_of(target: str) -> str:
    return target.split("://", 1)[1] if "://" in target else ("localhost" if target == "local" else target)


def launch(recipe: Recipe, *, target: str = "local", name: str | None = None, group: str | None = None,
           tags: Iterable[str] = (), notes: str = "", created_by: str | None = None, num_processes: int = 1,
           store: RunStore | None = None, settings: Settings | None = None) -> str:
    """Register a run and start it (or queue it until a local slot is free); returns its id.

    Nothing is left in the store when the target cannot take the run (unknown host, unreachable
    host, no sbatch): the error is raised and the half-made run is removed.
    """
    store = store or RunStore()
    settings = settings or load_settings()
    name = check_run_name(name or recipe.name)
    tags = [check_tag(t) for t in tags]
    group = check_group(group) if group else None
    if num_processes < 1:
        raise RunError(f"num_processes={num_processes} is not allowed; at least 1")
    launcher = launcher_for(target, settings)
    run_id = new_run_id(name)
    run_dir = confined_path(Path(RUNS_DIR) / run_id, field="run directory")
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.yaml").write_text(recipe.to_yaml())
    store.create_run(
        run_id=run_id, name=name, algorithm=recipe.name, recipe_yaml=recipe.to_yaml(), total_steps=recipe.train.steps,
        target=target, launcher=launcher.scheme, host=_host_of(target), created_by=created_by or getpass.getuser(),
        run_dir=str(run_dir), group=group, tags=tags, notes=notes,
        launch={"num_processes": num_processes, "mixed_precision": {"fp32": "no"}.get(recipe.train.precision, recipe.train.precision)})
    if launcher.scheme != "local":
        try:
            _start(store, store.get_run(run_id), launcher)
        except LaunchError:
            store.delete(run_id)
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
    else:
        _start_queued_local(store, settings)
    return run_id


def launch_group(recipes: list[Recipe], *, group: str, target: str = "local", created_by: str | None = None,
                 store: RunStore | None = None, settings: Settings | None = None, **kwargs) -> list[str]:
    """Launch recipes side by side as one comparison group sharing model, prompts and seed."""
    if not recipes:
        raise RunError("a comparison group needs at least one recipe")
    check_group(group)
    first = recipes[0]
    shared = [f"{key}={_get(first, key)}" for key in GROUP_SHARED_FIELDS if _get(first, key) is not None]
    aligned = [r.with_overrides(shared) for r in recipes]
    return [launch(r, target=target, group=group, created_by=created_by, store=store, settings=settings, **kwargs)
            for r in aligned]


def _get(recipe: Recipe, dotted: str):
    value = recipe
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _start(store: RunStore, run: dict, launcher: Launcher) -> None:
    handle = launcher.start(run)
    store.update_run(run["id"], handle=handle)
    store.set_status(run["id"], "starting")


def _visible_gpus() -> list[int]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [int(x) for x in env.split(",") if x.strip().isdigit()]
    import torch

    return list(range(torch.cuda.device_count()))


def _start_queued_local(store: RunStore, settings: Settings) -> int:
    """Start queued local runs while slots are free (FIFO). GPU runs get their own devices."""
    local = [r for r in store.runs(ACTIVE_STATUSES) if r["launcher"] == "local"]
    running = [r for r in local if r["handle"]]
    queued = [r for r in local if not r["handle"]]
    gpus = _visible_gpus() if queued else []
    started = 0
    for run in queued:
        need = int(run["launch"].get("num_processes", 1))
        if gpus:
            busy = {g for r in running for g in r["launch"].get("gpus", [])}
            free = [g for g in gpus[: settings.gpu_slots or len(gpus)] if g not in busy]
            if len(free) < need:
                break
            run["launch"]["gpus"] = free[:need]
            store.update_run(run["id"], launch=run["launch"])
        elif sum(int(r["launch"].get("num_processes", 1)) for r in running) + need > settings.cpu_slots and running:
            break
        launcher = launcher_for("local", settings)
        try:
            _start(store, run, launcher)
        except LaunchError as err:
            store.set_status(run["id"], "failed", error=str(err))
            continue
        running.append(store.get_run(run["id"]))
        started += 1
    return started


def _ingest_new(store: RunStore, run: dict, launcher: Launcher) -> int:
    chunk = launcher.read_events(run)
    old = int(run["events_offset"])
    if chunk.offset == old:
        return 0
    return store.ingest(run["id"], chunk.events, offset=(old, chunk.offset))


def _finalise(store: RunStore, run_id: str, launcher: Launcher) -> None:
    """The process is gone and wrote no final status: decide one from what is known."""
    run = store.get_run(run_id)
    if run["status"] in TERMINAL_STATUSES:
        return
    status, error = getattr(launcher, "exit_status", lambda r: (None, None))(run)
    if run["cancel_requested"]:
        status, error = "cancelled", error or "cancelled by the user"
    if status is None:
        status, error = "lost", "the run's process ended without a final status event"
    store.set_status(run_id, status, error=error)


def sync(store: RunStore | None = None, settings: Settings | None = None) -> int:
    """Ingest every active run's new events and reconcile; returns the number of new rows."""
    store = store or RunStore()
    settings = settings or load_settings()
    new = 0
    for run in store.runs(ACTIVE_STATUSES):
        if not run["handle"]:
            continue  # queued, not started yet
        try:
            launcher = launcher_for(run["target"], settings)
            new += _ingest_new(store, run, launcher)
            if store.get_run(run["id"])["status"] in TERMINAL_STATUSES:
                continue
            if launcher.alive(run) is False:
                new += _ingest_new(store, store.get_run(run["id"]), launcher)  # lines written while it exited
                _finalise(store, run["id"], launcher)
        except LaunchError:
            continue  # unreachable now; try again next time rather than declare the run lost
    _start_queued_local(store, settings)
    return new


def cancel(run_id: str, *, store: RunStore | None = None, settings: Settings | None = None, wait: bool = True,
           grace_s: float = CANCEL_GRACE_S) -> None:
    """Stop a run: SIGTERM (the trainer records ``cancelled``), SIGKILL after ``grace_s``.

    A queued run is cancelled without starting. ``wait=False`` returns at once (the UI) and
    finishes the escalation in a background thread.
    """
    store = store or RunStore()
    run = store.get_run(run_id)
    if run["status"] in TERMINAL_STATUSES:
        return
    store.update_run(run_id, cancel_requested=1)
    if not run["handle"]:
        store.set_status(run_id, "cancelled", error="cancelled before it started")
        return
    launcher = launcher_for(run["target"], settings)
    if wait:
        launcher.cancel(run, grace_s)
        sync(store, settings)
    else:
        threading.Thread(target=launcher.cancel, args=(run, grace_s), daemon=True).start()


def delete(run_id: str, *, store: RunStore | None = None, settings: Settings | None = None) -> None:
    """Cancel if still active, then remove the run from the store and its local directory."""
    store = store or RunStore()
    run = store.get_run(run_id)
    if run["status"] in ACTIVE_STATUSES:
        cancel(run_id, store=store, settings=settings, grace_s=3.0)
    store.delete(run_id)
    run_dir = Path(run["run_dir"])
    runs_root = workbench_home() / RUNS_DIR
    if runs_root in run_dir.resolve().parents:  # never remove anything outside the home's runs/
        shutil.rmtree(run_dir, ignore_errors=True)


def wait(run_id: str, *, store: RunStore | None = None, settings: Settings | None = None, poll_s: float = 0.5,
         timeout_s: float | None = None, on_step=None) -> str:
    """Sync until the run reaches a final status; returns it (``on_step(run)`` after each sync)."""
    store = store or RunStore()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        sync(store, settings)
        run = store.get_run(run_id)
        if on_step is not None:
            on_step(run)
        if run["status"] in TERMINAL_STATUSES:
            return run["status"]
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still {run['status']} after {timeout_s} s")
        time.sleep(poll_s)


_collectors: dict[str, threading.Thread] = {}
_collectors_lock = threading.Lock()


def ensure_collector(store: RunStore | None = None, interval_s: float = 0.25) -> threading.Thread:
    """One background collector thread per store file in this process (the app starts it)."""
    store = store or RunStore()
    key = str(store.path)
    with _collectors_lock:
        thread = _collectors.get(key)
        if thread is None or not thread.is_alive():
            thread = threading.Thread(target=_collect_forever, args=(store, interval_s), daemon=True,
                                      name=f"workbench-collector:{key}")
            thread.start()
            _collectors[key] = thread
    return thread


def _collect_forever(store: RunStore, interval_s: float) -> None:
    """Sync every ``interval_s``; back off (up to 30 s) while syncing fails; stop if the home is gone."""
    delay = interval_s
    while store.path.parent.exists():
        try:
            sync(store)
            delay = interval_s
        except Exception:  # a bad row must not kill the collector; the next pass retries
            import traceback

            traceback.print_exc()
            delay = min(30.0, delay * 2)
        time.sleep(delay)
    with _collectors_lock:
        _collectors.pop(str(store.path), None)
