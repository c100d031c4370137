"""The collector: keeps the store in step with the runs.

``sync`` ingests, for every active run, the new events its launcher can read, starts queued local
runs when a slot is free (``scheduler.start_queued_local``), and gives runs whose process is gone a
final status (from their last events, the wrapper's exit code, or ``lost``), so nothing stays
"running" forever. It is safe to call from several processes at once: ingest is compare-and-set
on the event offset (``RunRepository.ingest``). ``ensure_collector`` runs it in a background thread
(the app); ``wait`` follows one run to its end (the CLI's ``--wait``).
"""

from __future__ import annotations

import logging
import threading
import time

from workbench.runs.launchers import ConfigError, LaunchError, Launcher
from workbench.runs.records import ACTIVE_STATUSES, Run, RunRepository
from workbench.runs.scheduler import launcher_for, start_queued_local
from workbench.runs.settings import Settings, load_settings
from workbench.runs.store import RunStore, StoreError

log = logging.getLogger(__name__)


def ingest_new(store: RunRepository, run: Run, launcher: Launcher) -> int:
    """Ingest what the launcher reads past the run's offset (and the file identity it read it
    from: a local events file replaced by a rename is read again, see ``read_file_events``)."""
    chunk = launcher.read_events(run)
    old, old_inode = run.events_offset, run.events_inode
    new_inode = chunk.inode or old_inode
    if chunk.offset == old and chunk.warning is None and new_inode == old_inode:
        return 0
    return store.ingest(run.id, chunk.events, offset=(old, chunk.offset), inode=(old_inode, new_inode),
                        warning=chunk.warning)


def _finalise(store: RunRepository, run_id: str, launcher: Launcher) -> None:
    """The process is gone and wrote no final status: decide one from what is known."""
    run = store.get_run(run_id)
    if run.terminal:
        return
    status, error = launcher.exit_status(run)
    if run.cancel_requested:
        status, error = "cancelled", error or "cancelled by the user"
    if status is None:
        status, error = "lost", "the run's process ended without a final status event"
    store.set_status(run_id, status, error=error)


_last_alive: dict[tuple[str, str], float] = {}  # (store identity, run id) -> monotonic time of the last alive()


def alive_check_due(last_checked: float | None, now: float, every_s: float) -> bool:
    """Whether the collector should ask the launcher ``alive`` again (at most once per ``every_s``)."""
    return last_checked is None or now - last_checked >= every_s


def sync(store: RunRepository | None = None, settings: Settings | None = None) -> int:
    """Ingest every active run's new events and reconcile; returns the number of new rows.

    A run whose target no longer exists in the settings becomes ``lost``; an unreachable one is
    retried next time; any other failure of one run is logged and does not stop the others.
    A store that cannot be written raises StoreError at once: a collector that cannot record
    anything must say so, not report "0 rows".
    """
    store = store or RunStore()
    settings = settings or load_settings()
    store.check_writable()
    new = 0
    for run in store.runs(ACTIVE_STATUSES):
        if not run.handle:
            continue  # queued, or being started by the queue right now
        try:
            new += _sync_run(store, run, settings)
        except StoreError:
            raise  # the file, not this run: every other run would fail the same way
        except ConfigError as err:
            lose(store, run.id, err)
        except LaunchError:
            continue  # unreachable now; try again next time rather than declare the run lost
        except Exception:  # noqa: BLE001  (one broken run must not stop the collector for all the others)
            log.exception("syncing run %s failed; the next pass retries it", run.id)
    start_queued_local(store, settings)
    return new


def lose(store: RunRepository, run_id: str, err: ConfigError) -> None:
    """The run's target is gone from the settings: nothing can follow or stop it any more."""
    store.set_status(run_id, "lost", error=f"cannot follow this run any more: {err}")


def _sync_run(store: RunRepository, run: Run, settings: Settings) -> int:
    launcher = launcher_for(run.target, settings)
    key = (store.identity, run.id)
    new = ingest_new(store, run, launcher)
    if store.get_run(run.id).terminal:
        _last_alive.pop(key, None)
        return new
    now = time.monotonic()
    if not alive_check_due(_last_alive.get(key), now, getattr(launcher, "alive_every_s", 0.0)):
        return new
    _last_alive[key] = now
    if launcher.alive(run) is False:
        new += ingest_new(store, store.get_run(run.id), launcher)  # lines written while it exited
        _finalise(store, run.id, launcher)
        _last_alive.pop(key, None)
    return new


def wait(run_id: str, *, store: RunRepository | None = None, settings: Settings | None = None, poll_s: float = 0.5,
         timeout_s: float | None = None, on_step=None) -> str:
    """Sync until the run reaches a final status; returns it (``on_step(run)`` after each sync)."""
    store = store or RunStore()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        sync(store, settings)
        run = store.get_run(run_id)
        if on_step is not None:
            on_step(run)
        if run.terminal:
            return run.status
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still {run.status} after {timeout_s} s")
        time.sleep(poll_s)


_collectors: dict[str, threading.Thread] = {}


_collectors_lock = threading.Lock()


def ensure_collector(store: RunRepository | None = None, interval_s: float = 0.25) -> threading.Thread:
    """One background collector thread per store file in this process (the app starts it)."""
    store = store or RunStore()
    key = store.identity
    with _collectors_lock:
        thread = _collectors.get(key)
        if thread is None or not thread.is_alive():
            thread = threading.Thread(target=_collect_forever, args=(store, interval_s), daemon=True,
                                      name=f"workbench-collector:{key}")
            thread.start()
            _collectors[key] = thread
    return thread


def _collect_forever(store: RunRepository, interval_s: float) -> None:
    """Sync every ``interval_s``; back off (up to 30 s) while syncing fails; stop if the home is gone."""
    delay = interval_s
    while store.is_open():
        try:
            sync(store)
            delay = interval_s
        except Exception:  # noqa: BLE001  (bad settings must not kill the collector; the next pass retries)
            log.exception("collector pass failed; retrying in %.1f s", min(30.0, delay * 2))
            delay = min(30.0, delay * 2)
        time.sleep(delay)
    with _collectors_lock:
        _collectors.pop(store.identity, None)


def forget_alive_check(store: RunRepository, run_id: str) -> None:
    """The next ``sync`` asks the launcher whether ``run_id`` is alive at once (after a cancel)."""
    _last_alive.pop((store.identity, run_id), None)
