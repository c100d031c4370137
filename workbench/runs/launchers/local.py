"""Runs on this machine: a detached process group that outlives the app.

The trainer is started by a small ``sh`` wrapper in its own session (``setsid``), double-forked so
that init, not the app, becomes its parent (no zombies, survives an app restart). The wrapper
records the trainer's exit code in ``exit_code``, which tells a crash (``kill -9``: 137) from a
clean end when the event stream alone cannot.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from workbench.export.commands import shell_join, train_command
from workbench.runs.launchers.base import LAUNCHERS, EventChunk, LaunchError, Launcher, parse_events

EXIT_CODE_FILE = "exit_code"
STDOUT_FILE = "stdout.log"

# `setsid` gives the trainer its own process group (cancel signals the whole group: accelerate's
# launcher and every rank); `&` + `echo $!` returns at once, so init adopts the wrapper.
_DETACH = 'setsid sh -c \'"$@" > {stdout} 2>&1; echo $? > {exit_code}\' wb-run {argv} < /dev/null > /dev/null 2>&1 & echo $!'


def _start_time(pid: int) -> str | None:
    """Process start time from /proc (guards against a recycled pid); None if no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie has finished
        return None
    return fields[19]


@LAUNCHERS.register("local")
class LocalLauncher(Launcher):
    """``accelerate launch -m workbench train`` as a detached process group on this machine."""

    scheme = "local"

    def command(self, run: dict) -> list[str]:
        launch = run.get("launch") or {}
        return train_command(
            str(Path(run["run_dir"]) / "recipe.yaml"), run["run_dir"], python=sys.executable,
            num_processes=int(launch.get("num_processes", 1)), cpu=not launch.get("gpus"),
            mixed_precision=launch.get("mixed_precision", "no"))

    def environment(self, run: dict) -> dict[str, str]:
        launch = run.get("launch") or {}
        env = dict(os.environ)
        gpus = launch.get("gpus") or []
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)  # "" hides every GPU from CPU runs
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def start(self, run: dict) -> dict:
        run_dir = Path(run["run_dir"])
        argv = self.command(run)
        script = _DETACH.format(stdout=STDOUT_FILE, exit_code=EXIT_CODE_FILE, argv=shell_join(argv))
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
        handle = run.get("handle") or {}
        pid = handle.get("pid")
        if pid is None:
            return False
        current = _start_time(pid)
        if current is None:
            return False
        return handle.get("start_time") in (None, current)

    def cancel(self, run: dict, grace_s: float = 10.0) -> None:
        pgid = (run.get("handle") or {}).get("pgid")
        if pgid is None or not self.alive(run):
            return
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not _group_exists(pgid):
                return
            time.sleep(0.1)
        _signal_group(pgid, signal.SIGKILL)

    def read_events(self, run: dict) -> EventChunk:
        offset = int(run.get("events_offset") or 0)
        path = Path(run["run_dir"]) / "events.jsonl"
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return EventChunk([], offset)
        return parse_events(data, offset)

    def exit_status(self, run: dict) -> tuple[str | None, str | None]:
        """After the process is gone: (status, error) from the wrapper's exit code, if it wrote one."""
        path = Path(run["run_dir"]) / EXIT_CODE_FILE
        try:
            code = int(path.read_text().strip())
        except (OSError, ValueError):
            return None, None  # the wrapper itself was killed: nothing to go on
        if code == 0:
            return None, None  # a clean exit wrote its own final status event
        if code > 128:
            name = signal.Signals(code - 128).name if code - 128 in signal.Signals._value2member_map_ else str(code - 128)
            return "failed", f"trainer process killed by {name} (exit code {code})"
        last = _last_line(Path(run["run_dir"]) / STDOUT_FILE)
        return "failed", f"trainer process exited with code {code}" + (f": {last}" if last else "")


def _last_line(path: Path, max_bytes: int = 4096) -> str:
    """The last non-empty line of a log (accelerate's launcher prints why its worker died there)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - max_bytes))
            lines = [l.strip() for l in f.read().decode(errors="replace").splitlines() if l.strip()]
    except OSError:
        return ""
    return lines[-1][-500:] if lines else ""


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_exists(pgid: int) -> bool:
    """Any live (non-zombie) process left in the group? Zombies count as gone: PID 1 in some
    containers never reaps orphans, so ``killpg(pgid, 0)`` would report finished runs forever."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False
