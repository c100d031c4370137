"""The one-button comparison a first-time user gets: GRPO vs RLOO vs PPO on the tiny model."""

from __future__ import annotations

from workbench.recipe import Recipe, load_recipe

QUICKSTART_PRESETS = ("grpo", "rloo", "ppo")
# 16 repeated problems, 8 prompts x G=8, 160 steps: measured here (2 cores, all three at once) RLOO
# and PPO climb from ~0.45 to ~0.63 reward and GRPO (KL 0.04) stays ~0.4-0.5; done in ~90 s
QUICKSTART_OVERRIDES = ["task=arithmetic_drill", "sampling.prompts_per_step=8", "train.steps=160"]


def quickstart_recipes() -> list[Recipe]:
    """Presets tuned to show learning within two minutes on a 2-core CPU, all three at once."""
    return [load_recipe(name, QUICKSTART_OVERRIDES) for name in QUICKSTART_PRESETS]
