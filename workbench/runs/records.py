"""The typed records of the run layer, backend-neutral: what a run is (``Run``), its statuses, and
the interface a run store implements (``RunRepository``).

The service (planning, queue, collector, lifecycle) is written against ``RunRepository`` only, so
another backend is a class with the same methods, not a change to the service.
``workbench.runs.store.RunStore`` implements it on SQLAlchemy, for a SQLite file and for PostgreSQL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Protocol, runtime_checkable

import pandas as pd

ACTIVE_STATUSES = ("queued", "starting", "running")
TERMINAL_STATUSES = ("finished", "failed", "cancelled", "lost")
STATUSES = ACTIVE_STATUSES + TERMINAL_STATUSES
RESUMABLE_STATUSES = ("failed", "cancelled", "lost")  # runs that `runs resume` continues from their checkpoint


class RunError(ValueError):
    """A run that does not exist, or a request about a run that is not allowed (message says why)."""


AUDIT_ACTIONS = ("launch", "cancel", "resume", "delete", "edit", "settings",
                 "sign_in", "sign_in_refused", "sign_out", "import",
                 "db_upgrade", "db_copy",
                 "token_create", "token_revoke", "token_refused")  # db_*: `python -m workbench db upgrade / copy` (workbench.runs.dbtools)
MAX_AUDIT_DETAIL = 1000  # characters of an entry's detail (longer is cut)


@dataclass(frozen=True)
class AuditEntry:
    """One line of the audit log: who did what, to which runs or settings, when, from where."""

    at: float
    """Unix time (seconds)."""
    actor: str
    """``Principal.owner`` of who acted (the name tried, for a refused sign-in)."""
    role: str
    """The principal's role ("" when unknown, e.g. a refused sign-in)."""
    auth: str
    """How the name was established (``Principal.auth``)."""
    action: str
    """One of ``AUDIT_ACTIONS``."""
    target: str
    """Run id(s) comma-separated, a group, "settings", or "" (sign-in)."""
    detail: str = ""
    """One line, at most ``MAX_AUDIT_DETAIL`` characters (longer is cut)."""
    address: str = ""
    """The client's address when known ("" from the CLI)."""


@dataclass(frozen=True, eq=True)
class Run(Mapping):
    """One run as the store holds it (one ``runs`` row), read-only.

    Fields are frozen; the containers (``tags``, ``launch``, ``handle``, ``warnings``, ``sweep``)
    are fresh copies made by each read, so changing one changes nothing stored: a change goes
    through the repository (``update_run`` and the named operations).

    Read-only mapping access (``run["status"]``, ``run.get("handle")``, ``{**run}``) is kept for
    the transition from the row dicts the store used to return (launchers and older tests read
    runs that way); new code reads attributes.
    """

    id: str
    name: str
    algorithm: str
    status: str
    target: str
    launcher: str
    host: str
    created_by: str
    created_at: float
    recipe: str
    run_dir: str
    total_steps: int
    started_at: float | None = None
    ended_at: float | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    notes: str = ""
    launch: dict[str, Any] = field(default_factory=dict)
    handle: dict[str, Any] = field(default_factory=dict)
    events_offset: int = 0
    events_inode: str | None = None
    last_step: int = -1
    reward: float | None = None
    error: str | None = None
    cancel_requested: bool = False
    skipped_events: int = 0
    warnings: list[str] = field(default_factory=list)
    arm: str | None = None
    seed: int | None = None
    sweep: dict[str, Any] = field(default_factory=dict)
    metrics_generation: int = 0  # +1 when its metric rows change other than by an append (workbench.runs.metrics_cache)

    __hash__ = None  # containers inside: not hashable (a Run is a value to read, not a key)

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def num_processes(self) -> int:
        """Processes (and, on GPUs, devices) the run asks for."""
        return int(self.launch.get("num_processes", 1))

    def to_dict(self) -> dict[str, Any]:
        """Every field as a plain dict (copies of the containers)."""
        return dataclasses.asdict(self)

    # -- read-only mapping access (transition from row dicts) ---------------------------------
    def __getitem__(self, key: str) -> Any:
        if key not in RUN_FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(RUN_FIELDS)

    def __len__(self) -> int:
        return len(RUN_FIELDS)


RUN_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Run))


@dataclass(frozen=True)
class NewRun:
    """A run to register (queued): what the caller decides. The store adds the rest (status,
    creation time, offsets) and reads the seed from the recipe (``train.seed``), so the seed
    column cannot disagree with what the run trains with. ``arm`` defaults to ``name``."""

    run_id: str
    name: str
    algorithm: str
    recipe_yaml: str
    total_steps: int
    target: str
    launcher: str
    host: str
    created_by: str
    run_dir: str
    group: str | None = None
    tags: tuple[str, ...] = ()
    notes: str = ""
    launch: dict[str, Any] = field(default_factory=dict)
    arm: str | None = None
    sweep: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, value: NewRun | Mapping[str, Any]) -> NewRun:
        """A NewRun from itself or from ``create_run``'s keyword arguments."""
        if isinstance(value, NewRun):
            return value
        data = {k: v for k, v in value.items() if v is not None or k in ("group", "arm")}
        data["tags"] = tuple(data.get("tags") or ())
        return cls(**data)


@runtime_checkable
class RunRepository(Protocol):
    """What the service needs from a run store. Every write is atomic; the compare-and-set ones
    (``claim_queued``, ``cancel_queued``, ``reopen``, ``ingest`` with an offset) decide races
    between processes, so the service never checks then acts. RunError for an unknown run id or
    a refused request; a store that cannot be used raises ``StoreError`` (a RunError) naming it."""

    @property
    def identity(self) -> str:
        """A stable name of this store (its file, its URL): per-store caches are keyed by it."""

    def is_open(self) -> bool:
        """False once the store is gone for good (its home removed): collectors stop."""

    def check_writable(self) -> None: ...

    def create_runs(self, runs: list[NewRun],
                    check: Callable[[dict[str, dict[str, list[Run]]]], None] | None = None) -> list[str]: ...

    def get_run(self, run_id: str) -> Run: ...

    def runs(self, statuses: Iterable[str] | None = None) -> list[Run]: ...

    def list_runs(self, status: str | None = None, group: str | None = None, tag: str | None = None) -> pd.DataFrame: ...

    def arms(self, group: str) -> dict[str, list[Run]]: ...

    def update_run(self, run_id: str, **fields: Any) -> None: ...

    def lock(self, name: str) -> AbstractContextManager[None]: ...

    def claim_queued(self, run_id: str) -> bool: ...

    def cancel_queued(self, run_id: str, error: str = ...) -> bool: ...

    def rename(self, run_id: str, name: str) -> None: ...

    def set_tags(self, run_id: str, tags: Iterable[str]) -> None: ...

    def set_notes(self, run_id: str, notes: str) -> None: ...

    def delete(self, run_id: str) -> None: ...

    def reopen(self, run_id: str, launch: dict[str, Any]) -> None: ...

    def set_status(self, run_id: str, status: str, *, error: str | None = None) -> bool: ...

    def ingest(self, run_id: str, events: list[Any], *, offset: tuple[int, int] | None = None,
               warning: str | None = None, inode: tuple[str | None, str | None] | None = None) -> int: ...

    def record_audit(self, entry: AuditEntry) -> None: ...

    def audit_entries(self, *, limit: int = 1000, since: float | None = None, actor: str | None = None,
                      action: str | None = None) -> list[AuditEntry]:
        """The audit log, newest first."""
