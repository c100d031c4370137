"""What the app may read from disk: the recipe fields that name a file or directory on this
machine (datasets, a local model), confined to the workbench home. The Launch page confines what is
typed into its form; the run service (``check_launch_inputs``) checks every recipe it launches for
the app again, so a caller that skipped the form gets the same rule. The CLI, the user's own
machine and files, opts out (``trust_local_imports``). teacher.model is confined by the schema
itself (``recipe.teacher_reference``), for the CLI too. Torch-free."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from workbench.home import confined_path, workbench_home
from workbench.recipe import Recipe
from workbench.yamlsafe import short

_MODEL_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def _dataset_path(field: str, text: str) -> str | None:
    """A dataset inside the workbench home (relative to it, or absolute), resolved; None for ''."""
    return str(confined_path(text, field=field)) if text else None


def _model_reference(field: str, text: str) -> str:
    """A built-in model name or a hub id ('org/name') as typed; anything that names a local file
    or directory (a path, a .gguf file, a directory in the home) resolved inside the home. A
    hub-id-shaped name that is a path in the app's working directory is refused: the run would
    read that directory instead of the hub."""
    from workbench.model_facts import builtin_model_names

    if text in builtin_model_names():
        return text
    home = workbench_home()
    if text.startswith(("/", "~", ".")) or text.endswith(".gguf") or (home / text).exists():
        path = confined_path(Path(text).expanduser(), field=field)
        if not path.exists():
            raise ValueError(f"{field}={short(text)}: no such file or directory in the workbench home")
        return str(path)
    if not _MODEL_REF.match(text) or ".." in text:
        raise ValueError(f"{field}={short(text)} is not allowed; 'tiny', a Hugging Face id like 'org/name' or a "
                         "model directory inside the workbench home")
    if Path(text).exists():
        raise ValueError(f"{field}={short(text)} is a path outside the workbench home; only paths inside it are allowed")
    return text


#: Every recipe field that names something on this machine's disk -> how the app confines it (the
#: form's fields, the Launch page's swept values and the run service all go through ``app_path_value``).
#: teacher.model is confined by the schema itself (recipe.teacher_reference), for the CLI too.
PATH_FIELDS = {"dataset": _dataset_path, "eval.dataset": _dataset_path, "model": _model_reference}


def app_path_value(field: str, value: Any) -> Any:
    """``value`` of the path field ``field`` as the app may use it (resolved inside the workbench
    home), or ValueError naming the field and the value typed (never the file's contents).
    Values of other fields pass unchanged."""
    if field not in PATH_FIELDS:
        return value
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{field}={short(value)} is not allowed; a path inside the workbench home")
    text = (value or "").strip()
    if not text.isprintable():
        raise ValueError(f"{field}={short(text)} is not allowed: control characters")
    if field == "model" and not text:
        raise ValueError("model='' is empty; 'tiny' or a Hugging Face id like 'org/name'")
    return PATH_FIELDS[field](field, text)


def app_paths_sweep(sweep: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """A sweep with every value of a path field confined as the form confines it."""
    return {key: [app_path_value(key, v) for v in values] for key, values in sweep.items()}


def check_app_paths(recipe: Recipe) -> None:
    """Every path field of ``recipe`` is one the app may read (ValueError naming the field)."""
    data = recipe.to_dict()
    for field in PATH_FIELDS:
        value = functools.reduce(dict.__getitem__, field.split("."), data)
        if value is not None:
            app_path_value(field, value)
