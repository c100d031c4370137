"""Loss-aggregation lab: per-token gradient weight under each mode (the RLHF book's example,
editable), a run's batch, and length drift of runs differing only in aggregation."""

from __future__ import annotations

import streamlit as st

from workbench.algorithms import names
from workbench.core import PolicyLossConfig
from workbench.recipe import load_recipe
from workbench.ui.labs import title_of
from workbench.ui.labs._shared import diagnostics_by_step, launch_button, open_store, pick_runs, run_recipe, show_table
from workbench.viz import lab_aggregation as viz

BOOK_TEXT = "2, 2, 2, 2\n2, 2, 2, 2, 2, 2, 2"
PROBE_MODES = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")


def _analytic() -> None:
    st.subheader("Analytic: the book's 4- and 7-token example")
    text = st.text_area("Per-token losses l = R A (one sequence per line)", BOOK_TEXT, key="agg_losses",
                        help="The book's example: R = 1, A = 2, masks of 4 and 7 tokens")
    try:
        seqs = viz.parse_sequences(text)
    except ValueError as err:
        st.error(str(err))
        return
    longest = max(len(s) for s in seqs)
    max_len = st.number_input("L_max (the recipe's max completion length)", min_value=longest, value=max(longest, 7), step=1, key="agg_lmax")
    table = viz.aggregation_table(seqs, int(max_len))
    value = st.radio("Show", ["grad_wrt_ratio", "weight"], horizontal=True, key="agg_value",
                     format_func={"grad_wrt_ratio": "dL/dR per token (the book's ratio.grad)", "weight": "weight dL/dl"}.get)
    st.plotly_chart(viz.aggregation_figure(table, value), key="agg_fig")
    summary = table.groupby(["mode", "seq"], sort=False).agg(length=("length", "first"), loss=("loss", "first"),
                                                             weight=("weight", "first"), grad_wrt_ratio=("grad_wrt_ratio", "first"))
    show_table(summary.reset_index(), key="agg_table")
    st.caption("Weights by autograd through workbench.core.aggregate_loss, for every mode it registers. The book "
               "prints token-mean's line without the advantage (0.0909 = the weight 1/11); with A = 2 it is 0.1818. "
               "seq-mean-token-mean gives short sequences' tokens more weight (1/n_i): the length bias Dr. GRPO "
               "removes. Dr. GRPO's normaliser: seq-mean-token-sum-norm divides by B x L_max (TRL dr_grpo, verl "
               ">= 0.9); token-sum-norm by L_max only (verl < 0.9's seq-mean-token-sum-norm), a step B times larger.")
    _with_a_policy_loss(seqs, int(max_len))


def _with_a_policy_loss(seqs: list[list[float]], max_len: int) -> None:
    """The same tokens through a registered policy loss first (their values as advantages)."""
    st.markdown("**Through a policy loss.** The numbers above as the tokens' advantages A, through any registered "
                "policy loss and then each aggregation: dJ / d log pi per token.")
    c1, c2 = st.columns(2)
    loss = c1.selectbox("Policy loss", names("policy_loss"), format_func=lambda n: f"{title_of('policy_loss', n)} ({n})",
                        key="agg_loss")
    log_ratio = c2.slider("log-ratio log(pi / pi_old) of every token", -1.0, 1.0, 0.0, 0.05, key="agg_log_ratio")
    table = viz.loss_gradient_table(loss, seqs, max_len, PolicyLossConfig(), log_ratio)
    st.plotly_chart(viz.aggregation_figure(table, "grad_logp"), key="agg_loss_fig")
    st.caption("At log-ratio 0 (on-policy) every loss hands each token its advantage, so these bars equal dL/dR above: "
               "the aggregation alone weighs the tokens, for sequence-ratio losses (GSPO, GMPO) too. Move the ratio and "
               "the losses part: the clip zeroes A > 0 tokens above 1 + eps, SAPO's gate fades, CISPO's weight caps. "
               "Default settings of each loss (PolicyLossConfig()); pi_old = 0.1.")


def _empirical() -> None:
    st.subheader("Empirical: a run's batch, and length drift")
    store = open_store()
    if store is None:
        return
    run_ids = pick_runs(store, key="agg_run", label="Run (its diagnostics batch)", multi=False)
    if run_ids:
        rid = run_ids[0]
        diags = diagnostics_by_step(store, rid)
        recipe = run_recipe(store, rid)
        if diags:
            step = st.select_slider("Step", sorted(diags), value=max(diags), key="agg_step")
            max_len = recipe.sampling.max_completion_length if recipe else len(diags[step]["mask"][0])
            weights = viz.run_batch_weights(diags[step], max_len)
            st.plotly_chart(viz.weight_vs_length_figure(weights, recipe.algorithm.aggregation if recipe else None), key="agg_weights")
        else:
            st.info("This run has no diagnostics events yet.")
    drift_ids = pick_runs(store, key="agg_drift_runs", label="Runs for length drift (ideally differing only in aggregation)", max_default=3)
    if drift_ids:
        metrics = store.metrics(drift_ids)
        if len(metrics) and "completions/mean_length" in metrics.columns:
            labels = {rid: f"{rid} ({r.algorithm.aggregation})" for rid in drift_ids if (r := run_recipe(store, rid))}
            st.plotly_chart(viz.length_drift_figure(metrics, labels), key="agg_drift")
        else:
            st.info("No metrics yet for these runs.")
    with st.expander("Launch the length probe: three runs differing only in aggregation"):
        st.caption("Task length_probe pays for the first letter only, so any drift in completion length comes from the "
                   "aggregation. Same seed and prompts for the three runs.")
        recipes = [load_recipe("dr_grpo", ["task=length_probe", "sampling.max_completion_length=24", "train.steps=40",
                                           f"algorithm.aggregation={mode}", f"name=probe-{mode}"]) for mode in PROBE_MODES]
        launch_button(recipes, key="agg_launch", label="Launch the length probe (3 runs)", group="length-probe")


def render() -> None:
    st.title("Loss aggregation")
    st.caption("How per-token losses become one scalar decides how much gradient each token gets.")
    _analytic()
    _empirical()
