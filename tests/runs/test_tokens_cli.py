"""API tokens through the real CLI in subprocesses, on a SQLite store in tmp_path: create prints the
secret once, list never shows it, a member's token is refused the admin-only commands, revoked and
unknown tokens stop every store command with exit 2 naming WORKBENCH_TOKEN, and the audit log has
the create, the revoke and the refusal."""

from __future__ import annotations

import os
import subprocess
import sys

import sqlalchemy as sa

from tests.runs.test_arms import full_queue  # noqa: F401  (a home whose CPU slot is held: launches queue)


def _cli(home, *args, token=None):
    env = {**os.environ, "WORKBENCH_HOME": str(home)}
    env.pop("WORKBENCH_DB", None)
    env.pop("WORKBENCH_TOKEN", None)
    if token is not None:
        env["WORKBENCH_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "workbench", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_create_use_revoke_and_refuse_through_the_cli(tmp_path):
    made = _cli(tmp_path, "tokens", "create", "--user", "ada@example.org", "--days", "30", "--label", "laptop")
    assert made.returncode == 0, made.stderr
    secret = next(line.split("=", 1)[1] for line in made.stdout.splitlines() if line.startswith("WORKBENCH_TOKEN="))
    token_id = made.stdout.split()[1]
    assert secret.startswith("wb_")

    listed = _cli(tmp_path, "tokens", "list")
    assert listed.returncode == 0 and token_id in listed.stdout and secret not in listed.stdout

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'runs.db'}")
    with engine.connect() as conn:
        cells = [str(c) for row in conn.execute(sa.text("SELECT * FROM api_tokens")) for c in row]
    engine.dispose()
    assert cells and not any(secret in c for c in cells)

    as_member = _cli(tmp_path, "tokens", "list", token=secret)  # a member may not manage tokens
    assert as_member.returncode == 2 and "tokens" in as_member.stderr and as_member.stdout == ""
    assert _cli(tmp_path, "runs", "list", token=secret).returncode == 0  # a member may read

    bad_days = _cli(tmp_path, "tokens", "create", "--user", "bob", "--days", "400")
    assert bad_days.returncode == 2 and "days=400" in bad_days.stderr

    assert _cli(tmp_path, "tokens", "revoke", token_id).returncode == 0
    revoked = _cli(tmp_path, "runs", "list", token=secret)
    assert revoked.returncode == 2 and "WORKBENCH_TOKEN" in revoked.stderr and "revoked" in revoked.stderr
    assert revoked.stdout == ""
    unknown = _cli(tmp_path, "runs", "list", token="wb_" + "x" * 43)
    assert unknown.returncode == 2 and "WORKBENCH_TOKEN is not a known token" in unknown.stderr

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'runs.db'}")
    with engine.connect() as conn:
        actions = [row[0] for row in conn.execute(sa.text("SELECT action FROM audit ORDER BY id"))]
    engine.dispose()
    assert actions.count("token_create") == 1 and "token_revoke" in actions and "token_refused" in actions


def test_a_members_token_cancels_their_own_app_launched_run_and_not_anothers(full_queue):
    """The token's user is the owner the app records for an OIDC sign-in (the verified email), so a
    run launched from the app is the token holder's; someone else's stays untouched."""
    from tests.runs.test_authz import _seed

    store = full_queue  # its home's only CPU slot is held: queued runs stay queued, nothing trains
    tmp_path = store.path.parent
    made = _cli(tmp_path, "tokens", "create", "--user", "ada@example.org", "--role", "member")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.split("WORKBENCH_TOKEN=", 1)[1].split()[0]
    _seed(store, tmp_path, "adas", "queued", owner="ada@example.org")
    _seed(store, tmp_path, "bobs", "queued", owner="bob@example.org")

    theirs = _cli(tmp_path, "runs", "cancel", "bobs", token=secret)
    assert theirs.returncode == 2 and "permission denied" in theirs.stderr
    assert store.get_run("bobs").status == "queued"
    own = _cli(tmp_path, "runs", "cancel", "adas", token=secret)
    assert own.returncode == 0, own.stderr
    assert store.get_run("adas").status == "cancelled"


def test_an_expired_token_stops_the_real_cli_and_its_list_says_expired(tmp_path, monkeypatch):
    """A token issued ten days ago for one day (the service's clock set back at issue) is refused by
    the CLI with one line naming WORKBENCH_TOKEN and 'expired', exit 2, nothing printed; the
    admin's list marks it expired."""
    import time

    from workbench.runs import RunStore
    from workbench.runs.apitokens import create_token
    from workbench.runs.authz import Principal

    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))
    monkeypatch.delenv("WORKBENCH_DB", raising=False)
    secret, record = create_token(Principal("root", "admin", "test"), user="ada@example.org", role="member", days=1,
                                  store=RunStore(), now=time.time() - 10 * 86400)
    expired = _cli(tmp_path, "runs", "list", token=secret)
    assert expired.returncode == 2 and expired.stdout == ""
    assert expired.stderr.strip() == f"error: WORKBENCH_TOKEN (token {record.id}) expired"
    listed = _cli(tmp_path, "tokens", "list")
    row = next(line.split("\t") for line in listed.stdout.splitlines() if line.startswith(record.id))
    assert row[-1] == "expired" and secret not in listed.stdout


def test_a_cli_process_looks_its_token_up_once(tmp_path, monkeypatch):
    """The command line checks WORKBENCH_TOKEN before the command and the command asks for its
    principal again: the second ask is answered without the store (a token revoked between them
    still acts for the command under way; its last use is written once); the next process is refused."""
    from workbench.runs import RunStore
    from workbench.runs.apitokens import create_token, revoke_token
    from workbench.runs.authz import TOKEN_AUTH, Principal
    from workbench.runs.roles import cli_principal

    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))
    monkeypatch.delenv("WORKBENCH_DB", raising=False)
    admin = Principal("root", "admin", "test")
    secret, record = create_token(admin, user="ada@example.org", role="member", days=1, store=RunStore())
    monkeypatch.setenv("WORKBENCH_TOKEN", secret)
    assert cli_principal() == Principal("ada@example.org", "member", TOKEN_AUTH)
    first_use = RunStore().token_by_hash(record.secret_sha256).last_used_at
    revoke_token(admin, record.id, store=RunStore())
    assert cli_principal() == Principal("ada@example.org", "member", TOKEN_AUTH)
    assert RunStore().token_by_hash(record.secret_sha256).last_used_at == first_use is not None
    refused = _cli(tmp_path, "runs", "list", token=secret)
    assert refused.returncode == 2 and "revoked" in refused.stderr
