"""Who may launch, cancel and delete runs, and who owns them.

Policy (pure, :func:`auth_policy`): when the app listens beyond this machine (``server.address``
not localhost / 127.0.0.1 / ::1; an empty address means *all interfaces*) or a password is
configured, every launch / cancel / delete / settings change needs a signed-in user. The password
comes from the environment variable ``WORKBENCH_PASSWORD`` or ``st.secrets["password"]`` and is
compared in constant time (``hmac.compare_digest``). With no password on a non-local address the
actions stay disabled, and the page says how to set one. The name typed at sign-in is recorded as
the owner (``created_by``, suffixed " (password)": a claim, see ``runs.authz``) of what that session launches; it is kept in
``st.session_state["wb_user"]``.

Roles (``workbench.runs.authz``): the app acts through the run service as a ``Principal`` built
here (``current_principal``), and the service applies the one rule of who may do what. A session
of an app that needs no sign-in (this machine only, no password) is the OS user with role admin,
as the CLI is. A session signed in with the password is a member (launches, and cancels,
resumes, deletes and edits its own runs) when an admin password is also configured
(``WORKBENCH_ADMIN_PASSWORD`` or ``st.secrets["admin_password"]``), and an admin (everything,
other people's runs and the settings too) otherwise (one shared password: everyone is trusted
alike, as before roles); signing in with the admin password makes an admin. A session that is
not signed in where sign-in is needed is a viewer: it reads, and every action is refused.

Guessing is limited server-wide (``signin_limits``): failed sign-ins are counted per client
address and for the whole server in a SQLite ledger under the workbench home that every session
and app process shares. The typed name is a label, not a key. After 5 failures each further one
locks that address for 2 s, 4 s, 8 s ... at most 15 min; once the server counts 50 failures with
no 10-min pause, each further one locks everyone for 2 s, 4 s ... at most 60 s. While locked an
attempt is refused without its password being looked at. Forwarding headers count only from the ``trusted_proxies`` of the
settings. Every failed or refused attempt is logged (logger ``workbench.auth``, WARNING).
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import time
from dataclasses import dataclass

import streamlit as st

from workbench.home import workbench_home
from workbench.runs.authz import LOCAL_AUTH, PASSWORD_AUTH, Principal, local_user_name, refusal
from workbench.runs.settings import SettingsError, load_settings
from workbench.ui.signin_limits import (
    GLOBAL_KEY,
    LEDGER_FILE,
    AttemptLedger,
    client_address,
    describe_wait,
    key_kind,
    ledger_keys,
)

log = logging.getLogger("workbench.auth")
# The ledger's clock (wall-clock seconds, shared with other app processes); tests move it.
signin_clock = time.time

PASSWORD_ENV = "WORKBENCH_PASSWORD"
ADMIN_PASSWORD_ENV = "WORKBENCH_ADMIN_PASSWORD"
NO_AUTH = "not signed in"
ROLE_KEY = "wb_role"
ANONYMOUS = "anonymous"
LOCAL_ADDRESSES = frozenset({"localhost", "127.0.0.1", "::1"})
USER_KEY, AUTHED_KEY = "wb_user", "wb_authed"
_USER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
USER_RULE = "1-64 characters: letters, digits, '.', '_', '@', '-', starting with a letter or digit"


@dataclass(frozen=True)
class Policy:
    """``required``: actions need a signed-in user; ``possible``: a password exists to sign in
    with; ``reason``: the sentence the login form shows."""

    required: bool
    possible: bool
    reason: str


def is_local_address(address: str | None) -> bool:
    """True only for loopback names; '' / None / 0.0.0.0 listen on every interface."""
    return (address or "").strip().strip("[]") in LOCAL_ADDRESSES


def auth_policy(address: str | None, password: str | None) -> Policy:
    """What the app asks of a user, given where it listens and whether a password is set."""
    shown = address or "all interfaces"
    if not is_local_address(address):
        if not password:
            return Policy(True, False,
                          f"This workbench listens on {shown}, beyond this machine, and no password is set: "
                          f"launching, cancelling and deleting are disabled. Set the environment variable "
                          f"{PASSWORD_ENV} (or `password` in .streamlit/secrets.toml) and restart the app.")
        return Policy(True, True, f"This workbench listens on {shown}, beyond this machine: sign in to launch, "
                                  "cancel or delete runs. Your name is recorded as the runs' owner.")
    if password:
        return Policy(True, True, "A workbench password is set: sign in to launch, cancel or delete runs. "
                                  "Your name is recorded as the runs' owner.")
    return Policy(False, True, "This workbench only listens on this machine; no sign-in needed.")


def password_matches(given: str, expected: str) -> bool:
    """Constant-time comparison (no early exit that leaks how many characters matched)."""
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def check_user_name(name: str) -> str:
    name = (name or "").strip()
    if not _USER.match(name):
        raise ValueError(f"user={name!r} is not allowed; {USER_RULE}")
    return name


def _configured(env: str, secret_key: str) -> str | None:
    """The environment variable ``env`` if set, else ``st.secrets[secret_key]``, else None."""
    value = os.environ.get(env)
    if value:
        return value
    try:
        secret = st.secrets.get(secret_key)
    except Exception:  # no secrets.toml at all: Streamlit raises instead of returning None
        secret = None
    return str(secret) if secret else None


def configured_password() -> str | None:
    """``WORKBENCH_PASSWORD`` if set, else ``st.secrets['password']``, else None."""
    return _configured(PASSWORD_ENV, "password")


def configured_admin_password() -> str | None:
    """``WORKBENCH_ADMIN_PASSWORD`` if set, else ``st.secrets['admin_password']``, else None."""
    return _configured(ADMIN_PASSWORD_ENV, "admin_password")


def password_role(password: str) -> str | None:
    """The role a sign-in with ``password`` gets (see the module docstring), None for a wrong one.
    Both comparisons always run (constant time: which password matched does not show in timing)."""
    expected, admin = configured_password(), configured_admin_password()
    is_admin = bool(admin) and password_matches(password, admin)
    is_member = bool(expected) and password_matches(password, expected)
    if is_admin:
        return "admin"
    if is_member:
        return "member" if admin else "admin"
    return None


def current_policy() -> Policy:
    return auth_policy(st.get_option("server.address"), configured_password())


def current_user() -> str:
    """The signed-in name, or the OS user when no sign-in is needed."""
    user = st.session_state.get(USER_KEY)
    if user:
        return user
    try:
        return check_user_name(local_user_name())
    except ValueError:
        return "local"


def current_principal() -> Principal:
    """Who this session acts as, for the run service (see the module docstring): the OS user as
    admin where no sign-in is needed, the signed-in name with its role, else a viewer."""
    if not current_policy().required:
        return Principal(current_user(), "admin", LOCAL_AUTH)
    if st.session_state.get(AUTHED_KEY) and st.session_state.get(USER_KEY):
        return Principal(st.session_state[USER_KEY], st.session_state.get(ROLE_KEY, "member"), PASSWORD_AUTH)
    return Principal(ANONYMOUS, "viewer", NO_AUTH)


def can_act() -> bool:
    """May this session launch / cancel / delete / change settings?"""
    policy = current_policy()
    return not policy.required or bool(st.session_state.get(AUTHED_KEY))


def blocked_reason(action: str | None = None, run=None) -> str | None:
    """Why this session may not act (None when it may): the sign-in policy first, then, for an
    ``action`` (``workbench.runs.authz.RULES``; on ``run``), the service's own rule for this
    session's principal. The service checks again when the action arrives."""
    if not can_act():
        policy = current_policy()
        return policy.reason if not policy.possible else "Sign in (sidebar) to launch, cancel or delete runs."
    return None if action is None else refusal(current_principal(), action, run)


def signin_ledger() -> AttemptLedger:
    """The server-wide ledger of failed sign-ins (one SQLite file per workbench home)."""
    return AttemptLedger(workbench_home() / LEDGER_FILE, clock=lambda: signin_clock())


def trusted_proxies() -> list:
    """The settings' trusted proxies as networks; none when the settings file is unreadable (then
    forwarding headers are ignored: the safe side)."""
    try:
        return load_settings().trusted_proxy_networks()
    except SettingsError as err:
        log.warning("sign-in: settings unreadable, trusting no proxy: %s", err)
        return []


def current_client_address() -> str:
    """This session's client address (``signin_limits.client_address``)."""
    try:
        ip, forwarded = st.context.ip_address, st.context.headers.get_all("X-Forwarded-For")
    except Exception:  # no script-run context (e.g. called from a thread): nothing to read
        ip, forwarded = None, []
    return client_address(ip, forwarded if isinstance(forwarded, list) else [], trusted_proxies())


# which lock refused an attempt -> how the refusal names it
LOCK_SCOPES = {"address": "from this address", GLOBAL_KEY: "on this workbench (from all addresses)"}


def refusal_message(locked: tuple[str, ...], wait: float) -> str:
    scopes = " and ".join(dict.fromkeys(LOCK_SCOPES[key_kind(key)] for key in locked))
    return f"Too many failed sign-ins {scopes}: try again in {describe_wait(wait)}."


def sign_in(user: str, password: str, address: str | None = None) -> str | None:
    """Check a sign-in; on success record the user and return None, else the error message.
    Attempts pass through the ledger first: while the address (or the whole server) is locked the
    attempt is refused whatever the password, saying how long to wait. The name is not a key:
    anyone may type any name, so locking a name would only let strangers lock its owner out."""
    expected = configured_password()
    if not expected:
        return current_policy().reason
    try:
        user = check_user_name(user)
    except ValueError as err:
        return str(err)
    address = address or current_client_address()
    keys, ledger = ledger_keys(address), signin_ledger()
    admission = ledger.admit(keys)
    if not admission.allowed:
        log.warning("sign-in refused (locked for %.0f s more by %s): name=%r address=%s",
                    admission.wait_s, ",".join(admission.locked), user, address)
        return refusal_message(admission.locked, admission.wait_s)
    role = password_role(password)
    if role is None:
        wait = ledger.wait_s(keys)
        log.warning("sign-in failed (wrong password): name=%r address=%s failures=%s next attempt in %.0f s",
                    user, address, admission.failures, wait)
        return "Wrong password." + (f" Too many failed sign-ins: try again in {describe_wait(wait)}." if wait else "")
    ledger.succeeded(keys)
    log.info("sign-in: name=%r role=%s address=%s", user, role, address)
    st.session_state[USER_KEY], st.session_state[ROLE_KEY], st.session_state[AUTHED_KEY] = user, role, True
    return None


def sidebar() -> None:
    """The sign-in form (or who is signed in) in the sidebar."""
    policy = current_policy()
    with st.sidebar:
        if not policy.required:
            st.caption(f"User: **{current_user()}** (local). {policy.reason}")
            return
        if st.session_state.get(AUTHED_KEY):
            st.caption(f"Signed in as **{st.session_state[USER_KEY]}** ({st.session_state.get(ROLE_KEY, 'member')}).")
            if st.button("Sign out", key="wb_sign_out"):
                st.session_state.pop(USER_KEY, None)
                st.session_state.pop(ROLE_KEY, None)
                st.session_state.pop(AUTHED_KEY, None)
                st.rerun()
            return
        st.markdown("**Sign in**")
        st.caption(policy.reason)
        if not policy.possible:
            return
        with st.form("wb_login", clear_on_submit=False):
            user = st.text_input("Your name (recorded as the owner of your runs)", key="wb_login_user")
            password = st.text_input("Password", type="password", key="wb_login_password")
            submitted = st.form_submit_button("Sign in")
        if submitted:
            error = sign_in(user, password)
            if error:
                st.error(error)
            else:
                st.rerun()
