"""A reward function that stalls its run at one step (a process to kill -9 at a known point)."""

import os
import time

STALL_ENV = "WB_TEST_STALL_AT_STEP"
# optional: a file path; only the first attempt that creates it stalls (a requeued job keeps the
# environment it was submitted with, so the variable alone would stall every attempt)
STALL_ONCE_ENV = "WB_TEST_STALL_ONCE_MARKER"
# optional: a file path created when the stall begins: every event of the steps before it is
# written by then (a test waiting for the stall itself, not for a metrics line of the step before,
# which the same step's samples and lens events still follow)
STALLED_FILE_ENV = "WB_TEST_STALLED_FILE"


def _first_stall() -> bool:
    marker = os.environ.get(STALL_ONCE_ENV)
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def exact_match_stalling(prompts, completions, completion_ids=None, trainer_state=None, **kwargs):
    """Exact match against ``answer``; sleeps (until killed) at step ``$WB_TEST_STALL_AT_STEP``
    when that variable is set, so a test can SIGKILL the run inside that step (with
    ``$WB_TEST_STALL_ONCE_MARKER``: in the first attempt only; ``$WB_TEST_STALLED_FILE``: a file
    created as the stall begins)."""
    if trainer_state and os.environ.get(STALL_ENV) == str(trainer_state["step"]) and _first_stall():
        if os.environ.get(STALLED_FILE_ENV):
            open(os.environ[STALLED_FILE_ENV], "w").close()
        time.sleep(600)
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, kwargs["answer"])]
