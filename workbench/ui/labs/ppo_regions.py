"""PPO-region lab: the clipped objective against the ratio (analytic), and where a run's tokens
fell (empirical). Layout and widgets only; figures from ``workbench.viz.lab_regions``."""

from __future__ import annotations

import streamlit as st

from workbench.algorithms import FAMILIES
from workbench.core import PolicyLossConfig
from workbench.recipe import load_recipe
from workbench.ui.labs import title_of
from workbench.ui.labs._shared import diagnostics_by_step, launch_button, open_store, own_settings, pick_runs, run_recipe, show_table
from workbench.viz import lab_regions as viz

def ratio_curve_losses() -> list[str]:
    """Policy losses whose spec has ``ratio_curve`` (a token's loss is a function of its ratio alone), in registry order."""
    return [n for n, s in FAMILIES["policy_loss"].specs.items() if s.ratio_curve]


def drawn_at_first(names: list[str]) -> list[str]:
    """The losses of ``names`` on the chart when the page opens: their spec's ``region_lab.drawn``."""
    specs = FAMILIES["policy_loss"].specs
    return [n for n in names if specs[n].region_lab is not None and specs[n].region_lab.drawn]


def _analytic() -> None:
    st.subheader("Analytic: objective and gradient against the ratio")
    c1, c2, c3, c4 = st.columns(4)
    eps_low = c1.slider("eps_low", 0.0, 0.9, 0.2, 0.01, key="ppo_eps_low", help="R below 1 - eps_low stops A<0 updates (PPO 0.2)")
    eps_high = c2.slider("eps_high", 0.0, 0.9, 0.28, 0.01, key="ppo_eps_high", help="R above 1 + eps_high stops A>0 updates (DAPO clip-higher 0.28)")
    use_c = c3.checkbox("dual clip c", value=True, key="ppo_use_c", help="verl clip_ratio_c: caps the loss of A<0 tokens whose ratio exploded")
    c = c3.slider("c", 1.05, 5.0, 2.0, 0.05, key="ppo_c", disabled=not use_c)
    adv = c4.slider("|A|", 0.1, 3.0, 1.0, 0.1, key="ppo_adv")
    names = ratio_curve_losses()
    own = own_settings(names, "ppo_")
    try:  # the config checks its own fields (clip_c > 1 + eps_high) and names them
        cfg = PolicyLossConfig(eps_low=eps_low, eps_high=eps_high, clip_c=c if use_c else None)
    except ValueError as err:
        st.error(str(err))
        return
    chosen = st.multiselect("Policy losses (every registered loss whose token loss is a function of its ratio)", names,
                            default=drawn_at_first(names), format_func=lambda n: title_of("policy_loss", n),
                            key="ppo_losses")
    if not chosen:
        st.info("Pick at least one policy loss to draw.")
        return
    # each loss with its spec's own settings on this page; any other with the clip's
    configs = {n: PolicyLossConfig(**own[n]) if n in own else cfg for n in chosen}
    curves = viz.analytic_curves({title_of("policy_loss", n): (n, configs[n]) for n in chosen}, advantages=(adv, -adv))
    st.plotly_chart(viz.analytic_figure(curves, cfg), key="ppo_analytic")
    st.caption("Curves are `workbench.core.compute_policy_loss` on a grid of ratios; gradients by autograd, per unit "
               "of log-probability (dJ/dlog pi = R A inside the trust region). The shading is PPO clip's. GSPO's and "
               "GMPO's x-axis is the sequence ratio (one-token sequences); CISPO's surrogate value is sg(w) A log R, and "
               "only its gradient w A (never zero) matters. SAPO's soft gate: the gradient 4 s (1 - s) R A, s = "
               "sigmoid(tau (R - 1)), equals the policy gradient at R = 1 and fades on both sides, never exactly to 0. "
               "Not drawn: losses whose token loss depends on more than its ratio (DPPO on the old probability, "
               "Clip-Cov / KL-Cov on the batch's covariance).")
    show_table(viz.book_regions_table(), key="ppo_book_table")


def _empirical() -> None:
    st.subheader("Empirical: what happened to a run's tokens")
    store = open_store()
    if store is None:
        return
    run_ids = pick_runs(store, key="ppo_runs", label="Runs (two or more: same axes)")
    with st.expander("No run with clipping yet? Launch a short one"):
        st.caption("GRPO with mu = 2 passes per batch, so the ratio moves away from 1 and the clip bites.")
        launch_button([load_recipe("grpo", ["train.mu=2", "train.steps=20"])], key="ppo_launch", label="Launch GRPO, mu = 2, 20 steps")
    if not run_ids:
        return
    diags = {rid: diagnostics_by_step(store, rid) for rid in run_ids}
    steps = sorted(set().union(*[set(d) for d in diags.values()]))
    if not steps:
        st.info("These runs have no diagnostics events yet (logging.diagnostics_every = 0, or no step finished).")
        return
    step = st.select_slider("Step", steps, value=steps[-1], key="ppo_step")
    recipe = run_recipe(store, run_ids[0])
    points = {rid: viz.token_points(diags[rid][step]) for rid in run_ids if step in diags[rid]}
    cols = st.columns(max(len(points), 1))
    for col, (rid, p) in zip(cols, points.items()):
        col.metric(f"zero-gradient tokens · {rid}", f"{viz.zero_grad_fraction(p):.1%}", help="tokens whose policy gradient was exactly 0 (clipped, A = 0, or masked)")
    st.plotly_chart(viz.region_scatter(points, recipe.policy_loss_config() if recipe else None), key="ppo_scatter")
    st.plotly_chart(viz.region_share_figure({rid: viz.region_shares(d) for rid, d in diags.items()}), key="ppo_shares")


def render() -> None:
    st.title("PPO clip regions")
    st.caption("The six cases of the clipped objective (RLHF book, policy-gradient chapter) from the formulas, "
               "next to where a real run's tokens fell. Every number comes from workbench.core.")
    _analytic()
    _empirical()
