"""Conditions under which a knob has no effect, shared by several specs (pure functions of a
recipe dict). Each returns a reason (a sentence naming the settings) or None when the knob acts."""

from __future__ import annotations

from typing import Callable

from .spec import RecipeData, setting


def single_pass(data: RecipeData) -> str | None:
    """One optimiser update per batch (train.mu = 1 and train.minibatches = 1): the old policy is
    the current one, the trainer uses old = sg(logp), and every ratio is exactly 1."""
    if setting(data, "train.mu") == 1 and setting(data, "train.minibatches") == 1:
        return "train.mu=1 and train.minibatches=1 (one update per batch): every ratio is exactly 1"
    return None


def at_ratio_one(*fields: str, what: str = "it never bites") -> Callable[[RecipeData], dict[str, str]]:
    """A spec rule: ``fields`` have no effect while every ratio is 1 (``single_pass``)."""
    def rule(data: RecipeData) -> dict[str, str]:
        reason = single_pass(data)
        return {f: f"{reason}, so {what}" for f in fields} if reason else {}

    return rule


def off_unless(path: str, value: object, what: str) -> Callable[[RecipeData], str | None]:
    """A knob rule: the knob acts only while ``path`` equals ``value``."""
    def rule(data: RecipeData) -> str | None:
        return None if setting(data, path) == value else f"{path}={setting(data, path)!r}: {what}"

    return rule


def off_at(path: str, value: object, what: str) -> Callable[[RecipeData], str | None]:
    """A knob rule: the knob has no effect while ``path`` equals ``value`` (its switch is off)."""
    def rule(data: RecipeData) -> str | None:
        return f"{path}={value!r}: {what}" if setting(data, path) == value else None

    return rule


def zero(path: str, what: str) -> Callable[[RecipeData], str | None]:
    """A knob rule: the knob has no effect while the coefficient at ``path`` is 0."""
    def rule(data: RecipeData) -> str | None:
        return f"{path}=0: {what}" if setting(data, path) == 0 else None

    return rule
