"""Every number of the recipe schema is bounded, and names are labels, never paths.

The walk below finds every numeric field of Recipe (recursively through its sections, in tuples,
lists and Optionals) from pydantic's ``model_fields``, so a field added later without bounds
fails here: +-1e300 (finite: ``allow_inf_nan=False`` lets it through) used to pass validation and
fail at step 0 (eps, delta, weight_decay, sapo_tau, value_clip, betas = [2, 3]); a 5001-digit
integer used to raise Python's int-string ValueError naming no field."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from tests.test_cli import assert_one_line_error, cli, leftovers
from workbench.recipe import Recipe, RecipeError

NUMBER_TYPES = (int, float)


def _numeric_shape(annotation) -> tuple[str, type, int] | None:
    """(container, number type, arity) of a numeric annotation: ('scalar', float, 1),
    ('tuple', float, 2), ('list', float, 1); None when the field holds no number."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _numeric_shape(args[0])
    if annotation is bool:
        return None
    if annotation in NUMBER_TYPES:
        return ("scalar", annotation, 1)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        shapes = [s for s in map(_numeric_shape, args) if s is not None]
        return shapes[0] if shapes else None
    if origin is tuple and args:
        inner = _numeric_shape(args[0])
        return ("tuple", inner[1], len(args)) if inner else None
    if origin is list and args:
        inner = _numeric_shape(args[0])
        return ("list", inner[1], 1) if inner else None
    return None


def numeric_fields(model: type[BaseModel] = Recipe, prefix: str = "") -> list[tuple[str, tuple]]:
    """(dotted path, shape) of every numeric field of ``model`` and its sections."""
    out = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out += numeric_fields(annotation, f"{prefix}{name}.")
        elif (shape := _numeric_shape(annotation)) is not None:
            out.append((f"{prefix}{name}", shape))
    return out


FIELDS = numeric_fields()


def test_the_walk_sees_every_kind_of_numeric_field():
    """The walk itself is checked: it must reach scalars, Optionals, tuples and lists of numbers."""
    paths = dict(FIELDS)
    assert len(paths) >= 60, sorted(paths)
    for path in ("algorithm.eps_low", "algorithm.delta", "algorithm.value_clip", "optim.betas", "optim.weight_decay",
                 "reward_weights", "sampling.max_prompt_length", "train.steps", "lora.alpha", "teacher.kl_coef"):
        assert path in paths, path
    assert paths["optim.betas"][0] == "tuple" and paths["reward_weights"][0] == "list"


def _with_value(path: str, shape: tuple, number) -> dict:
    container, _, arity = shape
    value = {"scalar": number, "tuple": [number] * arity, "list": [number]}[container]
    data = Recipe().to_dict()
    *sections, last = path.split(".")
    node = data
    for part in sections:
        node = node[part]
    node[last] = value
    return data


def _huge(kind: type, sign: int):
    return sign * (10**300 if kind is int else 1e300)


@pytest.mark.parametrize("sign", [1, -1], ids=["+1e300", "-1e300"])
@pytest.mark.parametrize("path, shape", FIELDS, ids=[p for p, _ in FIELDS])
def test_every_numeric_field_refuses_1e300_naming_it(path, shape, sign):
    with pytest.raises(RecipeError) as info:
        Recipe.from_dict(_with_value(path, shape, _huge(shape[1], sign)))
    message = str(info.value)
    assert path in message, message
    assert len(message) < 600, message


@pytest.mark.parametrize("path, shape", FIELDS, ids=[p for p, _ in FIELDS])
def test_every_numeric_field_refuses_a_5001_digit_integer_naming_it(path, shape):
    """Through --set (YAML) and through a dict (a Python int whose repr itself raises)."""
    value = "1" * 5001
    set_value = value if shape[0] == "scalar" else f"[{', '.join([value] * shape[2])}]"
    with pytest.raises(RecipeError) as info:
        Recipe().with_overrides([f"{path}={set_value}"])
    assert f"{path}" in str(info.value) and "5001 digits" in str(info.value) and len(str(info.value)) < 600
    with pytest.raises(RecipeError) as info:
        Recipe.from_dict(_with_value(path, shape, 10**5000))
    assert path in str(info.value) and len(str(info.value)) < 600, str(info.value)[:600]


@pytest.mark.parametrize("item, expected", [
    ("algorithm.eps_high=1e300", "algorithm.eps_high"),  # YAML 1.1 reads 1e300 as text: refused as not a number
    ("algorithm.delta=1.0e+300", "algorithm.delta"),
    ("optim.betas=[2, 3]", "optim.betas.0=2"),
    ("algorithm.value_clip=-1.0e+300", "algorithm.value_clip"),
    (f"train.steps={'9' * 5001}", "train.steps=<an integer of 5001 digits>"),
])
def test_the_issue_examples_through_the_cli(tmp_path, item, expected):
    res = cli(tmp_path, "train", "grpo", "--set", item, "--run-dir", str(tmp_path / "run"))
    assert_one_line_error(res, expected)
    assert not (tmp_path / "run").exists() and leftovers(tmp_path) == []


# ---- names --------------------------------------------------------------------------------------

HOSTILE_NAMES = ["../../etc", "a/b", "..\\x", "tab\there", "nl\nx", "nul\x00x", "x" * 300, "..", " . ", "\x1b[31mred"]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_a_name_is_a_label_not_a_path(name):
    with pytest.raises(RecipeError) as info:
        Recipe(name="grpo").with_overrides([f"name={name!r}"]) if "\x00" not in name else Recipe.from_dict({"name": name})
    assert "name=" in str(info.value) and len(str(info.value)) < 400


@pytest.mark.parametrize("name", ["../../etc", "x" * 300])
def test_a_hostile_name_through_the_cli_writes_nothing(tmp_path, name):
    res = cli(tmp_path, "train", "grpo", "--set", f"name={name}")
    assert_one_line_error(res, "name=")
    assert leftovers(tmp_path) == [] and not (tmp_path.parent / "etc").exists()


@pytest.mark.parametrize("name", [*HOSTILE_NAMES, "my run", "été", "grpo", "-x-", "a..b", "", "日本語"])
def test_slug_is_always_a_safe_single_path_part(tmp_path, name):
    from workbench.runs.names import check_run_name, slug

    part = slug(name)
    assert check_run_name(part) == part and len(part) <= 40
    runs = tmp_path / "runs"
    assert (runs / part).resolve().parent == runs.resolve()
    assert slug("grpo") == "grpo" and slug("my run") == "my-run"
