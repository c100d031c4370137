"""Launchers by target scheme: ``local``, ``ssh://HOST``, ``slurm``, ``ray`` / ``ray://HOST:PORT`` (one interface, see base.py)."""

from workbench.runs.launchers.base import (LAUNCHERS, ConfigError, EventChunk, LaunchError, Launcher, parse_events,
                                           read_file_events, status_from_exit_code, target_scheme, targets_help)
from workbench.runs.launchers import local, ray_jobs, slurm, ssh  # noqa: F401  (register the targets)

__all__ = ["LAUNCHERS", "ConfigError", "EventChunk", "LaunchError", "Launcher", "parse_events", "read_file_events",
           "status_from_exit_code", "target_scheme", "targets_help"]
