"""The API tokens page: an admin issues a token (its secret shown once, then gone from the page),
sees it listed without its secret, and revokes it; the token works through the service until then
and is refused after; everyone else is refused in one line with nothing of the list. Real SQLite
store, the run service's own authorisation and audit."""

from __future__ import annotations

import pytest

from tests.ui.conftest import page
from workbench.runs import apitokens
from workbench.runs.authz import TOKEN_AUTH, Principal
from workbench.runs.tokens import TOKEN_COLUMNS, TokenError


def _codes(at) -> list[str]:
    return [c.value for c in at.code]


def test_an_admin_issues_lists_and_revokes_a_token(home, store):
    at = page("tokens_page").run()  # this machine only, no password: the OS user, admin
    assert not at.exception and not at.error
    assert at.dataframe[0].value.empty and list(at.dataframe[0].value.columns) == list(TOKEN_COLUMNS)
    at.text_input(key="token_user").input("ada@lab.org")
    at.selectbox(key="token_role").select("member")
    at.number_input(key="token_days").set_value(7)
    at.text_input(key="token_label").input("cluster login node")
    next(b for b in at.button if b.label == "Issue token").click().run()
    assert not at.exception and not at.error
    (code,) = _codes(at)
    assert code.startswith("export WORKBENCH_TOKEN=wb_")
    secret = code.split("=", 1)[1]
    table = at.dataframe[0].value
    assert table[["user", "role", "label", "status"]].values.tolist() == [["ada@lab.org", "member", "cluster login node", "active"]]
    assert not table.isin([secret]).any().any()  # listed without its secret
    assert apitokens.token_principal(secret, store=store) == Principal("ada@lab.org", "member", TOKEN_AUTH)

    at.run()  # the next run of the page: the secret is not shown again
    assert _codes(at) == []
    token_id = table["id"][0]
    assert at.selectbox(key="token_revoke_id").value == token_id
    at.button(key=f"token_revoke:{token_id}").click().run()
    assert not at.exception and not at.error
    assert at.dataframe[0].value["status"].tolist() == ["revoked"]
    with pytest.raises(TokenError, match="was revoked"):
        apitokens.token_principal(secret, store=store)
    actions = [(e.action, e.target) for e in store.audit_entries()]
    assert ("token_create", token_id) in actions and ("token_revoke", token_id) in actions


def test_a_bad_field_is_one_line_and_issues_nothing(home, store):
    at = page("tokens_page").run()
    at.text_input(key="token_user").input("two words")
    next(b for b in at.button if b.label == "Issue token").click().run()
    assert [e.value for e in at.error] == [
        "user='two words' is not allowed; 1..255 printable characters, no spaces (the name the app records as owner: "
        "a verified email or subject)"]
    assert _codes(at) == [] and at.dataframe[0].value.empty


@pytest.mark.parametrize("role", ["viewer", "member"])
def test_the_tokens_page_refuses_everyone_but_admins_in_one_line(home, store, monkeypatch, role):
    monkeypatch.setenv("WORKBENCH_PASSWORD", "s3cret")
    apitokens.create_token(Principal("root", "admin", "test"), user="ada@lab.org", role="member", days=3, store=store)
    at = page("tokens_page")
    at.session_state["wb_user"], at.session_state["wb_role"], at.session_state["wb_authed"] = "bob", role, True
    at.run()
    assert [e.value for e in at.error] == [
        f"Refused: permission denied: tokens by bob ({role}, shared password): needs role admin"]
    assert not at.dataframe and not at.text_input and not at.button and not at.code


def test_a_queued_revoke_never_acts_on_the_token_chosen_after_it(home, store):
    """The runs page's queued-click case on Revoke: a click on Revoke while token A was chosen,
    handled in one rerun with token B chosen, revokes neither (the button's key names its token);
    B's own button then revokes B alone. The button is found by its label, so the test runs on
    either keying (with one key for every token, one of them was revoked: checked)."""
    admin = Principal("admin", "admin", "test")
    (_, a), (_, b) = (apitokens.create_token(admin, user=u, role="member", days=7, store=store) for u in ("ada", "bob"))
    at = page("tokens_page").run()
    at.selectbox(key="token_revoke_id").select(a.id).run()
    next(button for button in at.button if button.label == "Revoke").click()
    at.selectbox(key="token_revoke_id").select(b.id)
    at.run()  # one rerun: the click on A's Revoke and B chosen
    assert not at.exception and not at.error
    assert [t.revoked_at for t in store.tokens()] == [None, None]
    at.button(key=f"token_revoke:{b.id}").click().run()
    assert {t.id: t.revoked_at is not None for t in store.tokens()} == {a.id: False, b.id: True}
