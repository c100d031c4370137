"""How a command reports the user's mistake: one line ``error: ...`` on stderr and exit code 2.

Below every CLI verb (``workbench.cli`` and the run layer's ``runs.cli`` both import it), so a verb
that finds bad input itself prints exactly what ``workbench.cli.main`` prints for an error raised
to it, without importing the top-level CLI (that import pointed upward and made a cycle).
"""

from __future__ import annotations

import sys

EXIT_BAD_INPUT = 2


def one_line(message: str) -> str:
    """A (possibly multi-line) error message as one line: 'head:\\n  a\\n  b' -> 'head: a; b'."""
    head, *rest = [part.strip() for part in str(message).strip().splitlines() if part.strip()]
    return f"{head} {'; '.join(rest)}" if rest else head


def report(message: str) -> int:
    print(f"error: {one_line(message)}", file=sys.stderr)
    return EXIT_BAD_INPUT
