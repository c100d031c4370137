"""API tokens: pure functions for the CLI's principal on a shared store (issue 21).

A token is ``wb_`` + ``secrets.token_urlsafe(32)`` (256 random bits), shown once; the store keeps
only its SHA-256 (a fast hash is enough for a random secret: there is nothing to guess), compared
with ``hmac.compare_digest``. The CLI reads it from ``WORKBENCH_TOKEN`` only, never a flag (a flag
lands in shell history and ``ps``). A token acts for ``user_name`` with ``role``; it expires after
1..MAX_DAYS days and can be revoked. This module decides nothing about the database: the store
and the service call these functions.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import math
import secrets
from dataclasses import dataclass

TOKEN_ENV = "WORKBENCH_TOKEN"
TOKEN_PREFIX = "wb_"
MIN_DAYS, MAX_DAYS = 1, 365
DAY_SECONDS = 86400.0
ID_LENGTH = 12  # hex characters of a token's public id


class TokenError(ValueError):
    """A token that cannot be used or issued (one line naming WORKBENCH_TOKEN or the field, and why)."""


@dataclass(frozen=True)
class TokenRecord:
    """One row of ``api_tokens`` (never the secret)."""

    id: str
    secret_sha256: str
    user_name: str
    role: str
    label: str
    created_by: str
    created_at: float
    expires_at: float
    last_used_at: float | None = None
    revoked_at: float | None = None


def new_secret() -> str:
    """A fresh, recognisable secret: 'wb_' + 43 url-safe characters."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def new_token_id() -> str:
    """A public id to list and revoke a token by (not derived from the secret)."""
    return secrets.token_hex(ID_LENGTH // 2)


def secret_hash(secret: str) -> str:
    """The SHA-256 (hex) the store keeps instead of the secret."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def secret_matches(secret: str, stored_hash: str) -> bool:
    """True when ``secret`` hashes to ``stored_hash`` (constant-time comparison)."""
    return hmac.compare_digest(secret_hash(secret), stored_hash)


def checked_days(days: object) -> int:
    """``--days`` as an int in MIN_DAYS..MAX_DAYS, else TokenError naming the field and value."""
    if isinstance(days, bool) or not isinstance(days, (int, float)) or not math.isfinite(days) \
            or int(days) != days or not MIN_DAYS <= days <= MAX_DAYS:
        raise TokenError(f"days={days!r} is not allowed; a whole number of days from {MIN_DAYS} to {MAX_DAYS}")
    return int(days)


def checked_secret_shape(secret: str) -> str:
    """The env value stripped, when it looks like a workbench token; else TokenError."""
    text = (secret or "").strip()
    if not text.startswith(TOKEN_PREFIX) or len(text) < len(TOKEN_PREFIX) + 40:
        raise TokenError(f"{TOKEN_ENV} is not a workbench token (it should start with {TOKEN_PREFIX!r}); "
                         "create one with: python -m workbench tokens create")
    return text


def unusable_reason(record: TokenRecord | None, now: float) -> str | None:
    """Why a looked-up token cannot act (unknown, revoked, expired), or None when it can."""
    if record is None:
        return f"{TOKEN_ENV} is not a known token"
    if record.revoked_at is not None:
        return f"{TOKEN_ENV} (token {record.id}) was revoked"
    if now >= record.expires_at:
        return f"{TOKEN_ENV} (token {record.id}) expired"
    return None


#: The columns a token is listed with (``python -m workbench tokens list`` and the Tokens page).
TOKEN_COLUMNS = ("id", "user", "role", "label", "created_by", "created", "expires", "last_used", "revoked", "status")


def _utc(at: float | None) -> str:
    return "-" if at is None else f"{dt.datetime.fromtimestamp(at, dt.timezone.utc):%Y-%m-%d %H:%M}"


def token_status(record: TokenRecord, now: float) -> str:
    """'revoked', 'expired' or 'active' (a revoked token that also expired says revoked)."""
    if record.revoked_at is not None:
        return "revoked"
    return "expired" if now >= record.expires_at else "active"


def token_row(record: TokenRecord, now: float) -> tuple[str, ...]:
    """One token as ``TOKEN_COLUMNS`` (times in UTC, minutes), never its hash."""
    return (record.id, record.user_name, record.role, record.label, record.created_by, _utc(record.created_at),
            _utc(record.expires_at), _utc(record.last_used_at), _utc(record.revoked_at), token_status(record, now))
