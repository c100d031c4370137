"""Runs: the persistent run store, launchers (local, SSH, SLURM), live ingest and reconciliation.

The UI and the CLI only call what is exported here.
"""

from workbench.runs.launchers import ConfigError, LaunchError
from workbench.runs.quickstart import QUICKSTART_SEEDS, quickstart_plan, quickstart_recipes
from workbench.runs.authz import ROLES, PermissionDenied, Principal, local_principal
from workbench.runs.records import Run, RunRepository
from workbench.runs.service import (MAX_RUNS_PER_LAUNCH, PlannedRun, cancel, delete, edit_run, ensure_collector, launch,
                                    launch_group, launch_planned, model_outputs, parse_sweep, plan_runs, resume, sync,
                                    update_settings, wait)
from workbench.runs.settings import Settings, SettingsError, SlurmDefaults, SSHHost, load_settings
from workbench.runs.store import ACTIVE_STATUSES, RESUMABLE_STATUSES, STATUSES, TERMINAL_STATUSES, RunError, RunStore

__all__ = [
    "ACTIVE_STATUSES", "MAX_RUNS_PER_LAUNCH", "QUICKSTART_SEEDS", "RESUMABLE_STATUSES", "ROLES", "STATUSES", "TERMINAL_STATUSES",
    "ConfigError", "LaunchError", "PermissionDenied", "PlannedRun", "Principal", "Run", "RunError", "RunRepository", "RunStore",
    "Settings", "SettingsError", "SlurmDefaults", "SSHHost", "cancel", "delete", "edit_run", "ensure_collector", "launch",
    "launch_group", "launch_planned", "load_settings", "local_principal", "model_outputs", "parse_sweep", "plan_runs",
    "quickstart_plan", "quickstart_recipes", "resume", "sync", "update_settings", "wait",
]
