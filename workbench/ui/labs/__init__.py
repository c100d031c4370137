"""The labs: analytic views from the formulas next to what happened in real runs.

``LAB_PAGES``: (render function, title, url path) for each lab page; app navigation turns them
into ``st.Page`` entries of a "Labs" section. A lab's module (and with it torch, for the core's
functions) is imported when its page is first opened, not when the navigation is built: the
workbench pages never load torch (it made the first visit to Launch take ~8 s).
"""

from __future__ import annotations

import importlib
from typing import Callable

from workbench.algorithms import FAMILIES, names, walkthroughs

# Preset walkthroughs: key -> title, in page order, from the specs that carry them.
WALKTHROUGH_TITLES: dict[str, str] = {key: w.title for key, (_, w) in walkthroughs().items()}
# Families with one walkthrough page per registered name (render_component has a worked example for them).
COMPONENT_FAMILIES: tuple[str, ...] = ("advantage", "policy_loss", "shaping")


def title_of(family: str, name: str) -> str:
    """The page title of a registered name (its spec's title, else the name itself)."""
    return FAMILIES[family].specs[name].title if name in FAMILIES[family].specs else name


def page_url(family: str, name: str) -> str:
    return f"walkthrough-{FAMILIES[family].slug}-{name.replace('_', '-')}"


def page_title(family: str, name: str) -> str:
    return f"{FAMILIES[family].label} walkthrough: {title_of(family, name)}"


def _lazy(module: str, function: str = "render", *args: str) -> Callable[[], None]:
    """A render function that imports ``workbench.ui.labs.<module>`` on its first call."""
    def render() -> None:
        getattr(importlib.import_module(f"workbench.ui.labs.{module}"), function)(*args)

    render.__name__ = render.__qualname__ = "_".join(["render", module, *args])
    return render


# One walkthrough per registered advantage estimator, policy loss and shaping, from the specs
# (tests/test_algorithms.py checks they equal the registries), all rendered by the one template
# estimators.render_component.
REGISTERED_NAMES: dict[str, tuple[str, ...]] = {family: names(family) for family in COMPONENT_FAMILIES}

LAB_PAGES: list[tuple[Callable[[], None], str, str]] = [
    (_lazy("ppo_regions"), "PPO clip regions", "lab-ppo-regions"),
    (_lazy("aggregation"), "Loss aggregation", "lab-aggregation"),
    *[(_lazy("estimators", "render_walkthrough", key), f"Walkthrough: {title}", f"walkthrough-{key.replace('_', '-')}")
      for key, title in WALKTHROUGH_TITLES.items()],
    *[(_lazy("estimators", "render_component", family, name), page_title(family, name), page_url(family, name))
      for family, names in REGISTERED_NAMES.items() for name in names],
    (_lazy("kl"), "KL estimators", "lab-kl"),
    (_lazy("lens"), "Same-batch lens", "lab-lens"),
    (_lazy("experiments"), "Experiments", "lab-experiments"),
]
