"""What the CLI and the UI call: the run layer's service, one module per concern.

- ``planning``: arms x seeds and sweeps, validated before anything is written (``plan_runs``);
- ``scheduler``: the local queue and its CPU / GPU placement, starting claimed runs;
- ``collector``: ``sync`` (ingest every active run's new events, reconcile ended processes),
  ``ensure_collector``, ``wait``;
- ``lifecycle``: the actions of a principal (launch, cancel, resume, delete, edit, settings),
  each authorised by ``authz`` below every UI;
- ``audit``: the audit log (``record_event``, ``record_refused_sign_in``; ``audit_log`` for admins);
- ``records`` / ``store``: the ``Run`` record, the ``RunRepository`` interface and its
  implementation on SQLAlchemy (SQLite, PostgreSQL); ``ingest``: what an event must look like.

This module re-exports their public names, so ``workbench.runs.service.X`` keeps working.
"""

from workbench.runs.audit import audit_log, record_event, record_refused_sign_in
from workbench.runs.authz import ROLES, PermissionDenied, Principal, authorize, local_principal, refusal
from workbench.runs.collector import alive_check_due, ensure_collector, forget_alive_check, ingest_new, lose, sync, wait
from workbench.runs.launchers import ConfigError, LaunchError
from workbench.runs.lifecycle import (RUNS_DIR, cancel, check_launch_inputs, delete, edit_run, launch, launch_group,
                                      launch_planned, model_outputs, resume, update_settings)
from workbench.runs.planning import (ARM_SEPARATOR, GROUP_SHARED_FIELDS, MAX_RUNS_PER_LAUNCH, SEED_FIELD, PlannedRun,
                                     check_joins_group, parse_sweep, plan_runs)
from workbench.runs.records import (ACTIVE_STATUSES, AUDIT_ACTIONS, RESUMABLE_STATUSES, TERMINAL_STATUSES, AuditEntry,
                                    NewRun, Run, RunError, RunRepository)
from workbench.runs.scheduler import (CANCEL_GRACE_S, QUEUE_LOCK, claim_and_start, launcher_for, start_queued_local,
                                      usable_gpus)
from workbench.runs.store import RunStore, StoreError, default_store

__all__ = [
    "ACTIVE_STATUSES", "AUDIT_ACTIONS", "AuditEntry", "audit_log", "default_store", "record_event", "record_refused_sign_in", "ARM_SEPARATOR", "CANCEL_GRACE_S", "GROUP_SHARED_FIELDS", "MAX_RUNS_PER_LAUNCH", "QUEUE_LOCK",
    "RESUMABLE_STATUSES", "ROLES", "RUNS_DIR", "SEED_FIELD", "TERMINAL_STATUSES", "ConfigError", "LaunchError", "NewRun",
    "PermissionDenied", "PlannedRun", "Principal", "Run", "RunError", "RunRepository", "RunStore", "StoreError",
    "alive_check_due", "authorize", "cancel", "check_joins_group", "check_launch_inputs", "claim_and_start", "delete",
    "edit_run", "ensure_collector", "forget_alive_check", "ingest_new", "launch", "launch_group", "launch_planned",
    "launcher_for", "local_principal", "lose", "model_outputs", "parse_sweep", "plan_runs", "refusal", "resume",
    "start_queued_local", "sync", "update_settings", "usable_gpus", "wait",
]
