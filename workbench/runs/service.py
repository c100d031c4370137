"""What the CLI and the UI call: launch, cancel, delete, and keep the store in step with the runs.

``sync`` is the collector: for every active run it ingests the new events its launcher can read,
starts queued local runs when a slot is free, and gives runs whose process is gone a final status
(from their last events, the wrapper's exit code, or ``lost``) so nothing stays "running" forever.
It is safe to call from several processes at once: ingest is compare-and-set on the event offset
(``RunStore.ingest``), and queued local runs are started under one lock per store file, each after
winning a compare-and-set claim (``RunStore.claim_queued``), so a run starts exactly once.
"""

from __future__ import annotations

import getpass
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Iterable

from workbench.export.commands import MIXED_PRECISION
from workbench.home import confined_path, workbench_home
from workbench.recipe import Recipe
from workbench.runs.launchers import LAUNCHERS, ConfigError, LaunchError, Launcher, target_scheme
from workbench.runs.names import check_group, check_run_name, check_tag, new_run_id
from workbench.runs.settings import Settings, load_settings
from workbench.runs.store import ACTIVE_STATUSES, TERMINAL_STATUSES, RunError, RunStore

RUNS_DIR = "runs"
CANCEL_GRACE_S = 10.0
# fields a comparison group forces to the first recipe's values, so curves are comparable
GROUP_SHARED_FIELDS = ("model", "task", "dataset", "sampling.prompts_per_step", "train.seed")
QUEUE_LOCK = "queue"
log = logging.getLogger(__name__)


def launcher_for(target: str, settings: Settings | None = None) -> Launcher:
    """The launcher object of a target string ('local', 'ssh://NAME', 'slurm').

    ConfigError when the target cannot be used at all (unknown scheme, host not in settings):
    launcher constructors do no I/O, so every LaunchError they raise is about configuration.
    """
    scheme = target_scheme(target)
    if scheme not in LAUNCHERS:
        raise ConfigError(f"target={target!r} is not allowed; use one of: local, ssh://HOST (a host in settings), slurm")
    try:
        return LAUNCHERS.get(scheme)(target, settings or load_settings())
    except ConfigError:
        raise
    except LaunchError as err:
        raise ConfigError(str(err)) from err


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
        launch={"num_processes": num_processes, "mixed_precision": MIXED_PRECISION[recipe.train.precision]})
    if launcher.scheme != "local":
        try:
            _claim_and_start(store, store.get_run(run_id), launcher)
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


def _claim_and_start(store: RunStore, run: dict, launcher: Launcher) -> bool:
    """Start a queued run if this caller wins its claim (False: another caller did, or it was
    cancelled first). The handle is recorded before ``cancel_requested`` is read, and ``cancel``
    sets that flag before it reads the handle, so a cancel racing with the start is never lost:
    one of the two sides sees the other and stops the process."""
    if not store.claim_queued(run["id"]):
        return False
    _start_claimed(store, run, launcher)
    return True


def _visible_gpus() -> list[int]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [int(x) for x in env.split(",") if x.strip().isdigit()]
    import torch

    return list(range(torch.cuda.device_count()))


def usable_gpus(gpu_slots: int | None, visible: list[int]) -> list[int]:
    """The GPUs local runs may take: the first ``gpu_slots`` visible devices (None: all; 0: none,
    every local run then uses the CPU slots). See ``Settings.gpu_slots``."""
    return list(visible) if gpu_slots is None else list(visible[:gpu_slots])


def _needs(run: dict) -> int:
    return int(run["launch"].get("num_processes", 1))


def _start_queued_local(store: RunStore, settings: Settings) -> int:
    """Start queued local runs while slots are free (FIFO); returns how many started.

    One caller at a time per store file (a lock shared by every process), so the slot count it
    reads cannot change under it except by runs ending.
    """
    with store.lock(QUEUE_LOCK):
        local = [r for r in store.runs(ACTIVE_STATUSES) if r["launcher"] == "local"]
        queued = [r for r in local if r["status"] == "queued"]
        claimed = [r for r in local if r["status"] != "queued"]
        running = [r for r in claimed if not _drop_orphaned_claim(store, r)]
        if not queued:
            return 0
        usable = usable_gpus(settings.gpu_slots, _visible_gpus())
        launcher = launcher_for("local", settings)
        started = 0
        for run in queued:
            if run["cancel_requested"]:  # a cancel that stopped half-way: finish it
                store.cancel_queued(run["id"])
                continue
            placement = _place(run, running, usable, settings)
            if placement is _WAIT:
                break
            if isinstance(placement, str):
                store.set_status(run["id"], "failed", error=placement)
                continue
            if not store.claim_queued(run["id"]):
                continue  # cancelled meanwhile
            if placement:
                run["launch"]["gpus"] = placement
                store.update_run(run["id"], launch=run["launch"])
            try:
                _start_claimed(store, run, launcher)
            except LaunchError as err:
                store.set_status(run["id"], "failed", error=str(err))
                continue
            running.append(store.get_run(run["id"]))
            started += 1
        return started


def _start_claimed(store: RunStore, run: dict, launcher: Launcher) -> None:
    """Start a run this caller has claimed and record its handle; then honour a cancel that came
    while it was starting (that cancel saw no handle to signal)."""
    store.update_run(run["id"], handle=launcher.start(run))
    current = store.get_run(run["id"])
    if current["cancel_requested"]:
        launcher.cancel(current, CANCEL_GRACE_S)


def _drop_orphaned_claim(store: RunStore, run: dict) -> bool:
    """A claimed local run without a handle, seen under the queue lock: its claimer died between
    the claim and recording the process (claims and handles are only written under that lock).
    Marks it ``lost``; True if it was one."""
    if run["status"] != "starting" or run["handle"]:
        return False
    store.set_status(run["id"], "lost", error="the process starting this run ended before recording it")
    return True


_WAIT = object()  # placement: not now, keep the queue order


def _place(run: dict, running: list[dict], usable: list[int], settings: Settings):
    """Where a queued run can go now: its GPU list (``[]``: CPU), ``_WAIT``, or an error message
    when it can never start here."""
    need = _needs(run)
    if usable:
        if need > len(usable):
            return (f"this run needs {need} GPUs (one per process) but only {len(usable)} can be used here "
                    f"(gpu_slots={settings.gpu_slots}, visible: {usable}); launch it with at most {len(usable)} processes")
        busy = {g for r in running for g in r["launch"].get("gpus", [])}
        free = [g for g in usable if g not in busy]
        return free[:need] if len(free) >= need else _WAIT
    on_cpu = [r for r in running if not r["launch"].get("gpus")]
    if on_cpu and sum(_needs(r) for r in on_cpu) + need > settings.cpu_slots:
        return _WAIT
    return []


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
    status, error = launcher.exit_status(run)
    if run["cancel_requested"]:
        status, error = "cancelled", error or "cancelled by the user"
    if status is None:
        status, error = "lost", "the run's process ended without a final status event"
    store.set_status(run_id, status, error=error)


_last_alive: dict[tuple[str, str], float] = {}  # (store file, run id) -> monotonic time of the last alive()


def alive_check_due(last_checked: float | None, now: float, every_s: float) -> bool:
    """Whether the collector should ask the launcher ``alive`` again (at most once per ``every_s``)."""
    return last_checked is None or now - last_checked >= every_s


def sync(store: RunStore | None = None, settings: Settings | None = None) -> int:
    """Ingest every active run's new events and reconcile; returns the number of new rows.

    A run whose target no longer exists in the settings becomes ``lost``; an unreachable one is
    retried next time; any other failure of one run is logged and does not stop the others.
    """
    store = store or RunStore()
    settings = settings or load_settings()
    new = 0
    for run in store.runs(ACTIVE_STATUSES):
        if not run["handle"]:
            continue  # queued, or being started by the queue right now
        try:
            new += _sync_run(store, run, settings)
        except ConfigError as err:
            _lose(store, run["id"], err)
        except LaunchError:
            continue  # unreachable now; try again next time rather than declare the run lost
        except Exception:  # noqa: BLE001  (one broken run must not stop the collector for all the others)
            log.exception("syncing run %s failed; the next pass retries it", run["id"])
    _start_queued_local(store, settings)
    return new


def _lose(store: RunStore, run_id: str, err: ConfigError) -> None:
    """The run's target is gone from the settings: nothing can follow or stop it any more."""
    store.set_status(run_id, "lost", error=f"cannot follow this run any more: {err}")


def _sync_run(store: RunStore, run: dict, settings: Settings) -> int:
    launcher = launcher_for(run["target"], settings)
    key = (str(store.path), run["id"])
    new = _ingest_new(store, run, launcher)
    if store.get_run(run["id"])["status"] in TERMINAL_STATUSES:
        _last_alive.pop(key, None)
        return new
    now = time.monotonic()
    if not alive_check_due(_last_alive.get(key), now, getattr(launcher, "alive_every_s", 0.0)):
        return new
    _last_alive[key] = now
    if launcher.alive(run) is False:
        new += _ingest_new(store, store.get_run(run["id"]), launcher)  # lines written while it exited
        _finalise(store, run["id"], launcher)
        _last_alive.pop(key, None)
    return new


def cancel(run_id: str, *, store: RunStore | None = None, settings: Settings | None = None, wait: bool = True,
           grace_s: float = CANCEL_GRACE_S) -> None:
    """Stop a run: SIGTERM (the trainer records ``cancelled``), SIGKILL after ``grace_s``.

    A queued run is cancelled without starting (compare-and-set against the queue's claim); one
    that the queue is starting right now is cancelled by the queue once its process is recorded.
    ``wait=False`` returns at once (the UI) and finishes the escalation in a background thread.
    """
    store = store or RunStore()
    if store.get_run(run_id)["status"] in TERMINAL_STATUSES or store.cancel_queued(run_id):
        return
    store.update_run(run_id, cancel_requested=1)  # before reading the handle (see _claim_and_start)
    run = store.get_run(run_id)
    if not run["handle"] or run["status"] in TERMINAL_STATUSES:
        return
    try:
        launcher = launcher_for(run["target"], settings)
    except ConfigError as err:
        _lose(store, run_id, err)  # so that it can still be deleted
        return
    _last_alive.pop((str(store.path), run_id), None)  # the next sync asks at once
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
        except Exception:  # noqa: BLE001  (bad settings must not kill the collector; the next pass retries)
            log.exception("collector pass failed; retrying in %.1f s", min(30.0, delay * 2))
            delay = min(30.0, delay * 2)
        time.sleep(delay)
    with _collectors_lock:
        _collectors.pop(str(store.path), None)
