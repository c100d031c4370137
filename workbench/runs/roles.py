"""Which role someone gets, from who they are: pure functions over the settings' ``roles`` mapping.

What each role may do is ``workbench.runs.authz`` (the one rule, enforced in the service); this
module only says *who* is a viewer, a member or an admin:

- a user who signed in through the team's identity provider (OpenID Connect, ``st.login``):
  ``role_for(claims, settings)`` from the provider's claims (verified email, subject, groups);
- the CLI: the local OS user. On the local SQLite file it is admin (whoever runs it can write that
  file directly, so a lesser role would protect nothing). On a server database
  (``WORKBENCH_DB`` set to a URL whose scheme is not sqlite, e.g. ``postgresql://...``) the store
  is shared, so the CLI takes its role from ``roles.cli_roles`` (OS user name -> role), member for
  an unlisted user: the same rules as the app for the same store;
- the CLI with ``WORKBENCH_TOKEN`` set (any store): the token's user and role
  (``workbench.runs.apitokens``); an unknown, revoked or expired token is refused (TokenError).

Emails are trusted only when the provider marks them ``email_verified`` (or the settings say
``trust_unverified_email``): an unverified address is whatever the account holder typed, and a
verified name is what a run's ownership is compared with.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from workbench.runs.authz import LOCAL_AUTH, Principal, local_user_name
from workbench.runs.settings import RoleMapping, Settings, load_settings

SERVER_STORE_ENV = "WORKBENCH_DB"
CLI_SERVER_DEFAULT_ROLE = "member"
MAX_SUBJECT = 255  # OpenID Connect Core 1.0, 2: a sub is at most 255 ASCII characters


class IdentityError(ValueError):
    """Claims that name nobody the workbench can record as an owner (one line, says why)."""


def _mapping(settings: Settings | RoleMapping) -> RoleMapping:
    return settings.roles if isinstance(settings, Settings) else settings


def _is_true(value: object) -> bool:
    """A boolean claim: true, or the string 'true' some providers send."""
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def verified_email(claims: Mapping, settings: Settings | RoleMapping) -> str | None:
    """The claims' email, lower-cased, when the provider verified it (``email_verified``) or the
    settings trust unverified ones; else None."""
    email = claims.get("email")
    if not isinstance(email, str) or email.count("@") != 1 or not _clean(email):
        return None
    if not (_is_true(claims.get("email_verified")) or _mapping(settings).trust_unverified_email):
        return None
    return email.strip().lower()


def _clean(text: str) -> bool:
    """Usable as a recorded name: 1..MAX_SUBJECT printable characters, no spaces."""
    text = text.strip()
    return 0 < len(text) <= MAX_SUBJECT and text.isprintable() and not any(c.isspace() for c in text)


def subject(claims: Mapping) -> str | None:
    """The provider's stable user id (``sub``) when it is a usable name, else None."""
    sub = claims.get("sub")
    return sub.strip() if isinstance(sub, str) and _clean(sub) else None


def claim_groups(claims: Mapping, settings: Settings | RoleMapping) -> frozenset[str]:
    """The user's groups from the settings' ``groups_claim`` (a list, or one string); anything
    that is not a string is ignored."""
    value = claims.get(_mapping(settings).groups_claim)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        return frozenset()
    return frozenset(group for group in value if isinstance(group, str))


def identity_name(claims: Mapping, settings: Settings | RoleMapping) -> str:
    """What a signed-in user is recorded as (``Principal.name``, the owner of their runs): the
    verified email, else the subject. IdentityError when the claims have neither."""
    name = verified_email(claims, settings) or subject(claims)
    if name is None:
        raise IdentityError("the identity provider sent neither a verified email nor a usable subject (sub): "
                            "nobody to sign in")
    return name


def role_for(claims: Mapping, settings: Settings | RoleMapping) -> str:
    """The role of a user the identity provider signed in, from their ``claims`` (``st.user``)
    and the settings' ``roles``; the first rule that matches wins:

    1. ``admins`` names their verified email (any case) or their subject (exact) -> admin;
    2. one of their groups is in ``admin_groups`` -> admin;
    3. one of their groups is in ``member_groups`` -> member;
    4. their verified email's domain is in ``member_domains`` (exactly, not a subdomain) -> member;
    5. else ``default_role`` (viewer unless the settings say member).
    """
    mapping = _mapping(settings)
    email, sub = verified_email(claims, mapping), subject(claims)
    admin_emails = {entry.lower() for entry in mapping.admins}
    if (email is not None and email in admin_emails) or (sub is not None and sub in mapping.admins):
        return "admin"
    groups = claim_groups(claims, mapping)
    if groups & set(mapping.admin_groups):
        return "admin"
    if groups & set(mapping.member_groups):
        return "member"
    if email is not None and email.rpartition("@")[2] in mapping.member_domains:
        return "member"
    return mapping.default_role


# ---- the CLI ------------------------------------------------------------------------------------

def is_server_store(url: str | None) -> bool:
    """True when ``WORKBENCH_DB`` names a database server (a URL whose scheme is not sqlite, e.g.
    'postgresql://...', 'postgresql+psycopg://...'); False when unset, a sqlite URL or a plain path."""
    text = (url or "").strip()
    if "://" not in text:
        return False
    scheme = text.split("://", 1)[0].split("+", 1)[0].lower()
    return scheme != "sqlite"


def cli_role(user: str, settings: Settings | RoleMapping, *, server_store: bool) -> str:
    """The CLI's role: admin on the local SQLite file; on a server database ``cli_roles[user]``,
    else member."""
    if not server_store:
        return "admin"
    return _mapping(settings).cli_roles.get(user, CLI_SERVER_DEFAULT_ROLE)


# A CLI process resolves its token once per store: the command line checks it before anything is
# done and the command asks again, and each lookup wrote last_used_at (and a refusal's audit entry).
_TOKEN_PRINCIPALS: dict[tuple[str, str, str], Principal] = {}


def _token_principal(secret: str) -> Principal:
    """``apitokens.token_principal(secret)`` on the store this process's environment names, looked
    up on the first call only (a refusal raises every time and is not kept)."""
    key = (secret, os.environ.get(SERVER_STORE_ENV, ""), os.environ.get("WORKBENCH_HOME", ""))
    if key not in _TOKEN_PRINCIPALS:
        from workbench.runs.apitokens import token_principal  # the store only when a token is given
        _TOKEN_PRINCIPALS[key] = token_principal(secret)
    return _TOKEN_PRINCIPALS[key]


def cli_principal(env: Mapping[str, str] | None = None, home: Path | None = None) -> Principal:
    """Who the CLI acts as: the OS user, with ``cli_role`` for the store ``env`` (default: this
    process's environment) points at. Reads the settings only for a server database (a broken
    settings file then raises ``SettingsError``, naming the field)."""
    env = os.environ if env is None else env
    if env.get("WORKBENCH_TOKEN", "").strip():
        return _token_principal(env["WORKBENCH_TOKEN"])
    user = local_user_name()
    server = is_server_store(env.get(SERVER_STORE_ENV))
    settings = load_settings(home) if server else Settings()
    return Principal(user, cli_role(user, settings, server_store=server), LOCAL_AUTH)
