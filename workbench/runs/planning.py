"""Planning a launch: arms x seeds (and sweeps), validated before anything is written (pure; no
torch, no store). ``plan_runs`` turns recipes, a sweep grid and a seed count into ``PlannedRun``
values; ``check_joins_group`` keeps a group's arms honest when runs are added to it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from workbench.runs.records import Run, RunError

if TYPE_CHECKING:  # the recipe module imports the estimator registries (torch); listing runs must not
    from workbench.recipe import Recipe

# fields a comparison group forces to the first recipe's values, so curves are comparable (unless
# they are swept). The seed is not one of them: it is the replication axis (see plan_runs).
GROUP_SHARED_FIELDS = ("model", "task", "dataset", "sampling.prompts_per_step")
SEED_FIELD = "train.seed"
MAX_RUNS_PER_LAUNCH = 100  # arms x seeds of one launch: a typo in --seeds must not queue thousands of runs
ARM_SEPARATOR = " · "


@dataclass(frozen=True)
class PlannedRun:
    """One run of a launch: its arm label, seed, the recipe it trains (``train.seed == seed``) and
    the swept values that make its arm (dotted field -> value; {} without a sweep)."""

    arm: str
    seed: int
    recipe: Recipe
    sweep: dict[str, Any] = field(default_factory=dict)


def parse_sweep(items: Iterable[str]) -> dict[str, list[Any]]:
    """CLI ``--sweep FIELD=V1,V2`` items (and the Launch page's "Values of FIELD" boxes) ->
    {dotted field: [values]}; each value list is read as one YAML flow sequence by the limited
    loader (workbench.yamlsafe: no aliases, bounded depth and integer length), so
    ``optim.betas=[0.9,0.99],[0.9,0.999]`` sweeps two pairs and a hostile list is one RunError
    naming the field, not a traceback or minutes of expansion."""
    from workbench.yamlsafe import YamlInputError, load_yaml, short

    sweep: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or not raw.strip():
            raise RunError(f"--sweep {short(item)} is not allowed; expected FIELD=V1,V2,..., e.g. algorithm.eps_high=0.2,0.28")
        try:
            values = load_yaml(f"[{raw}]", root=key)
        except YamlInputError as err:
            if str(err).startswith("not valid YAML"):
                raise RunError(f"--sweep {short(item)}: the values are not a valid YAML list ({str(err)[16:-1]})") from None
            raise RunError(f"--sweep {short(key, 40)}: {err}") from None
        if key in sweep:
            raise RunError(f"--sweep {key} is given twice; list every value in one --sweep {key}=V1,V2")
        sweep[key] = values
    return sweep


def _format_value(value: Any) -> str:
    """A swept value as an arm label shows it: YAML spelling for true/false/null and lists, str otherwise."""
    return json.dumps(value) if value is None or isinstance(value, (bool, list, dict)) else str(value)


def _arm_label(base: str, point: Mapping[str, Any]) -> str:
    """'grpo' + {algorithm.eps_high: 0.28, algorithm.aggregation: 'token-mean'} ->
    'grpo · eps_high=0.28 · aggregation=token-mean' (the field's last part; the whole path where
    two swept fields share it)."""
    leaves = [key.rsplit(".", 1)[-1] for key in point]
    names = [leaf if leaves.count(leaf) == 1 else key for key, leaf in zip(point, leaves)]
    return ARM_SEPARATOR.join([base, *(f"{n}={_format_value(v)}" for n, v in zip(names, point.values()))])


def _check_sweep(sweep: Mapping[str, Sequence[Any]], recipe: Recipe) -> dict[str, list[Any]]:
    """Swept fields exist in ``recipe`` (not the seed), each with distinct values."""
    checked = {}
    for key, values in sweep.items():
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        node, parts = recipe.to_dict(), key.split(".")
        for depth, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                where = ".".join(parts[:depth]) or "the recipe"
                known = ", ".join(node) if isinstance(node, dict) else "(none: not a section)"
                raise RunError(f"--sweep {key}: unknown field; fields of {where}: {known}")
            node = node[part]
        if key == SEED_FIELD:
            raise RunError(f"--sweep {SEED_FIELD} is not allowed: the seed is the replication axis; use --seeds N")
        if not values:
            raise RunError(f"--sweep {key} has no values; give at least one")
        shown = [_format_value(v) for v in values]
        repeated = sorted({v for v in shown if shown.count(v) > 1})
        if repeated:
            raise RunError(f"--sweep {key} lists {', '.join(repeated)} twice; each value makes one arm")
        checked[key] = values
    return checked


def _base_recipes(sources: Sequence[str | Recipe], overrides: Sequence[str]) -> list[tuple[str, Recipe]]:
    """(arm base label, recipe) per source: a preset name is its own label, a YAML file or a Recipe
    object is labelled by its ``name``. ``overrides`` (``--set``) apply to every source."""
    from workbench.recipe import load_recipe

    bases = []
    for source in sources:
        if isinstance(source, str):
            recipe = load_recipe(source, list(overrides))
            label = source if Path(source).suffix not in (".yaml", ".yml") else recipe.name
        else:
            recipe, label = (source.with_overrides(list(overrides)) if overrides else source), source.name
        bases.append((label, recipe))
    labels = [label for label, _ in bases]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise RunError(f"recipes {', '.join(map(repr, twice))} appear twice in one launch; each arm needs its own "
                       "name (rename one with --set name=...)")
    return bases


def plan_runs(sources: Sequence[str | Recipe], *, seeds: int = 1, sweep: Mapping[str, Sequence[Any]] | None = None,
              overrides: Sequence[str] = (), target: str = "local", num_processes: int = 1) -> list[PlannedRun]:
    """Every run of a launch, each one validated, before anything starts (pure; no torch, no store).

    arms = sources x the grid of ``sweep`` ({dotted field: [values]}); every arm runs with seeds
    s0, s0 + 1, ..., s0 + seeds - 1, where s0 is the first recipe's ``train.seed``, so seed k of
    every arm shares its sampling and data order (paired seeds). ``GROUP_SHARED_FIELDS`` that are
    not swept are forced to the first recipe's values. Each (arm, seed) recipe is validated
    (Recipe's bounds; this machine's CPUs/GPUs for a local ``target``): the first invalid one is a
    RecipeError naming its arm and seed, and nothing is returned.

    Returns len(sources) x prod(len(values)) x seeds PlannedRun, arm-major, seeds ascending.
    """
    from workbench.machine import check_fits_machine
    from workbench.recipe import RecipeError
    from workbench.runs.launchers import target_scheme

    if not sources:
        raise RunError("a launch needs at least one recipe")
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise RunError(f"--seeds={seeds!r} is not allowed; a whole number of seeds per arm, at least 1")
    arms = len(sources) * math.prod(len(v) if isinstance(v, (list, tuple)) else 1 for v in (sweep or {}).values())
    if arms * seeds > MAX_RUNS_PER_LAUNCH:
        raise RunError(f"this launch would create {arms} arms x {seeds} seeds = {arms * seeds} runs; at most "
                       f"{MAX_RUNS_PER_LAUNCH} per launch: use fewer seeds, recipes or sweep values")
    bases = _base_recipes(sources, overrides)
    first = bases[0][1]
    grid = _check_sweep(sweep or {}, first)
    shared = [f"{key}={_yaml_text(_get(first, key))}" for key in GROUP_SHARED_FIELDS
              if key not in grid and _get(first, key) is not None]
    check_machine = target_scheme(target) == "local"  # elsewhere the machine is not known here
    planned = []
    for label, base in bases:
        aligned = base.with_overrides(shared) if shared and len(bases) > 1 else base
        for values in product(*grid.values()):
            point = dict(zip(grid, values))
            arm = _arm_label(label, point)
            for seed in range(first.train.seed, first.train.seed + seeds):
                items = [f"{key}={_yaml_text(value)}" for key, value in point.items()] + [f"{SEED_FIELD}={seed}"]
                try:
                    recipe = aligned.with_overrides(items)
                    if check_machine:
                        check_fits_machine(recipe, num_processes)
                except RecipeError as err:
                    if arms * seeds == 1:  # the only run: the recipe's own message says it all
                        raise
                    raise RecipeError(f"arm {arm!r} seed {seed} is not allowed: {err}") from None
                planned.append(PlannedRun(arm=arm, seed=seed, recipe=recipe, sweep=point))
    check_sweep_acts(grid, planned)
    return planned


def inert_sweeps(grid: Mapping[str, Sequence[Any]], planned: Sequence[PlannedRun]) -> dict[str, dict[str, str]]:
    """Swept field -> {arm: why the field has no effect in that arm} (``workbench.algorithms.inert_knobs``,
    read from the specs), for the swept fields inert in at least one arm; {} when every swept
    field acts everywhere. The seeds of an arm share its settings, so one recipe per arm is read."""
    from workbench.algorithms import inert_knobs

    first_of_arm = {p.arm: p.recipe for p in planned}
    inert = {arm: inert_knobs(recipe) for arm, recipe in first_of_arm.items()}
    out = {key: {arm: knobs[key] for arm, knobs in inert.items() if key in knobs} for key in grid}
    return {key: arms for key, arms in out.items() if arms}


def check_sweep_acts(grid: Mapping[str, Sequence[Any]], planned: Sequence[PlannedRun]) -> None:
    """Refuse a swept field that has no effect in any arm (:func:`inert_sweeps`: eps_high of the
    clip at mu = 1 with one minibatch, sapo_tau_* under another loss, kl_estimator at kl_coef = 0):
    its arms would differ only by noise, a comparison with nothing to find. A field that acts in
    at least one arm (swept beside train.mu, say) is allowed."""
    arms = {p.arm for p in planned}
    for key, inert in inert_sweeps(grid, planned).items():
        if set(inert) == arms:
            raise InertSweepError(key, next(iter(inert.values())))


class InertSweepError(RunError):
    """A swept field that acts in no arm (its name and the reason kept for the Launch page,
    which shows them beside the sweep editor)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"--sweep {field} has no effect in any arm ({reason}): its arms would differ only by "
                         "noise; sweep a field that acts, or change the setting named")
        self.field, self.reason = field, reason


def _yaml_text(value: Any) -> str:
    """A value as ``with_overrides`` reads it back (JSON is YAML): 0.28, "token-mean", [0.9, 0.99]."""
    return json.dumps(value)


def check_joins_group(arms: Mapping[str, list[Run]], group: str, planned: Sequence[PlannedRun]) -> None:
    """Runs added to an existing group keep its arms honest: an arm label already there must mean
    the same recipe minus its seed, and a seed it already has would be a copy, not a replicate.
    ``arms``: the group's arms as ``RunStore.create_runs`` reads them inside the transaction that
    inserts the new runs, so a launch racing with this one cannot slip a seed in between."""
    import yaml

    for arm, runs in arms.items():
        mine = [p for p in planned if p.arm == arm]
        if not mine:
            continue
        theirs = _with_defaults(yaml.safe_load(runs[0].recipe) or {})
        differs = _differing_fields(_without_seed(theirs), _without_seed(mine[0].recipe.to_dict()))
        if differs:
            key, old, new = differs[0]
            raise RunError(f"group {group!r} already has arm {arm!r} with {key}={old!r}, this launch has {key}={new!r}; "
                           "launch into another group or give the recipe another name (--set name=...)")
        taken = sorted({p.seed for p in mine} & {r.seed for r in runs})
        if taken:
            raise RunError(f"group {group!r} already has arm {arm!r} with seed(s) {taken}: a run with the same seed is "
                           f"a copy, not a replicate; add seeds with --set {SEED_FIELD}={max(r.seed or 0 for r in runs) + 1}")


def recipe_differences(recipes: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The fields in which arms differ, seed aside: ``{arm: stored recipe YAML}`` ->
    ``{dotted field: {arm: value}}`` for every field whose value is not the same in all arms
    (fields this version added filled in with their defaults); a field an
    arm lacks is None there. Fields in the order they are first found (each arm against the first).
    What a comparison report shows beside the curves."""
    import yaml

    full = {arm: _without_seed(_with_defaults(yaml.safe_load(text) or {})) for arm, text in recipes.items()}
    first = next(iter(full.values()), {})
    fields = dict.fromkeys(key for recipe in full.values() for key, _, _ in _differing_fields(first, recipe))
    return {key: {arm: _value_at(recipe, key) for arm, recipe in full.items()} for key in fields}


def _value_at(data: dict, key: str) -> Any:
    """``setting`` of a recipe dict, None where an arm's recipe lacks the field."""
    from workbench.algorithms.spec import setting

    try:
        return setting(data, key)
    except (KeyError, TypeError):
        return None


def _with_defaults(data: dict) -> dict:
    """A stored recipe with the fields this version added filled in (as is if it no longer validates)."""
    from workbench.recipe import Recipe, RecipeError

    try:
        return Recipe.from_dict(data).to_dict()
    except RecipeError:
        return data


def _without_seed(recipe: dict) -> dict:
    section, key = SEED_FIELD.split(".")
    return {**recipe, section: {k: v for k, v in (recipe.get(section) or {}).items() if k != key}}


def _differing_fields(a: Any, b: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted field, value in a, value in b) wherever two recipe dicts differ, in field order."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [] if a == b else [(prefix, a, b)]
    return [d for key in dict.fromkeys([*a, *b])
            for d in _differing_fields(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else key)]


def _get(recipe: Recipe, dotted: str):
    value = recipe
    for part in dotted.split("."):
        value = getattr(value, part)
    return value
