"""The one YAML loader for text a user typed or wrote (recipe files, ``--set`` values, the Launch
form's fields, the settings file): plain data only, with limits, and errors that quote at most a
short prefix of what was typed.

PyYAML's ``safe_load`` builds no objects, but it has no limits: a 337-character alias bomb
("billion laughs") expands to millions of nodes, a 5000-deep ``[[[...]]]`` overflows the
composer's recursion, and a 5001-digit integer raises Python's int-string ValueError naming no
field. Here, while the document is composed (before anything is built):

- anchors and aliases (``&a`` / ``*a``) are refused: a recipe never needs them, and refusing them
  outright is the only bound on expansion that is simple to trust;
- nesting deeper than ``MAX_DEPTH`` and more than ``MAX_NODES`` nodes are refused;
- an integer longer than ``MAX_INT_DIGITS`` digits is refused, naming where it is
  (``algorithm.kl_coef``): no field of the workbench takes one that long;
- the text itself is refused above a size limit before it is parsed (files: by their size on
  disk, before they are read).

Plain scalars resolve to str, decimal int, float, bool (true/false) and null only: PyYAML's YAML 1.1
resolvers read ``1:20`` as 80 (sexagesimal), ``0b101`` as 5, ``010`` as 8 and ``2024-01-01`` as
a date, so ``--set train.seed=1:20`` silently trained seed 80. Here those stay strings (and the
field's own check refuses them). Explicit tags other than the standard ones for those types
(``!!binary``, ``!!set``, ``!!timestamp``, ``!!python/...``, ``!custom``) are refused.

Torch-free and Streamlit-free: the CLI, the app and the run layer all call it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 1 << 20  # a recipe or settings file: the presets are ~2 KB
MAX_VALUE_CHARS = 64 << 10  # one --set value or one form field
MAX_DEPTH = 64  # recipes nest 3 deep; reasoning-gym configs a few more
MAX_NODES = 100_000  # scalars + lists + mappings in one document
MAX_INT_DIGITS = 100  # every integer field is bounded far below 10**100
SHOWN_CHARS = 80  # at most this much of a value is quoted back in an error


class YamlInputError(ValueError):
    """User YAML that is refused (syntax, size, aliases, depth, an over-long integer): one line."""


def short(value: Any, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters (with the full length said), safe for any value:
    an error message never prints a megabyte (or a 5001-digit integer, whose repr raises)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * limit:
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    if isinstance(value, (dict, list, tuple)) and not _small(value):
        return f"<a {type(value).__name__} of {len(value)} items>"
    try:
        text = _URL_CREDENTIALS.sub(r"\1***@", repr(value))
    except ValueError:  # a container holding a huge integer
        return f"<a {type(value).__name__} of {len(value)} items>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


# the user[:password]@ of a URL: an error that repeats a refused value never shows a credential
# (the one line goes to a terminal, a page, a log)
_URL_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^\s/@'\"]+@")


def _small(value: Any, budget: int = 10_000) -> bool:
    """A container small enough to repr cheaply (counts nodes up to ``budget``, no recursion)."""
    stack, seen = [value], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > budget:
            return False
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return True


_TAG = "tag:yaml.org,2002:"
ALLOWED_TAGS = frozenset(_TAG + t for t in ("str", "int", "float", "bool", "null", "seq", "map"))
_INT = re.compile(r"^[-+]?[0-9][0-9_]*$")  # decimal only (no 0x / 0o / 0b, no 1:20); 010 is ten
_FLOAT = re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")  # PyYAML's, less sexagesimal
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")


class _PlainResolver(yaml.resolver.BaseResolver):
    """Implicit types of plain scalars: a subset of PyYAML's YAML 1.1 set, so any string
    ``yaml.safe_dump`` leaves unquoted reads back as the same string."""

    yaml_implicit_resolvers: dict = {}


_PlainResolver.add_implicit_resolver(_TAG + "bool", re.compile("^(?:" + "|".join(_BOOL) + ")$"), list("tTfF"))
_PlainResolver.add_implicit_resolver(_TAG + "int", _INT, list("-+0123456789"))
_PlainResolver.add_implicit_resolver(_TAG + "float", _FLOAT, list("-+0123456789."))
_PlainResolver.add_implicit_resolver(_TAG + "null", _NULL, ["~", "n", "N", ""])


class _PlainConstructor(yaml.constructor.SafeConstructor):
    """SafeConstructor whose int / float / bool read only the spellings above, also under an
    explicit ``!!int`` (``!!int 0b101`` is refused, not 5)."""

    def _plain(self, node: Any, patterns: tuple, what: str) -> str:
        value = self.construct_scalar(node)
        if not any(p.match(value) for p in patterns):
            raise YamlInputError(f"{short(value)} is not a {what} (decimal digits only)")
        return value

    def construct_yaml_int(self, node: Any) -> int:
        return int(self._plain(node, (_INT,), "whole number").replace("_", ""))

    def construct_yaml_float(self, node: Any) -> float:
        value = self._plain(node, (_FLOAT, _INT), "number").replace("_", "").lower()
        return float(value.replace(".inf", "inf").replace(".nan", "nan"))

    def construct_yaml_bool(self, node: Any) -> bool:
        value = self.construct_scalar(node)
        if value not in _BOOL:
            raise YamlInputError(f"{short(value)} is not true or false")
        return _BOOL[value]


_PlainConstructor.add_constructor(_TAG + "int", _PlainConstructor.construct_yaml_int)
_PlainConstructor.add_constructor(_TAG + "float", _PlainConstructor.construct_yaml_float)
_PlainConstructor.add_constructor(_TAG + "bool", _PlainConstructor.construct_yaml_bool)


class _LimitedLoader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer,
                     _PlainConstructor, _PlainResolver):
    """A safe loader with plain types only that checks every node while the document is composed
    (before construction)."""

    def __init__(self, stream: str, root: str = "") -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        _PlainConstructor.__init__(self)
        _PlainResolver.__init__(self)
        self._path: list[str] = root.split(".") if root else []  # where the document sits (a --set key)
        self._root = len(self._path)
        self._nodes = 0

    def _where(self) -> str:
        return ".".join(self._path) or "the document"

    def compose_node(self, parent: Any, index: Any) -> Any:
        label = index.value if isinstance(index, yaml.ScalarNode) else (str(index) if isinstance(index, int) else None)
        if label is not None:
            self._path.append(label[:40])
        try:
            if self.check_event(yaml.AliasEvent) or getattr(self.peek_event(), "anchor", None):
                raise YamlInputError(f"{self._where()}: anchors and aliases (&name, *name) are not allowed; "
                                     "write each value out")
            tag = getattr(self.peek_event(), "tag", None)
            if tag not in (None, "!") and tag not in ALLOWED_TAGS:
                raise YamlInputError(f"{self._where()}: the tag {short(tag.replace(_TAG, '!!'), 40)} is not allowed; "
                                     "plain values only (text, numbers, true/false, null, lists, mappings)")
            self._nodes += 1
            if self._nodes > MAX_NODES:
                raise YamlInputError(f"more than {MAX_NODES} values in one document: at most {MAX_NODES}")
            if len(self._path) - self._root > MAX_DEPTH:
                raise YamlInputError(f"{'.'.join(self._path[:3])}...: nested more than {MAX_DEPTH} levels deep; "
                                     f"at most {MAX_DEPTH}")
            node = super().compose_node(parent, index)
            if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:int":
                digits = sum(c.isdigit() for c in node.value)
                if digits > MAX_INT_DIGITS:
                    raise YamlInputError(f"{'.'.join(self._path) + '=' if self._path else ''}<an integer of {digits} digits>: at most "
                                         f"{MAX_INT_DIGITS} digits (every number of a recipe is bounded far below)")
            return node
        finally:
            if label is not None:
                self._path.pop()


def _syntax_error(err: yaml.YAMLError) -> str:
    """PyYAML's multi-line report as one short phrase with the line and column."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"not valid YAML ({problem[:SHOWN_CHARS]}{at})"


def load_yaml(text: str, *, max_chars: int = MAX_VALUE_CHARS, root: str = "") -> Any:
    """``text`` as plain data (``None`` for an empty document), within the limits above.
    ``root``: the field the text is the value of (``task_config`` for ``--set task_config=...``),
    so a refusal names ``task_config.min_terms``. YamlInputError, one line."""
    if len(text) > max_chars:
        raise YamlInputError(f"{len(text)} characters: at most {max_chars}")
    loader = _LimitedLoader(text, root)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as err:
        raise YamlInputError(_syntax_error(err)) from None
    except RecursionError:  # not reachable within MAX_DEPTH; kept so a deep input can never print a traceback
        raise YamlInputError(f"nested more than {MAX_DEPTH} levels deep; at most {MAX_DEPTH}") from None
    except ValueError as err:  # a constructor's own check (e.g. int-string conversion)
        if isinstance(err, YamlInputError):
            raise
        raise YamlInputError(short(str(err), SHOWN_CHARS)) from None
    finally:
        loader.dispose()


def read_yaml_file(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """A YAML file's data; its size is checked on disk before it is read (a 1 GB file is never
    loaded into memory). YamlInputError for a file too large, not UTF-8 or refused by load_yaml."""
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise YamlInputError(f"{size} bytes: at most {max_bytes}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise YamlInputError(f"not UTF-8 text (byte {err.start})") from None
    return load_yaml(text, max_chars=max_bytes)
