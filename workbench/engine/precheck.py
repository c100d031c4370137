"""What a run reads besides its recipe, checked before its run directory exists: the custom
datasets and the reward functions. A bad one is one line naming the field (exit 2 from the CLI),
not a failed run left behind. Torch-free: ``train`` calls it before the trainer is imported, and
``launch`` can call it while planning.

What is checked (and what is not):
- ``dataset`` / ``eval.dataset``: read in full by the same reader the trainer uses
  (tasks.load_dataset_rows): size, UTF-8, format, a non-empty ``prompt`` in every row, each at
  most MAX_PROMPT_CHARS characters. Prompts longer than ``sampling.max_prompt_length`` tokens are
  not refused: they are left-truncated as in TRL and counted (prompts/truncated_ratio).
- ``task_config``: every number finite (``nan`` / ``.inf`` passed the schema, which types it as
  plain data, and reached reasoning-gym's generators). Its sizes are not bounded here: each
  reasoning-gym dataset has its own meaning for them.
- ``reward_funcs`` (or the task's defaults): resolved as the trainer resolves them, and
  ``reward_weights`` counted against them. Resolving an import reference imports its module (the
  CLI keeps Python's usual import rules); the app first limits references to an allow-list
  (rewards.check_app_reward_funcs), so nothing typed there is imported.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from workbench.engine.rewards import load_reward_function, reward_weights_for
from workbench.engine.tasks import load_dataset_rows, resolve_task

if TYPE_CHECKING:
    from workbench.recipe import Recipe


def check_dataset(recipe: "Recipe") -> None:
    """Read the recipe's datasets as training will; DatasetError naming dataset / eval.dataset."""
    if recipe.dataset:
        load_dataset_rows(recipe.dataset, field="dataset")
    if recipe.dataset and recipe.eval.enabled and recipe.eval.dataset:
        load_dataset_rows(recipe.eval.dataset, limit=recipe.eval.num_prompts, field="eval.dataset")


def reward_references(recipe: "Recipe") -> tuple[list[str], list[float] | None]:
    """(references, weights) a run scores with: the recipe's, else its task's defaults (with the
    task's weights). The trainer's reward_setup resolves exactly these."""
    task = resolve_task(recipe.task, recipe.task_config, system_prompt=recipe.system_prompt) if recipe.task else None
    refs = list(recipe.reward_funcs) or (list(task.reward_funcs) if task else [])
    if not refs:
        raise ValueError("reward_funcs is empty and no task supplies defaults: name at least one reward function")
    weights = recipe.reward_weights
    if weights is None and not recipe.reward_funcs and task is not None:
        weights = list(task.reward_weights)
    return refs, weights


def check_reward_funcs(recipe: "Recipe") -> None:
    """Resolve every reward function and count the weights, as the run will when it starts."""
    refs, weights = reward_references(recipe)
    for ref in refs:
        try:
            load_reward_function(ref)
        except ValueError as err:
            raise ValueError(f"reward_funcs: {err}") from None
    reward_weights_for(weights, refs)


def non_finite(value: Any, where: str) -> tuple[str, float] | None:
    """(dotted place, value) of the first NaN or infinite float in plain data, or None."""
    stack = [(where, value)]
    while stack:
        place, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return place, item
        if isinstance(item, dict):
            stack.extend((f"{place}.{k}", v) for k, v in reversed(list(item.items())))
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{place}.{i}", v) for i, v in reversed(list(enumerate(item))))
    return None


def check_task_config(recipe: "Recipe") -> None:
    """ValueError naming the first task_config value that is NaN or infinite."""
    found = non_finite(recipe.task_config, "task_config")
    if found is not None:
        place, value = found
        raise ValueError(f"{place}={value}: not a finite number; give a number (nan and inf are not allowed)")


def check_run_inputs(recipe: "Recipe") -> None:
    """Everything a run reads before it trains: task_config's numbers, datasets, then reward functions."""
    check_task_config(recipe)
    check_dataset(recipe)
    check_reward_funcs(recipe)
