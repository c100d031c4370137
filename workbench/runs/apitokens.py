"""API tokens in the service layer: issue, list, revoke (admins only, ``authz.RULES["tokens"]``,
each audited) and resolve ``WORKBENCH_TOKEN`` to the CLI's principal (a refusal is audited too).

The pure rules (secret shape, hash, bounds) are ``workbench.runs.tokens``. A token's role is what
the admin gives it (viewer/member/admin); it acts for ``user`` — the verified name the app records
as that person's owner (their OIDC email or subject), so runs launched with it are theirs.
"""

from __future__ import annotations

import time

from workbench.runs import audit
from workbench.runs.authz import ROLES, TOKEN_AUTH, Principal, authorize
from workbench.runs.records import RunRepository
from workbench.runs.roles import MAX_SUBJECT
from workbench.runs.store import default_store
from workbench.runs.tokens import (DAY_SECONDS, TokenError, TokenRecord, checked_days, checked_secret_shape,
                                   new_secret, new_token_id, secret_hash, unusable_reason)

MAX_LABEL = 100


def _checked_user(user: str) -> str:
    text = (user or "").strip()
    if not 0 < len(text) <= MAX_SUBJECT or not text.isprintable() or any(c.isspace() for c in text):
        raise TokenError(f"user={user!r} is not allowed; 1..{MAX_SUBJECT} printable characters, no spaces "
                         "(the name the app records as owner: a verified email or subject)")
    return text


def create_token(principal: Principal, *, user: str, role: str, days: object, label: str = "",
                 store: RunRepository | None = None, now: float | None = None) -> tuple[str, TokenRecord]:
    """Issue a token acting for ``user`` with ``role`` for ``days``; returns (secret, record). The
    secret is returned once and never stored."""
    authorize(principal, "tokens")
    if role not in ROLES:
        raise TokenError(f"role={role!r} is not allowed; one of: {', '.join(ROLES)}")
    if len(label) > MAX_LABEL or not label.isprintable():
        raise TokenError(f"label={label!r} is not allowed; at most {MAX_LABEL} printable characters")
    user, days = _checked_user(user), checked_days(days)
    store = store or default_store()
    now = time.time() if now is None else now
    secret = new_secret()
    record = TokenRecord(id=new_token_id(), secret_sha256=secret_hash(secret), user_name=user, role=role,
                         label=label, created_by=principal.owner, created_at=now,
                         expires_at=now + days * DAY_SECONDS)
    store.add_token(record)
    audit.record(store, principal, "token_create", record.id, f"for {user} as {role}, {days} days, label {label!r}")
    return secret, record


def list_tokens(principal: Principal, *, store: RunRepository | None = None) -> list[TokenRecord]:
    """Every token (the caller shows no hash)."""
    authorize(principal, "tokens")
    return (store or default_store()).tokens()


def revoke_token(principal: Principal, token_id: str, *, store: RunRepository | None = None) -> None:
    """Revoke ``token_id`` now; TokenError when no unrevoked token has that id."""
    authorize(principal, "tokens")
    store = store or default_store()
    if not store.set_token_time(token_id, "revoked_at", time.time()):
        raise TokenError(f"token id={token_id!r} is not an unrevoked token; see: python -m workbench tokens list")
    audit.record(store, principal, "token_revoke", token_id)


def token_principal(secret: str, *, store: RunRepository | None = None, now: float | None = None) -> Principal:
    """The principal ``WORKBENCH_TOKEN`` acts as; TokenError (one line naming WORKBENCH_TOKEN and
    why) for an unknown, revoked or expired token, which is audited as token_refused."""
    store = store or default_store()
    now = time.time() if now is None else now
    record = store.token_by_hash(secret_hash(checked_secret_shape(secret)))
    reason = unusable_reason(record, now)
    if reason is not None:
        who = Principal(record.user_name if record else "(unknown token)", "viewer", TOKEN_AUTH)
        audit.record(store, who, "token_refused", record.id if record else "", reason)
        raise TokenError(reason)
    store.set_token_time(record.id, "last_used_at", now)
    return Principal(record.user_name, record.role, TOKEN_AUTH)
