"""One interface for every place a run can execute (this machine, an SSH host, a SLURM cluster).

A launcher is a class registered in ``LAUNCHERS`` under the scheme of its target
(``local``, ``ssh``, ``slurm``). The store keeps each run's ``handle`` (a JSON dict the launcher
returned from :meth:`Launcher.start`: pid, remote dir, job id ...) so that any later process (the
app after a restart, the CLI) can poll, cancel and read the run again.

``run`` below is the store's row as a dict: ``id``, ``run_dir`` (local Path string), ``host``,
``recipe`` (YAML text), ``handle`` (dict), ``status``, ``events_offset`` (bytes of events already
ingested).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.core.registry import Registry


class LaunchError(RuntimeError):
    """A run could not be started, reached or cancelled (message says where and why)."""


@dataclass
class EventChunk:
    """Complete event lines read since ``run['events_offset']``; ``offset`` is the new position."""

    events: list[dict[str, Any]] = field(default_factory=list)
    offset: int = 0


class Launcher:
    """Base class: subclasses implement all four methods."""

    scheme = ""

    def __init__(self, target: str, settings) -> None:
        self.target = target  # e.g. "local", "ssh://gpu1", "slurm"
        self.settings = settings

    def start(self, run: dict) -> dict:
        """Start the run detached (it must outlive this process); return its handle."""
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


LAUNCHERS: Registry = Registry("launcher")


def target_scheme(target: str) -> str:
    """'ssh://gpu1' -> 'ssh'; 'local' -> 'local'."""
    return target.split("://", 1)[0]


def parse_events(data: bytes, offset: int, prefix: bytes = b"") -> EventChunk:
    """Parse the complete lines of ``data`` (which starts at byte ``offset`` of the stream).

    Only lines ending in a newline are consumed, so a line being written is read next time.
    With ``prefix`` (stdout mirrors), only lines starting with it are events.
    """
    import json

    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        if prefix:
            if not line.startswith(prefix):
                continue
            line = line[len(prefix):]
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line torn by a crash in the middle of a write
    return EventChunk(events, offset + end)
