"""The labs: analytic views from the formulas next to what happened in real runs.

``LAB_PAGES``: (render function, title, url path) for each lab page; app navigation turns them
into ``st.Page`` entries of a "Labs" section. A lab's module (and with it torch, for the core's
functions) is imported when its page is first opened, not when the navigation is built: the
workbench pages never load torch (it made the first visit to Launch take ~8 s).
"""

from __future__ import annotations

import importlib
from typing import Callable

from workbench.core.choices import ADVANTAGE_NAMES, POLICY_LOSS_NAMES, SHAPING_NAMES
from workbench.ui.labs.explanations import page_title, page_url

# Estimator walkthroughs: key -> title, in page order. ui/labs/estimators.py's WALKTHROUGHS holds
# the same keys and titles with the core functions (torch); tests/ui/test_app.py checks they agree.
WALKTHROUGH_TITLES: dict[str, str] = {"grpo": "GRPO", "dr_grpo": "Dr. GRPO", "rloo": "RLOO",
                                      "reinforce_pp": "REINFORCE++", "ppo": "PPO with GAE", "gspo": "GSPO",
                                      "cispo": "CISPO"}


def _lazy(module: str, function: str = "render", *args: str) -> Callable[[], None]:
    """A render function that imports ``workbench.ui.labs.<module>`` on its first call."""
    def render() -> None:
        getattr(importlib.import_module(f"workbench.ui.labs.{module}"), function)(*args)

    render.__name__ = render.__qualname__ = "_".join(["render", module, *args])
    return render


# One walkthrough per registered advantage estimator and policy loss, from the torch-free mirror
# of the registries (core/choices.py; tests/test_recipe.py checks it equals the registries), all
# rendered by the one template estimators.render_component.
REGISTERED_NAMES: dict[str, tuple[str, ...]] = {"advantage": ADVANTAGE_NAMES, "policy_loss": POLICY_LOSS_NAMES,
                                                "shaping": SHAPING_NAMES}

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
