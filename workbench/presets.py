"""Which algorithm a recipe is: the preset whose algorithm settings it has, whatever the run is
called (the Runs page's "algorithm" column used to show the run's name)."""

from __future__ import annotations

from functools import lru_cache

from workbench.recipe import Recipe, load_recipe, preset_names


@lru_cache(maxsize=1)
def _preset_algorithms() -> tuple[tuple[str, tuple[tuple[str, object], ...]], ...]:
    """(preset name, its algorithm section as sorted items) for every preset, in preset order."""
    return tuple((name, tuple(sorted(load_recipe(name).to_dict()["algorithm"].items()))) for name in preset_names())


def algorithm_label(recipe: Recipe) -> str:
    """The preset whose ``algorithm`` section equals the recipe's ('dapo'); otherwise the preset
    with the fewest differing algorithm fields, marked '(modified)' ('grpo (modified)')."""
    own = dict(recipe.to_dict()["algorithm"])
    differences = [(sum(own.get(k) != v for k, v in items), name) for name, items in _preset_algorithms()]
    count, name = min(differences, key=lambda d: d[0])  # min keeps the first preset on ties
    return name if count == 0 else f"{name} (modified)"
