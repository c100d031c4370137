"""KL lab: k1, k2, k3 against the true KL of two small categoricals; bias and variance against
the number of samples; which placement each algorithm uses. Layout only (workbench.viz.lab_kl)."""

from __future__ import annotations

import streamlit as st

from workbench.ui.labs._shared import show_table
from workbench.viz import lab_kl as viz
from workbench.viz.lab_estimators import parse_numbers

SAMPLE_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def render() -> None:
    st.title("KL estimators")
    st.caption("Per-token estimators of KL(pi || ref) from samples x ~ pi, with d = log ref(x) - log pi(x): "
               "k1 = -d, k2 = d^2/2, k3 = e^d - d - 1 (Schulman 2020), as computed by workbench.core.kl.")
    st.latex(r"\mathrm{KL}(\pi\,\|\,\pi_{ref}) = \sum_x \pi(x) \log\frac{\pi(x)}{\pi_{ref}(x)}")
    c1, c2 = st.columns(2)
    p_text = c1.text_input("pi (the policy), probabilities", "0.5, 0.3, 0.15, 0.05", key="kl_pi")
    q_text = c2.text_input("ref (the reference), probabilities", "0.25, 0.25, 0.25, 0.25", key="kl_ref")
    c3, c4 = st.columns(2)
    trials = c3.slider("Monte Carlo trials per n", 10, 1000, 200, 10, key="kl_trials")
    seed = c4.number_input("seed", 0, 10_000, 0, key="kl_seed")
    try:
        p_raw, q_raw = parse_numbers(p_text, "pi"), parse_numbers(q_text, "ref")
        pi, ref = viz.categorical(p_raw, "pi"), viz.categorical(q_raw, "ref")
        if len(pi) != len(ref):
            raise ValueError(f"pi has {len(pi)} outcomes but ref has {len(ref)}: give both the same support")
    except ValueError as err:
        st.error(str(err))
        return
    for note in filter(None, (viz.normalisation_note(p_raw, "pi"), viz.normalisation_note(q_raw, "ref"))):
        st.info(note, icon=":material/info:")
    kl = viz.true_kl(pi, ref)
    st.metric("true KL(pi || ref)", f"{kl:.5f}")
    show_table(viz.estimator_moments(pi, ref), key="kl_moments", column_config={
        c: st.column_config.NumberColumn(format="%.4g") for c in ("true KL", "mean", "bias", "variance")})
    exact = viz.bias_variance_vs_samples(pi, ref, SAMPLE_COUNTS)
    mc = viz.monte_carlo(pi, ref, SAMPLE_COUNTS, trials=int(trials), seed=int(seed))
    st.plotly_chart(viz.kl_figure(exact, kl, mc), key="kl_fig")
    st.caption("Lines and bands are exact (sums over the support): bias does not shrink with n, the std falls as "
               "1/sqrt(n). k1 is unbiased. k3 is unbiased too until core's clamp |k3| <= 10 (verl's, against one wild "
               "token) bites: with pi = 0.98, 0.01, 0.01 and ref = 0.1, 0.45, 0.45 its bias is -0.60. k3 has lower "
               "variance when pi is close to ref; k2 is biased.")
    st.subheader("Where each preset puts the KL")
    st.caption("in_reward: the reward is shaped before the advantages, r - beta KL; in_loss: beta KL_t is added to "
               "each token's loss and aggregated with it. Read from the presets in recipes/.")
    show_table(viz.placement_table(), key="kl_placement")
