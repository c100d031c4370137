"""The one-button comparison a first-time user gets: GRPO vs RLOO vs PPO on the tiny model, each
arm with several seeds so the verdict table can say whether a gap is real."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.recipe import Recipe, load_recipe

if TYPE_CHECKING:
    from workbench.runs.service import PlannedRun

QUICKSTART_PRESETS = ("grpo", "rloo", "ppo")
QUICKSTART_SEEDS = 3  # seeds per arm: the fewest that give each arm a confidence interval with some width to trust
# 16 repeated problems, 8 prompts x G=8, 160 steps. bench/learning_bench.py (2 cores, all three at
# once, one seed each): first step after ~10 s, all done in ~87 s; reward gain (last 20 - first 20
# steps) GRPO +0.14 (3.5 s.e.), RLOO +0.29 (7.0 s.e.), PPO +0.09 (2.4 s.e.)
QUICKSTART_OVERRIDES = ["task=arithmetic_drill", "sampling.prompts_per_step=8", "train.steps=160"]


def quickstart_recipes() -> list[Recipe]:
    """Presets tuned to show learning within two minutes on a 2-core CPU, all three at once."""
    return [load_recipe(name, QUICKSTART_OVERRIDES) for name in QUICKSTART_PRESETS]


def quickstart_plan(seeds: int = QUICKSTART_SEEDS) -> list[PlannedRun]:
    """The Quick comparison's runs: arms grpo, rloo, ppo x ``seeds`` paired seeds (0, 1, ...),
    validated for this machine; launch them with ``launch_planned(..., group=...)``."""
    from workbench.runs.service import plan_runs

    return plan_runs(list(QUICKSTART_PRESETS), seeds=seeds, overrides=QUICKSTART_OVERRIDES)
