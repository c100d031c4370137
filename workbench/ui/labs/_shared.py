"""Widgets the lab pages share: picking runs from the store, reading their recipe, and a launch
button that respects the app's sign-in policy. Layout only; the run layer is imported lazily so a
lab's analytic half works even where no run store can be opened."""

from __future__ import annotations

from typing import Any

import streamlit as st

from workbench.recipe import Recipe


def open_store():
    """The run store of this workbench home, or None (with the reason shown) if it cannot open."""
    try:
        from workbench.runs import RunStore

        return RunStore()
    except Exception as err:  # the analytic half of the page must still work
        st.info(f"No run store available here ({type(err).__name__}: {err}); the empirical views need one.")
        return None


def pick_runs(store, *, key: str, label: str = "Runs", multi: bool = True, max_default: int = 2) -> list[str]:
    """Select runs from the store (newest first); [] when there are none."""
    runs = store.list_runs()
    if not len(runs):
        st.info("No runs yet: launch one (Launch page, or the button on this page) to see what happened to its tokens.")
        return []
    runs = runs.sort_values("created_at", ascending=False)
    ids = list(runs["id"])
    names = dict(zip(runs["id"], runs["name"]))
    status = dict(zip(runs["id"], runs["status"]))
    fmt = lambda rid: f"{names[rid]} · {status[rid]} · {rid}"  # noqa: E731
    if multi:
        return st.multiselect(label, ids, default=ids[:max_default], format_func=fmt, key=key)
    chosen = st.selectbox(label, ids, format_func=fmt, key=key)
    return [chosen] if chosen else []


def run_recipe(store, run_id: str) -> Recipe | None:
    """The recipe a run was launched with (None if the store has none that validates)."""
    try:
        return Recipe.from_yaml(store.get_run(run_id).get("recipe") or "")
    except Exception:
        return None


def diagnostics_by_step(store, run_id: str) -> dict[int, dict[str, Any]]:
    return {step: store.diagnostics(run_id, step) for step in store.diagnostic_steps(run_id)}


def launch_blocked_reason() -> str | None:
    """Why this session may not launch (sign-in policy of workbench.ui.auth), or None."""
    from workbench.ui import auth

    return auth.blocked_reason()


def launch_button(recipes: list[Recipe], *, key: str, label: str, group: str | None = None) -> None:
    """A button launching ``recipes`` on this machine (one run, or a comparison ``group``); disabled,
    with the reason, when the app requires sign-in and this session has not signed in."""
    reason = launch_blocked_reason()
    if reason:
        st.caption(f":material/lock: {reason}")
    if not st.button(label, key=key, disabled=bool(reason), help=reason):
        return
    from workbench.runs import launch, launch_group
    from workbench.ui import auth

    user = st.session_state.get("wb_user") or auth.current_user()
    try:
        if group:
            ids = launch_group(recipes, group=group, target="local", created_by=user)
        else:
            ids = [launch(recipes[0], target="local", created_by=user)]
    except Exception as err:  # launch errors name the field at fault; show them, do not crash the page
        st.error(f"Could not launch: {err}")
        return
    st.success(f"Launched {', '.join(ids)}: follow it on the Live / Compare page; its tokens appear here as it runs.")
