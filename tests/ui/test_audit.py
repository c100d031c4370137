"""The audit log in the app: the password sign-in's sign-in, refusal and sign-out are written to
it through the run service (with the client's address), and the Audit page shows it to admins
only, newest first, filtered, and as a CSV a spreadsheet cannot run. Real SQLite store; the
identity provider's sign-ins are tested in chromium (tests/e2e/test_oidc_browser.py)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.ui.conftest import page
from workbench.runs import service
from workbench.runs.authz import PASSWORD_AUTH, Principal
from workbench.ui import audit_page

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def sign_in_as(at: AppTest, user: str, password: str) -> list[str]:
    at.sidebar.text_input(key="wb_login_user").input(user)
    at.sidebar.text_input(key="wb_login_password").input(password)
    next(b for b in at.button if b.label == "Sign in").click().run()
    return [e.value for e in at.sidebar.error]


def entries(store, **filters) -> list[tuple]:
    return [(e.actor, e.role, e.auth, e.action, e.target, e.detail, e.address)
            for e in store.audit_entries(**filters)]


def test_password_sign_in_its_refusal_and_sign_out_are_audited(home, store, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PASSWORD", "s3cret")
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert sign_in_as(at, "carol", "guess") == ["Wrong password."]
    assert sign_in_as(at, "carol", "s3cret") == []
    next(b for b in at.sidebar.button if b.label == "Sign out").click().run()
    assert "wb_user" not in at.session_state
    claimed = "carol (password)"  # a typed name is a claim: suffixed, as on the runs it launches
    assert entries(store)[::-1] == [
        (claimed, "", PASSWORD_AUTH, "sign_in_refused", "", "wrong password", "local"),
        (claimed, "admin", PASSWORD_AUTH, "sign_in", "", "password", "local"),
        (claimed, "admin", PASSWORD_AUTH, "sign_out", "", "", "local"),
    ]


def test_attempts_refused_while_locked_are_not_written(home, store, monkeypatch):
    """Wrong passwords are rate-limited by the ledger, so each is written; an attempt refused
    while locked costs nothing, so it is only logged (else anyone could fill the log)."""
    monkeypatch.setenv("WORKBENCH_PASSWORD", "s3cret")
    from workbench.ui import auth

    for _ in range(5):
        auth.sign_in("mallory", "guess", address="203.0.113.9")
    for _ in range(20):
        assert auth.sign_in("mallory", "guess", address="203.0.113.9").startswith("Too many failed sign-ins")
    refused = entries(store, action="sign_in_refused")
    assert len(refused) == 5 and {r[-1] for r in refused} == {"203.0.113.9"}


ADMIN = Principal("root", "admin", "test")


@pytest.fixture
def logged(store):
    """Four entries: a member's sign-in and launch from another machine, then an admin's launch
    whose target a spreadsheet would run as a formula, and a settings save."""
    bob = Principal("bob", "member", "test", address="192.0.2.7")
    service.record_event(bob, "sign_in", detail="password")
    service.record_event(bob, "launch", "run-1")
    service.record_event(ADMIN, "launch", "=HYPERLINK(\"http://x\")")
    service.record_event(ADMIN, "settings", "settings", "cpu_slots 3 -> 4")
    return store


def test_the_audit_page_lists_newest_first_and_filters(home, logged):
    at = page("audit_page").run()  # this machine only, no password: the OS user, admin
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    assert table["action"].tolist() == ["settings", "launch", "launch", "sign_in"]
    assert table["actor"].tolist()[-2:] == ["bob", "bob"] and table["address"].tolist()[-1] == "192.0.2.7"
    at.selectbox(key="audit_action").select("launch").run()
    assert at.dataframe[0].value["target"].tolist() == ['=HYPERLINK("http://x")', "run-1"]
    at.text_input(key="audit_actor").input("bob").run()
    assert at.dataframe[0].value["target"].tolist() == ["run-1"]
    at.selectbox(key="audit_action").select("(all)").run()
    assert at.dataframe[0].value["action"].tolist() == ["launch", "sign_in"]


def test_the_csv_export_is_the_table_and_runs_no_formula(home, logged):
    frame = audit_page.entries_frame(service.audit_log(ADMIN))
    rows = list(csv.DictReader(io.StringIO(audit_page.audit_csv(frame).decode("utf-8"))))
    assert [r["action"] for r in rows] == frame["action"].tolist()
    assert rows[1]["target"] == "'=HYPERLINK(\"http://x\")"  # shown as text, not run
    assert rows[0]["detail"] == "cpu_slots 3 -> 4" and rows[3]["address"] == "192.0.2.7"
    assert list(rows[0]) == audit_page.COLUMNS


@pytest.mark.parametrize("role", ["viewer", "member"])
def test_the_audit_page_refuses_everyone_but_admins_in_one_line(home, logged, monkeypatch, role):
    monkeypatch.setenv("WORKBENCH_PASSWORD", "s3cret")
    at = page("audit_page")
    at.session_state["wb_user"], at.session_state["wb_role"], at.session_state["wb_authed"] = "bob", role, True
    at.run()
    assert [e.value for e in at.error] == [
        f"Refused: permission denied: audit by bob ({role}, shared password): needs role admin"]
    assert not at.dataframe and not at.text_input and not at.selectbox  # nothing of the log, not even its filters
    with pytest.raises(service.PermissionDenied, match="audit by bob"):
        service.audit_log(Principal("bob", role, PASSWORD_AUTH))
