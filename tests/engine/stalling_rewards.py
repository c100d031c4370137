"""A reward function that stalls its run at one step (a process to kill -9 at a known point)."""

import os
import time

STALL_ENV = "WB_TEST_STALL_AT_STEP"


def exact_match_stalling(prompts, completions, completion_ids=None, trainer_state=None, **kwargs):
    """Exact match against ``answer``; sleeps (until killed) at step ``$WB_TEST_STALL_AT_STEP``
    when that variable is set, so a test can SIGKILL the run inside that step."""
    if trainer_state and os.environ.get(STALL_ENV) == str(trainer_state["step"]):
        time.sleep(600)
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, kwargs["answer"])]
