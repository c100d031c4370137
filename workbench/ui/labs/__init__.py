"""The labs: analytic views from the formulas next to what happened in real runs.

``LAB_PAGES``: (render function, title, url path) for each lab page; app navigation turns them
into ``st.Page`` entries of a "Labs" section.
"""

from __future__ import annotations

from typing import Callable

from workbench.ui.labs import aggregation, estimators, kl, lens, ppo_regions

LAB_PAGES: list[tuple[Callable[[], None], str, str]] = [
    (ppo_regions.render, "PPO clip regions", "lab-ppo-regions"),
    (aggregation.render, "Loss aggregation", "lab-aggregation"),
    *estimators.PAGES,
    (kl.render, "KL estimators", "lab-kl"),
    (lens.render, "Same-batch lens", "lab-lens"),
]
