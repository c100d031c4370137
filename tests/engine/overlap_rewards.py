"""Reward functions for tests/engine/test_overlap_rewards.py (reward functions are import paths).

``waits_for_the_forwards`` returns only once the behaviour forwards have started (``FORWARDS_STARTED``,
set by the test's forwards): it can score only if the forwards run while it does."""

import threading

FORWARDS_STARTED = threading.Event()
SCORED_ON: list[str] = []  # the thread each call scored on
SAW_FORWARDS: list[bool] = []  # per call: whether the forwards had started before the wait ran out


def waits_for_the_forwards(completions, answer, **kwargs):
    SCORED_ON.append(threading.current_thread().name)
    started = FORWARDS_STARTED.wait(timeout=60)
    SAW_FORWARDS.append(started)
    return [float(started and str(a) in str(c)) for c, a in zip(completions, answer)]
