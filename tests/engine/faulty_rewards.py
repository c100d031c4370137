"""Reward functions that misbehave on purpose (referenced by import path in the tests)."""

import math
import os
from pathlib import Path


def raises_at_step_2(prompts, completions, completion_ids=None, trainer_state=None, **kwargs):
    if trainer_state and trainer_state["step"] >= 2:
        raise ZeroDivisionError("boom in the reward")
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, kwargs["answer"])]


def infinite_at_step_2(prompts, completions, completion_ids=None, trainer_state=None, **kwargs):
    if trainer_state and trainer_state["step"] >= 2:
        return [math.inf] * len(completions)
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, kwargs["answer"])]


def overflowing_at_step_2(prompts, completions, completion_ids=None, trainer_state=None, **kwargs):
    """From step 2, rewards of +-3e38 (finite float32): centred without a std (Dr. GRPO) they give
    per-token losses of +-3e38 whose sum over a sequence overflows float32."""
    if trainer_state and trainer_state["step"] >= 2:
        return [3e38 if i % 2 else -3e38 for i in range(len(completions))]
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, kwargs["answer"])]


def raises_once_at_step_2(prompts, completions, completion_ids=None, trainer_state=None, **kwargs):
    """Raises the first time any process sees step 2 (a crash that a resume, in this process or
    another, gets past): the file named by ``WB_TEST_FAILED_ONCE`` records that it did."""
    marker = Path(os.environ["WB_TEST_FAILED_ONCE"])
    if trainer_state and trainer_state["step"] == 2 and not marker.exists():
        marker.write_text("step 2")
        raise ZeroDivisionError("boom in the reward, once")
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, kwargs["answer"])]
