"""The audit log: every launch, cancel, resume, delete, edit, settings change and sign-in, with who
(``Principal.owner``, role, how they signed in), when, what (the run ids, group or "settings", and
a one-line detail) and from where (``Principal.address``; "" from the CLI).

The service's actions (``workbench.runs.lifecycle``) record their entry after they succeed; a
refused action raises ``PermissionDenied`` before anything happens and is not an entry (it is
logged by Python logging). The UI records what it does outside the service (sign-in, sign-out,
a refused sign-in) with ``record_event`` / ``record_refused_sign_in``. Reading the log is an
admin's (``authz.RULES["audit"]``).

An entry that cannot be written (a store that went read-only after the action) does not undo or
fail the action, which has already happened: it is logged as an error naming the entry, so the
server's log still holds it.
"""

from __future__ import annotations

import logging
import time

from workbench.runs.authz import Principal, authorize
from workbench.runs.records import AUDIT_ACTIONS, AuditEntry, RunError, RunRepository
from workbench.runs.store import StoreError, default_store

log = logging.getLogger(__name__)


def _check_action(action: str) -> None:
    if action not in AUDIT_ACTIONS:
        raise RunError(f"action={action!r} is not allowed; one of: {', '.join(AUDIT_ACTIONS)}")


def _append(store: RunRepository | None, entry: AuditEntry) -> None:
    """Write ``entry``; a store that cannot take it is logged (the action stands)."""
    try:
        (store or default_store()).record_audit(entry)
    except StoreError as err:
        log.error("audit entry not recorded (%s): %s", err, entry)


def record(store: RunRepository | None, principal: Principal, action: str, target: str = "", detail: str = "") -> None:
    """One entry for what ``principal`` just did (``target``: run ids comma-separated, a group,
    "settings" or ""), at the present time, from ``principal.address``."""
    _check_action(action)
    _append(store, AuditEntry(at=time.time(), actor=principal.owner, role=principal.role, auth=principal.auth,
                              action=action, target=target, detail=detail, address=principal.address))


def record_event(principal: Principal, action: str, target: str = "", detail: str = "", *,
                 store: RunRepository | None = None) -> None:
    """An action the UI performs outside the service (``sign_in``, ``sign_out``), as ``principal``."""
    record(store, principal, action, target, detail)


def record_refused_sign_in(name: str, auth: str, address: str, detail: str = "", *,
                           store: RunRepository | None = None) -> None:
    """A sign-in that was refused: the name tried (no role: nobody was signed in), how, from where."""
    _append(store, AuditEntry(at=time.time(), actor=name, role="", auth=auth, action="sign_in_refused", target="",
                              detail=detail, address=address))


def audit_log(principal: Principal, *, limit: int = 1000, since: float | None = None, actor: str | None = None,
              action: str | None = None, store: RunRepository | None = None) -> list[AuditEntry]:
    """The audit log, newest first (``RunRepository.audit_entries``'s filters); admins only
    (PermissionDenied for anyone else)."""
    authorize(principal, "audit")
    return (store or default_store()).audit_entries(limit=limit, since=since, actor=actor, action=action)
