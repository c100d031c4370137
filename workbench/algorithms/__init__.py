"""``workbench.algorithms``: one torch-free spec per registered algorithm, from which everything
else that names an algorithm derives.

Five families, one module each (``advantages``, ``policy_losses``, ``aggregations``,
``kl_estimators``, ``shapings``), each holding one ``Spec`` per name registered in the matching
``workbench.core`` registry, in registry order. The recipe's names, capability checks and
policy-loss fields, the Launch form's options and inert-knob captions, the walkthrough pages and
the labs read these specs; nothing here imports torch (tests/test_algorithms.py checks that
every registered function has exactly one spec and that each spec's ``implementation`` is it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from . import advantages, aggregations, kl_estimators, policy_losses, shapings
from .advantages import GPG_ALPHAS, GRPO_SCALES
from .kl_estimators import KL_PLACEMENTS
from .policy_losses import CISPO_BOUNDS, DPPO_TIS_CAP, GSPO_VARIANTS, REINFORCE_FORMS
from .shapings import DISTILL_MODES
from .spec import MAX_COEF, MAX_SEED, InertRule, Knob, LabSlider, RecipeData, RegionLab, Spec, Walkthrough, setting

__all__ = ["CISPO_BOUNDS", "DISTILL_MODES", "DPPO_TIS_CAP", "FAMILIES", "GPG_ALPHAS", "GRPO_SCALES", "GSPO_VARIANTS", "KL_PLACEMENTS",
           "MAX_COEF", "MAX_SEED", "REINFORCE_FORMS", "Family", "Knob", "LabSlider", "RegionLab", "Spec", "Walkthrough",
           "choice_help", "inert_knobs", "names", "register", "resolve", "spec", "unregister", "walkthroughs",
           "with_capability"]


@dataclass(frozen=True)
class Family:
    """One registry family. ``switch``: the recipe field naming its member; ``choose(recipe_dict)``
    gives the member a recipe uses (None: the family is off, e.g. no teacher, so no shaping, and
    ``off`` says why). ``label`` / ``slug``: how the walkthrough pages name it. ``registry``: import
    path of the core registry. ``inert``: family-level knob rules (field -> rule)."""

    key: str
    label: str
    slug: str
    switch: str
    registry: str
    specs: dict[str, Spec]
    choose: Callable[[RecipeData], str | None]
    off: str = ""
    inert: dict[str, InertRule] = field(default_factory=dict)

    def knobs(self) -> tuple[Knob, ...]:
        """Every knob a member reads, once, in first-use order."""
        seen: dict[str, Knob] = {}
        for s in self.specs.values():
            for k in s.knobs:
                seen.setdefault(k.field, k)
        return tuple(seen.values())


def _named(path: str) -> Callable[[RecipeData], str | None]:
    return lambda data: setting(data, path)


FAMILIES: dict[str, Family] = {f.key: f for f in (
    Family("advantage", "Estimator", "adv", "algorithm.advantage",
           "workbench.core.advantages:ADVANTAGE_ESTIMATORS", advantages.SPECS, _named("algorithm.advantage")),
    Family("policy_loss", "Loss", "loss", "algorithm.policy_loss",
           "workbench.core.policy_losses:POLICY_LOSSES", policy_losses.SPECS, _named("algorithm.policy_loss"),
           inert=policy_losses.FAMILY_INERT),
    Family("aggregation", "Aggregation", "agg", "algorithm.aggregation",
           "workbench.core.aggregation:LOSS_AGGREGATIONS", aggregations.SPECS, _named("algorithm.aggregation")),
    Family("kl_estimator", "KL estimator", "kl", "algorithm.kl_estimator",
           "workbench.core.kl:KL_ESTIMATORS", kl_estimators.SPECS, _named("algorithm.kl_estimator"),
           inert=kl_estimators.FAMILY_INERT),
    Family("shaping", "Shaping", "shaping", "teacher.model",
           "workbench.core.distillation:ADVANTAGE_SHAPINGS", shapings.SPECS,
           lambda data: "opd" if setting(data, "teacher.model") is not None else None,
           off="teacher.model is null: no distillation"),
)}


def names(family: str) -> tuple[str, ...]:
    """The registered names of ``family``, in registry order."""
    return tuple(FAMILIES[family].specs)


def spec(family: str, name: str) -> Spec:
    """The spec of ``name``; KeyError listing the family's names otherwise."""
    specs = FAMILIES[family].specs
    if name not in specs:
        raise KeyError(f"no {family} spec {name!r}; specs: {', '.join(specs)}")
    return specs[name]


def register(s: Spec) -> Spec:
    """Add ``s`` to its family after the specs declared here (a plugin's or a test's algorithm,
    whose function is registered in the matching core registry); a name with a spec already fails.
    What reads the specs when it runs (the labs, the Launch form, the capability checks) sees it."""
    specs = FAMILIES[s.family].specs
    if s.name in specs:
        raise ValueError(f"{s.family} {s.name!r} has a spec already")
    specs[s.name] = s
    return s


def unregister(family: str, name: str) -> Spec:
    """Remove ``name``'s spec from ``family`` (what ``register`` added); KeyError if it has none."""
    spec(family, name)
    return FAMILIES[family].specs.pop(name)


def with_capability(family: str, **wanted: Any) -> frozenset[str]:
    """Names of ``family`` whose specs have every attribute in ``wanted`` (needs_critic=True, level='token')."""
    return frozenset(n for n, s in FAMILIES[family].specs.items()
                     if all(getattr(s, attr) == value for attr, value in wanted.items()))


def choice_help(family: str, lead: str) -> str:
    """The help text of the recipe field naming a member of ``family``: ``lead``, then every
    registered name with its spec's title and what it needs ("gae (GAE (PPO); needs a critic)")."""
    needs = (("needs_critic", "needs a critic"), ("needs_baseline_rollout", "needs a greedy baseline rollout"),
             ("needs_groups", "needs G >= 2"))
    def one(s: Spec) -> str:
        wants = "; ".join(text for attr, text in needs if getattr(s, attr))
        label = "" if s.title.lower() == s.name.lower() else s.title
        if s.title.startswith(s.name):  # "k1+ (straight-through)" -> "straight-through"
            label = s.title[len(s.name):].strip(" ()")
        inside = "; ".join(x for x in (label, wants) if x)
        return f"{s.name} ({inside})" if inside else s.name
    return f"{lead}: " + ", ".join(one(s) for s in FAMILIES[family].specs.values()) + "."


def walkthroughs() -> dict[str, tuple[Spec, Walkthrough]]:
    """Every preset walkthrough, by key, in family then registry order, with the spec it belongs to."""
    return {w.key: (s, w) for f in FAMILIES.values() for s in f.specs.values() for w in s.walkthroughs}


def resolve(path: str) -> Any:
    """The object at an import path 'package.module:attribute' (imports the module: torch for core)."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _recipe_data(recipe: Any) -> Mapping[str, Any]:
    """A Recipe, or a (partial) recipe dict, as the full recipe dict with every default filled in."""
    if hasattr(recipe, "to_dict"):
        return recipe.to_dict()
    from workbench.recipe import Recipe  # the schema fills defaults; imported here: the recipe imports this package

    return Recipe.from_dict(dict(recipe)).to_dict()


def inert_knobs(recipe: Any) -> dict[str, str]:
    """Recipe field -> why it has no effect under ``recipe``'s settings (a Recipe or a recipe dict;
    a partial dict gets the recipe's defaults). A knob is inert when the family member the recipe
    chose does not read it (sapo_tau_* unless policy_loss=sapo), when its family is off (teacher.*
    without a teacher), or when a rule of its knob, family or chosen spec says so (eps_high of the
    clip at one update per batch, kl_estimator at kl_coef=0, adv_eps at grpo_scale=none)."""
    data = _recipe_data(recipe)
    out: dict[str, str] = {}
    for fam in FAMILIES.values():
        name = fam.choose(data)
        chosen = fam.specs.get(name) if name is not None else None
        for knob in fam.knobs():
            if knob.shared:
                continue
            if chosen is None:
                reason = fam.off
            elif knob.field not in chosen.knob_fields:
                readers = [n for n, s in fam.specs.items() if knob.field in s.knob_fields]
                reason = f"{fam.switch}={name!r} does not read it (read by {fam.key} {', '.join(readers)})"
            else:
                reason = knob.inert_when(data) if knob.inert_when else None
            if reason:
                out.setdefault(knob.field, reason)
        for path, rule in fam.inert.items():
            if reason := rule(data):
                out.setdefault(path, reason)
        for path, reason in (chosen.inert_when(data) if chosen is not None and chosen.inert_when else {}).items():
            out.setdefault(path, reason)
    return out
