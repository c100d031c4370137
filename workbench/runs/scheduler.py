"""The local queue and its placement on CPU / GPU slots, and starting a claimed run on any target.

Queued local runs start FIFO while slots are free (``start_queued_local``), one caller at a time
per store (``RunRepository.lock``), each after winning a compare-and-set claim
(``RunRepository.claim_queued``), so a run starts exactly once however many processes race.
"""

from __future__ import annotations

import dataclasses

from workbench.runs.launchers import LAUNCHERS, ConfigError, LaunchError, Launcher, target_scheme, targets_help
from workbench.runs.records import ACTIVE_STATUSES, Run, RunRepository
from workbench.runs.settings import Settings, load_settings

CANCEL_GRACE_S = 10.0
QUEUE_LOCK = "queue"


def launcher_for(target: str, settings: Settings | None = None) -> Launcher:
    """The launcher object of a target string ('local', 'ssh://NAME', 'slurm', 'ray', 'ray://HOST:PORT').

    ConfigError when the target cannot be used at all (unknown scheme, host not in settings):
    launcher constructors do no I/O, so every LaunchError they raise is about configuration.
    """
    scheme = target_scheme(target)
    if scheme not in LAUNCHERS:
        raise ConfigError(f"target={target!r} is not allowed; use one of: {targets_help()}")
    try:
        return LAUNCHERS.get(scheme)(target, settings or load_settings())
    except ConfigError:
        raise
    except LaunchError as err:
        raise ConfigError(str(err)) from err


def claim_and_start(store: RunRepository, run: Run, launcher: Launcher) -> bool:
    """Start a queued run if this caller wins its claim (False: another caller did, or it was
    cancelled first). The handle is recorded before ``cancel_requested`` is read, and ``cancel``
    sets that flag before it reads the handle, so a cancel racing with the start is never lost:
    one of the two sides sees the other and stops the process."""
    if not store.claim_queued(run.id):
        return False
    _start_claimed(store, run, launcher)
    return True


def usable_gpus(gpu_slots: int | None, visible: list[int]) -> list[int]:
    """The GPUs local runs may take: the first ``gpu_slots`` visible devices (None: all; 0: none,
    every local run then uses the CPU slots). See ``Settings.gpu_slots``."""
    return list(visible) if gpu_slots is None else list(visible[:gpu_slots])


def start_queued_local(store: RunRepository, settings: Settings) -> int:
    """Start queued local runs while slots are free (FIFO); returns how many started.

    One caller at a time per store file (a lock shared by every process), so the slot count it
    reads cannot change under it except by runs ending.
    """
    with store.lock(QUEUE_LOCK):
        local = [r for r in store.runs(ACTIVE_STATUSES) if r.launcher == "local"]
        queued = [r for r in local if r.status == "queued"]
        claimed = [r for r in local if r.status != "queued"]
        running = [r for r in claimed if not _drop_orphaned_claim(store, r)]
        if not queued:
            return 0
        from workbench.machine import visible_gpus  # here: the recipe schema it imports loads only for a queued run

        usable = usable_gpus(settings.gpu_slots, visible_gpus(torch_on_rocm=True))
        launcher = launcher_for("local", settings)
        started = 0
        for run in queued:
            if run.cancel_requested:  # a cancel that stopped half-way: finish it
                store.cancel_queued(run.id)
                continue
            placement = _place(run, running, usable, settings)
            if placement is _WAIT:
                break
            if isinstance(placement, str):
                store.set_status(run.id, "failed", error=placement)
                continue
            if not store.claim_queued(run.id):
                continue  # cancelled meanwhile
            if placement:
                run = dataclasses.replace(run, launch={**run.launch, "gpus": placement})
                store.update_run(run.id, launch=run.launch)
            try:
                _start_claimed(store, run, launcher)
            except LaunchError as err:
                store.set_status(run.id, "failed", error=str(err))
                continue
            running.append(store.get_run(run.id))
            started += 1
        return started


def _start_claimed(store: RunRepository, run: Run, launcher: Launcher) -> None:
    """Start a run this caller has claimed and record its handle; then honour a cancel that came
    while it was starting (that cancel saw no handle to signal)."""
    store.update_run(run.id, handle=launcher.start(run))
    current = store.get_run(run.id)
    if current.cancel_requested:
        launcher.cancel(current, CANCEL_GRACE_S)


def _drop_orphaned_claim(store: RunRepository, run: Run) -> bool:
    """A claimed local run without a handle, seen under the queue lock: its claimer died between
    the claim and recording the process (claims and handles are only written under that lock).
    Marks it ``lost``; True if it was one."""
    if run.status != "starting" or run.handle:
        return False
    store.set_status(run.id, "lost", error="the process starting this run ended before recording it")
    return True


_WAIT = object()  # placement: not now, keep the queue order


def _place(run: Run, running: list[Run], usable: list[int], settings: Settings):
    """Where a queued run can go now: its GPU list (``[]``: CPU), ``_WAIT``, or an error message
    when it can never start here."""
    need = run.num_processes
    if usable:
        if need > len(usable):
            return (f"this run needs {need} GPUs (one per process) but only {len(usable)} can be used here "
                    f"(gpu_slots={settings.gpu_slots}, visible: {usable}); launch it with at most {len(usable)} processes")
        busy = {g for r in running for g in r.launch.get("gpus", [])}
        free = [g for g in usable if g not in busy]
        return free[:need] if len(free) >= need else _WAIT
    on_cpu = [r for r in running if not r.launch.get("gpus")]
    if on_cpu and sum(r.num_processes for r in on_cpu) + need > settings.cpu_slots:
        return _WAIT
    return []
