"""Small helpers shared by the pages (no maths, no file formats)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from workbench.runs import ACTIVE_STATUSES, RunStore
from workbench.ui import auth

# Material icons (rendered by Streamlit's markdown; no emoji font needed in the browser).
STATUS_ICONS = {"queued": ":material/hourglass_empty:", "starting": ":material/rocket_launch:",
                "running": ":blue[:material/play_circle:]", "finished": ":green[:material/check_circle:]",
                "failed": ":red[:material/error:]", "cancelled": ":orange[:material/stop_circle:]",
                "lost": ":gray[:material/help:]"}


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


def guarded_button(label: str, *, key: str, **kwargs) -> bool:
    """A button that is disabled (with the reason as tooltip) when this session may not act."""
    reason = auth.blocked_reason()
    return st.button(label, key=key, disabled=bool(reason) or kwargs.pop("disabled", False),
                     help=reason or kwargs.pop("help", None), **kwargs)


def blocked_notice() -> bool:
    """Show why actions are disabled; True when they are."""
    reason = auth.blocked_reason()
    if reason:
        st.warning(reason, icon=":material/lock:")
    return bool(reason)
