"""Experiments lab: canned experiments (``workbench.runs.experiments``), each a claim from a paper
with the arms x seeds that test it. One click launches one as a comparison group (exp-KEY-n);
while it runs the page shows its progress, and its result is the verdict table of the metric that
shows the effect (plus the arms' mean curves with 95% bands), next to what the paper reports.
Layout only: the plans are ``experiment_plan``, the statistics ``workbench.analysis``."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from workbench.analysis.stats import DuplicateSeedError
from workbench.runs import ACTIVE_STATUSES
from workbench.runs.experiments import (EXPERIMENTS, Experiment, experiment_frame, experiment_groups, experiment_plan,
                                        next_group, paper_direction)
from workbench.ui.common import LAUNCH_ERRORS, STATUS_ICONS, guarded_button, launch_planned_and_remember, verdict_table
from workbench.ui.labs._shared import open_store
from workbench.viz.arms import arm_figure
from workbench.viz.curves import Panel, has_values, progress

REFRESH_S = 2.0  # while a group runs: progress and table re-read this often


def _describe(experiment: Experiment) -> None:
    st.markdown(f"**{experiment.question}**")
    arms = " vs ".join(f"`{p}`" for p in experiment.presets)
    sweep = "; ".join(f"`{k}` = {', '.join(map(str, v))}" for k, v in experiment.sweep.items())
    settings = ", ".join(f"`{o}`" for o in experiment.overrides)
    st.markdown(f"Arms: {arms}{' x ' + sweep if sweep else ''}, {experiment.seeds} seeds each"
                f"{'; every arm with ' + settings if settings else ''}. Metric: `{experiment.metric}`"
                f"{' (also ' + ', '.join(f'`{m}`' for m in experiment.also) + ')' if experiment.also else ''}.")
    st.info(f"**What the paper reports.** {experiment.paper}\n\n*{experiment.citation}*", icon=":material/menu_book:")
    if experiment.note:
        st.caption(experiment.note)


def _launch(experiment: Experiment, store) -> None:
    """The launch button: plan (validated) then launch as the next exp-KEY-n group."""
    try:
        planned = experiment_plan(experiment)
    except LAUNCH_ERRORS as err:
        st.error(str(err))
        return
    if guarded_button(f"Launch {len(planned)} runs", key=f"exp_launch_{experiment.key}", type="primary"):
        group = next_group(experiment, store.groups()["group"].tolist())
        ids = launch_planned_and_remember(planned, group)
        if ids:
            st.session_state[f"exp_group_{experiment.key}"] = group
            st.success(f"Launched group {group}: {len(ids)} runs (they queue for free CPU slots).")


def _progress(runs: pd.DataFrame) -> bool:
    """Progress of the group's runs; True while any is active."""
    done = sum(progress(int(s), int(t)) for s, t in zip(runs["last_step"], runs["total_steps"])) / max(1, len(runs))
    counts = runs["status"].value_counts()
    st.progress(min(1.0, done), text=" · ".join(f"{STATUS_ICONS.get(s, '')} {n} {s}" for s, n in counts.items()))
    return bool(runs["status"].isin(ACTIVE_STATUSES).any())


def _result(experiment: Experiment, group: str, polling: bool) -> None:
    store = open_store()
    if store is None:
        return
    runs = store.list_runs(group=group)
    if not len(runs):
        st.info(f"Group {group} has no runs.")
        return
    live = _progress(runs)
    if polling and not live:
        st.rerun()  # the group just ended: redraw the page once more without the timer
    frame = experiment_frame(store, runs["id"].tolist()[::-1], experiment)
    if not len(frame):
        st.info("Waiting for the first step…")
        return
    if live:
        st.caption("Runs still going: the table scores each run's latest steps and changes as they finish.")
    for metric in experiment.metrics:
        st.subheader(metric)
        if metric in frame.columns and has_values(frame[metric]):
            chart = arm_figure(frame, Panel(metric, (metric,)), height=260)
            st.plotly_chart(chart.figure, key=f"exp_chart_{metric}")
            st.caption(f"Mean over seeds per arm: {chart.caption}")
        verdict_table(frame, metric, experiment.window)
    _paper_check(frame, experiment, live)


def _paper_check(frame: pd.DataFrame, experiment: Experiment, live: bool) -> None:
    """One line: does the table show the direction the paper reports?"""
    try:
        outcome = paper_direction(frame, experiment)
    except DuplicateSeedError as err:  # two runs of an arm with one seed: say so, as verdict_table does
        st.info(str(err))
        return
    expect = experiment.expect
    claim = f"`{expect.higher}` > `{expect.lower}` on `{experiment.metric}`"
    if outcome is None:
        return
    if live:
        st.caption(f"The paper's direction, {claim}: decided when the runs end.")
    elif outcome:
        st.success(f"Reproduced here: {claim}, the 95% interval of the difference excludes 0.", icon=":material/check:")
    else:
        st.warning(f"Not reproduced here: the 95% interval of {claim} does not exclude 0 with these seeds "
                   "(see 'seeds needed' above).", icon=":material/help:")


def render() -> None:
    st.title("Experiments")
    st.caption("Claims from the papers, tested on this machine: arms x seeds, the metric that should move, and the "
               "verdict table (per arm the mean with its 95% CI over seeds; per pair the difference with its CI and "
               "P(A > B)). The built-in tiny model learns four arithmetic facts; an effect that needs long "
               "chain-of-thought may not show on it, and the table says so.")
    key = st.selectbox("Experiment", list(EXPERIMENTS), format_func=lambda k: EXPERIMENTS[k].title, key="exp_pick")
    experiment = EXPERIMENTS[key]
    _describe(experiment)
    store = open_store()
    if store is None:
        return
    _launch(experiment, store)
    groups = experiment_groups(experiment, store.groups()["group"].tolist())
    if not groups:
        st.caption("Not launched yet: its result appears here.")
        return
    wanted = st.session_state.get(f"exp_group_{key}")
    group = st.selectbox("Launch", groups, index=groups.index(wanted) if wanted in groups else 0, key=f"exp_run_{key}")
    active = bool(store.list_runs(group=group)["status"].isin(ACTIVE_STATUSES).any())
    st.fragment(_result, run_every=REFRESH_S if active else None)(experiment, group, active)
