"""The one-button comparison a first-time user gets: GRPO vs RLOO vs PPO on the tiny model."""

from __future__ import annotations

from workbench.recipe import Recipe, load_recipe

QUICKSTART_PRESETS = ("grpo", "rloo", "ppo")
# 16 repeated problems, 8 prompts x G=8, 160 steps. bench/learning_bench.py (2 cores, all three at
# once): first step after ~10 s, all done in ~87 s; reward gain (last 20 - first 20 steps) GRPO
# +0.14 (3.5 s.e.), RLOO +0.29 (7.0 s.e.), PPO +0.09 (2.4 s.e.)
QUICKSTART_OVERRIDES = ["task=arithmetic_drill", "sampling.prompts_per_step=8", "train.steps=160"]


def quickstart_recipes() -> list[Recipe]:
    """Presets tuned to show learning within two minutes on a 2-core CPU, all three at once."""
    return [load_recipe(name, QUICKSTART_OVERRIDES) for name in QUICKSTART_PRESETS]
