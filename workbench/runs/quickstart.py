"""The one-button comparison a first-time user gets: GRPO vs RLOO vs PPO on the tiny model, each
arm with several seeds so the verdict table can say whether a gap is real."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.recipe import Recipe, load_recipe

if TYPE_CHECKING:
    from workbench.runs.service import PlannedRun

QUICKSTART_PRESETS = ("grpo", "rloo", "ppo")
QUICKSTART_SEEDS = 3  # seeds per arm: the fewest that give each arm a confidence interval with some width to trust
# The presets' own defaults (arithmetic_four, G = 8 x 4 prompts, lr 1e-3, 60 steps): 9 runs, 3 at a
# time (cpu_slots 3) on 2 cores. See bench/learning_bench.py --part quick for the wall time and
# each arm's reward gain with its 95% interval over seeds.
QUICKSTART_OVERRIDES: list[str] = []


def quickstart_recipes() -> list[Recipe]:
    """The three arms' recipes (one seed each)."""
    return [load_recipe(name, QUICKSTART_OVERRIDES) for name in QUICKSTART_PRESETS]


def quickstart_plan(seeds: int = QUICKSTART_SEEDS, first_seed: int = 0) -> list[PlannedRun]:
    """The Quick comparison's runs: arms grpo, rloo, ppo x ``seeds`` paired seeds (first_seed,
    first_seed + 1, ...), validated for this machine; launch them with ``launch_planned(..., group=...)``."""
    from workbench.runs.service import plan_runs

    return plan_runs(list(QUICKSTART_PRESETS), seeds=seeds, overrides=[*QUICKSTART_OVERRIDES, f"train.seed={first_seed}"])
