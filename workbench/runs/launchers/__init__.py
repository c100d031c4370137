"""Launchers by target scheme: ``local``, ``ssh://HOST``, ``slurm`` (one interface, see base.py)."""

from workbench.runs.launchers.base import LAUNCHERS, EventChunk, LaunchError, Launcher, parse_events, target_scheme
from workbench.runs.launchers import local, slurm, ssh  # noqa: F401  (register the targets)

__all__ = ["LAUNCHERS", "EventChunk", "LaunchError", "Launcher", "parse_events", "target_scheme"]
