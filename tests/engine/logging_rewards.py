"""A reward function that logs through TRL's log_extra / log_metric (referenced by import path)."""


def exact_with_logs(prompts, completions, completion_ids=None, log_extra=None, log_metric=None, **kwargs):
    """exact_match, logging the stripped completion and its length as extra columns and two
    metrics: the batch's mean length, and 1.0 then 3.0 under one name (its step value: 2.0)."""
    answers = kwargs["answer"]
    rewards = [float(c.strip() == a) for c, a in zip(completions, answers)]
    log_extra("stripped", [c.strip() for c in completions])
    log_extra("n_chars", [len(c) for c in completions])
    log_metric("custom/mean_chars", sum(len(c) for c in completions) / len(completions))
    log_metric("custom/twice", 1.0)
    log_metric("custom/twice", 3.0)
    return rewards


def exact_without_logging_kwargs(prompts, completions, completion_ids, answer):
    """A function with an explicit signature (no **kwargs): it must not be handed the callables."""
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
