"""Launchers by target scheme: ``local``, ``ssh://HOST``, ``slurm`` (one interface, see base.py)."""

from workbench.runs.launchers.base import (LAUNCHERS, ConfigError, EventChunk, LaunchError, Launcher, parse_events,
                                           read_file_events, status_from_exit_code, target_scheme)
from workbench.runs.launchers import local, slurm, ssh  # noqa: F401  (register the targets)

__all__ = ["LAUNCHERS", "ConfigError", "EventChunk", "LaunchError", "Launcher", "parse_events", "read_file_events",
           "status_from_exit_code", "target_scheme"]
