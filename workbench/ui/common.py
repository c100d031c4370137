"""Small helpers shared by the pages (no maths, no file formats)."""

from __future__ import annotations

import uuid
from typing import Callable, Iterable

import pandas as pd
import streamlit as st

from workbench import runs as wr
from workbench.analysis.smoothing import RAW_VERDICT_NOTE
from workbench.analysis.window import DEFAULT_WINDOW_FRAC
from workbench.recipe import Recipe, RecipeError
from workbench.runs import ACTIVE_STATUSES, RunStore
from workbench.ui import auth
from workbench.viz.tables import verdict

# Material icons (rendered by Streamlit's markdown; no emoji font needed in the browser).
STATUS_ICONS = {"queued": ":material/hourglass_empty:", "starting": ":material/rocket_launch:",
                "running": ":blue[:material/play_circle:]", "finished": ":green[:material/check_circle:]",
                "failed": ":red[:material/error:]", "cancelled": ":orange[:material/stop_circle:]",
                "lost": ":gray[:material/help:]"}

# What a launch can fail with; each message names the field or target at fault.
LAUNCH_ERRORS = (wr.RunError, wr.LaunchError, RecipeError, ValueError, OSError)


def store() -> RunStore:
    """The run store of the current workbench home (cheap: each call opens short connections)."""
    return RunStore()


def run_labels(runs: pd.DataFrame) -> dict[str, str]:
    """run id -> a short label: the run name, or name + id suffix where names repeat."""
    counts = runs["name"].value_counts()
    return {rid: (name if counts[name] == 1 else f"{name} ({rid[-4:]})") for rid, name in zip(runs["id"], runs["name"])}


def run_option(runs: pd.DataFrame, *, status: bool = True):
    """format_func for run-id selectboxes: 'name · status · id' ('name · id' without ``status``,
    where a status line next to the selector follows the run: the browser keeps an option's
    label as it was first drawn, so a status in it went stale)."""
    by_id = runs.set_index("id")
    if not status:
        return lambda rid: f"{by_id.at[rid, 'name']} · {rid}"
    return lambda rid: f"{by_id.at[rid, 'name']} · {by_id.at[rid, 'status']} · {rid}"


def any_active(runs: pd.DataFrame) -> bool:
    return bool(runs["status"].isin(ACTIVE_STATUSES).any()) if len(runs) else False


def refused(action: str | None = None, run=None) -> bool:
    """Check the sign-in policy (and, for an ``action``, the service's rule for this session's
    principal) again at the moment of an action; True (and the reason shown as an error) when
    this session may not act. ``disabled=`` alone is not a gate: Streamlit before 1.61 accepts a
    click on a disabled button from a crafted client, and a button drawn enabled can be clicked
    after the session signed out in another rerun. Nor is this check the gate: the service
    authorises every action itself (``workbench.runs.authz``); this only says why early."""
    reason = auth.blocked_reason(action, run)
    if reason:
        st.error(f"Refused: {reason}", icon=":material/lock:")
    return bool(reason)


def guarded_button(label: str, *, key: str, disabled: bool = False, help: str | None = None, action: str | None = None,
                   run=None, **kwargs) -> bool:
    """A button that is disabled (with the reason as tooltip) when this session may not act
    (``action`` on ``run``: the service's rule, ``workbench.runs.authz.RULES``), and whose click
    counts only if the session may still act when it arrives. The UI's affordance: the service
    refuses the action itself all the same."""
    reason = auth.blocked_reason(action, run)
    clicked = st.button(label, key=key, disabled=bool(reason) or disabled, help=reason or help, **kwargs)
    return clicked and not refused(action, run)


def blocked_notice() -> bool:
    """Show why actions are disabled; True when they are."""
    reason = auth.blocked_reason()
    if reason:
        st.warning(reason, icon=":material/lock:")
    return bool(reason)


def launch_and_remember(recipes: list[Recipe], group: str | None = None, *, target: str = "local",
                        tags: Iterable[str] = (), notes: str = "") -> list[str] | None:
    """Launch one recipe (``group`` None) or a comparison group as this session's principal; remember
    the new runs so Live / Compare opens on them. Returns their ids, or None after showing why
    nothing was launched (not allowed, or the launcher's error naming the field at fault)."""
    if group is None and len(recipes) != 1:
        raise ValueError(f"launching {len(recipes)} recipes needs a comparison group name")
    try:
        planned = wr.plan_runs(recipes, target=target)
    except LAUNCH_ERRORS as err:
        st.error(str(err))
        return None
    return launch_planned_and_remember(planned, group, target=target, tags=tags, notes=notes)


def launch_planned_and_remember(planned: list[wr.PlannedRun], group: str | None = None, *, target: str = "local",
                                tags: Iterable[str] = (), notes: str = "") -> list[str] | None:
    """Launch the runs of ``wr.plan_runs`` (arms x seeds, already validated) as this session's principal,
    all or nothing; remember them so Live / Compare opens on them. Returns their ids, or None
    after showing why nothing was launched. Reward functions are held to the app's list and the
    datasets read before anything is written (``wr.launch_planned``)."""
    if refused("launch"):
        return None
    try:
        ids = _launch_as_principal(planned, group, target=target, tags=tags, notes=notes)
    except LAUNCH_ERRORS as err:
        st.error(str(err))
        return None
    remember_launch(ids, group)
    return ids


def _launch_as_principal(planned: list[wr.PlannedRun], group: str | None, *, target: str = "local",
                         tags: Iterable[str] = (), notes: str = "") -> list[str]:
    """``wr.launch_planned`` as this session's principal, reward functions held to the app's list.
    Makes no Streamlit call: nothing in it is a point where a rerun can interrupt the script."""
    from workbench.ui.recipe_form import allowed_reward_refs  # the app's rule: built-ins + settings' list

    return wr.launch_planned(planned, principal=auth.current_principal(), group=group, target=target, tags=list(tags),
                             notes=notes, store=store(), reward_funcs_allowed=allowed_reward_refs())


def remember_launch(ids: list[str], group: str | None) -> None:
    """Remember launched runs: the launch's message shows them; Live / Compare opens on them."""
    st.session_state["launch_result"] = {"group": group, "ids": list(ids)}
    if group:
        st.session_state["compare_group"] = group
    st.session_state["compare_runs"] = list(ids)


# -- launches in flight: one click, one launch, even in a burst of clicks -----------------------------
# A click's rerun can be interrupted by the next click's rerun at any Streamlit call (they are the
# script's yield points), also after the launch and before it is recorded; a flag consumed at the
# start of the rerun then let the next click launch again (a burst launched 2 runs). A flight is
# made by the first click's callback only, carries the launch's ids the moment they exist (the
# launch and that assignment have no Streamlit call between them), and ends once they are
# remembered: every click in between finds it and adds nothing.

# A flight is carried out by the rerun of the page that made it, however long that rerun takes (a
# time limit dropped slow launches on a loaded server: the button stayed disabled, nothing said). A
# flight whose rerun was cut off because the user went to another page is dropped by that page's
# run (``drop_flights_elsewhere``), so it never launches when its page is next drawn.

#: Session key of each launch button's flight -> the url path of the page that carries it out.
FLIGHT_PAGES = {"launch_flight": "launch", "quick_flight": "launch"}


def drop_flights_elsewhere(url_path: str) -> None:
    """Called by the app before it runs the page at ``url_path``: flights of other pages are dropped."""
    for key, home in FLIGHT_PAGES.items():
        if home != url_path:
            st.session_state.pop(key, None)


def request_flight(key: str) -> None:
    """on_click of a launch button: start a flight under ``key`` unless one is in the air or this
    session may not launch (then the click's rerun only says why: ``guarded_button``). Runs before
    the rerun the click makes, which therefore draws the button disabled."""
    if key not in st.session_state and auth.blocked_reason("launch") is None:
        st.session_state[key] = {"token": uuid.uuid4().hex}


def in_flight(key: str) -> bool:
    return key in st.session_state


def carry_out_flight(key: str, plan: Callable[[], list[wr.PlannedRun]], group: str | None, *, ready: bool = True,
                     target: str = "local", tags: Iterable[str] = (), notes: str = "") -> list[str] | None:
    """Launch the flight under ``key`` once: plan it (``plan()``), launch it as this session's
    principal and remember the runs. Returns their ids when this rerun ended the flight, else None
    (no flight; the form is not ``ready``: dropped; or the launch failed:
    shown, dropped). A flight that launched in an interrupted rerun is only remembered here."""
    assert key in FLIGHT_PAGES, f"flight {key!r} has no page in FLIGHT_PAGES"
    flight = st.session_state.get(key)
    if flight is None:
        return None
    if "ids" not in flight:
        if not ready:
            del st.session_state[key]
            return None
        try:
            with st.spinner("Launching…"):
                planned = plan()
                flight["group"] = group
                flight["ids"] = _launch_as_principal(planned, group, target=target, tags=tags, notes=notes)
        except LAUNCH_ERRORS as err:
            del st.session_state[key]
            st.error(str(err))
            return None
    remember_launch(flight["ids"], flight["group"])
    del st.session_state[key]
    return flight["ids"]


# -- the verdict table (Live / Compare's arms view, the Experiments lab) ------------------------------
VERDICT_HELP = {
    "seeds": "Runs of this arm with a score (one score per run: its final-window mean; the seed is the unit "
             "of replication, never the step).",
    "95% CI": "Student-t interval of the mean over seeds (exact for normal scores; a bootstrap is too narrow "
              "with 3 seeds).",
    "IQM": "Interquartile mean over seeds (25% trimmed; = the mean below 4 seeds).",
    "IQM 95% CI": "Seeded percentile bootstrap of the IQM (from 5 seeds).",
    "A − B": "mean(A) - mean(B) of the final-window scores.",
    "P(A > B)": "Probability of improvement: the share of seed pairs in which A beats B (ties 1/2).",
    "p (Welch)": "Two-sided Welch t-test of the difference.",
    "seeds needed": "Seeds per arm a two-sample t-test needs to detect the observed gap (alpha 0.05, power 0.8). "
                    "A planning number, as noisy as the few-seed gap it starts from. '—' where there is no "
                    "number: no gap between the means (nothing to detect, the power is undefined) or under 2 seeds "
                    "in an arm.",
}


def verdict_table(frame: pd.DataFrame, metric: str, window: float = DEFAULT_WINDOW_FRAC, *, baseline: str | None = None) -> None:
    """Draw the verdict table of ``metric`` over the final ``window`` (fraction of each run's
    logged steps) from ``RunStore.arm_metrics(ids)``: per arm mean, IQM, 95% CIs and seeds; per
    pair (every pair, or each arm against ``baseline``) the difference with its 95% CI, P(A > B),
    the verdict and the seeds needed. Places no widgets (callers own their controls); shows why
    when there is nothing to score."""
    try:
        result = verdict(frame, metric, window, baseline=baseline)
    except ValueError as err:
        st.info(str(err))
        return
    number = st.column_config.NumberColumn
    config = {c: st.column_config.Column(help=h) for c, h in VERDICT_HELP.items()}
    config |= {c: number(format="%.4g", help=VERDICT_HELP.get(c)) for c in ("mean", "IQM", "A − B", "p (Welch)")}
    config["P(A > B)"] = number(format="%.2f", help=VERDICT_HELP["P(A > B)"])
    st.caption(f"**{metric}**, score of a run = its mean over the {result.window}; {RAW_VERDICT_NOTE}.")
    st.dataframe(result.arms, hide_index=True, column_config=config)
    if len(result.pairs):
        st.dataframe(result.pairs, hide_index=True, column_config=config)
