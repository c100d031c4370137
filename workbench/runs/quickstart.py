"""The one-button comparison a first-time user gets: GRPO vs RLOO vs PPO on the tiny model."""

from __future__ import annotations

from workbench.recipe import Recipe, load_recipe

QUICKSTART_PRESETS = ("grpo", "rloo", "ppo")
# 16 repeated problems: reward climbs within ~40 steps; 8 prompts x G=8 keeps a step < 0.5 s per run
QUICKSTART_OVERRIDES = ["task=arithmetic_drill", "sampling.prompts_per_step=8", "train.steps=80"]


def quickstart_recipes() -> list[Recipe]:
    """Presets tuned to show learning within two minutes on a 2-core CPU, all three at once."""
    return [load_recipe(name, QUICKSTART_OVERRIDES) for name in QUICKSTART_PRESETS]
