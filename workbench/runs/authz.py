"""Who acts, and the one rule that says what they may do: checked in the service, below every UI.

A ``Principal`` is the acting user: a name (recorded as a run's ``created_by``), a role and how
they were authenticated. Roles, lowest first:

- ``viewer``: reads everything, changes nothing;
- ``member``: launches runs, and cancels, resumes, deletes and edits (name, tags, notes) the runs
  they launched (``created_by`` equals their ``owner``);
- ``admin``: everything, including other people's runs and the workbench settings.

Every action of the service (``launch``, ``launch_planned``, ``launch_group``, ``cancel``,
``resume``, ``delete``, ``edit_run``, ``update_settings``) takes the principal and calls
``authorize`` before it changes anything; a refusal is ``PermissionDenied``, one line naming the
action, the user and what is needed. The app (``workbench.ui.auth.current_principal``) builds the
principal from its sign-in state; the CLI acts as ``local_principal()``. A later API or a team
identity provider only builds principals: the rule stays here.

Ownership is as strong as the identity behind it. A name typed at a shared-password sign-in is a
claim, not an identity (anyone with the password can type any name), so it is recorded with the
suffix " (password)" (``Principal.owner``): a verified name (the OS user, a later identity
provider) can never equal it, and no password member can take over the runs launched from the
CLI or before a password was set. Between password members, ownership prevents mistakes, not
impersonation: give people their own admin password, or an identity provider (issue 21).
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from workbench.runs.records import Run, RunError

ROLES = ("viewer", "member", "admin")  # lowest first: a role may do what the roles before it may
LOCAL_AUTH = "local OS user"
PASSWORD_AUTH = "shared password"
TOKEN_AUTH = "API token"  # WORKBENCH_TOKEN, issued by an admin (workbench.runs.apitokens)
OIDC_AUTH = "OpenID Connect"  # verified by the team's identity provider (workbench.runs.roles)
# How names are established that are claims, not identities: their owner key carries a suffix with
# a space, which no checked user name can contain.
CLAIMED_AUTHS = {PASSWORD_AUTH: " (password)"}


class PermissionDenied(RunError):
    """The acting principal may not do this (one line: the action, the user, what is needed)."""


@dataclass(frozen=True)
class Principal:
    """Who acts: ``name`` (the owner recorded on what they launch), ``role`` (one of ``ROLES``),
    ``auth`` (how the name was established: "local OS user", "shared password", ...) and
    ``address`` (where from, for the audit log)."""

    name: str
    role: str
    auth: str
    address: str = ""
    """Where the request came from (the client's address; "" for the CLI): recorded in the audit log."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role={self.role!r} is not allowed; one of: {', '.join(ROLES)}")
        if not self.name:
            raise ValueError("a principal needs a name")

    def at_least(self, role: str) -> bool:
        return ROLES.index(self.role) >= ROLES.index(role)

    @property
    def owner(self) -> str:
        """What a run this principal launches records as ``created_by``, and what ``owns`` compares:
        the name, suffixed when it is only claimed (``CLAIMED_AUTHS``)."""
        return self.name + CLAIMED_AUTHS.get(self.auth, "")

    def owns(self, run: Run) -> bool:
        return run.created_by == self.owner

    def __str__(self) -> str:
        return f"{self.name} ({self.role}, {self.auth})"


def local_user_name() -> str:
    """The OS user running this process: the passwd name of its effective uid, as the kernel
    knows it. Not ``getpass.getuser()``, which believes ``$USER`` / ``$LOGNAME``: on a shared
    store ``USER=ops workbench runs cancel ...`` would borrow the role ``roles.cli_roles`` gives
    ``ops``. A uid without a passwd entry is named ``uid-N``."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name or f"uid-{os.geteuid()}"
    except KeyError:
        return f"uid-{os.geteuid()}"


def local_principal() -> Principal:
    """The CLI's principal: the local OS user, role ``admin``. The CLI works on a store file in
    the user's own workbench home; whoever can run it can read and write that file directly, so a
    lesser role would protect nothing (a team server's store is another matter: issue 21)."""
    return Principal(local_user_name(), "admin", LOCAL_AUTH)


@dataclass(frozen=True)
class Rule:
    """What an action needs: at least ``role``; with ``own_run`` a member only for runs they own."""

    role: str
    own_run: bool = False

    def allows(self, principal: Principal, run: Run | None) -> bool:
        if principal.role == "admin":
            return True
        if not principal.at_least(self.role):
            return False
        return not self.own_run or (run is not None and principal.owns(run))

    def needs(self, run: Run | None) -> str:
        if self.own_run:
            owner = f" ({run.created_by})" if run is not None else ""
            return f"to be the run's owner{owner} with role member, or role admin"
        return f"role {self.role}" + (" or admin" if self.role != "admin" else "")


# action -> its rule: the one table of who may do what
RULES: dict[str, Rule] = {
    "launch": Rule("member"),
    "cancel": Rule("member", own_run=True),
    "resume": Rule("member", own_run=True),
    "delete": Rule("member", own_run=True),
    "edit": Rule("member", own_run=True),  # name, tags, notes
    "settings": Rule("admin"),
    "audit": Rule("admin"),  # read the audit log
    "tokens": Rule("admin"),  # create, list or revoke API tokens (`python -m workbench tokens`)
    "database": Rule("admin"),  # upgrade or copy a server database (`python -m workbench db`, runs/dbtools.py)
}
ACTIONS = tuple(RULES)


def refusal(principal: Principal, action: str, run: Run | None = None) -> str | None:
    """Why ``principal`` may not do ``action`` (to ``run``), or None when they may."""
    rule = RULES.get(action)
    if rule is None:
        raise ValueError(f"action={action!r} is not allowed; one of: {', '.join(ACTIONS)}")
    if rule.allows(principal, run):
        return None
    what = f"{action} run {run.id}" if run is not None else action
    return f"permission denied: {what} by {principal}: needs {rule.needs(run)}"


def authorize(principal: Principal, action: str, run: Run | None = None) -> None:
    """PermissionDenied (naming the action, the user and what is needed) unless allowed."""
    if not isinstance(principal, Principal):
        raise PermissionDenied(f"permission denied: {action} needs an acting principal, got {type(principal).__name__}")
    reason = refusal(principal, action, run)
    if reason is not None:
        raise PermissionDenied(reason)

