"""Same-batch lens lab: how far every estimator x policy loss would have pulled the same model
apart, over a run. Layout only; figures from workbench.viz.lab_lens."""

from __future__ import annotations

import streamlit as st

from workbench.recipe import load_recipe
from workbench.ui.labs._shared import launch_button, open_store, pick_runs, run_recipe
from workbench.viz import lab_lens as viz

POINTS = {"before": "before the step (ratio 1: estimators differ)", "after": "after the step (ratio moved: losses differ)"}


TOP_CHOICES = (viz.DEFAULT_TOP, 16, 32)


def newest_run_with_lens(store) -> str | None:
    """The newest run of the store that logged lens events (None: no run has)."""
    runs = store.list_runs()
    if not len(runs):
        return None
    return next((r for r in runs.sort_values("created_at", ascending=False)["id"] if store.lens(r)), None)


def render() -> None:
    st.title("Same-batch lens")
    st.caption("Every logging.lens_every steps the engine evaluates every advantage estimator x policy loss on the "
               "step's own batch: loss, gradient norm, and the cosine between each one's gradient and the run's own "
               "gradient / the update actually taken (workbench/engine/lens.py).")
    store = open_store()
    if store is None:
        return
    with st.expander("Launch a short run with the lens on"):
        st.caption("GRPO, 20 steps, lens every 2 steps. Each lens evaluation of this run costs about 9 of its training "
                   "steps on the tiny CPU model (bench/lens_bench.py measured 8.75x; other recipes differ: 35-57x on the "
                   "opd preset), so the lens is off by default. Each evaluation's time is logged as perf/lens_time.")
        launched = launch_button([load_recipe("grpo", ["train.steps=20", "train.mu=2", "logging.lens_every=2"])],
                                 key="lens_launch", label="Launch GRPO with the lens")
    if launched:  # show the run just launched, not the one selected before (it has no lens events)
        st.session_state["lens_run"] = launched[0]
    elif "lens_run" not in st.session_state and (newest := newest_run_with_lens(store)):
        st.session_state["lens_run"] = newest  # the newest run usually has the lens off
    run_ids = pick_runs(store, key="lens_run", label="Run", multi=False)
    if not run_ids:
        return
    lenses = store.lens(run_ids[0])
    frame = viz.lens_frame(lenses)
    if not len(frame):
        lens_every = (run_recipe(store, run_ids[0]) or load_recipe("grpo")).logging.lens_every
        st.info("No lens events yet: they appear every logging.lens_every steps while it runs." if lens_every
                else "This run has no lens events: launch it with logging.lens_every > 0.")
        return
    teacher = lenses[-1].get("teacher")
    if teacher:
        st.caption(viz.teacher_caption(lenses[-1]["run"]["advantage"], teacher))
    c1, c2, c3 = st.columns(3)
    metric = c1.selectbox("Metric", list(viz.LENS_METRICS), format_func=viz.LENS_METRICS.get, key="lens_metric")
    point = c2.radio("Evaluated", list(POINTS), format_func=POINTS.get, key="lens_point")
    losses = ["all"] + list(dict.fromkeys(frame["policy_loss"]))
    loss = c3.selectbox("Policy loss", losses, key="lens_loss")
    policy_loss = None if loss == "all" else loss
    shown = frame[frame["point"] == point]
    combos = (shown if policy_loss is None else shown[shown["policy_loss"] == policy_loss])["combo"].nunique()
    options = [*(n for n in TOP_CHOICES if n < combos), "all"]
    chosen = st.segmented_control("Lines", options, default=options[0], key="lens_top",
                                  help="The combinations with the largest |value| at the last lens step, and the run's own.")
    top = None if (chosen or options[0]) == "all" else int(chosen or options[0])
    st.plotly_chart(viz.lens_over_run_figure(frame, metric, point, policy_loss, top=top), key="lens_over_run")
    st.caption(f"All {combos} estimator x loss lines." if top is None else
               f"{top} of {combos} estimator x loss lines: the largest |value| at the last lens step, and the run's "
               "own; more under Lines.")
    steps = sorted(frame["step"].unique())
    step = st.select_slider("Step for the grid", steps, value=steps[-1], key="lens_step")
    st.plotly_chart(viz.lens_heatmap(frame, int(step), metric, point), key="lens_heatmap")
    for row, why in viz.empty_rows(frame, int(step), metric, point).items():
        st.caption(f"Row '{row}' is empty at step {int(step)}: {why}.")
    st.caption("Every row is the run's whole objective with its estimator and loss swapped in. RLOO = G/(G-1) x "
               "Dr. GRPO, so their rows agree in direction (cosine 1) when the run has no in-loss KL and no entropy "
               "bonus; those terms do not scale with the advantages. At 'before' the ratio is 1, so every policy loss "
               "gives the same gradient; the policy losses part ways once the ratio has moved.")
