"""A settings section drawn from its pydantic model: one widget per field, chosen by the field's
type, with its bounds and its docstring as help. A field added to the model appears on the page
with nothing to copy; fields whose value runs code on a machine (a cluster's python, a runtime
environment that installs packages) are passed as ``read_only``: shown, kept, edited only in
settings.yaml.

Types and their widgets (what the page returns for the model to validate):

====================  ==================================  =====================================
annotation            widget                              value
====================  ==================================  =====================================
bool                  checkbox                            bool
int / float           number_input (ge / le / gt bounds)  int / float
str                   text_input                          str (stripped)
list[str]             text_area, one entry per line       list of the non-empty lines
dict[str, str]        text_area, ``key: value`` per line  dict (a line without ':' is an error)
anything else         read-only JSON                      the stored value
====================  ==================================  =====================================
"""

from __future__ import annotations

import json
import typing
from typing import Any

import annotated_types
import streamlit as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo


class FormValueError(ValueError):
    """A value the widget cannot turn into the field's type (names the field, the value and the form)."""


def field_label(name: str) -> str:
    return name.replace("_", " ").capitalize()


def bounds(info: FieldInfo) -> dict[str, float]:
    """number_input's min_value / max_value from the field's ge / gt / le / lt metadata (a strict
    bound is shown as the bound itself; the model's validation refuses the value at it)."""
    out: dict[str, float] = {}
    for item in info.metadata:
        for attr, key in (("ge", "min_value"), ("gt", "min_value"), ("le", "max_value"), ("lt", "max_value")):
            if isinstance(item, getattr(annotated_types, attr.capitalize())):
                out[key] = getattr(item, attr)
    return out


def widget_kind(info: FieldInfo) -> str:
    """bool, int, float, str, lines (list[str]), pairs (dict[str, str]) or read_only."""
    annotation = info.annotation
    if annotation in (bool, int, float, str):
        return annotation.__name__
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and args == (str,):
        return "lines"
    if origin is dict and args == (str, str):
        return "pairs"
    return "read_only"


def lines_value(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def pairs_value(text: str, field: str) -> dict[str, str]:
    """``key: value`` lines -> dict; FormValueError naming the first line that is not one."""
    pairs = {}
    for line in lines_value(text):
        key, sep, value = line.partition(":")
        if not sep or not key.strip():
            raise FormValueError(f"{field}: line {line!r:.80} is not allowed; one 'name: value' per line")
        pairs[key.strip()] = value.strip()
    return pairs


def pairs_text(value: dict[str, str]) -> str:
    return "\n".join(f"{k}: {v}" for k, v in value.items())


def model_section(model: BaseModel, *, prefix: str, key: str, read_only: tuple[str, ...] = (),
                  columns: int = 1) -> tuple[dict[str, Any], list[str]]:
    """Draw one widget per field of ``model`` (its current values); return the edited values as a
    dict for ``type(model).model_validate`` (read-only and unknown-type fields unchanged) and the
    errors of text that cannot become its field's type (that field then keeps its stored value).
    Widget keys are ``{key}_{field}``; ``prefix`` names the section in errors (``ray.address``)."""
    values: dict[str, Any] = {}
    errors: list[str] = []
    shown = [name for name in type(model).model_fields if name not in read_only]
    cols = st.columns(columns) if columns > 1 else None
    for index, name in enumerate(shown):
        info = type(model).model_fields[name]
        current, label, help_text = getattr(model, name), field_label(name), info.description
        where = cols[index % columns] if cols else st
        widget_key, kind = f"{key}_{name}", widget_kind(info)
        if kind == "bool":
            values[name] = where.checkbox(label, value=current, key=widget_key, help=help_text)
        elif kind in ("int", "float"):
            cast = int if kind == "int" else float  # Streamlit refuses mixed int / float arguments
            number = where.number_input(label, value=cast(current), key=widget_key, help=help_text,
                                        step=cast(1 if kind == "int" else 0.5),
                                        **{k: cast(v) for k, v in bounds(info).items()})
            values[name] = int(number) if kind == "int" else float(number)
        elif kind == "str":
            values[name] = where.text_input(label, value=current, key=widget_key, help=help_text).strip()
        elif kind == "lines":
            values[name] = lines_value(where.text_area(label, value="\n".join(current), key=widget_key,
                                                       help=f"{help_text} One per line." if help_text else "One per line."))
        elif kind == "pairs":
            text = where.text_area(label, value=pairs_text(current), key=widget_key,
                                   help=f"{help_text} One 'name: value' per line." if help_text else None)
            try:
                values[name] = pairs_value(text, f"{prefix}.{name}")
            except FormValueError as err:
                errors.append(str(err))
    fixed = [name for name, info in type(model).model_fields.items() if name in read_only or widget_kind(info) == "read_only"]
    if fixed:
        st.caption("Edited in settings.yaml only (runs code where the jobs run, or has no form field): " +
                   ", ".join(f"{name} = `{json.dumps(getattr(model, name))}`" for name in fixed))
    return {**model.model_dump(mode="json"), **values}, errors
