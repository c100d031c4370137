"""Runs: the persistent run store, launchers (local, SSH, SLURM), live ingest and reconciliation.

The UI and the CLI only call what is exported here.
"""

from workbench.runs.launchers import ConfigError, LaunchError
from workbench.runs.quickstart import quickstart_recipes
from workbench.runs.service import cancel, delete, ensure_collector, launch, launch_group, sync, wait
from workbench.runs.settings import Settings, SettingsError, SlurmDefaults, SSHHost, load_settings, save_settings
from workbench.runs.store import ACTIVE_STATUSES, STATUSES, TERMINAL_STATUSES, RunError, RunStore

__all__ = [
    "ACTIVE_STATUSES", "STATUSES", "TERMINAL_STATUSES", "ConfigError", "LaunchError", "RunError", "RunStore", "Settings",
    "SettingsError", "SlurmDefaults", "SSHHost", "cancel", "delete", "ensure_collector", "launch", "launch_group",
    "load_settings", "quickstart_recipes", "save_settings", "sync", "wait",
]
