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


# ---- limits on guessing (issue 17: 40 attempts in 38 s from four browsers, none refused) ----------

from workbench.ui import auth  # noqa: E402
from workbench.ui.signin_limits import (  # noqa: E402
    AttemptLedger,
    BackoffPolicy,
    client_address,
    describe_wait,
    ledger_keys,
)


class Clock:
    """Wall-clock seconds that only move when a test says so."""

    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_delays_double_after_five_free_failures_up_to_fifteen_minutes():
    policy = BackoffPolicy()
    delays = [policy.delay_s(n) for n in range(1, 16)]
    assert delays == [0, 0, 0, 0, 2, 4, 8, 16, 32, 64, 128, 256, 512, 900, 900]
    assert policy.delay_s(50) == 900 and policy.delay_s(10**6) == 900  # bounded however many failures
    assert [describe_wait(s) for s in (0.01, 2, 59.2, 60, 256, 900)] == ["1 s", "2 s", "1 min", "1 min", "4 min 16 s", "15 min"]


def test_ledger_locks_address_and_name_with_exact_delays(tmp_path):
    clock = Clock()
    ledger = AttemptLedger(tmp_path / "l.sqlite", clock=clock)
    keys = ledger_keys("10.0.0.7", "Alice")
    for n in range(1, 5):
        admission = ledger.admit(keys)
        assert admission.allowed and admission.failures == {"address:10.0.0.7": n, "name:alice": n}
        assert ledger.wait_s(keys) == 0
    assert ledger.admit(keys).allowed and ledger.wait_s(keys) == 2  # the 5th failure: 2 s
    clock.now += 1.5
    refused = ledger.admit(keys)
    assert not refused.allowed and refused.wait_s == 0.5
    assert ledger.state("name:alice").failures == 5  # a refused attempt is not counted
    # the lock holds for the name from any address, and for the address under any name
    assert not ledger.admit(ledger_keys("10.9.9.9", "ALICE")).allowed
    assert not ledger.admit(ledger_keys("10.0.0.7", "bob")).allowed
    assert ledger.admit(ledger_keys("10.9.9.9", "bob")).allowed
    clock.now += 0.5
    assert ledger.admit(keys).allowed and ledger.wait_s(keys) == 4  # the 6th: 4 s
    clock.now += 4
    assert ledger.admit(keys).allowed and ledger.wait_s(keys) == 8
    ledger.succeeded(keys)  # a right password clears both keys
    assert ledger.wait_s(keys) == 0 and ledger.state("address:10.0.0.7").failures == 0


def test_fifty_failures_lock_for_fifteen_minutes_at_most_then_the_password_works(tmp_path):
    clock = Clock()
    ledger = AttemptLedger(tmp_path / "l.sqlite", clock=clock)
    keys = ledger_keys("local", "owner")
    admitted = 0
    while admitted < 50:
        admission = ledger.admit(keys)
        admitted += admission.allowed
        clock.now += max(admission.wait_s, 0.001)
    assert ledger.state("name:owner").failures == 50
    assert ledger.wait_s(keys) <= 900
    clock.now += 900
    assert ledger.admit(keys).allowed  # never locked out for good


def test_failures_are_forgotten_an_hour_after_the_last(tmp_path):
    clock = Clock()
    ledger = AttemptLedger(tmp_path / "l.sqlite", clock=clock)
    keys = ledger_keys("local", "carol")
    for _ in range(5):
        ledger.admit(keys)
    clock.now += 3599
    assert ledger.admit(keys).failures["name:carol"] == 6
    clock.now += 3600
    assert ledger.admit(keys).failures["name:carol"] == 1


def _admit_once(path: str, now: float, queue) -> None:
    queue.put(AttemptLedger(path, clock=lambda: now).admit(ledger_keys("203.0.113.5", "mallory")).allowed)


def test_ledger_is_shared_by_processes_and_parallel_attempts_cannot_slip_through(tmp_path):
    import multiprocessing

    path, now = str(tmp_path / "l.sqlite"), 5_000.0
    ledger = AttemptLedger(path, clock=lambda: now)
    for _ in range(4):
        ledger.admit(ledger_keys("203.0.113.5", "mallory"))
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_admit_once, args=(path, now, queue)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    results = sorted(queue.get(timeout=5) for _ in procs)
    assert results == [False] * 5 + [True]  # the 5th failure locks; the other five are refused
    assert ledger.state("name:mallory").failures == 5


def test_client_address_prefers_the_peer_and_trusts_only_the_nearest_proxy():
    assert client_address("198.51.100.4", {"X-Forwarded-For": "1.1.1.1"}) == "198.51.100.4"
    assert client_address(None, {"X-Forwarded-For": "6.6.6.6, 198.51.100.4"}) == "198.51.100.4"
    assert client_address(None, {"x-real-ip": "2001:db8::1"}) == "2001:db8::1"
    assert client_address(None, {"X-Forwarded-For": "<script>"}) == "local"
    assert client_address(None, None) == "local" and client_address("", {}) == "local"


def sign_in_as(at, user, password):
    at.sidebar.text_input(key="wb_login_user").input(user)
    at.sidebar.text_input(key="wb_login_password").input(password)
    sign_in_button(at).click().run()
    return [e.value for e in at.sidebar.error]


def test_repeated_wrong_passwords_lock_every_session_until_the_delay_ends(home, monkeypatch, caplog):
    monkeypatch.setenv("WORKBENCH_PASSWORD", "s3cret")
    clock = Clock()
    monkeypatch.setattr(auth, "signin_clock", clock)
    at = AppTest.from_file(APP, default_timeout=60).run()
    for _ in range(4):
        assert sign_in_as(at, "erin", "guess") == ["Wrong password."]
    assert sign_in_as(at, "erin", "guess") == ["Wrong password. Too many failed sign-ins: try again in 2 s."]
    locked = ["Too many failed sign-ins from this address or for this name: try again in 2 s."]
    assert sign_in_as(at, "erin", "s3cret") == locked  # the right password too
    assert "wb_user" not in at.session_state and at.button(key="launch_go").disabled
    fresh = AppTest.from_file(APP, default_timeout=60).run()  # a new browser session: same ledger
    assert sign_in_as(fresh, "erin", "s3cret") == locked
    assert sign_in_as(fresh, "someone-else", "s3cret") == locked  # same address, another name
    clock.now += 2
    assert sign_in_as(fresh, "erin", "s3cret") == []
    assert fresh.session_state["wb_user"] == "erin" and not fresh.button(key="launch_go").disabled
    failed = [r for r in caplog.records if r.name == "workbench.auth" and r.levelname == "WARNING"]
    assert len(failed) == 8 and all("name='erin'" in r.getMessage() or "someone-else" in r.getMessage() for r in failed)
    assert sum("wrong password" in r.getMessage() for r in failed) == 5


def test_client_address_ignores_what_is_not_a_string():
    # AppTest's st.context.ip_address is a MagicMock; a proxy object must never become a key
    from unittest.mock import MagicMock

    assert client_address(MagicMock(), {"X-Real-IP": MagicMock()}) == "local"
    assert client_address(MagicMock(), {"X-Real-IP": "192.0.2.1"}) == "192.0.2.1"
