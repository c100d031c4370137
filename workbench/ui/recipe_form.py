"""Every Recipe field as a widget, with its docstring as help and its validation error beside it.

The pure part (:func:`field_specs`, :func:`parse_field`, :func:`validate_form`,
:func:`comparison_recipes`) knows nothing of Streamlit and is unit tested; :func:`render_form`
only places widgets. Typed values are parsed by ``workbench.yamlsafe`` (plain data, never code; no
aliases, bounded size and depth);
reward functions are limited to the built-ins and the import references an admin allowed
(settings ``reward_funcs_allowed``), datasets to files inside the workbench home, so nothing typed
into the page can make a run import or read arbitrary code or files.
"""

from __future__ import annotations

import functools
import re
import typing
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Literal

import streamlit as st
import yaml
from pydantic import BaseModel, ValidationError

from workbench.algorithms import FAMILIES, inert_knobs
from workbench.engine.rewards import app_reward_choices
from workbench.engine.tasks import BUILTIN_FAMILY
from workbench.runs.confinement import PATH_FIELDS, app_path_value, app_paths_sweep, check_app_paths  # noqa: F401  (the Launch page's)
from workbench.recipe import _NAMED_CHOICES, Recipe, format_validation_error, load_recipe  # registry-backed choices
from workbench.yamlsafe import MAX_VALUE_CHARS, YamlInputError, load_yaml, short

SECTIONS = {"algorithm": "Algorithm", "sampling": "Sampling", "optim": "Optimiser", "train": "Training",
            "logging": "Logging", "checkpoint": "Checkpoints", "eval": "Evaluation", "lora": "LoRA", "teacher": "Distillation"}
NO_TASK = "(none: use the dataset)"
KEY_PREFIX = "rf:"
# What "the same experiment" means for a comparison group: these come from the edited recipe,
# everything else (algorithm, optimiser, mu / minibatches) from each algorithm's preset.
SHARED_FIELDS = ("model", "task", "dataset", "reward_funcs", "reward_weights", "sampling", "logging", "checkpoint")
SHARED_TRAIN_FIELDS = ("steps", "seed", "rollout", "precision", "threads")


@dataclass(frozen=True)
class FieldSpec:
    """One editable field. ``kind``: choice (selectbox), multi (multiselect), bool (checkbox),
    text (free string) or value (YAML scalar / list: numbers, None, [a, b])."""

    path: str
    kind: str
    help: str
    choices: tuple[Any, ...] = ()
    optional: bool = False

    @property
    def key(self) -> str:
        return KEY_PREFIX + self.path

    @property
    def label(self) -> str:
        return self.path.rsplit(".", 1)[-1]


def _choices_of(section: str, name: str, annotation) -> tuple[Any, ...] | None:
    if section == "algorithm" and name in _NAMED_CHOICES:
        return tuple(_NAMED_CHOICES[name]())
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    return None


def _is_optional(annotation) -> bool:
    return type(None) in typing.get_args(annotation)


def _section_specs(section: str, model: type[BaseModel]) -> list[FieldSpec]:
    specs = []
    for name, field in model.model_fields.items():
        path, annotation, help_ = f"{section}.{name}", field.annotation, field.description or ""
        choices = _choices_of(section, name, annotation)
        if choices is not None:
            specs.append(FieldSpec(path, "choice", help_, choices))
        elif typing.get_origin(annotation) is list and typing.get_origin(typing.get_args(annotation)[0]) is Literal:
            specs.append(FieldSpec(path, "multi", help_, typing.get_args(typing.get_args(annotation)[0])))
        elif annotation is bool:
            specs.append(FieldSpec(path, "bool", help_))
        else:
            specs.append(FieldSpec(path, "value", help_, optional=_is_optional(annotation)))
    return specs


@functools.cache
def _task_groups() -> dict[str, tuple[str, ...]]:
    """Task values by group: built-in, then reasoning-gym by family (``task_catalogue``)."""
    from workbench.engine.tasks import task_catalogue

    return {group: tuple(names) for group, names in task_catalogue().items()}


def _task_choices() -> tuple[str, ...]:
    """Built-in tasks, then every reasoning-gym dataset as ``reasoning_gym/<name>`` family by
    family, then no task."""
    return (*(name for names in _task_groups().values() for name in names), NO_TASK)


@functools.cache
def _task_labels() -> dict[str, str]:
    """task value -> 'family / name' ('built-in / arithmetic', 'reasoning-gym · games / sudoku'):
    the picker's labels, so typing a family or a name filters its 100+ entries."""
    return {name: f"{group} / {name.rsplit('/', 1)[-1]}" for group, names in _task_groups().items() for name in names}


def task_label(value: str) -> str:
    """The task picker's label of ``value`` (a value not in the catalogue, e.g. a previous run's, as is)."""
    return _task_labels().get(value, value)


def task_help(description: str) -> str:
    """The task field's help: its docstring, then the groups with their sizes (typing searches)."""
    groups = ", ".join(f"{group.removeprefix('reasoning-gym · ')} ({len(names)})"
                       for group, names in _task_groups().items() if group != BUILTIN_FAMILY)
    builtin = ", ".join(_task_groups()[BUILTIN_FAMILY])
    return (f"{description}\n\nType to search: labels read 'family / name'. Built-in (for the tiny model): "
            f"{builtin}. reasoning-gym (for real models, e.g. smollm2-135m), by family: {groups}.")


def model_help(description: str) -> str:
    """The model field's help: its docstring, then every built-in model with its size, memory and
    time per step here (``workbench.model_facts.MODEL_CARDS``)."""
    from workbench.model_facts import builtin_models_help

    return f"{description}\n\n{builtin_models_help()}"


#: Choice fields whose options read better with a label than their raw value.
CHOICE_LABELS = {"task": task_label}


def field_specs() -> list[FieldSpec]:
    """Every Recipe field in form order: the top-level fields, then each section's."""
    top = Recipe.model_fields
    specs = [
        FieldSpec("name", "text", "Run name (also the default run id prefix): letters, digits, '.', '_', '-'."),
        FieldSpec("description", "text", "Free text shown with the run."),
        FieldSpec("model", "text", model_help(top["model"].description or "")),
        FieldSpec("task", "choice", task_help(top["task"].description or ""), _task_choices()),
        FieldSpec("task_config", "value", top["task_config"].description or ""),
        FieldSpec("system_prompt", "text", top["system_prompt"].description or "", optional=True),
        FieldSpec("dataset", "text", (top["dataset"].description or "") + " Path relative to the workbench home.",
                  optional=True),
        FieldSpec("reward_funcs", "multi", (top["reward_funcs"].description or "").split("(default")[0]
                  + "(here: the built-ins and the references allowed in settings; default: the task's).",
                  app_reward_choices(allowed_reward_refs())),
        FieldSpec("reward_weights", "value", top["reward_weights"].description or "", optional=True),
    ]
    for section in SECTIONS:
        specs += _section_specs(section, top[section].annotation)
    return specs


def allowed_reward_refs() -> tuple[str, ...]:
    """settings.yaml's reward_funcs_allowed (none when the settings do not load: the Launch page
    shows that error itself)."""
    from workbench.runs.settings import SettingsError, load_settings

    try:
        return tuple(load_settings().reward_funcs_allowed)
    except SettingsError:
        return ()


def get_path(data: dict, path: str) -> Any:
    for part in path.split("."):
        data = data[part]
    return data


def set_path(data: dict, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        data = data.setdefault(part, {})
    data[last] = value


def format_field(spec: FieldSpec, value: Any) -> Any:
    """A recipe value as its widget holds it."""
    if spec.kind == "choice" and spec.path == "task":
        return NO_TASK if value is None else value
    if spec.kind in ("choice", "bool"):
        return value
    if spec.kind == "multi":
        return list(value or [])
    if spec.kind == "text" or spec.path in PATH_FIELDS:
        return "" if value is None else str(value)
    if value is None:
        return ""
    text = yaml.safe_dump(list(value) if isinstance(value, tuple) else value, default_flow_style=True).strip()
    return text.removesuffix("\n...").strip()


def parse_field(spec: FieldSpec, raw: Any) -> Any:
    """A widget's value as the recipe value; ValueError naming the field and value otherwise."""
    if spec.path == "task":
        return None if raw == NO_TASK else raw
    if isinstance(raw, str) and len(raw) > MAX_VALUE_CHARS:
        raise ValueError(f"{spec.path}={short(raw)}: at most {MAX_VALUE_CHARS} characters")
    if spec.path in PATH_FIELDS:
        return app_path_value(spec.path, raw)
    if spec.kind == "text" and spec.optional:
        return raw if raw.strip() else None
    if spec.kind == "multi":  # a crafted client can send any list: only the offered choices pass
        unknown = [v for v in raw or [] if v not in spec.choices]
        if unknown:
            raise ValueError(f"{spec.path}={short(unknown[0])} is not allowed here; allowed: {', '.join(map(str, spec.choices))}")
        return list(raw or [])
    if spec.kind in ("choice", "bool", "text"):
        return raw
    text = str(raw).strip()
    if not text:
        if spec.optional:
            return None
        raise ValueError(f"{spec.path}='' is empty; enter a value")
    try:
        return load_yaml(text, root=spec.path)
    except YamlInputError as err:
        if str(err).startswith("not valid YAML"):
            raise ValueError(f"{spec.path}={short(text)} is not a number, list or None") from None
        raise ValueError(f"{spec.path}={short(text)}: {err}") from None


def pydantic_errors(err: ValidationError) -> dict[str, str]:
    """field path ('' for the whole recipe, 'algorithm' for a section rule) -> message lines."""
    out: dict[str, list[str]] = {}
    for line, e in zip(format_validation_error(err).split("\n  ")[1:], err.errors()):
        out.setdefault(".".join(str(p) for p in e["loc"]), []).append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def validate_form(raw: dict[str, Any], base: Recipe) -> tuple[Recipe | None, dict[str, str]]:
    """Widget values by path -> (Recipe or None, errors by field path).

    Fields not in ``raw`` keep ``base``'s values. A field that does not parse is reported and
    left at its base value so that the rest of the recipe is still checked.
    """
    data, errors = base.to_dict(), {}
    for spec in field_specs():
        if spec.path not in raw:
            continue
        try:
            set_path(data, spec.path, parse_field(spec, raw[spec.path]))
        except ValueError as err:
            errors[spec.path] = str(err)
    if spec_name_error := _name_error(data.get("name")):
        errors["name"] = spec_name_error
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as err:
        return None, {**pydantic_errors(err), **errors}
    return (recipe if not errors else None), errors


def _name_error(name: Any) -> str | None:
    from workbench.runs.names import check_run_name

    try:
        check_run_name(name)
    except ValueError as err:
        return str(err)
    return None


def comparison_recipes(base: Recipe, presets: list[str]) -> list[Recipe]:
    """The edited recipe first, then one per other algorithm preset, sharing ``base``'s model,
    task, data, rewards, sampling, logging and the train fields in ``SHARED_TRAIN_FIELDS`` (so
    the runs differ only in their algorithm, optimiser and update schedule)."""
    shared = base.to_dict()
    out = [base]
    for name in presets:
        data = load_recipe(name).to_dict()
        for field in SHARED_FIELDS:
            data[field] = shared[field]
        for field in SHARED_TRAIN_FIELDS:
            data["train"][field] = shared["train"][field]
        out.append(Recipe.from_dict(data))
    return out


# Fields a sweep may vary: every recipe field but the labels and the seed (seeds are the
# replication axis: "seeds per arm").
NOT_SWEPT = ("name", "description", "train.seed")


def sweepable_fields() -> list[FieldSpec]:
    """The fields the Launch page's sweep editor offers, in form order."""
    return [s for s in field_specs() if s.path not in NOT_SWEPT]


def sweep_values_help(spec: FieldSpec) -> str:
    """What to type as a swept field's values: comma separated, and the choices where it has them."""
    choices = f" One of: {', '.join(map(str, spec.choices))}." if spec.choices and spec.kind == "choice" else ""
    return f"Comma-separated values (YAML: 0.2, 0.28 or token-mean, seq-mean-token-mean).{choices} {spec.help}"


# The knob fields each family switch on the Algorithm tab decides about: {switch path: family}.
_SWITCHES = {f.switch: f for f in FAMILIES.values() if f.switch.startswith("algorithm.")}


def is_relevant(spec: FieldSpec, values: dict[str, Any]) -> bool:
    """Whether the form should show ``spec`` given the current widget values by path: a knob of
    a family (its spec lists it) shows only while the chosen member reads it (gspo_variant with
    policy_loss=gspo, gpg_alpha with advantage=gpg, sapo_tau_* with sapo). Other fields always show."""
    for switch, family in _SWITCHES.items():
        chosen = family.specs.get(values.get(switch))
        owned = {k.field for k in family.knobs() if not k.shared}
        if chosen is not None and spec.path in owned and spec.path not in chosen.knob_fields:
            return False
    return True


def inert_notes(recipe: Recipe | None) -> dict[str, str]:
    """Field path -> why it has no effect under ``recipe``'s settings (workbench.algorithms.inert_knobs;
    {} while the form does not validate)."""
    return inert_knobs(recipe) if recipe is not None else {}


def field_rows(specs: list[FieldSpec], width: int = 3) -> list[list[FieldSpec]]:
    """Lay fields out in rows of ``width``; an X_low / X_high pair always shares one row."""
    rows: list[list[FieldSpec]] = []
    row: list[FieldSpec] = []
    paths = [s.path for s in specs]
    for i, spec in enumerate(specs):
        pair = spec.path.endswith("_low") and spec.path.removesuffix("_low") + "_high" in paths[i + 1:i + 2]
        if pair and len(row) > width - 2:
            rows.append(row)
            row = []
        row.append(spec)
        if len(row) == width and not pair:
            rows.append(row)
            row = []
    return rows + ([row] if row else [])


def fields_at_fault(errors: dict[str, str]) -> list[str]:
    """The field paths an error dict blames, in order: a field's own error names it; a rule over
    several fields (key '' or a section) names the fields its message mentions."""
    paths = [s.path for s in field_specs()]
    out: list[str] = []
    for key, message in errors.items():
        named = [key] if key in paths else sorted((p for p in paths if re.search(rf"(?<![\w.]){re.escape(p)}(?![\w])", message)),
                                                  key=message.find)
        for path in named or [key or "recipe"]:
            if path not in out:
                out.append(path)
    return out


def section_title(path: str) -> str | None:
    """The tab a field path is shown on (None for the top-level fields)."""
    return SECTIONS.get(path.split(".", 1)[0]) if "." in path else None


# ---- Streamlit ------------------------------------------------------------------------------


def load_into_form(recipe: Recipe) -> None:
    """Put ``recipe``'s values into the widgets' state (starting point changed)."""
    data = recipe.to_dict()
    for spec in field_specs():
        st.session_state[spec.key] = format_field(spec, get_path(data, spec.path))
    st.session_state["rf:draft"] = data


def _widget(spec: FieldSpec, error: str | None, inert: str | None = None) -> None:
    label, key, help_ = spec.label, spec.key, spec.help
    if spec.kind == "choice":
        st.selectbox(label, spec.choices, key=key, help=help_, format_func=CHOICE_LABELS.get(spec.path, str))
    elif spec.kind == "multi":  # a value not offered (a previous run's, launched from the CLI) stays visible,
        held = [v for v in st.session_state.get(key) or [] if v not in spec.choices]  # refused by parse_field
        st.multiselect(label, [*spec.choices, *held], key=key, help=help_)
    elif spec.kind == "bool":
        st.checkbox(label, key=key, help=help_)
    else:
        placeholder = "None" if spec.optional else None
        st.text_input(label, key=key, help=help_, placeholder=placeholder)
    if inert:
        st.caption(f":material/block: No effect here: {inert}.")
    if error:
        st.error(error, icon=":material/error:")


def render_form(base: Recipe) -> tuple[Recipe | None, dict[str, str]]:
    """All fields (top-level, then one tab per section) with errors under each; returns the
    validated recipe (None while anything is invalid) and the errors by field path."""
    specs = field_specs()
    draft = st.session_state.get("rf:draft") or base.to_dict()
    for spec in specs:  # widgets dropped while another page was shown get the draft back
        if spec.key not in st.session_state:
            st.session_state[spec.key] = format_field(spec, get_path(draft, spec.path))
    raw = {spec.path: st.session_state[spec.key] for spec in specs}
    recipe, errors = validate_form(raw, base)
    st.session_state["rf:draft"] = {**base.to_dict(), **(recipe.to_dict() if recipe else draft)}
    inert = inert_notes(recipe)

    top = [s for s in specs if "." not in s.path]
    cols = st.columns(2)
    for i, spec in enumerate(top):
        with cols[i % 2]:
            _widget(spec, errors.get(spec.path))
    # Labels never change (a label with a warning sign made a new tab bar, which jumped back to
    # the first tab); the fields at fault are listed with their tab instead.
    tabs = st.tabs(list(SECTIONS.values()), key="rf:tabs")
    for tab, section in zip(tabs, SECTIONS):
        with tab:
            if errors.get(section):
                st.error(errors[section], icon=":material/error:")
            fields = [s for s in specs if s.path.startswith(section + ".") and is_relevant(s, raw)]
            for row in field_rows(fields):
                for col, spec in zip(st.columns(3), row):
                    with col:
                        _widget(spec, errors.get(spec.path), inert.get(spec.path))
    if errors.get(""):
        st.error(errors[""], icon=":material/error:")
    return recipe, errors


def preset_notes(name: str) -> str:
    """The leading comment block of a preset file (paper, what it is, defining settings)."""
    from workbench.recipe import preset_path

    lines = []
    for line in preset_path(name).read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].removeprefix(" "))
    return "\n".join(lines)
