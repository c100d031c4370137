"""PPO-region lab: the clipped objective against the ratio (analytic), and where a run's tokens
fell (empirical). Layout and widgets only; figures from ``workbench.viz.lab_regions``."""

from __future__ import annotations

import streamlit as st

from workbench.algorithms import FAMILIES
from workbench.core import PolicyLossConfig
from workbench.recipe import load_recipe
from workbench.ui.labs import title_of
from workbench.ui.labs._shared import diagnostics_by_step, launch_button, open_store, pick_runs, run_recipe, show_table
from workbench.viz import lab_regions as viz

DEFAULT_CURVES = ("clip", "gspo", "cispo", "sapo", "gmpo")


def ratio_curve_losses() -> list[str]:
    """Policy losses whose spec has ``ratio_curve`` (a token's loss is a function of its ratio alone), in registry order."""
    return [n for n, s in FAMILIES["policy_loss"].specs.items() if s.ratio_curve]


def _analytic() -> None:
    st.subheader("Analytic: objective and gradient against the ratio")
    c1, c2, c3, c4 = st.columns(4)
    eps_low = c1.slider("eps_low", 0.0, 0.9, 0.2, 0.01, key="ppo_eps_low", help="R below 1 - eps_low stops A<0 updates (PPO 0.2)")
    eps_high = c2.slider("eps_high", 0.0, 0.9, 0.28, 0.01, key="ppo_eps_high", help="R above 1 + eps_high stops A>0 updates (DAPO clip-higher 0.28)")
    use_c = c3.checkbox("dual clip c", value=True, key="ppo_use_c", help="verl clip_ratio_c: caps the loss of A<0 tokens whose ratio exploded")
    c = c3.slider("c", 1.05, 5.0, 2.0, 0.05, key="ppo_c", disabled=not use_c)
    adv = c4.slider("|A|", 0.1, 3.0, 1.0, 0.1, key="ppo_adv")
    g1, g2, g3 = st.columns(3)
    gspo_help = "The paper uses eps_low = 3e-4 and eps_high = 4e-4 on its sequence ratio; widened here so the band is visible"
    gspo_low = g1.number_input("GSPO eps_low", 0.0, 0.9, 0.05, 0.01, format="%.4f", key="ppo_gspo_low", help=gspo_help)
    gspo_high = g2.number_input("GSPO eps_high", 0.0, 0.9, 0.05, 0.01, format="%.4f", key="ppo_gspo_high", help=gspo_help)
    cispo_high = g3.slider("CISPO eps_high (weight cap 1 + eps_high)", 0.0, 4.0, 0.28, 0.01, key="ppo_cispo_high")
    s1, s2, s3 = st.columns(3)
    tau_pos = s1.slider("SAPO tau_pos (A > 0)", 0.1, 10.0, 1.0, 0.05, key="ppo_sapo_pos", help="TRL / verl default 1.0")
    tau_neg = s2.slider("SAPO tau_neg (A < 0)", 0.1, 10.0, 1.05, 0.05, key="ppo_sapo_neg", help="TRL / verl default 1.05")
    gmpo_eps = s3.slider("GMPO eps (on the log-ratio)", 0.0, 1.0, 0.4, 0.01, key="ppo_gmpo_eps",
                         help="The GMPO paper's 0.4: the ratio stays in [e^-0.4, e^0.4]")
    try:  # the config checks its own fields (clip_c > 1 + eps_high) and names them
        cfg = PolicyLossConfig(eps_low=eps_low, eps_high=eps_high, clip_c=c if use_c else None)
    except ValueError as err:
        st.error(str(err))
        return
    # each loss's own settings on this page; any other loss with a ratio curve uses the clip's
    own = {"gspo": PolicyLossConfig(eps_low=gspo_low, eps_high=gspo_high),
           "cispo": PolicyLossConfig(eps_low=1.0, eps_high=cispo_high),
           "sapo": PolicyLossConfig(sapo_tau_pos=tau_pos, sapo_tau_neg=tau_neg),
           "gmpo": PolicyLossConfig(eps_low=gmpo_eps, eps_high=gmpo_eps)}
    names = ratio_curve_losses()
    chosen = st.multiselect("Policy losses (every registered loss whose token loss is a function of its ratio)", names,
                            default=[n for n in DEFAULT_CURVES if n in names], format_func=lambda n: title_of("policy_loss", n),
                            key="ppo_losses")
    if not chosen:
        st.info("Pick at least one policy loss to draw.")
        return
    curves = viz.analytic_curves({title_of("policy_loss", n): (n, own.get(n, cfg)) for n in chosen}, advantages=(adv, -adv))
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
