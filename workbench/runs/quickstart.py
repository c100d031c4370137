"""The one-button comparison a first-time user gets: GRPO vs RLOO vs PPO on the tiny model."""

from __future__ import annotations

from workbench.recipe import Recipe, load_recipe

QUICKSTART_PRESETS = ("grpo", "rloo", "ppo")
QUICKSTART_OVERRIDES: list[str] = []


def quickstart_recipes() -> list[Recipe]:
    """Presets tuned to show learning within two minutes on a 2-core CPU, all three at once."""
    return [load_recipe(name, QUICKSTART_OVERRIDES) for name in QUICKSTART_PRESETS]
