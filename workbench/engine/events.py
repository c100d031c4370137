"""The run's append-only event stream (JSON lines), flushed every event.

Kinds: ``status`` (state changes), ``metrics`` (one line per step), ``samples`` (a few
prompt/completion/reward rows), ``diagnostics`` (per-token ratio, advantage, mask, region for a
subset of the batch), ``lens`` (the same-batch lens, every ``logging.lens_every`` steps; see
``workbench/engine/lens.py``), ``error`` and ``resume`` (a resumed attempt starts again at
its step: the store drops that step and later ones of the attempt before; see checkpoint.py). Every line carries ``kind``, ``step`` and ``time``; ingest is
idempotent by (run, step, kind). The same lines can be mirrored to stdout (remote runs).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

EVENTS_FILE = "events.jsonl"
EVENT_KINDS = ("status", "metrics", "samples", "diagnostics", "lens", "error", "resume")
STDOUT_PREFIX = "@@wb "  # marks event lines among other stdout output


def _jsonable(value: Any) -> Any:
    """Floats that JSON cannot hold (NaN, inf) become None; tensors become lists/numbers."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class EventWriter:
    """Appends events to ``run_dir/events.jsonl`` (and optionally stdout); only rank 0 writes."""

    def __init__(self, run_dir: Path, *, enabled: bool = True, mirror: TextIO | None = None) -> None:
        self.path = Path(run_dir) / EVENTS_FILE
        self.enabled = enabled
        self.mirror = mirror
        self._file = open(self.path, "a", encoding="utf-8") if enabled else None

    def emit(self, kind: str, step: int, **payload: Any) -> None:
        if kind not in EVENT_KINDS:
            raise ValueError(f"event kind={kind!r} is not allowed; choose one of: {', '.join(EVENT_KINDS)}")
        if not self.enabled:
            return
        line = json.dumps({"kind": kind, "step": step, "time": time.time(), **_jsonable(payload)}, allow_nan=False)
        self._reopen_if_replaced()
        self._file.write(line + "\n")
        self._file.flush()  # in the kernel now: a kill -9 right after a step cannot lose it
        if kind in ("status", "error"):  # fsync (~4 ms) only where a machine crash must not lose it
            os.fsync(self._file.fileno())
        if self.mirror is not None:
            self.mirror.write(STDOUT_PREFIX + line + "\n")
            self.mirror.flush()

    def _reopen_if_replaced(self) -> None:
        """A file moved over ``events.jsonl`` (``cp`` then ``mv``) or its removal would leave this
        writer appending to the old, unlinked inode, where no reader finds the later events:
        append to whatever the path names now (the collector notices the new inode and reads it
        again from the start)."""
        try:
            same = os.path.samestat(os.stat(self.path), os.fstat(self._file.fileno()))
        except FileNotFoundError:
            same = False
        if not same:
            self._file.close()
            self._file = open(self.path, "a", encoding="utf-8")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """All complete event lines of a run (a torn last line from a crash is skipped)."""
    path = Path(run_dir) / EVENTS_FILE
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def stdout_mirror(enabled: bool) -> TextIO | None:
    return sys.stdout if enabled else None
