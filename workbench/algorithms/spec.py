"""The vocabulary of an algorithm spec: ``Spec`` (one registered name of one family) and ``Knob``
(one recipe field an algorithm reads). Pure data: no torch, no pydantic, no Streamlit.

A spec says everything the rest of the workbench needs to know about a registered function
without importing it: where the function is (``implementation``, an import path), what it
needs from a run (capabilities), which recipe fields it reads (knobs) and when they have no
effect, and what the walkthrough pages say about it (title, equations, fixes, framework names,
notes, preset). The recipe, the Launch form, the labs and the navigation read specs; only the
engine imports the functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

# Bounds the recipe shares with the knobs declared here (recipe.py imports them).
# Loss coefficients (beta, entropy, KL-Cov, value, teacher lambda): TRL / verl / slime use 1e-3 to 1;
# 1e300 is finite but turns the loss nan at the first step, after the run directory exists.
MAX_COEF = 1000.0
MAX_SEED = 2**32 - 1  # numpy's limit

#: A recipe as nested plain data (``Recipe.to_dict()``); what the inert rules read.
RecipeData = Mapping[str, Any]
#: A rule saying why a knob has no effect under these settings, or None when it acts.
InertRule = Callable[[RecipeData], "str | None"]


def setting(data: RecipeData, path: str) -> Any:
    """The value at a dotted ``path`` ('train.mu') of a recipe dict."""
    node: Any = data
    for part in path.split("."):
        node = node[part]
    return node


@dataclass(frozen=True)
class Knob:
    """One recipe field that an algorithm reads.

    ``field`` is the recipe path ('algorithm.eps_high'). A knob with a ``type`` is declared
    here, once: the recipe generates its pydantic field from it (type, default, bounds and
    ``help`` as the field's description), so bounds and help are written in one place. A knob
    without a type names a field the recipe declares itself (its help is the recipe's).
    ``config`` is the core config's attribute when it differs from the recipe field's last part
    (AdvantageConfig.scale <- algorithm.grpo_scale). ``shared`` knobs matter beyond the family
    that lists them (sampling.num_generations sets the batch for every estimator), so they are
    never reported as unread. ``inert_when(recipe_dict)`` says why the knob has no effect under
    the given settings (None: it acts)."""

    field: str
    type: Any = None
    default: Any = None
    help: str = ""
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] = ()
    config: str | None = None
    shared: bool = False
    inert_when: InertRule | None = None

    @property
    def name(self) -> str:
        """The core config's attribute (what the registered function reads as ``cfg.<name>``)."""
        return self.config or self.field.rsplit(".", 1)[-1]

    @property
    def declared(self) -> bool:
        """Whether this knob declares its recipe field (else the recipe declares it)."""
        return self.type is not None

    @property
    def bounds(self) -> dict[str, float]:
        return {k: v for k, v in (("ge", self.ge), ("gt", self.gt), ("le", self.le), ("lt", self.lt)) if v is not None}


@dataclass(frozen=True)
class LabSlider:
    """One widget of the PPO-region lab for a loss's own settings: it sets the config attributes
    ``knobs`` (GMPO's one eps sets eps_low and eps_high) to its value. ``key`` is the widget's key
    after the lab's prefix ('sapo_pos' -> 'ppo_sapo_pos'); ``lo`` / ``hi`` / ``default`` / ``step``
    its range; ``number_format`` set: a number input with that format instead of a slider (GSPO's
    paper clip is 3e-4, finer than a slider's step)."""

    key: str
    label: str
    knobs: tuple[str, ...]
    lo: float
    hi: float
    default: float
    step: float
    help: str = ""
    number_format: str | None = None


@dataclass(frozen=True)
class RegionLab:
    """How the PPO-region lab draws a loss with a ratio curve, so a new loss appears there from its
    spec alone. ``sliders``: widgets for the loss's own settings; ``fixed``: config attributes the
    lab pins (CISPO's eps_low = 1: the drawn weight has no lower bound, as in the cispo preset).
    Neither: the loss is drawn with the page's PPO-clip sliders (eps_low, eps_high, dual clip c).
    ``drawn``: on the chart when the page opens. A ratio-curve loss without a ``RegionLab`` is
    offered with the clip's sliders, not drawn at first."""

    sliders: tuple[LabSlider, ...] = ()
    fixed: tuple[tuple[str, float], ...] = ()
    drawn: bool = True

    def settings(self, values: Mapping[str, float]) -> dict[str, float]:
        """The config attributes this loss is drawn with, given each slider's value by key (empty:
        draw it with the page's PPO-clip settings)."""
        out = dict(self.fixed)
        for s in self.sliders:
            out.update(dict.fromkeys(s.knobs, values[s.key]))
        return out


@dataclass(frozen=True)
class Walkthrough:
    """A preset walkthrough page built around this spec (Labs navigation, ``walkthrough-<key>``):
    its title, the preset it launches (its equations are those of the preset's specs), one-line summary, input block ('rewards' | 'gae' | 'ratios') and the known biases
    it works through (empty: read from the preset's settings). ``helpers``: import paths of core
    functions shown next to the spec's own implementation. A 'ratios' walkthrough compares PPO clip
    and every loss with a 'ratios' walkthrough, each with its spec's ``region_lab`` widgets, and
    launches its spec's loss with the settings its widgets give (the clip's eps without them)."""

    key: str
    title: str
    preset: str
    summary: str
    inputs: str = "rewards"
    biases: tuple[str, ...] = ()
    helpers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Spec:
    """One registered name of one family (advantage, policy_loss, aggregation, kl_estimator, shaping).

    Capabilities: ``level`` is where the quantity lives ('token' advantages / ratios, or
    'sequence'); ``needs_groups`` (the baseline is the prompt's other completions: G >= 2),
    ``needs_critic`` (reads a value model), ``needs_baseline_rollout`` (reads the reward of an
    extra greedy completion per prompt); ``needs_policy_stats`` (reads the old log-probs and
    sum_v pi_v^2 of each sampled token); ``ratio_curve`` (losses: a token's loss is a function
    of its ratio alone, so the PPO-region lab can draw it; ``region_lab`` says with which
    settings). ``inert_when(recipe_dict)`` maps knob
    fields to why they have no effect under these settings with this spec chosen (e.g. the clip's
    eps at one update per batch)."""

    family: str
    name: str
    title: str
    implementation: str  # "module:function" of the registered function
    equations: tuple[str, ...] = ()  # LaTeX, shown with st.latex
    fixes: str = ""  # what problem of the method before it this one addresses
    frameworks: str = ""  # how TRL / verl / OpenRLHF / slime spell it
    knobs: tuple[Knob, ...] = ()
    notes: tuple[str, ...] = ()  # known biases and caveats
    preset: str | None = None  # the recipes/ preset that trains with it, if any
    level: str = "sequence"
    needs_groups: bool = False
    needs_critic: bool = False
    needs_baseline_rollout: bool = False
    needs_policy_stats: bool = False
    ratio_curve: bool = False
    inert_when: Callable[[RecipeData], dict[str, str]] | None = None
    walkthroughs: tuple[Walkthrough, ...] = ()
    helpers: tuple[str, ...] = field(default=())  # other core functions the page shows with it
    region_lab: RegionLab | None = None  # how the PPO-region lab draws it (losses with ratio_curve)
    #: Another name of the family whose value this one equals (the straight-through k1+ has k1's value
    #: and k2's gradient): views of values alone (the KL lab's bias / variance table) show the pair once.
    same_value_as: str | None = None
    #: Advantage estimators: the columns the all-estimators table of the walkthroughs shows it as, each
    #: (label, AdvantageConfig overrides); empty: one column, its title, at the config's defaults.
    example_variants: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    #: The known biases it has under a recipe's settings (keys of the walkthroughs' worked examples:
    #: 'std' = per-group std normalisation, 'length' = per-sequence length normalisation), or None.
    biases: Callable[[RecipeData], tuple[str, ...]] | None = None

    @property
    def knob_names(self) -> tuple[str, ...]:
        """The config attributes it reads, in order (``cfg.<name>``)."""
        return tuple(k.name for k in self.knobs)

    @property
    def knob_fields(self) -> tuple[str, ...]:
        return tuple(k.field for k in self.knobs)


def by_name(*specs: Spec) -> dict[str, Spec]:
    """Specs keyed by name, in the order given (= the registry's order); a repeated name fails."""
    out: dict[str, Spec] = {}
    for s in specs:
        if s.name in out:
            raise ValueError(f"{s.family} {s.name!r} has two specs")
        out[s.name] = s
    return out
