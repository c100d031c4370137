"""Small helpers shared by the pages (no maths, no file formats)."""

from __future__ import annotations

from typing import Iterable

import pandas as pd
import streamlit as st

from workbench import runs as wr
from workbench.recipe import Recipe, RecipeError
from workbench.runs import ACTIVE_STATUSES, RunStore
from workbench.ui import auth

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


def run_option(runs: pd.DataFrame):
    """format_func for run-id selectboxes: 'name · status · id'."""
    by_id = runs.set_index("id")
    return lambda rid: f"{by_id.at[rid, 'name']} · {by_id.at[rid, 'status']} · {rid}"


def any_active(runs: pd.DataFrame) -> bool:
    return bool(runs["status"].isin(ACTIVE_STATUSES).any()) if len(runs) else False


def refused() -> bool:
    """Check the sign-in policy again at the moment of an action; True (and the reason shown as
    an error) when this session may not act. ``disabled=`` alone is not a gate: Streamlit before
    1.61 accepts a click on a disabled button from a crafted client, and a button drawn enabled
    can be clicked after the session signed out in another rerun."""
    reason = auth.blocked_reason()
    if reason:
        st.error(f"Refused: {reason}", icon=":material/lock:")
    return bool(reason)


def guarded_button(label: str, *, key: str, disabled: bool = False, help: str | None = None, **kwargs) -> bool:
    """A button that is disabled (with the reason as tooltip) when this session may not act, and
    whose click counts only if the session may still act when it arrives."""
    reason = auth.blocked_reason()
    clicked = st.button(label, key=key, disabled=bool(reason) or disabled, help=reason or help, **kwargs)
    return clicked and not refused()


def blocked_notice() -> bool:
    """Show why actions are disabled; True when they are."""
    reason = auth.blocked_reason()
    if reason:
        st.warning(reason, icon=":material/lock:")
    return bool(reason)


def launch_and_remember(recipes: list[Recipe], group: str | None = None, *, target: str = "local",
                        tags: Iterable[str] = (), notes: str = "") -> list[str] | None:
    """Launch one recipe (``group`` None) or a comparison group as the signed-in user; remember
    the new runs so Live / Compare opens on them. Returns their ids, or None after showing why
    nothing was launched (not allowed, or the launcher's error naming the field at fault)."""
    if group is None and len(recipes) != 1:
        raise ValueError(f"launching {len(recipes)} recipes needs a comparison group name")
    if refused():
        return None
    common = {"target": target, "tags": list(tags), "notes": notes, "created_by": auth.current_user(), "store": store()}
    try:
        ids = (wr.launch_group(recipes, group=group, **common) if group else [wr.launch(recipes[0], **common)])
    except LAUNCH_ERRORS as err:
        st.error(str(err))
        return None
    st.session_state["launch_result"] = {"group": group, "ids": ids}
    if group:
        st.session_state["compare_group"] = group
    st.session_state["compare_runs"] = ids
    return ids
