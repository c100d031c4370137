"""Live / Compare: curves of chosen runs (or a comparison group) side by side, updating in place
while runs are live (a fragment re-runs every ``LIVE_EVERY_S``; the rest of the page does not),
with smoothing and x-axis controls, sample completions per step and a final-metrics table."""

from __future__ import annotations

import streamlit as st

from workbench import runs as wr
from workbench.ui.common import STATUS_ICONS, run_labels, run_option, store
from workbench.viz.curves import PANELS, X_AXES, available_panels, compare_figures, final_metrics_table, progress, step_label

LIVE_EVERY_S = 1.0
COLUMNS = 2


def _selection(runs) -> list[str]:
    groups = store().groups()
    modes = ["Group", "Runs"] if len(groups) else ["Runs"]
    mode = st.radio("Compare", modes, horizontal=True, key="compare_mode")
    if mode == "Group":
        names = groups["group"].tolist()
        wanted = st.session_state.get("compare_group")
        group = st.selectbox("Comparison group", names, index=names.index(wanted) if wanted in names else 0,
                             key="compare_group_select")
        return runs.loc[runs["group"] == group, "id"].tolist()[::-1]  # launch order
    default = [r for r in st.session_state.get("compare_runs", []) if r in set(runs["id"])] or runs["id"].tolist()[:1]
    return st.multiselect("Runs", runs["id"].tolist(), default=default, format_func=run_option(runs), key="compare_pick")


def _controls() -> dict:
    cols = st.columns([1, 2, 3])
    smoothing = cols[0].slider("Smoothing (EMA weight)", 0.0, 0.95, 0.0, 0.05, key="compare_smoothing",
                               help="Debiased exponential moving average, as in TensorBoard / W&B; raw values stay faint.")
    x = cols[1].radio("x-axis", list(X_AXES), horizontal=True, key="compare_x")
    panels = cols[2].multiselect("Charts", list(PANELS), default=list(PANELS), format_func=lambda k: PANELS[k].title,
                                 key="compare_panels")
    return {"smoothing": smoothing, "x": x, "panels": panels}


def _status_line(runs) -> None:
    parts = [f"{STATUS_ICONS.get(r.status, '')} **{r.name}** {r.status} · step {step_label(r.last_step, r.total_steps)}"
             f" ({progress(r.last_step, r.total_steps):.0%})" for r in runs.itertuples()]
    st.markdown(" &nbsp;|&nbsp; ".join(parts))


def _samples(ids: list[str], labels: dict[str, str]) -> None:
    st.subheader("Sample completions")
    cols = st.columns([2, 1])
    run_id = cols[0].selectbox("Run", ids, format_func=lambda r: labels.get(r, r), key="compare_sample_run")
    samples = store().samples(run_id)
    if samples.empty:
        st.caption("No samples logged yet.")
        return
    steps = sorted(samples["step"].unique().tolist())
    step = cols[1].selectbox("Step", steps, index=len(steps) - 1, key=f"compare_sample_step:{run_id}")
    rows = samples[samples["step"] == step].drop(columns=["run_id", "step"])
    st.dataframe(rows, hide_index=True, column_config={
        "reward": st.column_config.NumberColumn(format="%.3f"),
        "advantage": st.column_config.NumberColumn(format="%+.3f", help="sequence-level advantage (token mean)")})


def _live_view(ids: list[str], controls: dict, was_live: bool) -> None:
    """Everything that changes while runs train: re-run alone every LIVE_EVERY_S while live."""
    s = store()
    all_runs = s.list_runs()
    runs = all_runs[all_runs["id"].isin(ids)].set_index("id").loc[ids].reset_index()
    labels = run_labels(runs)
    _status_line(runs)
    for r in runs.itertuples():
        if r.status in ("failed", "lost") and r.error:
            st.error(f"{r.name}: {r.error}")
    metrics = s.metrics(ids)
    if metrics.empty:
        st.info("Waiting for the first step of the selected runs…")
    else:
        keys = [k for k in controls["panels"] if k in available_panels(metrics)]
        figures = compare_figures(metrics, keys, x=controls["x"], smoothing=controls["smoothing"], labels=labels)
        for start in range(0, len(keys), COLUMNS):
            cols = st.columns(COLUMNS)
            for col, key in zip(cols, keys[start:start + COLUMNS]):
                # a fixed key keeps the same chart element across updates: data changes, no remount
                col.plotly_chart(figures[key], key=f"chart:{key}", config={"displaylogo": False})
        st.subheader("Final metrics")
        st.dataframe(final_metrics_table(metrics, labels), hide_index=True)
    _samples(ids, labels)
    live = bool(runs["status"].isin(wr.ACTIVE_STATUSES).any())
    if was_live and not live:
        st.rerun(scope="app")  # every run ended: one full rerun turns the polling off


def render() -> None:
    st.title("Live / Compare")
    runs = store().list_runs()  # kept current by the collector app.py starts
    if runs.empty:
        st.info("No runs yet. Launch one on the Launch page (or press Quick comparison there).")
        return
    ids = _selection(runs)
    if not ids:
        st.info("Choose at least one run.")
        return
    controls = _controls()
    live = bool(runs.loc[runs["id"].isin(ids), "status"].isin(wr.ACTIVE_STATUSES).any())
    st.fragment(_live_view, run_every=LIVE_EVERY_S if live else None)(ids, controls, live)
