"""The workbench home directory and confinement of user-supplied paths to it.

Everything the workbench writes (the cached tiny model, run directories, the run store, settings)
lives under one directory: ``$WORKBENCH_HOME`` if set, else ``~/.workbench``.
"""

from __future__ import annotations

import os
from pathlib import Path


def workbench_home() -> Path:
    """The workbench home directory (created if missing)."""
    home = Path(os.environ.get("WORKBENCH_HOME") or Path.home() / ".workbench").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home.resolve()


def confined_path(relative: str | os.PathLike, *, root: Path | None = None, field: str = "path") -> Path:
    """Resolve ``relative`` under ``root`` (default: the workbench home), refusing escapes.

    Raises ValueError naming the field and value when the resolved path leaves ``root``
    (``../``, absolute paths elsewhere, symlinks pointing outside).
    """
    base = (root or workbench_home()).resolve()
    candidate = (base / Path(relative)).resolve()
    if candidate != base and base not in candidate.parents:
        raise ValueError(
            f"{field}={str(relative)!r} resolves outside the workbench home {str(base)!r}; "
            "only paths inside it are allowed"
        )
    return candidate
