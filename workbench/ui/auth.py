"""Who may launch, cancel and delete runs, and who owns them.

Two ways to sign in. With an identity provider configured (an ``[auth]`` section in Streamlit's
secrets: Google, Entra ID, Okta, Keycloak, any OpenID Connect provider), users sign in through it
with Streamlit's ``st.login`` (Authlib) and are verified identities: the principal is named by
their verified email (else the provider's subject), its auth is "OpenID Connect", and its role
comes from the provider's claims through the settings' ``roles`` mapping
(``workbench.runs.roles.role_for``), read again on every action, so a change of the mapping
applies at once. Sign-in is then required for every action, whatever address the app listens on,
and the password form is not shown. Without a provider, the shared password below stays.

Every sign-in, refused sign-in and sign-out goes to the audit log through the run service
(``record_event`` / ``record_refused_sign_in``), with the client's address. An identity provider's
sign-in is recorded once per token (``sign_in_detail``), not once per browser tab: Streamlit opens
a new session on every reload, and each one reads the same signed cookie.

Password policy (pure, :func:`auth_policy`): when the app listens beyond this machine (``server.address``
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
from collections.abc import Mapping
from dataclasses import dataclass

import streamlit as st

from workbench.home import workbench_home
from workbench.runs.authz import CLAIMED_AUTHS, LOCAL_AUTH, OIDC_AUTH, PASSWORD_AUTH, Principal, local_user_name, refusal
from workbench.runs.roles import IdentityError, identity_name, role_for
from workbench.runs.settings import Settings, SettingsError, load_settings
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
OIDC_NOTED_KEY = "wb_oidc_noted"  # the provider sign-in (its sign_in_detail) this session has recorded
SIGN_IN_SKEW_S = 300  # how far the provider's clock (a token's iat) may run ahead of ours
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


def auth_policy(address: str | None, password: str | None, provider: bool = False) -> Policy:
    """What the app asks of a user, given where it listens, whether a password is set and whether
    an identity provider is configured (then sign-in is required everywhere, through it)."""
    if provider:
        return Policy(True, True, "Sign in with your identity provider to launch, cancel or delete runs; "
                                  "your role comes from the workbench settings.")
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


def oidc_providers(section: object) -> list[str]:
    """The providers an ``[auth]`` secrets section configures, as ``st.login`` names them:
    'default' for credentials directly under [auth], then each [auth.NAME] sub-section that has a
    client_id ([auth.google], [auth.keycloak], ...). Empty when there is no usable section."""
    if not isinstance(section, Mapping):
        return []
    names = ["default"] if section.get("client_id") else []
    return names + [name for name, sub in section.items() if isinstance(sub, Mapping) and sub.get("client_id")]


def configured_providers() -> list[str]:
    """The identity providers of this app's secrets (``oidc_providers``)."""
    try:
        section = st.secrets.get("auth")
    except Exception:  # no secrets file at all: Streamlit raises instead of returning None
        section = None
    return oidc_providers(section)


def current_policy() -> Policy:
    return auth_policy(st.get_option("server.address"), configured_password(), bool(configured_providers()))


def provider_claims() -> dict | None:
    """The claims of the user signed in through the identity provider (``st.user``), else None."""
    if not configured_providers():
        return None
    try:
        user = st.user
        return {key: user.get(key) for key in user} if user.get("is_logged_in") else None
    except Exception as err:  # no script-run context, or a cookie Streamlit could not read
        log.warning("sign-in: st.user unreadable: %s", err)
        return None


def role_settings() -> Settings:
    """The settings that map claims to roles; the defaults (everyone a viewer, unverified emails
    untrusted) when the file is unreadable: the safe side, said in the log."""
    try:
        return load_settings()
    except SettingsError as err:
        log.warning("sign-in: settings unreadable, every provider user is a viewer: %s", err)
        return Settings()


def provider_principal(claims: dict, address: str = "") -> Principal:
    """The principal of a user the identity provider signed in: named by ``identity_name``, with
    ``role_for`` from the settings as they are now. IdentityError when the claims name nobody."""
    settings = role_settings()
    return Principal(identity_name(claims, settings), role_for(claims, settings), OIDC_AUTH, address=address)


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
    """Who this session acts as, for the run service (see the module docstring): the user the
    identity provider signed in, with the role the settings give them now; the OS user as admin
    where no sign-in is needed; the password-signed-in name with its role; else a viewer. Each
    carries the client's address (for the audit log)."""
    address = current_client_address()
    claims = provider_claims()
    if claims is not None:
        try:
            return provider_principal(claims, address)
        except IdentityError:
            return Principal(ANONYMOUS, "viewer", NO_AUTH, address=address)
    if not current_policy().required:
        return Principal(current_user(), "admin", LOCAL_AUTH, address=address)
    if st.session_state.get(AUTHED_KEY) and st.session_state.get(USER_KEY):
        return Principal(st.session_state[USER_KEY], st.session_state.get(ROLE_KEY, "member"), PASSWORD_AUTH,
                         address=address)
    return Principal(ANONYMOUS, "viewer", NO_AUTH, address=address)


def signed_in() -> bool:
    """Is someone signed in (through the identity provider, or with the password)?"""
    if configured_providers():
        return current_principal().auth == OIDC_AUTH
    return bool(st.session_state.get(AUTHED_KEY))


def can_act() -> bool:
    """May this session launch / cancel / delete / change settings?"""
    return not current_policy().required or signed_in()


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
    anyone may type any name, so locking a name would only let strangers lock its owner out.

    The audit log gets the sign-in, or the refusal of a wrong password (those are rate-limited by
    the ledger). An attempt refused while locked is logged (``workbench.auth``) but not written to
    the audit log: it costs the client nothing, so it would let anyone fill the log at wire speed."""
    from workbench.runs import service

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
        service.record_refused_sign_in(user + CLAIMED_AUTHS[PASSWORD_AUTH], PASSWORD_AUTH, address, "wrong password")
        return "Wrong password." + (f" Too many failed sign-ins: try again in {describe_wait(wait)}." if wait else "")
    ledger.succeeded(keys)
    log.info("sign-in: name=%r role=%s address=%s", user, role, address)
    service.record_event(Principal(user, role, PASSWORD_AUTH, address=address), "sign_in",
                         detail="admin password" if role == "admin" and configured_admin_password() else "password")
    st.session_state[USER_KEY], st.session_state[ROLE_KEY], st.session_state[AUTHED_KEY] = user, role, True
    return None


def sign_out() -> None:
    """Record the sign-out of this session's user, then end their session: forget the password
    sign-in, or clear the identity provider's cookie (``st.logout``, which also passes the
    provider's end-session page when it has one)."""
    from workbench.runs import service

    principal = current_principal()
    if principal.auth in (PASSWORD_AUTH, OIDC_AUTH):
        service.record_event(principal, "sign_out")
    for key in (USER_KEY, ROLE_KEY, AUTHED_KEY, OIDC_NOTED_KEY):
        st.session_state.pop(key, None)
    if provider_claims() is not None:
        st.logout()
    else:
        st.rerun()


# ---- sign-in through the identity provider ------------------------------------------------------

def sign_in_detail(claims: Mapping) -> str:
    """The audit detail of an identity provider's sign-in. It names the provider and the token by
    its issue time (``iat``), so that the sessions one sign-in opens (every reload, every tab
    reads the same cookie) record it once (``note_provider_sign_in``)."""
    iat = claims.get("iat")
    issued = (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(iat))
              if isinstance(iat, (int, float)) and not isinstance(iat, bool) and 0 < iat < 1e11 else "at an unknown time")
    return f"{OIDC_AUTH} ({claims.get('provider') or 'default'}), token issued {issued}"


def tried_name(claims: Mapping) -> str:
    """The name a refused identity tried, for the audit log: its email or subject, cut to 254
    characters; '(none)' without either."""
    for key in ("email", "sub"):
        value = claims.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()[:254]
    return "(none)"


def audit_store():
    """The store the run service writes the audit log to (its default store: ``WORKBENCH_DB``, else
    the home's SQLite file)."""
    from workbench.runs.store import default_store

    return default_store()


def already_recorded(actor: str, action: str, detail: str, claims: Mapping) -> bool:
    """Has another session of this sign-in (same actor, action and detail, since the token was
    issued, the provider's clock allowing ``SIGN_IN_SKEW_S`` ahead) recorded it already?"""
    iat = claims.get("iat")
    since = float(iat) - SIGN_IN_SKEW_S if isinstance(iat, (int, float)) and not isinstance(iat, bool) else None
    if since is None:
        return False
    entries = audit_store().audit_entries(actor=actor, action=action, since=since, limit=100)
    return any(entry.detail == detail for entry in entries)


def note_provider_sign_in(claims: Mapping, principal: Principal) -> None:
    """Record this session's identity-provider sign-in in the audit log once per token: a sign-in
    when the claims name someone, else a refused sign-in (nobody to name)."""
    from workbench.runs import service

    detail = sign_in_detail(claims)
    if st.session_state.get(OIDC_NOTED_KEY) == detail:
        return
    if principal.auth == OIDC_AUTH:
        if not already_recorded(principal.owner, "sign_in", detail, claims):
            log.info("sign-in: name=%r role=%s address=%s (%s)", principal.name, principal.role, principal.address, detail)
            service.record_event(principal, "sign_in", detail=detail)
    else:
        name, reason = tried_name(claims), "the provider sent neither a verified email nor a usable subject"
        if not already_recorded(name, "sign_in_refused", f"{detail}: {reason}", claims):
            log.warning("sign-in refused (%s): name=%r address=%s", reason, name, principal.address)
            service.record_refused_sign_in(name, OIDC_AUTH, principal.address, f"{detail}: {reason}")
    st.session_state[OIDC_NOTED_KEY] = detail


def provider_label(provider: str) -> str:
    return "Sign in" if provider == "default" else f"Sign in with {provider}"


def _provider_sidebar(policy: Policy) -> None:
    """The sidebar with an identity provider: a sign-in button per provider, or who is signed in,
    their role, and Sign out."""
    claims = provider_claims()
    if claims is None:
        st.markdown("**Sign in**")
        st.caption(policy.reason)
        for provider in configured_providers():
            if st.button(provider_label(provider), key=f"wb_login:{provider}"):
                st.login(provider)
        return
    principal = current_principal()
    note_provider_sign_in(claims, principal)
    if principal.auth == OIDC_AUTH:
        shown = claims.get("name") if isinstance(claims.get("name"), str) else None
        who = f"{shown} ({principal.name})" if shown and shown != principal.name else principal.name
        st.caption(f"Signed in as **{who}** ({principal.role}) through your identity provider.")
    else:
        st.error("Sign-in refused: your identity provider sent neither a verified email nor a usable subject. "
                 "Sign out and ask an admin.")
    if st.button("Sign out", key="wb_sign_out"):
        sign_out()


def sidebar() -> None:
    """The sign-in (identity provider buttons or the password form), or who is signed in, in the sidebar."""
    policy = current_policy()
    with st.sidebar:
        if configured_providers():
            _provider_sidebar(policy)
            return
        if not policy.required:
            st.caption(f"User: **{current_user()}** (local). {policy.reason}")
            return
        if st.session_state.get(AUTHED_KEY):
            st.caption(f"Signed in as **{st.session_state[USER_KEY]}** ({st.session_state.get(ROLE_KEY, 'member')}).")
            if st.button("Sign out", key="wb_sign_out"):
                sign_out()
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
