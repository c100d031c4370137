"""Sign-in for teams: when a password is needed, what the form says, constant-time comparison,
and the signed-in name recorded as the owner of launched runs."""

from pathlib import Path

import pytest
from streamlit import config
from streamlit.testing.v1 import AppTest

from workbench import runs as wr
from workbench.ui.auth import auth_policy, check_user_name, is_local_address, password_matches

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def test_policy_by_address_and_password():
    assert is_local_address("127.0.0.1") and is_local_address("localhost") and is_local_address("::1")
    assert not is_local_address("0.0.0.0") and not is_local_address("") and not is_local_address(None)
    assert auth_policy("127.0.0.1", None).required is False
    local_pw = auth_policy("127.0.0.1", "s3cret")
    assert local_pw.required and local_pw.possible
    open_pw = auth_policy("0.0.0.0", "s3cret")
    assert open_pw.required and open_pw.possible and "listens on 0.0.0.0, beyond this machine" in open_pw.reason
    open_no_pw = auth_policy(None, None)
    assert open_no_pw.required and not open_no_pw.possible
    assert "all interfaces" in open_no_pw.reason and "WORKBENCH_PASSWORD" in open_no_pw.reason


def test_password_comparison_and_user_names():
    assert password_matches("s3cret", "s3cret") and not password_matches("s3cre", "s3cret")
    assert password_matches("pässwörd", "pässwörd")
    assert check_user_name(" alice@lab ") == "alice@lab"
    with pytest.raises(ValueError, match=r"user='a b' is not allowed"):
        check_user_name("a b")


def sign_in_button(at):
    return next(b for b in at.button if b.label == "Sign in")


def test_password_gates_launch_until_signed_in(home, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PASSWORD", "s3cret")
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert at.button(key="launch_go").disabled and at.button(key="quick_compare").disabled
    assert "A workbench password is set" in " ".join(c.value for c in at.sidebar.caption)
    at.sidebar.text_input(key="wb_login_user").input("carol")
    at.sidebar.text_input(key="wb_login_password").input("wrong")
    sign_in_button(at).click().run()
    assert at.sidebar.error[0].value == "Wrong password."
    assert at.button(key="launch_go").disabled
    at.sidebar.text_input(key="wb_login_password").input("s3cret")
    sign_in_button(at).click().run()
    assert at.session_state["wb_user"] == "carol"
    assert not at.button(key="launch_go").disabled
    at.selectbox(key="launch_target").select("slurm").run()  # refused by the launcher: nothing starts
    at.button(key="launch_go").click().run()
    # past the auth gate, to the launcher, which refuses the target
    assert [e.value for e in at.error] == [LAUNCHER_REFUSAL], [e.value for e in at.error]


LAUNCHER_REFUSAL = ("`sbatch` is not on PATH: the slurm target submits with SLURM's sbatch (run the workbench on a login "
                    "node of the cluster, or export the script with `python -m workbench export RUN --to sbatch` and "
                    "submit it there)")


def test_password_in_secrets_gates_launch_until_signed_in(home):
    at = AppTest.from_file(APP, default_timeout=60)
    at.secrets["password"] = "from-secrets"
    at.run()
    assert at.button(key="launch_go").disabled and at.button(key="quick_compare").disabled
    assert "A workbench password is set" in " ".join(c.value for c in at.sidebar.caption)
    at.sidebar.text_input(key="wb_login_user").input("frank")
    at.sidebar.text_input(key="wb_login_password").input("from-secrets")
    sign_in_button(at).click().run()
    assert at.session_state["wb_user"] == "frank"
    assert not at.button(key="launch_go").disabled and not at.button(key="quick_compare").disabled


def test_listening_beyond_localhost_without_password_disables_actions(home):
    config.set_option("server.address", "0.0.0.0")
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert at.button(key="launch_go").disabled
    warning = at.warning[0].value
    assert "listens on 0.0.0.0" in warning and "WORKBENCH_PASSWORD" in warning
    assert not [b for b in at.button if b.label == "Sign in"]  # nothing to sign in with


def test_owner_of_a_launch_from_the_page_is_the_signed_in_user(home, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PASSWORD", "s3cret")
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.sidebar.text_input(key="wb_login_user").input("dave")
    at.sidebar.text_input(key="wb_login_password").input("s3cret")
    sign_in_button(at).click().run()
    at.text_input(key="rf:train.steps").input("2").run()
    at.button(key="launch_go").click().run()
    store = wr.RunStore()
    runs = store.list_runs()
    try:
        assert runs["created_by"].tolist() == ["dave"]
    finally:
        for run_id in runs["id"]:
            wr.cancel(run_id, store=store, grace_s=5)


# A click the server takes although it drew the button disabled: what Streamlit before 1.61 does
# with a crafted websocket message (1.61+ drops it). The script swaps st.button for one that
# ignores ``disabled`` during its own run only, so the page's own re-check is what is tested.
FORGED = """
import streamlit as st
_button = st.button
st.button = lambda *args, disabled=False, **kwargs: _button(*args, **kwargs)
try:
    {render}
finally:
    st.button = _button
"""


def forged(render: str) -> AppTest:
    return AppTest.from_string(FORGED.format(render=render), default_timeout=60)


def refusal(at) -> list[str]:
    return [e.value for e in at.error if e.value.startswith("Refused: ")]


@pytest.fixture
def signed_out(home, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PASSWORD", "s3cret")
    return home


def test_forged_delete_and_cancel_are_refused(signed_out, store):
    from tests.ui.seed import LiveRun

    live = LiveRun(store, name="live")
    try:
        at = forged("from workbench.ui import runs_page; runs_page.render()").run()
        at.selectbox(key="runs_selected").select(live.run_id).run()
        at.checkbox(key=f"runs_confirm:{live.run_id}").check().run()
        at.button(key="runs_cancel").click().run()
        assert refusal(at) == ["Refused: Sign in (sidebar) to launch, cancel or delete runs."]
        assert live.proc.poll() is None  # still running
        at.button(key="runs_delete").click().run()
        assert refusal(at) == ["Refused: Sign in (sidebar) to launch, cancel or delete runs."]
        assert store.get_run(live.run_id)["status"] == "running"
    finally:
        live.stop()


def test_forged_launch_and_settings_save_are_refused(signed_out, store):
    at = forged("from workbench.ui import launch_page; launch_page.render()").run()
    at.button(key="launch_go").click().run()
    assert refusal(at) == ["Refused: Sign in (sidebar) to launch, cancel or delete runs."]
    at.button(key="quick_compare").click().run()
    assert refusal(at) == ["Refused: Sign in (sidebar) to launch, cancel or delete runs."]
    at = forged("from workbench.ui.labs import estimators; estimators.render_walkthrough('rloo')").run()
    at.button(key="rloo_launch").click().run()
    assert refusal(at) == ["Refused: Sign in (sidebar) to launch, cancel or delete runs."]
    assert store.list_runs().empty
    at = forged("from workbench.ui import settings_page; settings_page.render()").run()
    at.number_input(key="set_cpu").set_value(3).run()
    at.button(key="set_save").click().run()
    assert refusal(at) == ["Refused: Sign in (sidebar) to launch, cancel or delete runs."]
    assert not (signed_out / "settings.yaml").exists()
