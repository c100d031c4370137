"""Names users type (run names, tags, groups): checked against one safe pattern.

They end up in paths, shell scripts and SQL parameters; a strict pattern is simpler to trust than
escaping everywhere (scripts still quote them).
"""

from __future__ import annotations

import re
import secrets
import time

NAME_RULE = "1-64 characters: letters, digits, '.', '_', '-', starting with a letter or digit"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _check(field: str, value: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value) or ".." in value:
        raise ValueError(f"{field}={value!r} is not allowed; {NAME_RULE} (no '..')")
    return value


def check_run_name(name: str) -> str:
    return _check("name", name)


def check_tag(tag: str) -> str:
    return _check("tag", tag)


def check_group(group: str) -> str:
    return _check("group", group)


def new_run_id(name: str) -> str:
    """NAME-YYYYmmdd-HHMMSS-xxxx: sortable by time, unique without a lock."""
    return f"{check_run_name(name)[:40]}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
