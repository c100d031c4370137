"""Audit: who launched, cancelled, resumed, deleted, edited, signed in or changed the settings, when,
and from where; newest first, filtered by actor and action, downloadable as CSV. Admins only: the
run service authorises the read itself (``audit_log``, rule ``audit``); anyone else gets one line
saying so, and nothing of the log."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from workbench.runs import service
from workbench.runs.authz import refusal
from workbench.runs.records import AUDIT_ACTIONS
from workbench.ui import auth

COLUMNS = ["when (UTC)", "actor", "role", "auth", "action", "target", "detail", "address"]
ALL = "(all)"
LIMITS = (100, 1000, 10000)
# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection); run names,
# tags and typed user names reach the log, so such cells are written with a leading apostrophe.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def entries_frame(entries) -> pd.DataFrame:
    """Audit entries (newest first, as the service returns them) as the page's table."""
    rows = [[time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.at)), e.actor, e.role, e.auth, e.action, e.target,
             e.detail, e.address] for e in entries]
    return pd.DataFrame(rows, columns=COLUMNS)


def csv_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy whose text cells cannot run as spreadsheet formulas (``FORMULA_STARTS``)."""
    return frame.map(lambda v: "'" + v if isinstance(v, str) and v.startswith(FORMULA_STARTS) else v)


def audit_csv(frame: pd.DataFrame) -> bytes:
    return csv_safe(frame).to_csv(index=False).encode("utf-8")


def render() -> None:
    st.title("Audit")
    principal = auth.current_principal()
    reason = refusal(principal, "audit")
    if reason:  # said before any widget; the service refuses the read itself all the same
        st.error(f"Refused: {reason}", icon=":material/lock:")
        return
    cols = st.columns([2, 2, 1])
    actor = cols[0].text_input("Actor (exact, e.g. ada@lab.org or erin (password))", key="audit_actor").strip()
    action = cols[1].selectbox("Action", [ALL, *AUDIT_ACTIONS], key="audit_action")
    limit = cols[2].selectbox("Newest", LIMITS, index=1, key="audit_limit")
    try:
        entries = service.audit_log(principal, limit=limit, actor=actor or None,
                                    action=None if action == ALL else action)
    except service.PermissionDenied as err:
        st.error(f"Refused: {err}", icon=":material/lock:")
        return
    frame = entries_frame(entries)
    st.caption(f"{len(frame)} entries, newest first" + (" (the newest shown; raise 'Newest' for more)"
                                                         if len(frame) == limit else "") + ".")
    st.dataframe(frame, hide_index=True)
    st.download_button("Download CSV", audit_csv(frame), file_name="workbench-audit.csv", mime="text/csv",
                       key="audit_csv", disabled=frame.empty)
