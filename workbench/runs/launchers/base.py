"""One interface for every place a run can execute (this machine, an SSH host, a SLURM or Ray cluster).

A launcher is a class registered in ``LAUNCHERS`` under the scheme of its target
(``local``, ``ssh``, ``slurm``, ``ray``). The store keeps each run's ``handle`` (a JSON dict the launcher
returned from :meth:`Launcher.start`: pid, remote dir, job id ...) so that any later process (the
app after a restart, the CLI) can poll, cancel and read the run again.

``run`` below is the store's row as a dict: ``id``, ``run_dir`` (local Path string), ``host``,
``recipe`` (YAML text), ``handle`` (dict), ``status``, ``events_offset`` (bytes of events already
ingested).

Every launcher's run directory holds the same three files (the names are defined only here):
``EVENTS_FILE`` (the engine's event stream), ``STDOUT_FILE`` (everything the trainer prints) and
``EXIT_CODE_FILE`` (the trainer's exit status, written by the wrapper when the trainer ends).
"""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from workbench.core.registry import Registry
from workbench.engine.events import EVENTS_FILE

STDOUT_FILE = "stdout.log"
EXIT_CODE_FILE = "exit_code"

__all__ = ["EVENTS_FILE", "EXIT_CODE_FILE", "STDOUT_FILE", "ConfigError", "EventChunk", "LAUNCHERS", "LaunchError",
           "Launcher", "UnreadableLine", "file_identity", "log_cause", "mirror_events", "parse_events", "read_file_events", "read_run_dir_events",
           "status_from_exit_code", "target_scheme", "targets_help", "text_cause"]


class LaunchError(RuntimeError):
    """A run could not be started, reached or cancelled (message says where and why)."""


class ConfigError(LaunchError):
    """The target itself is not usable (unknown scheme, ssh host not in settings, unsafe host entry).

    Unlike a plain LaunchError (host unreachable now), waiting does not help: the collector marks an
    active run whose target raises this ``lost`` instead of retrying it forever.
    """


@dataclass
class EventChunk:
    """Complete event lines read since ``run['events_offset']``; ``offset`` is the new position.

    ``events`` holds the parsed lines in order; a line that is not JSON is kept as an
    :class:`UnreadableLine`, so the store skips and counts it with the other bad events.
    ``warning``: the stream was not where the store left it (see :func:`read_file_events`).
    """

    events: list[Any] = field(default_factory=list)
    offset: int = 0
    warning: str | None = None
    inode: str | None = None
    """``"dev:ino"`` of the file the bytes were read from (None: not a local file); the store
    keeps it beside the offset, so a replaced file (a new inode) is noticed."""


@dataclass(frozen=True)
class UnreadableLine:
    """An event line that is not JSON (torn by a crash mid-write, or garbage); never a dict, so the
    store skips it and counts it in ``skipped_events``."""

    text: bytes

    def __repr__(self) -> str:
        return f"<line that is not JSON: {self.text[:60]!r}>"


class Launcher:
    """Base class: subclasses implement start, alive, cancel and read_events.

    The constructor must do no I/O (only read ``settings``): any LaunchError it raises is taken as a
    configuration error (see ``ConfigError`` and ``workbench.runs.service.launcher_for``).
    """

    scheme = ""
    target_help = ""
    """How a target of this launcher is written, for error messages and help (e.g. ``ssh://HOST (a host in settings)``)."""
    label = ""
    """What the Launch page calls this target (default: the target itself)."""
    alive_every_s = 0.0
    """Least seconds between two ``alive`` checks of one run by the collector (an ssh handshake or
    a squeue call per check is too much at the collector's 4 passes a second)."""

    def __init__(self, target: str, settings) -> None:
        self.target = target  # e.g. "local", "ssh://gpu1", "slurm", "ray://head:8265"
        self.settings = settings

    @classmethod
    def offered_targets(cls, settings) -> dict[str, str]:
        """{target: label} of this launcher that the Launch page offers with ``settings`` (none
        where the settings configure nothing for it); default: the scheme itself."""
        return {cls.scheme: cls.label or cls.scheme}

    def start(self, run: dict) -> dict:
        """Start the run detached (it must outlive this process); return its handle.

        With ``run['launch']['resume']`` the run is continued in its existing run directory
        (``train --resume``) from its newest checkpoint; ``run['launch']['previous_handle']`` is
        the handle of the attempt before (where that attempt ran)."""
        raise NotImplementedError

    def alive(self, run: dict) -> bool | None:
        """True while the run's process/job exists, False once gone, None if it cannot be told now."""
        raise NotImplementedError

    def cancel(self, run: dict, grace_s: float = 10.0) -> None:
        """SIGTERM (the trainer records ``cancelled``), then SIGKILL after ``grace_s``."""
        raise NotImplementedError

    def read_events(self, run: dict) -> EventChunk:
        """New complete event lines since ``run['events_offset']`` (a torn last line waits)."""
        raise NotImplementedError

    def exit_status(self, run: dict) -> tuple[str | None, str | None]:
        """After the process is gone and wrote no final status: ``(status, error)`` if the launcher
        knows how it ended (exit code, scheduler state), ``(None, None)`` if it does not."""
        return None, None

    def latest_checkpoint(self, run: dict) -> tuple[int, PurePath] | None:
        """(step, path) of the run's newest complete checkpoint where its trainer writes them, or
        None: a resume (``run['launch']['resume']``) continues at ``step + 1``, else at step 0.
        Here: the local run dir (this machine, or a cluster's shared filesystem)."""
        from workbench.engine.checkpoint import latest_checkpoint  # torch-free

        return latest_checkpoint(Path(run["run_dir"]))


LAUNCHERS: Registry = Registry("launcher")


def targets_help() -> str:
    """Every registered target form, for 'target=... is not allowed; use one of: ...'."""
    return ", ".join(LAUNCHERS.get(scheme).target_help or scheme for scheme in LAUNCHERS)


def target_scheme(target: str) -> str:
    """'ssh://gpu1' -> 'ssh'; 'local' -> 'local'."""
    return target.split("://", 1)[0]


def parse_events(data: bytes, offset: int, prefix: bytes = b"") -> EventChunk:
    """Parse the complete lines of ``data`` (which starts at byte ``offset`` of the stream).

    Only lines ending in a newline are consumed, so a line being written is read next time.
    With ``prefix`` (stdout mirrors), only lines starting with it are events. A line that is not
    JSON but ends with a whole event (a torn line, cut by a truncation or a crash mid-write, that
    the next event was appended to) gives both: the torn part is skipped and counted, the event
    after it is kept (``_split_glued``).
    """
    end = data.rfind(b"\n") + 1
    events: list[Any] = []
    for line in data[:end].splitlines():
        if prefix:
            if not line.startswith(prefix):
                continue
            line = line[len(prefix):]
        try:
            events.append(json.loads(line))
        except (ValueError, RecursionError):  # torn by a crash mid-write, garbage, or nested too deep
            events.extend(_split_glued(line))
    return EventChunk(events, offset + end)


EVENT_START = b'{"kind": '  # how EventWriter begins every line (json.dumps with ``kind`` first)


def _split_glued(line: bytes) -> list[Any]:
    """An unreadable line as [UnreadableLine(torn part), event] when it ends with a whole event
    that starts at some ``EVENT_START`` after its first byte, else [UnreadableLine(line)]."""
    start = line.find(EVENT_START, 1)
    while start > 0:
        try:
            event = json.loads(line[start:])
        except (ValueError, RecursionError):
            event = None
        if isinstance(event, dict) and "kind" in event:
            return [UnreadableLine(line[:start]), event]
        start = line.find(EVENT_START, start + 1)
    return [UnreadableLine(line)]


def file_identity(st: os.stat_result) -> str:
    """``"dev:ino"``: the same path with another identity is another file (replaced by a rename)."""
    return f"{st.st_dev}:{st.st_ino}"


def read_file_events(path: Path, offset: int, inode: str | None = None) -> EventChunk:
    """New complete events of the event file ``path`` from byte ``offset`` (none while it does not exist).

    The stream is append-only, so byte ``offset - 1`` is the newline that ended the last line the
    store took, in the file ``inode`` (``file_identity``; None: not known yet). If the path now
    names another file (``cp`` then ``mv`` over it), or the file is shorter than ``offset``, or that
    byte is no longer a newline, it was replaced or truncated: lines written since would be lost
    silently, so it is read again from the start (the store keeps the rows it has; keys make the
    replay add only new ones) and the chunk carries a warning for the run.
    """
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            identity, size = file_identity(st), st.st_size
            replaced = inode is not None and identity != inode
            if not replaced:
                f.seek(max(offset - 1, 0))
                data = f.read()
                if offset == 0 or data[:1] == b"\n":
                    chunk = parse_events(data[1:] if offset else data, offset)
                    chunk.inode = identity
                    return chunk
            f.seek(0)
            data = f.read()
    except FileNotFoundError:
        return EventChunk([], offset, inode=inode)
    chunk = parse_events(data, 0)
    chunk.inode = identity
    chunk.warning = (f"{path.name} was replaced by another file (a new inode) after {offset} bytes were ingested; "
                     "read again from the start" if replaced else
                     f"{path.name} shrank from {offset} bytes ingested to {size} bytes (truncated or replaced); "
                     "read again from the start" if size < offset else
                     f"{path.name} was rewritten before byte {offset} (replaced); read again from the start")
    return chunk


def read_run_dir_events(run: dict) -> EventChunk:
    """``read_file_events`` of the run's own ``EVENTS_FILE`` in its local ``run_dir`` (this machine,
    or a cluster's shared filesystem), from the stored offset and file identity (so a replaced
    file is noticed): the one reading of every launcher whose run directory is local."""
    return read_file_events(Path(run["run_dir"]) / EVENTS_FILE, int(run.get("events_offset") or 0),
                            run.get("events_inode"))


def status_from_exit_code(code: int, log_path: Path | None, where: str,
                          ignore: tuple[str, ...] = ()) -> tuple[str | None, str | None]:
    """``(status, error)`` of a trainer that ended with exit ``code`` without a final status event.

    0 -> ``(None, None)`` (a clean exit wrote its own final event); above 128 -> killed by signal
    ``code - 128``; otherwise the code and the last line of ``log_path`` (accelerate's launcher
    prints why its worker died there; None: no local log). ``where`` names the process, e.g.
    ``"trainer process"`` or ``"remote trainer on ssh host 'gpu1'"``. ``ignore``: prefixes of log
    lines that are not the trainer's (e.g. SLURM's ``srun: error: ...`` after it).
    """
    if code == 0:
        return None, None
    if code > 128:
        number = code - 128
        name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else f"signal {number}"
        return "failed", f"{where} killed by {name} (exit code {code})"
    last = _last_line(log_path, ignore=ignore) if log_path is not None else ""
    return "failed", f"{where} exited with code {code}" + (f": {last}" if last else "")


# The last line of a Python traceback: ``OSError: [Errno 28] No space left on device``,
# ``torch.OutOfMemoryError: ...``, ``KeyboardInterrupt`` (an exception's dotted name at column 0).
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Failure)(?::\s.*)?$")
_ANY_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?::\s.*)?$")  # an exception class of any name
_WRAPPER_EXCEPTIONS = ("subprocess.CalledProcessError",)  # accelerate's launcher re-raising a worker's exit
_TRACEBACK_START = "Traceback (most recent call last)"


def log_cause(path: Path, max_bytes: int = 65536) -> str:
    """Why a process died, from its log: the final line of the last traceback in the last
    ``max_bytes`` (at most 500 characters); "" when the log shows no traceback, or the last one
    has no final line (cut short by a kill): nothing to go on, the caller keeps ``lost``.

    Only the last traceback counts: an exception handled and logged earlier, or an
    exception-shaped line printed elsewhere, is not why the process died. The one exception is a
    launcher's re-raise of its worker's exit (``_WRAPPER_EXCEPTIONS``): then the traceback
    before it, the worker's, says why."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - max_bytes))
            return text_cause(f.read().decode(errors="replace"))
    except OSError:
        return ""


def text_cause(text: str) -> str:
    """:func:`log_cause` of a log's text (a remote log fetched whole, e.g. a Ray job's)."""
    lines = [line.rstrip() for line in text.splitlines()]
    starts = [i for i, line in enumerate(lines) if line.startswith(_TRACEBACK_START)]
    for start, end in reversed(list(zip(starts, [*starts[1:], len(lines)]))):
        cause = _final_line(lines[start + 1:end])
        if not cause.startswith(_WRAPPER_EXCEPTIONS):
            return cause[:500]
    return ""


def mirror_events(run: dict, offset: int, data: bytes) -> None:
    """Keep a local copy of a remote run's event stream in its local run dir: ``data`` are the
    stream's bytes from ``offset`` (written in place, so a re-read writes the same bytes again)."""
    run_dir = run.get("run_dir")
    if not data or not run_dir or not Path(run_dir).is_dir():
        return
    fd = os.open(Path(run_dir) / EVENTS_FILE, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def _final_line(block: list[str]) -> str:
    """The exception line of one traceback (the lines after its ``Traceback`` header; frames are
    indented): the first line shaped like a usual exception (``_EXCEPTION_LINE``), else the first
    shaped like any class name with its message (``mylib.Boom: ...``); "" when there is none
    (the traceback was cut short)."""
    for shape in (_EXCEPTION_LINE, _ANY_EXCEPTION_LINE):
        for line in block:
            if shape.match(line):
                return line
    return ""


def _last_line(path: Path, max_bytes: int = 4096, ignore: tuple[str, ...] = ()) -> str:
    """The last non-empty line of a log that starts with none of ``ignore`` (at most 500 characters of it)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, Path(path).stat().st_size - max_bytes))
            lines = [line.strip() for line in f.read().decode(errors="replace").splitlines()
                     if line.strip() and not line.strip().startswith(ignore)]
    except OSError:
        return ""
    return lines[-1][-500:] if lines else ""
