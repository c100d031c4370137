"""How a command reports the user's mistake: one line ``error: ...`` on stderr and exit code 2.

Below every CLI verb (``workbench.cli`` and the run layer's ``runs.cli`` both import it), so a verb
that finds bad input itself prints exactly what ``workbench.cli.main`` prints for an error raised
to it, without importing the top-level CLI (that import pointed upward and made a cycle).
"""

from __future__ import annotations

import sys

EXIT_BAD_INPUT = 2
NO_MESSAGE = "(no message)"  # what `error: ...` says for an error raised without text


def one_line(message: str | BaseException) -> str:
    """A (possibly multi-line) error message as one line: 'head:\\n  a\\n  b' -> 'head: a; b'.
    A message with no text (``ValueError()``, ``""``) is named rather than left empty, which
    would crash the error handler itself: the exception's class name, or ``NO_MESSAGE``."""
    parts = [part.strip() for part in str(message).splitlines() if part.strip()]
    if not parts:
        return type(message).__name__ if isinstance(message, BaseException) else NO_MESSAGE
    head, *rest = parts
    return f"{head} {'; '.join(rest)}" if rest else head


def report(message: str | BaseException) -> int:
    print(f"error: {one_line(message)}", file=sys.stderr)
    return EXIT_BAD_INPUT
