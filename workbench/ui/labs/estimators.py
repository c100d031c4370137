"""Walkthroughs. Two templates, both driven by data, none a page module per algorithm:

- per preset (GRPO, Dr. GRPO, RLOO, REINFORCE++, PPO with GAE, GSPO, CISPO): the equations, the
  project's own implementation (``inspect.getsource``), editable inputs with the advantages of
  *all* estimators side by side, the known biases as worked examples, and a launch button;
- per registry name (``render_component``): every advantage estimator and policy loss registered
  in ``workbench.core`` gets its page from its spec in ``workbench.algorithms`` (equations, what it fixes,
  framework names, notes) or, for a name registered later without one, from its docstring and
  the ``cfg.<field>`` its source reads; its knobs as widgets, and a worked example computed by
  the registered function itself on a small editable batch.

Layout and widgets only; numbers from ``workbench.viz.lab_estimators`` (i.e. workbench.core).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import streamlit as st

from workbench.algorithms import FAMILIES, Knob, Spec, resolve, spec as spec_of, walkthroughs
from workbench.core import (
    ADVANTAGE_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    AdvantageConfig,
    PolicyLossConfig,
)
from workbench.core.distillation import ADVANTAGE_SHAPINGS, DistillationConfig
from workbench.recipe import Algorithm, Sampling, Teacher, load_recipe
from workbench.ui.labs import merged_into, page_title, page_url, title_of
from workbench.ui.labs._shared import launch_button, own_settings, show_table
from workbench.ui.nav import page as nav_page
from workbench.viz import lab_estimators as viz
from workbench.viz import lab_regions


@dataclass(frozen=True)
class Walkthrough:
    """A preset walkthrough page, assembled from the specs: the walkthrough entry of its spec
    (title, summary, input block, biases) and the equations of every spec its preset composes."""

    key: str
    title: str
    preset: str
    equations: tuple[str, ...]
    functions: tuple[Callable, ...]
    summary: str
    inputs: str = "rewards"  # rewards | gae | ratios
    biases: tuple[str, ...] = ()
    extra_overrides: tuple[str, ...] = field(default_factory=tuple)
    owner: Spec | None = None  # the spec that carries it (the ratios block launches with its settings)


# The families a preset composes, in the order its walkthrough shows their equations.
COMPOSED = ("advantage", "policy_loss", "aggregation")


def preset_equations(preset: str) -> tuple[str, ...]:
    """The equations of the advantage estimator, policy loss and aggregation ``preset`` trains with."""
    a = load_recipe(preset).algorithm
    return tuple(eq for family in COMPOSED for eq in spec_of(family, getattr(a, family)).equations)


def _walkthrough(owner: Spec, w) -> Walkthrough:
    functions = tuple(resolve(path) for path in (owner.implementation, *owner.helpers, *w.helpers))
    return Walkthrough(w.key, w.title, w.preset, preset_equations(w.preset), tuple(dict.fromkeys(functions)),
                       w.summary, w.inputs, w.biases, owner=owner)


def walkthrough(key: str) -> Walkthrough:
    """The preset walkthrough ``key`` of the specs registered now (a plugin's included)."""
    return _walkthrough(*walkthroughs()[key])


def _rewards_block(w: Walkthrough) -> tuple[list[str], bool]:
    """Editable group(s) of rewards -> advantages of all estimators. Returns recipe overrides."""
    c1, c2, c3 = st.columns([3, 1, 1])
    text = c1.text_input("Rewards (groups of G contiguous completions)", "1, 0, 0, 0, 1, 1, 1, 0", key=f"{w.key}_rewards")
    G = c2.number_input("G (group size)", 1, 64, 4, key=f"{w.key}_G")
    eps = c3.number_input("eps", 0.0, 1.0, 1e-6, format="%.0e", key=f"{w.key}_eps")
    try:
        rewards = viz.parse_numbers(text, "rewards")
        table = viz.sequence_advantages(rewards, int(G), eps)
    except ValueError as err:
        st.error(str(err))
        return [], False
    # the format of a run's Samples table (compare page), so the same rewards read the same there
    advantage = st.column_config.NumberColumn(format="%+.3f")
    show_table(table, key=f"{w.key}_adv_table",
                 column_config={c: advantage for c in table.columns if c not in ("group", "reward")})
    st.plotly_chart(viz.advantages_figure(table), key=f"{w.key}_adv_fig")
    # G = 1 is the recipe's to refuse (group estimators need a baseline; PPO with GAE does not)
    return [f"sampling.num_generations={int(G)}", f"algorithm.adv_eps={eps}"], True


def _gae_block(w: Walkthrough) -> tuple[list[str], bool]:
    c1, c2 = st.columns(2)
    rtext = c1.text_input("Per-token rewards r_t", "0, 0, 0, 0, 1", key=f"{w.key}_rt")
    vtext = c2.text_input("Values V_t (the critic)", "0.2, 0.3, 0.4, 0.6, 0.8", key=f"{w.key}_vt")
    c3, c4 = st.columns(2)
    gamma = c3.slider("gamma", 0.0, 1.0, 1.0, 0.01, key=f"{w.key}_gamma")
    lam = c4.slider("lambda", 0.0, 1.0, 0.95, 0.01, key=f"{w.key}_lam")
    try:
        table = viz.gae_table(viz.parse_numbers(rtext, "per-token rewards"), viz.parse_numbers(vtext, "values"), gamma, lam)
    except ValueError as err:
        st.error(str(err))
        return [], False
    show_table(table, key=f"{w.key}_gae_table")
    st.plotly_chart(viz.gae_figure(table), key=f"{w.key}_gae_fig")
    st.caption("lambda = 0: one-step TD error (low variance, biased by the critic); lambda = 1: Monte Carlo return minus V.")
    st.markdown("**The same sequence-level rewards through every estimator**")
    overrides, ok = _rewards_block(w)
    return [f"algorithm.gamma={gamma}", f"algorithm.lam={lam}", *overrides], ok


def ratio_walkthrough_losses() -> list[str]:
    """The policy losses the ratios walkthroughs compare: PPO clip (the trust region the others
    change) and every loss whose spec carries a walkthrough with the ratios input block, in
    registry order (a plugin's loss with one joins every ratios walkthrough)."""
    specs = FAMILIES["policy_loss"].specs
    return [n for n, s in specs.items() if n == "clip" or any(w.inputs == "ratios" for w in s.walkthroughs)]


def _ratios_block(w: Walkthrough) -> tuple[list[str], bool]:
    text = st.text_input("Per-token log-ratios log(pi/pi_old) of one sequence", "0.0, 0.1, 0.5, -0.1, 2.0", key=f"{w.key}_lr")
    adv = st.slider("Advantage A", -2.0, 2.0, 1.0, 0.1, key=f"{w.key}_A")
    names = ratio_walkthrough_losses()
    eps = st.slider("eps (PPO clip)", 0.0, 0.5, 0.2, 0.01, key=f"{w.key}_eps_clip", help="eps_low = eps_high = eps")
    clip = PolicyLossConfig(eps, eps)
    own = own_settings(names, f"{w.key}_")  # each compared loss's own widgets, as the PPO-region lab draws it
    try:
        configs = {n: PolicyLossConfig(**own[n]) if n in own else clip for n in names}
        table = viz.per_token_policy_gradients(viz.parse_numbers(text, "log-ratios"), adv,
                                               {title_of("policy_loss", n): (n, configs[n]) for n in names})
    except ValueError as err:
        st.error(str(err))
        return [], False
    show_table(table, key=f"{w.key}_pg_table")
    st.plotly_chart(viz.policy_gradient_figure(table, [title_of("policy_loss", n) for n in names]), key=f"{w.key}_pg_fig")
    st.caption(" ".join(FAMILIES["policy_loss"].specs[n].fixes for n in names))
    st.markdown("**Advantages of all estimators on one group**")
    overrides, ok = _rewards_block(w)
    # the launched run takes this walkthrough's own loss with the settings it is drawn with here
    mine = own.get(w.owner.name) if w.owner is not None else None
    drawn = mine if mine else {"eps_low": clip.eps_low, "eps_high": clip.eps_high}
    return [*overrides, *(f"algorithm.{knob}={value}" for knob, value in drawn.items())], ok


INPUT_BLOCKS = {"rewards": _rewards_block, "gae": _gae_block, "ratios": _ratios_block}


def preset_biases(preset: str) -> tuple[str, ...]:
    """The known biases a preset's own settings have ('std': group-std advantages, 'length':
    per-sequence length normalisation), from the specs its recipe chooses (``Spec.biases``)."""
    data = load_recipe(preset).to_dict()
    found: list[str] = []
    for fam in FAMILIES.values():
        name = fam.choose(data)
        chosen = fam.specs.get(name) if name is not None else None
        found += [b for b in (chosen.biases(data) if chosen is not None and chosen.biases else ()) if b not in found]
    return tuple(found)


def _biases(w: Walkthrough) -> None:
    st.subheader("Known biases, worked")
    biases = w.biases or preset_biases(w.preset)
    if not biases:
        a = load_recipe(w.preset).algorithm
        st.caption(f"Neither known bias applies to the {w.preset} preset: advantage={a.advantage} (no group std), "
                   f"aggregation={a.aggregation} (no per-sequence length normalisation).")
    if "std" in biases:
        st.markdown("**Std normalisation rescales each group by its own spread.** In a group of 4, the rare answer, "
                    "right or wrong, gets |A| = 1.5: a lone correct answer 1.5, a correct answer in an almost-all-right "
                    "group only 0.50, against 0.87 in a balanced group. And the std cancels the scale: rewards "
                    "0.1, 0, 0, 0 give the same 1.5 as 1, 0, 0, 0, so a tiny (perhaps noisy) reward difference is "
                    "pushed as hard as a real one. Dr. GRPO keeps the scale (0.075 against 0.75):")
        show_table(viz.std_bias_example(), key=f"{w.key}_std_bias")
    if "length" in biases:
        st.markdown("**Length bias of per-sequence averaging.** A correct 4-token answer (+A) and a wrong 7-token answer "
                    "(-A): under seq-mean-token-mean each token of the long wrong answer is pushed down less, so long wrong "
                    "answers are penalised less and lengths grow:")
        show_table(viz.length_bias_example(), key=f"{w.key}_len_bias")


def render_walkthrough(key: str) -> None:
    w = walkthrough(key)
    st.title(f"Walkthrough: {w.title}")
    st.caption(w.summary)
    for eq in w.equations:
        st.latex(eq)
    aggregation = LOSS_AGGREGATIONS.get(load_recipe(w.preset).algorithm.aggregation)  # the preset's, by name
    with st.expander("The implementation the engine trains with (inspect.getsource)"):
        st.code(viz.source_of(*dict.fromkeys((*w.functions, aggregation))), language="python")
    if owner := merged_into(key):  # the registry walkthrough this page stands for in the navigation
        st.page_link(nav_page(page_url(*owner)), label=f"{page_title(*owner)}: its knobs and a per-token worked example",
                     icon=":material/arrow_forward:")
    overrides, launchable = INPUT_BLOCKS[w.inputs](w)
    _biases(w)
    st.subheader("Try it")
    if not launchable:
        st.caption("Fix the inputs above to launch a run with them.")
        return
    try:
        recipe = load_recipe(w.preset, [*overrides, "train.steps=20", *w.extra_overrides])
    except ValueError as err:
        st.error(str(err))
        return
    launch_button([recipe], key=f"{w.key}_launch", label=f"Launch a 20-step {w.title} run with these settings")



# ---------------------------------------------------------------------------------------------
# one walkthrough per registry name

REGISTRIES: dict[str, tuple[Any, type]] = {"advantage": (ADVANTAGE_ESTIMATORS, AdvantageConfig),
                                           "policy_loss": (POLICY_LOSSES, PolicyLossConfig),
                                           "shaping": (ADVANTAGE_SHAPINGS, DistillationConfig)}
# knobs the worked example does not offer as widgets: G has its own input; an in-reward KL needs a
# KL per token, which the example has no policy for (the table lists them all the same)
EXAMPLE_FIXED = frozenset({"group_size", "kl_coef"})


def knob_meaning(key: str) -> str:
    """The recipe's own description of a recipe key ('' for a key the recipe does not have)."""
    section, _, name = key.partition(".")
    model = {"algorithm": Algorithm, "sampling": Sampling, "teacher": Teacher}.get(section)
    info = model.model_fields.get(name) if model else None
    return (info.description or "") if info else ""


def knob_text(k: Knob) -> str:
    """What a knob does, as the spec that lists it says (GMPO's eps bounds the log-ratio, PPO's
    the ratio: one field, each loss's own text), else the recipe field's description."""
    return k.help or knob_meaning(k.field)


def _knob_for(family: str, name: str) -> Knob:
    """The family's knob setting config attribute ``name`` (a name no spec lists: algorithm.<name>)."""
    known = {k.name: k for k in FAMILIES[family].knobs()}
    return known.get(name) or Knob(f"algorithm.{name}")


def explanation(family: str, name: str) -> Spec:
    """The name's spec, or, for a name registered without one (e.g. by a test), one made from its
    registered function: the docstring's first paragraph as what it does, the config fields its
    source reads as its knobs."""
    registry, config_class = REGISTRIES[family]
    fn = registry.get(name)  # UnknownNameError listing the registered names
    if name in FAMILIES[family].specs:
        return FAMILIES[family].specs[name]
    doc = inspect.getdoc(fn) or "(no docstring)"
    knobs = tuple(_knob_for(family, k) for k in viz.knobs_read(fn, config_class))
    return Spec(family, name, name, f"{fn.__module__}:{fn.__name__}", (), doc.split("\n\n")[0], "", knobs)


def knobs_table(family: str, e: Spec) -> list[dict]:
    """One row per knob; "value" is what the worked example starts from (``knob_start``: the
    preset's recipe, e.g. group_size = its num_generations), not the config class's bare default."""
    start = knob_start(family, e)
    return [{"knob": k.name, "recipe key": k.field, "value": str(getattr(start, k.name)),
             "what it does": knob_text(k)} for k in e.knobs]


def _parse_optional(text: str, kind: type, label: str):
    text = text.strip()
    if text.lower() in ("", "none", "null"):
        return None
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{label}={text!r}: expected a number or empty (none)") from None


def knob_start(family: str, e: Spec) -> Any:
    """The config the example starts from: its preset's (GMPO's eps 0.4, PPO's lambda 0.95), or
    the config class's defaults for a name no preset trains with."""
    if e.preset is None:
        return REGISTRIES[family][1]()
    recipe = load_recipe(e.preset)
    return {"advantage": recipe.advantage_config, "policy_loss": recipe.policy_loss_config,
            "shaping": recipe.distillation_config}[family]()


def _knob_widgets(family: str, name: str, e: Spec) -> dict[str, Any]:
    """One widget per knob (type from the config field), starting at ``knob_start``. -> {field:
    value}; ValueError naming the knob for a value that does not parse."""
    fields = {f.name: f for f in dataclasses.fields(REGISTRIES[family][1])}
    start = knob_start(family, e)
    knobs = [k for k in e.knobs if k.name not in EXAMPLE_FIXED]
    values: dict[str, Any] = {}
    for col, k in zip(st.columns(max(len(knobs), 1)), knobs):
        knob = k.name
        f, key, value, text = fields[knob], f"wt_{name}_{knob}", getattr(start, knob), knob_text(k)
        if k.choices:
            values[knob] = col.selectbox(knob, k.choices, index=k.choices.index(value), key=key, help=text)
        elif isinstance(f.default, bool):
            values[knob] = col.checkbox(knob, value=value, key=key, help=text)
        elif f.default is None:
            kind = int if "int" in str(f.type) else float
            shown = "" if value is None else str(value)
            values[knob] = _parse_optional(col.text_input(knob, shown, key=key, placeholder="none", help=text), kind, knob)
        else:
            values[knob] = col.number_input(knob, value=float(value), format="%g", key=key, help=text)
    return values


def _advantage_example(name: str, knobs: dict[str, Any]) -> list[str]:
    """Editable batch -> the estimator's advantages per token. Returns recipe overrides."""
    c1, c2, c3 = st.columns([3, 3, 1])
    rtext = c1.text_input("Rewards (groups of G contiguous completions)", "1, 0, 0, 0, 1, 1, 1, 0", key=f"wt_{name}_rewards")
    ltext = c2.text_input("Completion lengths (tokens)", "2, 4, 3, 1, 2, 2, 4, 3", key=f"wt_{name}_lengths")
    G = int(c3.number_input("G", 1, 64, 4, key=f"wt_{name}_G"))
    estimator = FAMILIES["advantage"].specs.get(name)  # a name registered without a spec gets the rewards only
    extra = {i.keyword: st.text_input(i.label, i.default, key=f"wt_{name}_{i.keyword}")
             for i in (viz.example_inputs(estimator) if estimator is not None else ())}
    rewards = viz.parse_numbers(rtext, "rewards")
    lengths = viz.parse_numbers(ltext, "lengths")
    given = {k: viz.parse_numbers(v, k) for k, v in extra.items()}
    cfg = AdvantageConfig(group_size=G, **knobs)
    table = viz.advantage_example(name, rewards, lengths, cfg, **given)
    show_table(table, key=f"wt_{name}_example")
    st.caption(f"`compute_advantages({name!r}, rewards, mask, {cfg})` on these completions (A_t: advantage of token "
               "t, R_t: returns where they differ; empty cells are padding). The in-reward KL is off here.")
    return [f"sampling.num_generations={G}"]


def _policy_loss_example(name: str, e: Spec, knobs: dict[str, Any]) -> list[str]:
    """Editable log-ratios -> the loss, region and gradient of every token. Returns recipe overrides."""
    c1, c2 = st.columns([3, 1])
    text = c1.text_area("Per-token log-ratios log(pi / pi_old), one sequence per line", "0.0, 0.1, 0.5\n-0.3, -0.05, 0.2, 1.0",
                        key=f"wt_{name}_lr")
    atext = c2.text_input("Advantage of each sequence", "1, -1", key=f"wt_{name}_adv")
    seqs = [viz.parse_numbers(line, f"log-ratios line {i}") for i, line in enumerate(text.strip().splitlines(), 1) if line.strip()]
    if not seqs:
        raise ValueError("log-ratios is empty: give one line of comma-separated numbers per sequence")
    cfg = PolicyLossConfig(**knobs)
    table, metrics = viz.policy_loss_example(name, seqs, viz.parse_numbers(atext, "advantages"), cfg)
    show_table(table, key=f"wt_{name}_example")
    show_table([{"metric": k, "value": v} for k, v in metrics.items()], key=f"wt_{name}_metrics")
    st.caption(f"`compute_policy_loss({name!r}, logp, old_logp, A, mask, cfg)`, every pi_old = {viz.EXAMPLE_OLD_PROB}; "
               "the gradient by autograd, per token, before aggregation.")
    if e.ratio_curve:
        adv = float(max(abs(a) for a in viz.parse_numbers(atext, "advantages")) or 1.0)
        curves = lab_regions.analytic_curves({e.title: (name, cfg)}, advantages=(adv, -adv))
        st.plotly_chart(lab_regions.analytic_figure(curves), key=f"wt_{name}_curve")
    return []


def _shaping_example(name: str, knobs: dict[str, Any]) -> list[str]:
    """Editable advantages and log-probs of the student and the teacher -> the shaped advantage
    per token, computed by the registered shaping. Returns recipe overrides."""
    c1, c2, c3 = st.columns(3)
    atext = c1.text_input("Estimator's advantage of each token", "1, 1, 1, 1", key=f"wt_{name}_adv")
    stext = c2.text_input("Student log pi_theta(o_t)", "-0.5, -2.0, -0.1, -1.0", key=f"wt_{name}_student")
    ttext = c3.text_input("Teacher log pi_T(o_t)", "-0.4, -0.2, -3.0, -1.0", key=f"wt_{name}_teacher")
    table = viz.shaping_example(name, viz.parse_numbers(atext, "advantages"), viz.parse_numbers(stext, "student log-probs"),
                                viz.parse_numbers(ttext, "teacher log-probs"), DistillationConfig(**knobs))
    show_table(table, key=f"wt_{name}_example")
    st.caption(f"`shape_advantages({name!r}, A, student_logp, teacher_logp, mask, {DistillationConfig(**knobs)})` "
               "on one completion: d = student - teacher, A' the advantage the policy loss sees.")
    return []


EXAMPLES: dict[str, Callable[..., list[str]]] = {
    "advantage": lambda name, e, knobs: _advantage_example(name, knobs),
    "policy_loss": _policy_loss_example,
    "shaping": lambda name, e, knobs: _shaping_example(name, knobs),
}


def _launch_component(family: str, name: str, e: Spec, knobs: dict[str, Any], overrides: list[str]) -> None:
    st.subheader("Try it")
    axis = family if family != "shaping" else "teacher"
    base = e.preset or "grpo"
    chosen = [f"algorithm.{axis}={name}"] if family != "shaping" else []  # the preset carries its teacher
    sets = [*chosen, *overrides,
            *[f"{_knob_for(family, k).field}={'null' if v is None else v}" for k, v in knobs.items()], "train.steps=20"]
    try:
        recipe = load_recipe(base, sets)
    except ValueError as err:
        st.error(str(err))
        return
    launch_button([recipe], key=f"wt_{name}_launch",
                  label=f"Launch a 20-step run: the {base} preset with {axis}={name} and these knobs")


def render_component(family: str, name: str) -> None:
    """The walkthrough of registry ``family`` ('advantage' or 'policy_loss') entry ``name``."""
    registry, _ = REGISTRIES[family]
    e = explanation(family, name)
    st.title(page_title(family, name))
    st.caption(f"`{name}`, registered in workbench.core's {registry.family} registry"
               + (f"; trained by the `{e.preset}` preset." if e.preset else "."))
    for eq in e.equations:
        st.latex(eq)
    st.markdown(f"**What it fixes.** {e.fixes}")
    if e.frameworks:
        st.markdown(f"**In the frameworks.** {e.frameworks}")
    if e.knobs:
        show_table(knobs_table(family, e), key=f"wt_{name}_knobs")
    if e.notes:
        st.markdown("**Known biases and notes**\n" + "\n".join(f"- {n}" for n in e.notes))
    with st.expander("The implementation the engine trains with (inspect.getsource)"):
        st.code(viz.source_of(registry.get(name)), language="python")
    st.subheader("Worked example, computed by the registered function")
    try:
        knobs = _knob_widgets(family, name, e)
        overrides = EXAMPLES[family](name, e, knobs)
    except ValueError as err:  # the inputs' own checks and the configs' (they name the field)
        st.error(str(err))
        st.caption("Fix the inputs above to launch a run with them.")
        return
    _launch_component(family, name, e, knobs, overrides)


def component_pages() -> list[tuple[Callable[[], None], str, str]]:
    """(render, title, url path) of every name registered now, in registry order (a name
    registered after import, e.g. by a test, is included)."""
    def page(family: str, name: str) -> Callable[[], None]:
        def render() -> None:
            render_component(family, name)

        render.__name__ = f"render_{family}_{name}"
        return render

    return [(page(family, name), page_title(family, name), page_url(family, name))
            for family, (registry, _) in REGISTRIES.items() for name in registry.names()]
