"""What an event line must look like before any store writes it: pure, backend-neutral checks.

A run's event stream (``events.jsonl``, or the same lines over ssh / a cluster's filesystem) is
read by a launcher; each line becomes one of

- ``Event``: well-formed; ``kind``, an integer ``step`` >= 0, a finite ``time`` and the kind's
  ``payload`` (normalised: a status's error as text, a resume's warnings as short strings);
- ``Ignored``: a well-formed line of a kind this version does not know (a newer engine's): not
  stored, not counted, so an old app can follow a new trainer;
- ``Rejected``: a line no store can use, with the reason: not JSON, not a JSON object, a kind
  that is not a string, a step that is not a non-negative integer (``true`` is not one), a time
  that is not a number, any number SQLite (or a reader) cannot hold (an integer beyond int64,
  NaN, +-Infinity, ``1e999``), an unknown status, a payload of the wrong type.

A store writes ``Event`` values only and counts the ``Rejected`` ones (``skipped_events``,
``warnings``): one bad line must not stop the stream behind it. The SQLite store and a server
store apply the very same rules because they both call ``check_event``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from workbench.runs.records import STATUSES

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # SQLite INTEGER (and PostgreSQL BIGINT)
MAX_WARNING_CHARS = 500  # one warning a resume carries (e.g. a damaged checkpoint it skipped)


@dataclass(frozen=True)
class Event:
    """One checked event: what a store writes."""

    kind: str
    step: int
    time: float
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Ignored:
    """A well-formed event of a kind this version does not know."""

    kind: str


@dataclass(frozen=True)
class Rejected:
    """A line no store can use; ``reason`` is what the run's warnings show."""

    reason: str


Checked = Event | Ignored | Rejected


def is_int(value: Any) -> bool:
    """A JSON integer (``true`` / ``false`` are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def storable_number(value: Any) -> bool:
    """A number SQLite and every reader can hold: an int within int64, or a finite float
    (JSON text can carry ``12345678901234567890123``, ``1e999`` (inf), ``NaN``, ``Infinity``)."""
    if isinstance(value, float):
        return math.isfinite(value)
    return not isinstance(value, int) or INT64_MIN <= value <= INT64_MAX


def first_bad_number(value: Any) -> Any:
    """The first number anywhere in ``value`` (nested lists/dicts) that ``storable_number``
    rejects, or None. Iterative: a deeply nested payload must not hit the recursion limit."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
        elif not storable_number(item):
            return item
    return None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


# -- the payload of each kind: the normalised payload, or the reason it is refused ------------------
def _status(payload: dict) -> dict | str:
    status = payload.get("status")
    if status not in STATUSES:  # a status this version does not know would rank as terminal: refuse it
        return f"status={status!r}"
    return {"status": status, "error": _text(payload.get("error"))}


def _error(payload: dict) -> dict | str:
    return {"error": _text(payload.get("error"))}


def _metrics(payload: dict) -> dict | str:
    data = payload.get("metrics", {})
    return {"metrics": data} if isinstance(data, dict) else "metrics is not an object"


def _samples(payload: dict) -> dict | str:
    samples = payload.get("samples", [])
    if not isinstance(samples, list) or not all(isinstance(x, dict) for x in samples):
        return "samples is not a list of objects"
    return {"samples": samples}


def _resume(payload: dict) -> dict | str:
    warnings = payload.get("warnings") or []
    kept = [w[:MAX_WARNING_CHARS] for w in warnings if isinstance(w, str)] if isinstance(warnings, list) else []
    return {"warnings": kept}


def _as_is(payload: dict) -> dict | str:
    return payload


PAYLOAD_CHECKS: dict[str, Callable[[dict], dict | str]] = {
    "resume": _resume,
    "status": _status,
    "error": _error,
    "metrics": _metrics,
    "samples": _samples,
    "diagnostics": _as_is,
    "lens": _as_is,
}
KINDS = tuple(PAYLOAD_CHECKS)


def check_event(raw: Any, now: float) -> Checked:
    """One parsed line -> ``Event`` / ``Ignored`` / ``Rejected`` (see the module docstring).
    ``now``: the time of an event that carries none."""
    if not isinstance(raw, dict):
        return Rejected(f"not a JSON object: {repr(raw)[:100]}")
    bad = first_bad_number(raw)
    if bad is not None:
        return Rejected(f"number {str(bad)[:40]} is out of range or not finite (kind={str(raw.get('kind'))[:40]!r})")
    kind, step, when = raw.get("kind"), raw.get("step", 0), raw.get("time", now)
    if not is_int(step) or step < 0 or not is_number(when):
        return Rejected(f"step={str(step)[:40]} time={str(when)[:40]} (kind={str(kind)[:40]!r})")
    if not isinstance(kind, str):
        return Rejected(f"kind={str(kind)[:40]!r} is not a string")
    check = PAYLOAD_CHECKS.get(kind)
    if check is None:
        return Ignored(kind)
    payload = check({k: v for k, v in raw.items() if k not in ("kind", "step", "time")})
    if isinstance(payload, str):
        return Rejected(payload)
    return Event(kind, step, float(when), payload)
