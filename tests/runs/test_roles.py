"""Who gets which role (workbench.runs.roles): from an identity provider's claims through the
settings' role mapping, and the CLI's role on the local file vs a server database. Every rule,
their order, what is never trusted (unverified emails, junk claims), and the settings' one-line
errors for a bad mapping."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from workbench.runs import PermissionDenied, RunStore, cancel
from workbench.runs.authz import LOCAL_AUTH, ROLES
from workbench.runs.roles import (IdentityError, cli_principal, cli_role, identity_name, is_server_store, role_for,
                                  verified_email)
from workbench.runs.settings import DEFAULT_ROLES, RoleMapping, Settings, SettingsError, load_settings, save_settings

TEAM = Settings(roles=RoleMapping(admins=["Ada@Lab.org", "sub-root"], admin_groups=["wb-admins"],
                                  member_groups=["wb-members"], member_domains=["lab.org"]))


def claims(sub="u1", email=None, verified=True, groups=None, **extra) -> dict:
    out = {"sub": sub, **extra}
    if email is not None:
        out |= {"email": email, "email_verified": verified}
    if groups is not None:
        out["groups"] = groups
    return out


@pytest.mark.parametrize("user, role", [
    # 1. the admin list: a verified email (any case) or a subject (exact)
    (claims(email="ada@lab.org"), "admin"),
    (claims(email="ADA@LAB.ORG"), "admin"),
    (claims(sub="sub-root"), "admin"),
    (claims(sub="SUB-ROOT"), "viewer"),  # a subject is an opaque id: exact only
    (claims(email="ada@lab.org", verified=False), "viewer"),  # unverified: neither the list nor the domain counts
    # 2. admin groups beat member rules
    (claims(email="eve@elsewhere.org", groups=["wb-admins"]), "admin"),
    (claims(email="mel@lab.org", groups=["wb-members", "wb-admins"]), "admin"),
    (claims(groups="wb-admins"), "admin"),  # one group as a plain string
    # 3. member groups
    (claims(email="eve@elsewhere.org", groups=["wb-members"]), "member"),
    (claims(groups=["WB-MEMBERS"]), "viewer"),  # group names are exact
    # 4. member domains: exactly the domain, verified only
    (claims(email="mel@lab.org"), "member"),
    (claims(email="mel@LAB.org"), "member"),
    (claims(email="mel@sub.lab.org"), "viewer"),
    (claims(email="mel@evil-lab.org"), "viewer"),
    (claims(email="lab.org@evil.org"), "viewer"),
    (claims(email="mel@lab.org", verified="true"), "member"),  # some providers send the string
    (claims(email="mel@lab.org", verified="false"), "viewer"),
    # 5. the default
    (claims(email="vic@elsewhere.org"), "viewer"),
    (claims(), "viewer"),
    (claims(groups=["other"]), "viewer"),
])
def test_role_for_each_rule_in_order(user, role):
    assert role_for(user, TEAM) == role


def test_unverified_email_counts_only_when_the_settings_trust_it():
    trusting = Settings(roles=TEAM.roles.model_copy(update={"trust_unverified_email": True}))
    no_flag = {"sub": "s", "email": "ada@lab.org"}  # Entra ID sends no email_verified at all
    assert role_for(no_flag, TEAM) == "viewer" and identity_name(no_flag, TEAM) == "s"
    assert role_for(no_flag, trusting) == "admin" and identity_name(no_flag, trusting) == "ada@lab.org"
    assert role_for({"sub": "s", "email": "mel@lab.org"}, trusting) == "member"


def test_default_role_member_and_the_groups_claim_setting():
    open_team = Settings(roles=RoleMapping(default_role="member"))
    assert role_for(claims(email="x@anywhere.org"), open_team) == "member"
    by_roles = Settings(roles=RoleMapping(admin_groups=["ops"], groups_claim="roles"))
    assert role_for({"sub": "s", "roles": ["ops"]}, by_roles) == "admin"
    assert role_for({"sub": "s", "groups": ["ops"]}, by_roles) == "viewer"  # the other claim is not read


# every combination of the claims' features x the mapping's rules, against the rule table by hand
FEATURES = {"admin_listed": (False, True), "admin_group": (False, True), "member_group": (False, True),
            "domain": (False, True), "verified": (False, True)}


@pytest.mark.parametrize("combo", list(itertools.product(*FEATURES.values())),
                         ids=lambda c: "-".join(k for k, v in zip(FEATURES, c) if v) or "none")
@pytest.mark.parametrize("default", DEFAULT_ROLES)
def test_role_for_every_combination(combo, default):
    admin_listed, admin_group, member_group, domain, verified = combo
    email = ("boss" if admin_listed else "someone") + ("@lab.org" if domain else "@elsewhere.org")
    groups = (["g-admin"] if admin_group else []) + (["g-member"] if member_group else [])
    mapping = Settings(roles=RoleMapping(admins=["boss@lab.org", "boss@elsewhere.org"], admin_groups=["g-admin"],
                                         member_groups=["g-member"], member_domains=["lab.org"], default_role=default))
    expected = ("admin" if (admin_listed and verified) or admin_group else
                "member" if member_group or (domain and verified) else default)
    assert role_for(claims(email=email, verified=verified, groups=groups), mapping) == expected


JUNK = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=8)


@hsettings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["sub", "email", "email_verified", "groups", "name", "iat"]), JUNK))
def test_junk_claims_never_raise_and_never_reach_a_rule(junk):
    """Claims are the provider's (and, through a misconfigured provider, anyone's) to fill: any
    value gives a role without raising, and only well-formed values can match a rule."""
    role = role_for(junk, TEAM)
    assert role in ROLES
    if role != "viewer":
        assert verified_email(junk, TEAM) or isinstance(junk.get("groups"), (list, str)) or junk.get("sub") == "sub-root"


@hsettings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["wb-admins", "wb-members", "x", "y"]), max_size=4),
       st.sampled_from(["ada@lab.org", "mel@lab.org", "vic@else.org"]), st.booleans())
def test_more_groups_never_lower_a_role(groups, email, verified):
    base = role_for(claims(email=email, verified=verified, groups=groups), TEAM)
    more = role_for(claims(email=email, verified=verified, groups=[*groups, "wb-members"]), TEAM)
    assert ROLES.index(more) >= ROLES.index(base)


def test_identity_name_is_the_verified_email_else_the_subject():
    assert identity_name(claims(sub="abc", email="Ada@Lab.org"), TEAM) == "ada@lab.org"
    assert identity_name(claims(sub="abc", email="ada@lab.org", verified=False), TEAM) == "abc"
    assert identity_name({"sub": " abc "}, TEAM) == "abc"
    for nobody in ({}, {"sub": ""}, {"sub": "a b"}, {"sub": 7}, {"sub": "x" * 256},
                   {"email": "ada@lab.org", "email_verified": False}):
        with pytest.raises(IdentityError, match="neither a verified email nor a usable subject"):
            identity_name(nobody, TEAM)


@pytest.mark.parametrize("mapping, message", [
    ({"default_role": "admin"}, "roles.default_role='admin': not allowed; one of: viewer, member"),
    ({"member_domains": ["@lab.org"]}, "roles.member_domains=['@lab.org']: entry '@lab.org' is not allowed; a domain"),
    ({"member_domains": ["https://lab.org"]}, "entry 'https://lab.org' is not allowed; a domain such as lab.org"),
    ({"admins": ["a b"]}, "roles.admins=['a b']: entry 'a b' is not allowed; an email address or a subject"),
    ({"admin_groups": [""]}, "roles.admin_groups=['']: entry '' is not allowed; a group name"),
    ({"cli_roles": {"bob": "root"}}, "roles.cli_roles: bob='root' is not allowed; a role, one of: viewer, member, admin"),
    ({"cli_roles": {"bob smith": "member"}}, "roles.cli_roles: user 'bob smith' is not allowed; a POSIX user name"),
    ({"groups_claim": "a b"}, "roles.groups_claim='a b': not allowed; a claim name"),
    ({"admin": ["x"]}, "roles.admin=['x']: unknown field; allowed here: admins, admin_groups"),
])
def test_a_bad_role_mapping_is_one_line_naming_the_field(tmp_path, mapping, message):
    import yaml

    (tmp_path / "settings.yaml").write_text(yaml.safe_dump({"roles": mapping}))
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path)
    lines = str(err.value).splitlines()
    assert len(lines) == 2 and lines[0].endswith("invalid settings:") and message in lines[1], str(err.value)


def test_role_mapping_round_trips_through_the_settings_file(tmp_path):
    save_settings(TEAM, tmp_path)
    loaded = load_settings(tmp_path)
    assert loaded.roles.admins == ["Ada@Lab.org", "sub-root"] and loaded.roles.member_domains == ["lab.org"]
    assert role_for(claims(email="ada@lab.org"), loaded) == "admin"


# ---- the CLI ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("url, server", [
    (None, False), ("", False), ("/srv/wb/runs.db", False), ("sqlite:///srv/wb/runs.db", False),
    ("SQLITE+pysqlite:///x.db", False), ("postgresql://wb@db:5432/wb", True),
    ("postgresql+psycopg://wb@127.0.0.1/wb", True), ("mysql://h/db", True),
])
def test_server_store_is_told_by_the_url_scheme(url, server):
    assert is_server_store(url) is server


def test_cli_is_admin_on_the_local_file_and_mapped_on_a_server_store(tmp_path):
    import os
    import pwd

    user = pwd.getpwuid(os.geteuid()).pw_name
    save_settings(Settings(roles=RoleMapping(cli_roles={user: "viewer", "ops": "admin"})), tmp_path)
    local = cli_principal({}, tmp_path)
    assert (local.name, local.role, local.auth) == (user, "admin", LOCAL_AUTH)
    assert cli_principal({"WORKBENCH_DB": "sqlite:////x/runs.db"}, tmp_path).role == "admin"
    assert cli_principal({"WORKBENCH_DB": "postgresql://db/wb"}, tmp_path).role == "viewer"
    assert cli_role("ops", load_settings(tmp_path), server_store=True) == "admin"
    assert cli_role("someone", load_settings(tmp_path), server_store=True) == "member"  # unlisted: member
    assert cli_role("someone", load_settings(tmp_path), server_store=False) == "admin"
    (tmp_path / "settings.yaml").write_text("roles: {cli_roles: {x: boss}}\n")
    with pytest.raises(SettingsError, match="x='boss' is not allowed"):
        cli_principal({"WORKBENCH_DB": "postgresql://db/wb"}, tmp_path)
    assert cli_principal({}, tmp_path).role == "admin"  # the local file never reads the mapping


def test_the_cli_user_is_the_kernels_not_the_environments(tmp_path, monkeypatch):
    """$USER / $LOGNAME are the caller's to set: they must not borrow another user's role."""
    import os
    import pwd

    real = pwd.getpwuid(os.geteuid()).pw_name
    save_settings(Settings(roles=RoleMapping(cli_roles={"ops": "admin"})), tmp_path)
    for name in ("USER", "LOGNAME", "LNAME", "USERNAME"):
        monkeypatch.setenv(name, "ops")
    principal = cli_principal({"WORKBENCH_DB": "postgresql://db/wb"}, tmp_path)
    assert (principal.name, principal.role) == (real, "member")


def test_every_cli_command_acts_as_the_cli_principal():
    """``local_principal()`` is admin whatever the store: a command that used it (``import`` did)
    would let a viewer of a server store act as admin. The CLI's modules name only ``cli_principal``."""
    import workbench.cli
    import workbench.runs.cli

    for module in (workbench.cli, workbench.runs.cli):
        source = Path(module.__file__).read_text()
        assert "local_principal" not in source, module.__name__
    assert "cli_principal()" in Path(workbench.runs.cli.__file__).read_text()


def test_a_cli_member_on_a_server_store_cannot_cancel_another_users_run(tmp_path, monkeypatch):
    """The service applies the app's rule to the CLI's principal (here against a real SQLite store:
    the rule does not depend on the backend)."""
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))
    store = RunStore(tmp_path / "runs.db")
    store.create_run(run_id="theirs", name="theirs", algorithm="grpo", recipe_yaml="name: x\n", total_steps=1,
                     target="local", launcher="local", host="localhost", created_by="ada@lab.org",
                     run_dir=str(tmp_path / "runs" / "theirs"))
    member = cli_principal({"WORKBENCH_DB": "postgresql://db/wb"}, tmp_path)
    assert member.role == "member"
    with pytest.raises(PermissionDenied, match=f"cancel run theirs by {member.name} \\(member, local OS user\\)"):
        cancel("theirs", principal=member, store=store, wait=False)
    assert store.get_run("theirs").status == "queued"
