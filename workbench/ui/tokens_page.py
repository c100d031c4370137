"""API tokens: what ``python -m workbench tokens`` does, for admins in the app. A token lets the
CLI act on a shared store as a named user with a role (``WORKBENCH_TOKEN``); this page lists every
token (never a secret: the store keeps only hashes), issues one (its secret shown once, on the
run of the click, and nowhere after) and revokes one. Every action goes through the run service
(``workbench.runs.apitokens``), which authorises it (rule ``tokens``: admins) and audits it; anyone
else gets one line saying so and nothing of the list."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from workbench.runs import apitokens
from workbench.runs.authz import ROLES, PermissionDenied, refusal
from workbench.runs.tokens import MAX_DAYS, MIN_DAYS, TOKEN_COLUMNS, TOKEN_ENV, TokenError, token_row, token_status
from workbench.ui import auth

DEFAULT_DAYS = 30


def tokens_frame(records, now: float) -> pd.DataFrame:
    """Tokens as the page's table (the CLI's columns), newest first."""
    rows = [token_row(r, now) for r in sorted(records, key=lambda r: r.created_at, reverse=True)]
    return pd.DataFrame(rows, columns=list(TOKEN_COLUMNS))


def _create(principal) -> None:
    st.subheader("Issue a token")
    with st.form("token_create", clear_on_submit=True):
        c1, c2, c3 = st.columns([3, 1, 1])
        user = c1.text_input("Acts for (the name the app records as owner: a verified email or subject)",
                             value=principal.owner, key="token_user")
        role = c2.selectbox("Role", ROLES, index=ROLES.index("member"), key="token_role")
        days = c3.number_input("Days", MIN_DAYS, MAX_DAYS, DEFAULT_DAYS, key="token_days")
        label = st.text_input("Label (where it is used, e.g. 'cluster login node')", key="token_label")
        submitted = st.form_submit_button("Issue token")
    if not submitted:
        return
    try:
        secret, record = apitokens.create_token(principal, user=user, role=role, days=int(days), label=label)
    except (TokenError, PermissionDenied) as err:
        st.error(str(err))
        return
    st.success(f"Token {record.id} for {record.user_name} as {record.role}. Copy it now: it is shown once, "
               "and the store keeps only its hash.")
    st.code(f"export {TOKEN_ENV}={secret}", language="bash")


def _revoke(principal, records, now: float) -> bool:
    """The revoke box and button; True when a token was revoked on this run."""
    st.subheader("Revoke a token")
    active = [r for r in records if token_status(r, now) == "active"]
    if not active:
        st.caption("No active token.")
        return False
    labels = {r.id: f"{r.id} · {r.user_name} ({r.role}){' · ' + r.label if r.label else ''}" for r in active}
    c1, c2 = st.columns([4, 1])
    chosen = c1.selectbox("Token", list(labels), format_func=labels.get, key="token_revoke_id")
    c2.write("")  # aligns the button with the box
    # keyed by the token: a queued click is not carried over to another token chosen meanwhile (runs_page)
    if not c2.button("Revoke", key=f"token_revoke:{chosen}", type="primary"):
        return False
    try:
        apitokens.revoke_token(principal, chosen)
    except (TokenError, PermissionDenied) as err:
        st.error(str(err))
        return False
    st.success(f"Token {chosen} revoked: the CLI refuses it from now on.")
    return True


def render() -> None:
    st.title("API tokens")
    principal = auth.current_principal()
    reason = refusal(principal, "tokens")
    if reason:  # said before any widget; the service refuses every token action itself all the same
        st.error(f"Refused: {reason}", icon=":material/lock:")
        return
    st.caption(f"The CLI acts on this store as a token's user and role when {TOKEN_ENV} holds it "
               "(`python -m workbench tokens` does the same from a shell).")
    _create(principal)
    try:
        records = apitokens.list_tokens(principal)
    except PermissionDenied as err:
        st.error(f"Refused: {err}", icon=":material/lock:")
        return
    now = time.time()
    if _revoke(principal, records, now):
        records = apitokens.list_tokens(principal)
    st.subheader("Tokens")
    frame = tokens_frame(records, now)
    st.caption(f"{len(frame)} tokens, newest first; times in UTC.")
    st.dataframe(frame, hide_index=True)
