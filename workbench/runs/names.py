"""Names users type (run names, tags, groups).

Tags and groups end up in paths, shell scripts and SQL parameters; a strict pattern is simpler to
trust than escaping everywhere (scripts still quote them). A run's name is a free label with the
Recipe's own rule (``Recipe.name``: no path separators or control characters, 1-64 characters):
it never becomes a path itself; the run id and directory use ``slug(name)``.
"""

from __future__ import annotations

import re
import secrets
import time
import unicodedata

NAME_RULE = "1-64 characters: letters, digits, '.', '_', '-', starting with a letter or digit"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _check(field: str, value: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value) or ".." in value:
        raise ValueError(f"{field}={value!r} is not allowed; {NAME_RULE} (no '..')")
    return value


def check_run_name(name: str) -> str:
    """``name`` if the Recipe accepts it as its name (one rule: ``Recipe.name``'s length and
    validator, so 'my run' and 'été' pass here as they do in a recipe); ValueError naming it."""
    from workbench.recipe import MAX_NAME_CHARS, Recipe  # torch-free; the rule lives with the schema
    from workbench.yamlsafe import short

    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS:
        raise ValueError(f"name={short(name)} is not allowed; 1-{MAX_NAME_CHARS} characters")
    try:
        return Recipe._plain_name(name)
    except ValueError as err:
        raise ValueError(f"name={short(name)}: {err}") from None


def check_tag(tag: str) -> str:
    return _check("tag", tag)


def check_group(group: str) -> str:
    return _check("group", group)


SLUG_CHARS = 40  # the name part of a run id (NAME-YYYYmmdd-HHMMSS-xxxx stays under 64)


def slug(name: str) -> str:
    """``name`` as a safe directory / run-id part that always satisfies NAME_RULE: accents
    dropped, every run of other characters (separators, spaces, control characters) one '-',
    no '..', no leading or trailing punctuation, at most SLUG_CHARS; 'run' when nothing is left.
    A recipe's name is a free label (``--set name='my run'``); the paths use this."""
    text = unicodedata.normalize("NFKD", str(name)).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", text)
    text = re.sub(r"\.{2,}", ".", text)
    text = text.strip("._-")[:SLUG_CHARS].rstrip("._-")
    return text or "run"


def new_run_id(name: str) -> str:
    """SLUG-YYYYmmdd-HHMMSS-xxxx (SLUG = ``slug(name)``, so the id satisfies NAME_RULE whatever
    label the run has): sortable by time, unique without a lock."""
    return f"{slug(check_run_name(name))}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
