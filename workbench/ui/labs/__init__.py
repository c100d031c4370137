"""The labs: analytic views from the formulas next to what happened in real runs.

``labs()``: the lab pages, in the order a learner takes them, each with the navigation section it
sits in (``SECTIONS``: concepts first, then the estimators, the losses, and the experiments on real
runs), its sidebar label and its page title, built from the specs registered when it is called
(a plugin's spec registered after import gets its walkthrough page in the navigation). A
registered name whose spec carries preset walkthroughs (GRPO, RLOO, GSPO, ...) is listed once, by
those walkthroughs; its registry walkthrough stays reachable by its address and by a link on them
(``hidden``). ``lab_pages()``: (render function, title, url path) of every lab page, hidden ones
included.
A lab's module (and with it torch, for the core's functions) is imported when its page is first
opened, not when the navigation is built: the workbench pages never load torch (it made the
first visit to Launch take ~8 s).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from workbench.algorithms import FAMILIES, names, walkthroughs
from workbench.ui.heap import import_page

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
        getattr(import_page(f"workbench.ui.labs.{module}"), function)(*args)

    render.__name__ = render.__qualname__ = "_".join(["render", module, *args])
    return render


class LabPage(NamedTuple):
    render: Callable[[], None]
    title: str  # the page's own title
    url: str
    section: str  # its navigation section (one of SECTIONS)
    label: str  # its sidebar entry (the section already says what kind of page it is)
    hidden: bool = False  # not listed: merged into the preset walkthroughs of the same spec


# The navigation sections of the labs, in the order a learner takes them.
SECTIONS: tuple[str, ...] = ("Concepts", "Estimators", "Losses", "Experiments")
FAMILY_SECTIONS: dict[str, str] = {"advantage": "Estimators", "shaping": "Estimators", "policy_loss": "Losses"}


def _family_pages(family: str) -> list[LabPage]:
    """Every name of ``family`` registered now: its preset walkthroughs (if its spec carries any),
    then its registry walkthrough (one template, estimators.render_component), hidden when the
    preset walkthroughs stand for it."""
    section, out, presets_of = FAMILY_SECTIONS[family], [], walkthroughs()
    for name in names(family):
        presets = [(key, w.title) for key, (owner, w) in presets_of.items() if (owner.family, owner.name) == (family, name)]
        out += [LabPage(_lazy("estimators", "render_walkthrough", key), f"Walkthrough: {title}",
                        f"walkthrough-{key.replace('_', '-')}", section, title) for key, title in presets]
        out.append(LabPage(_lazy("estimators", "render_component", family, name), page_title(family, name),
                           page_url(family, name), section, title_of(family, name), hidden=bool(presets)))
    return out


def labs() -> list[LabPage]:
    """Every lab page, in navigation order, from the specs registered now."""
    return [
        LabPage(_lazy("ppo_regions"), "PPO clip regions", "lab-ppo-regions", "Concepts", "PPO clip regions"),
        LabPage(_lazy("aggregation"), "Loss aggregation", "lab-aggregation", "Concepts", "Loss aggregation"),
        LabPage(_lazy("kl"), "KL estimators", "lab-kl", "Concepts", "KL estimators"),
        *[page for family in COMPONENT_FAMILIES for page in _family_pages(family)],
        LabPage(_lazy("lens"), "Same-batch lens", "lab-lens", "Experiments", "Same-batch lens"),
        LabPage(_lazy("experiments"), "Experiments", "lab-experiments", "Experiments", "Experiments"),
    ]


def lab_pages() -> list[tuple[Callable[[], None], str, str]]:
    """(render, title, url path) of every lab page, hidden ones included."""
    return [(p.render, p.title, p.url) for p in labs()]


def merged_into(key: str) -> tuple[str, str] | None:
    """(family, name) of the hidden registry walkthrough that preset walkthrough ``key`` stands for."""
    owner, _ = walkthroughs()[key]
    return (owner.family, owner.name) if owner.family in FAMILY_SECTIONS else None
