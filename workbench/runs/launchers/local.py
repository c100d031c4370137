"""Runs on this machine: a detached process group that outlives the app.

The trainer is started by a small wrapper (``reaper.py``) in its own session (``setsid``),
double-forked so that init, not the app, becomes its parent (no zombies, survives an app restart).
The wrapper is the run's child subreaper and lives until every process of the run has ended
(it ignores the cancel's SIGTERM and reaps the orphans of a launcher that died), then records the
launcher's exit code in ``exit_code``, which tells a crash (``kill -9``: 137) from a clean end when
the event stream alone cannot. So ``alive`` is the wrapper's pid; should the wrapper itself be
killed, it is any process carrying the run's id in its environment (``RUN_ID_ENV``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from workbench.export.commands import shell_join, train_command
from workbench.runs.launchers.base import (EXIT_CODE_FILE, LAUNCHERS, STDOUT_FILE, EventChunk, LaunchError, Launcher,
                                           log_cause, read_run_dir_events, status_from_exit_code)

# `setsid` gives the run its own process group (cancel signals the whole group: accelerate's
# launcher and every rank); `&` + `echo $!` returns at once, so init adopts the wrapper.
_DETACH = "setsid {wrapper} < /dev/null > /dev/null 2>&1 & echo $!"
REAPER = Path(__file__).with_name("reaper.py")
RUN_ID_ENV = "WORKBENCH_RUN_ID"  # inherited by every process of the run: finds them once the wrapper is gone
KILL_WAIT_S = 5.0  # after SIGKILL of the trainer's processes, how long the wrapper gets to record it


class _Proc(NamedTuple):
    pid: int
    ppid: int
    pgid: int
    start_time: str


def _processes() -> list[_Proc]:
    """Every live (non-zombie) process on this machine, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            proc = _read_proc(int(entry.name))
            if proc is not None:
                found.append(proc)
    return found


def _read_proc(pid: int) -> _Proc | None:
    """One process from /proc/PID/stat; None if there is none or it is a zombie (it has finished:
    PID 1 in some containers never reaps orphans, so zombies must count as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":
        return None
    return _Proc(pid, int(fields[1]), int(fields[2]), fields[19])


def _start_time(pid: int) -> str | None:
    """Process start time from /proc (guards against a recycled pid); None if no such process."""
    proc = _read_proc(pid)
    return None if proc is None else proc.start_time


def _descendants(root: int) -> dict[int, str]:
    """{pid: start time} of every live descendant of ``root``, whatever its session (torch elastic
    starts multi-process workers with ``start_new_session=True``: a group signal misses them)."""
    table = _processes()
    children: dict[int, list[_Proc]] = {}
    for proc in table:
        children.setdefault(proc.ppid, []).append(proc)
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child.pid not in found:
                found[child.pid] = child.start_time
                todo.append(child.pid)
    return found


def _survivors(known: dict[int, str]) -> list[int]:
    """Pids of ``known`` that still run (same start time: not a recycled pid)."""
    return [pid for pid, start in known.items() if _start_time(pid) == start]


def _group_members(pgid: int) -> list[int]:
    return [p.pid for p in _processes() if p.pgid == pgid]


@LAUNCHERS.register("local")
class LocalLauncher(Launcher):
    """``accelerate launch -m workbench train`` as a detached process group on this machine."""

    scheme = "local"
    label = "this machine"
    alive_every_s = 0.0  # a /proc read: cheap enough for every collector pass

    def command(self, run: dict) -> list[str]:
        launch = run.get("launch") or {}
        processes = int(launch.get("num_processes", 1))
        return train_command(
            str(Path(run["run_dir"]) / "recipe.yaml"), run["run_dir"], python=sys.executable,
            num_processes=processes, cpu=not launch.get("gpus"), mixed_precision=launch.get("mixed_precision", "no"),
            main_process_port=str(_free_port()) if processes > 1 else None, resume=bool(launch.get("resume")))

    def environment(self, run: dict) -> dict[str, str]:
        launch = run.get("launch") or {}
        env = dict(os.environ)
        gpus = launch.get("gpus") or []
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)  # "" hides every GPU from CPU runs
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONUNBUFFERED"] = "1"
        env[RUN_ID_ENV] = str(run["id"])
        return env

    def start(self, run: dict) -> dict:
        run_dir = Path(run["run_dir"])
        (run_dir / EXIT_CODE_FILE).unlink(missing_ok=True)  # a resumed run's previous attempt left one
        argv = self.command(run)
        wrapper = shell_join([sys.executable, str(REAPER), STDOUT_FILE, EXIT_CODE_FILE, "--", *argv])
        script = _DETACH.format(wrapper=wrapper)
        try:
            out = subprocess.run(["sh", "-c", script], cwd=run_dir, env=self.environment(run), capture_output=True,
                                 text=True, timeout=30, check=True)
            pid = int(out.stdout.strip())
        except (OSError, subprocess.SubprocessError, ValueError) as err:
            raise LaunchError(f"could not start the run on this machine: {err}") from err
        start = None
        for _ in range(50):  # setsid may still be exec'ing
            start = _start_time(pid)
            if start is not None:
                break
            time.sleep(0.01)
        return {"pid": pid, "pgid": pid, "start_time": start, "command": shell_join(argv)}

    def alive(self, run: dict) -> bool | None:
        """While the wrapper lives (it outlives every process of the run); if the wrapper itself
        was killed, while any process of the run is left (they go on writing events)."""
        if _wrapper_alive(run):
            return True
        return bool(_run_processes(str(run["id"])))

    def cancel(self, run: dict, grace_s: float = 10.0) -> None:
        """SIGTERM to the group; after ``grace_s`` SIGKILL to every process of the run that is left
        (group members and descendants in other sessions, seen before or during the grace), except
        the wrapper, which then records the exit code and ends by itself."""
        handle = run.get("handle") or {}
        pgid, wrapper = handle.get("pgid"), handle.get("pid")
        if pgid is None or not self.alive(run):
            return
        known = _run_processes(str(run["id"]))  # with the orphans of a wrapper that was killed
        if _wrapper_alive(run):
            known[wrapper] = _start_time(wrapper)
            _add_descendants(known, wrapper)  # before the signal, as the tree changes when parents exit
        _signal_group(pgid, signal.SIGTERM)
        if _wait_gone(pgid, wrapper, known, grace_s):
            return
        for pid in (set(_survivors(known)) | set(_group_members(pgid))) - {wrapper}:
            _kill(pid, signal.SIGKILL)
        if not _wait_gone(pgid, wrapper, known, KILL_WAIT_S):
            _signal_group(pgid, signal.SIGKILL)  # the wrapper itself is stuck: no exit code then

    def read_events(self, run: dict) -> EventChunk:
        return read_run_dir_events(run)

    def exit_status(self, run: dict) -> tuple[str | None, str | None]:
        """After the process is gone: (status, error) from the wrapper's exit code, if it wrote one.
        Without one (the wrapper was killed, or could not write it: a full disk), the trainer's
        log may still say why: a traceback's last line (``OSError: [Errno 28] No space left on
        device``) makes the run ``failed`` with it; no traceback leaves nothing to go on."""
        log_path = Path(run["run_dir"]) / STDOUT_FILE
        try:
            code = int((Path(run["run_dir"]) / EXIT_CODE_FILE).read_text().strip())
        except (OSError, ValueError):
            cause = log_cause(log_path)
            return ("failed", f"the trainer process ended without a final status event: {cause}") if cause else (None, None)
        return status_from_exit_code(code, log_path, "trainer process")


def _wrapper_alive(run: dict) -> bool:
    handle = run.get("handle") or {}
    pid = handle.get("pid")
    current = None if pid is None else _start_time(pid)
    return current is not None and handle.get("start_time") in (None, current)


def _run_processes(run_id: str) -> dict[int, str]:
    """{pid: start time} of live processes whose environment carries ``RUN_ID_ENV=run_id`` (this
    user's; /proc/PID/environ of others is unreadable). A scan of /proc: only used once the
    wrapper is gone, and by cancel."""
    marker = f"{RUN_ID_ENV}={run_id}".encode()
    found = {}
    for proc in _processes():
        try:
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found[proc.pid] = proc.start_time
    return found


def _add_descendants(known: dict[int, str], wrapper: int) -> None:
    """Add the wrapper's current descendants to ``known`` (while the wrapper is still the same
    process: a recycled pid's children are none of ours)."""
    if wrapper in known and _start_time(wrapper) == known[wrapper]:
        known.update(_descendants(wrapper))


def _wait_gone(pgid: int, wrapper: int, known: dict[int, str], timeout_s: float) -> bool:
    """Poll until no process of the run is left (group and ``known``, which grows with descendants
    started meanwhile); False if some are still there after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        _add_descendants(known, wrapper)
        if not _group_members(pgid) and not _survivors(known):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _free_port() -> int:
    """A free TCP port for this run's rendezvous (two multi-process runs must not share 29500)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
