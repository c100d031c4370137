"""Sign-in for teams: when a password is needed, what the form says, constant-time comparison,
and the signed-in name recorded as the owner of launched runs."""

from pathlib import Path

import pytest
from streamlit import config
from streamlit.testing.v1 import AppTest

from workbench import runs as wr
from workbench.ui.auth import auth_policy, check_user_name, is_local_address, password_matches
from workbench.runs.authz import local_principal

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


def test_password_gates_launch_until_signed_in(home, monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBENCH_PASSWORD", "s3cret")
    # a machine without SLURM's client commands (the SLURM tests install them on this one)
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
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
        assert runs["created_by"].tolist() == ["dave (password)"]  # a typed name is a claim: suffixed
    finally:
        for run_id in runs["id"]:
            wr.cancel(run_id, principal=local_principal(), store=store, grace_s=5)


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
        at.button(key=f"runs_cancel:{live.run_id}").click().run()
        assert refusal(at) == ["Refused: Sign in (sidebar) to launch, cancel or delete runs."]
        assert live.proc.poll() is None  # still running
        at.button(key=f"runs_delete:{live.run_id}").click().run()
        assert refusal(at) == ["Refused: Sign in (sidebar) to launch, cancel or delete runs."]
        assert store.get_run(live.run_id)["status"] == "running"
    finally:
        live.stop()


def test_forged_launch_and_settings_save_are_refused(signed_out, store):
    at = forged("from workbench.ui import launch_page; launch_page.render()").run()
    at.button(key="launch_go").click().run()
    # once: the click's callback starts no flight for a session that may not launch
    assert refusal(at) == ["Refused: Sign in (sidebar) to launch, cancel or delete runs."]
    assert "launch_flight" not in at.session_state
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



def signed_in(at: AppTest, user: str, role: str) -> AppTest:
    """A session signed in as ``user`` with ``role`` (what ``auth.sign_in`` leaves)."""
    at.session_state["wb_user"], at.session_state["wb_role"], at.session_state["wb_authed"] = user, role, True
    return at


@pytest.fixture
def two_passwords(home, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PASSWORD", "s3cret")
    monkeypatch.setenv("WORKBENCH_ADMIN_PASSWORD", "adm1n")
    return home


def test_the_password_gives_member_and_the_admin_password_admin(two_passwords):
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.sidebar.text_input(key="wb_login_user").input("bob")
    at.sidebar.text_input(key="wb_login_password").input("s3cret")
    sign_in_button(at).click().run()
    assert (at.session_state["wb_user"], at.session_state["wb_role"]) == ("bob", "member")
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.sidebar.text_input(key="wb_login_user").input("root")
    at.sidebar.text_input(key="wb_login_password").input("adm1n")
    sign_in_button(at).click().run()
    assert (at.session_state["wb_user"], at.session_state["wb_role"]) == ("root", "admin")


def test_one_shared_password_signs_in_an_admin_as_before_roles(signed_out):
    # no admin password set: everyone who signs in is admin (the README's "Teams" bullet)
    assert (auth.password_role("s3cret"), auth.password_role("wrong")) == ("admin", None)
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.sidebar.text_input(key="wb_login_user").input("carol")
    at.sidebar.text_input(key="wb_login_password").input("s3cret")
    sign_in_button(at).click().run()
    assert (at.session_state["wb_user"], at.session_state["wb_role"]) == ("carol", "admin")


def test_a_member_may_not_touch_another_members_run_nor_the_settings(two_passwords, store):
    from tests.ui.seed import add_run

    theirs = add_run(store, owner="alice", name="theirs")
    at = signed_in(forged("from workbench.ui import runs_page; runs_page.render()"), "bob", "member").run()
    at.selectbox(key="runs_selected").select(theirs).run()
    at.checkbox(key=f"runs_confirm:{theirs}").check().run()
    needs = f"permission denied: delete run {theirs} by bob (member, shared password): needs to be the run's owner (alice)"
    assert at.button(key=f"runs_delete:{theirs}").proto.help.startswith(needs)  # drawn disabled, saying why
    at.button(key=f"runs_delete:{theirs}").click().run()
    assert refusal(at) == [f"Refused: {needs} with role member, or role admin"]
    at.text_area(key=f"runs_notes:{theirs}").input("mine now").run()
    at.button(key=f"runs_save:{theirs}").click().run()
    assert refusal(at)[0].startswith(f"Refused: permission denied: edit run {theirs} by bob")
    assert (store.get_run(theirs).notes, len(store.runs())) == ("", 1)
    at = signed_in(forged("from workbench.ui import settings_page; settings_page.render()"), "bob", "member").run()
    at.number_input(key="set_cpu").set_value(3).run()
    at.button(key="set_save").click().run()
    assert refusal(at) == ["Refused: permission denied: settings by bob (member, shared password): needs role admin"]
    assert not (two_passwords / "settings.yaml").exists()
    at = signed_in(AppTest.from_string("from workbench.ui import settings_page; settings_page.render()"), "root",
                   "admin").run()
    at.number_input(key="set_cpu").set_value(3).run()
    at.button(key="set_save").click().run()
    assert not at.error and load_settings().cpu_slots == 3


def test_a_member_manages_their_own_run(two_passwords, store):
    from tests.ui.seed import add_run

    mine = add_run(store, owner="bob (password)", name="mine")  # what bob's password sign-in records
    at = signed_in(AppTest.from_string("from workbench.ui import runs_page; runs_page.render()"), "bob", "member").run()
    at.selectbox(key="runs_selected").select(mine).run()
    at.text_area(key=f"runs_notes:{mine}").input("mine indeed").run()
    at.button(key=f"runs_save:{mine}").click().run()
    assert not at.error and store.get_run(mine).notes == "mine indeed"


# ---- limits on guessing (issue 17: 40 attempts in 38 s from four browsers, none refused) ----------

from workbench.runs import Settings, SettingsError, load_settings  # noqa: E402
from workbench.runs.settings import save_settings  # unauthorised: tests set up homes with it  # noqa: E402
from workbench.runs.settings import proxy_networks  # noqa: E402
from workbench.ui import auth  # noqa: E402
from workbench.ui.signin_limits import (  # noqa: E402
    KEY_POLICIES,
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


def test_delays_double_after_the_free_failures_up_to_their_caps():
    address, server = KEY_POLICIES["address"], KEY_POLICIES["global"]
    assert [address.delay_s(n) for n in range(1, 16)] == [0, 0, 0, 0, 2, 4, 8, 16, 32, 64, 128, 256, 512, 900, 900]
    assert address.delay_s(50) == 900 and address.delay_s(10**6) == 900  # bounded however many failures
    assert [server.delay_s(n) for n in range(1, 58)] == [0] * 49 + [2, 4, 8, 16, 32, 60, 60, 60]
    assert server.delay_s(10**6) == 60 and server.window_s == 600
    assert [describe_wait(s) for s in (0.01, 2, 59.2, 60, 256, 900)] == ["1 s", "2 s", "1 min", "1 min", "4 min 16 s", "15 min"]
    with pytest.raises(ValueError, match="window_s"):  # pruning needs every lock to end inside the window
        BackoffPolicy(max_delay_s=60, window_s=30)


def test_ledger_locks_the_address_with_exact_delays_and_not_other_addresses(tmp_path):
    clock = Clock()
    ledger = AttemptLedger(tmp_path / "l.sqlite", clock=clock)
    keys = ledger_keys("10.0.0.7")
    assert keys == ["address:10.0.0.7", "global"]  # the typed name is no key
    for n in range(1, 5):
        admission = ledger.admit(keys)
        assert admission.allowed and admission.failures == {"address:10.0.0.7": n, "global": n}
        assert ledger.wait_s(keys) == 0
    assert ledger.admit(keys).allowed and ledger.wait_s(keys) == 2  # the 5th failure: 2 s
    clock.now += 1.5
    refused = ledger.admit(keys)
    assert not refused.allowed and refused.wait_s == 0.5 and refused.locked == ("address:10.0.0.7",)
    assert ledger.state("address:10.0.0.7").failures == 5  # a refused attempt is not counted
    assert ledger.admit(ledger_keys("10.9.9.9")).allowed  # another address is not locked
    clock.now += 0.5
    assert ledger.admit(keys).allowed and ledger.wait_s(keys) == 4  # the 6th: 4 s
    clock.now += 4
    assert ledger.admit(keys).allowed and ledger.wait_s(keys) == 8
    assert ledger.state("global").failures == 8
    ledger.succeeded(keys)  # a right password clears the address, and only refunds the server's count
    assert ledger.wait_s(keys) == 0 and ledger.state("address:10.0.0.7").failures == 0
    assert ledger.state("global").failures == 7


def test_fifty_failures_lock_for_fifteen_minutes_at_most_then_the_password_works(tmp_path):
    clock = Clock()
    ledger = AttemptLedger(tmp_path / "l.sqlite", clock=clock)
    keys = ledger_keys("local")
    admitted = 0
    while admitted < 50:
        admission = ledger.admit(keys)
        admitted += admission.allowed
        clock.now += max(admission.wait_s, 0.001)
    assert ledger.state("address:local").failures == 50
    assert ledger.wait_s(keys) <= 900
    clock.now += 900
    assert ledger.admit(keys).allowed  # never locked out for good


def test_one_address_guessing_for_hours_never_locks_the_server(tmp_path):
    clock = Clock()
    ledger = AttemptLedger(tmp_path / "l.sqlite", clock=clock)
    keys, admitted, end = ledger_keys("203.0.113.9"), 0, clock.now + 6 * 3600
    while clock.now < end:  # as fast as the address's own locks allow
        admission = ledger.admit(keys)
        admitted += admission.allowed
        assert "global" not in admission.locked
        assert ledger.state("global").failures < 50
        clock.now += max(admission.wait_s, 0.001)
    assert 30 < admitted < 60  # ~17 in the first hour, then 4 an hour
    assert ledger.admit(ledger_keys("198.51.100.1")).allowed  # everyone else signs in at once


def test_many_addresses_together_lock_the_server_for_at_most_a_minute(tmp_path):
    clock = Clock()
    ledger = AttemptLedger(tmp_path / "l.sqlite", clock=clock)
    for n in range(50):  # a distributed guesser, one failure per address
        assert ledger.admit(ledger_keys(f"10.1.0.{n}")).allowed
    refused = ledger.admit(ledger_keys("198.51.100.1"))  # anyone, anywhere: 2 s after the 50th
    assert not refused.allowed and refused.wait_s == 2 and refused.locked == ("global",)
    assert auth.refusal_message(refused.locked, refused.wait_s) == (
        "Too many failed sign-ins on this workbench (from all addresses): try again in 2 s.")
    waits = []
    for n in range(50, 60):
        clock.now += ledger.wait_s(["global"])
        assert ledger.admit(ledger_keys(f"10.1.0.{n}")).allowed
        waits.append(ledger.wait_s(["global"]))
    assert waits == [4, 8, 16, 32, 60, 60, 60, 60, 60, 60]
    clock.now += 60
    assert ledger.admit(ledger_keys("198.51.100.1")).allowed
    clock.now += 600  # quiet for the window: the server's count starts again
    assert ledger.admit(ledger_keys("10.1.0.1")).failures["global"] == 1


def test_failures_are_forgotten_an_hour_after_the_last(tmp_path):
    clock = Clock()
    ledger = AttemptLedger(tmp_path / "l.sqlite", clock=clock)
    keys = ledger_keys("local")
    for _ in range(5):
        ledger.admit(keys)
    clock.now += 3599
    assert ledger.admit(keys).failures["address:local"] == 6
    clock.now += 3600
    assert ledger.admit(keys).failures["address:local"] == 1


def test_rows_older_than_the_window_are_deleted(tmp_path):
    clock = Clock()
    ledger = AttemptLedger(tmp_path / "l.sqlite", clock=clock)
    for n in range(40):  # rotating addresses, one failure each
        ledger.admit(ledger_keys(f"10.2.0.{n}"))
        clock.now += 1
    assert ledger.row_count() == 41
    clock.now += 3600 - 20  # the first 20 are now older than an hour, the rest are not
    ledger.admit(ledger_keys("10.3.0.1"))
    assert ledger.row_count() == 20 + 1 + 1 and ledger.state("address:10.2.0.19").failures == 0
    assert ledger.state("address:10.2.0.20").failures == 1
    clock.now += 3601
    ledger.admit(ledger_keys("10.3.0.2"))
    assert ledger.row_count() == 2  # only this attempt's address and the server's count


def _admit_once(path: str, now: float, queue) -> None:
    queue.put(AttemptLedger(path, clock=lambda: now).admit(ledger_keys("203.0.113.5")).allowed)


def test_ledger_is_shared_by_processes_and_parallel_attempts_cannot_slip_through(tmp_path):
    import multiprocessing

    path, now = str(tmp_path / "l.sqlite"), 5_000.0
    ledger = AttemptLedger(path, clock=lambda: now)
    for _ in range(4):
        ledger.admit(ledger_keys("203.0.113.5"))
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_admit_once, args=(path, now, queue)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    results = sorted(queue.get(timeout=5) for _ in procs)
    assert results == [False] * 5 + [True]  # the 5th failure locks; the other five are refused
    assert ledger.state("address:203.0.113.5").failures == 5 and ledger.state("global").failures == 5


LOOPBACK_PROXY = proxy_networks(["127.0.0.1", "::1"])
# What a client can write in X-Forwarded-For, and what Streamlit then reports as the peer of a
# connection from this machine (SSH tunnel, local browser): None, or, since uvicorn honours the
# header for loopback peers, the header's right-most entry whatever it is.
FORGED_XFF = ["9.9.9.9", "....", "1.2.3.4, 5.6.7.8", "::", "2001:db8::7", "127.0.0.1", "::ffff:8.8.8.8",
              "<script>", "1.2.3.4:80", "[2001:db8::9]:443", "x" * 200, ", ,", "10.0.0.1, junk"]


def uvicorn_peer(xff: str) -> str | None:
    """What st.context.ip_address says for a loopback connection sending ``xff`` (seen on a real
    server: tests/ui/test_auth.py::test_real_server_ignores_forged_forwarding_headers)."""
    parts = [p.strip() for p in xff.split(",")]
    host = next((p for p in reversed(parts) if p not in ("127.0.0.1", "::1")), parts[0])
    return None if host in ("127.0.0.1", "::1") else host


def test_forged_forwarding_headers_are_ignored_without_trusted_proxies():
    for xff in FORGED_XFF:
        for peer in (None, uvicorn_peer(xff), "127.0.0.1", "::1"):
            assert client_address(peer, [xff]) == "local", (peer, xff)
    rotated = {client_address(uvicorn_peer(f"198.18.{n // 256}.{n % 256}"), [f"198.18.{n // 256}.{n % 256}"])
               for n in range(200)}
    assert rotated == {"local"}  # 200 forged addresses, one key
    # a direct remote client is its own address, whatever it writes (or at worst 'local')
    for xff in FORGED_XFF + ["198.51.100.4, 7.7.7.7"]:
        assert client_address("198.51.100.4", [xff]) in ("198.51.100.4", "local"), xff
    assert client_address("198.51.100.4", ["7.7.7.7"]) == "198.51.100.4"
    assert client_address("198.51.100.4", ["198.51.100.4, 7.7.7.7"]) == "198.51.100.4"
    assert client_address("2001:db8::1:2", []) == "2001:db8::/64"  # one IPv6 subscriber block, one key
    assert client_address("::ffff:192.0.2.1", []) == "192.0.2.1"
    assert client_address(None, None) == "local" and client_address("", []) == "local"


def test_forwarding_headers_are_honoured_from_a_trusted_proxy_only():
    # nginx on this machine appending the client: the right-most entry that is not a trusted proxy
    assert client_address(None, ["203.0.113.7"], LOOPBACK_PROXY) == "203.0.113.7"
    assert client_address(uvicorn_peer("203.0.113.7"), ["203.0.113.7"], LOOPBACK_PROXY) == "203.0.113.7"
    # the client's own forged entries come first; the proxy's appended one wins
    assert client_address("203.0.113.7", ["6.6.6.6, 203.0.113.7"], LOOPBACK_PROXY) == "203.0.113.7"
    assert client_address(None, ["6.6.6.6", "203.0.113.7, 127.0.0.1"], LOOPBACK_PROXY) == "203.0.113.7"
    chain = proxy_networks(["127.0.0.1", "10.0.0.0/8"])  # two proxies in a row
    assert client_address(None, ["6.6.6.6, 203.0.113.7, 10.1.1.1"], chain) == "203.0.113.7"
    assert client_address(None, ["junk, 10.1.1.1"], chain) == "10.1.1.1"  # unreadable: the last trusted hop
    assert client_address(None, ["...."], LOOPBACK_PROXY) == "local"
    # a remote proxy listed by address; a remote client not listed gets no say
    remote = proxy_networks(["192.0.2.10"])
    assert client_address("192.0.2.10", ["203.0.113.7"], remote) == "203.0.113.7"
    assert client_address("192.0.2.11", ["203.0.113.7"], remote) == "192.0.2.11"
    assert client_address(None, ["203.0.113.7"], remote) == "local"  # loopback is not listed


def test_trusted_proxies_setting_is_validated(home):
    save_settings(Settings(trusted_proxies=["127.0.0.1", " 10.0.0.0/8", "::1", "192.168.1.1/24"]))
    assert [str(n) for n in load_settings().trusted_proxy_networks()] == ["127.0.0.1/32", "10.0.0.0/8", "::1/128",
                                                                         "192.168.1.0/24"]
    for bad in ("....", "localhost", "10.0.0.0/33", "1.2.3.4, 5.6.7.8", ""):
        (home / "settings.yaml").write_text(f"trusted_proxies: [{bad!r}]\n")
        with pytest.raises(SettingsError, match=r"trusted_proxies.*is not an IP address or network"):
            load_settings()


def test_client_address_ignores_what_is_not_a_string():
    # AppTest's st.context.ip_address is a MagicMock; a proxy object must never become a key
    from unittest.mock import MagicMock

    assert client_address(MagicMock(), [MagicMock()]) == "local"
    assert client_address(MagicMock(), MagicMock(), LOOPBACK_PROXY) == "local"
    assert client_address(MagicMock(), ["192.0.2.1"], LOOPBACK_PROXY) == "192.0.2.1"


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
    locked = ["Too many failed sign-ins from this address: try again in 2 s."]
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


def test_failures_under_the_owners_name_elsewhere_do_not_lock_the_owner_out(home, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PASSWORD", "s3cret")
    clock = Clock()
    monkeypatch.setattr(auth, "signin_clock", clock)
    for _ in range(30):  # a stranger keeps guessing as "owner" from another address
        error = auth.sign_in("owner", "guess", address="203.0.113.9")
        assert error.startswith(("Wrong password.", "Too many failed sign-ins from this address"))
        clock.now += 5
    assert auth.sign_in("owner", "s3cret", address="203.0.113.9").startswith("Too many")
    at = AppTest.from_file(APP, default_timeout=60).run()  # the owner, on this machine
    assert sign_in_as(at, "owner", "s3cret") == []
    assert at.session_state["wb_user"] == "owner"


# A tiny page that records the address the real auth code computes for its session.
ADDRESS_PAGE = """
from workbench.ui import auth
open({out!r}, "a").write(auth.current_client_address() + "\\n")
"""


def test_real_server_ignores_forged_forwarding_headers(tmp_path):
    """`streamlit run` for real (uvicorn in front), a websocket client on 127.0.0.1 (as through an SSH
    tunnel) writing X-Forwarded-For: counted as 'local' unless settings trust 127.0.0.1."""
    import asyncio
    import os
    import subprocess
    import sys

    websockets = pytest.importorskip("websockets")
    from streamlit.proto.BackMsg_pb2 import BackMsg

    from tests.ui.test_server import free_port, health, stop

    home, out, page = tmp_path / "home", tmp_path / "addresses.txt", tmp_path / "page.py"
    page.write_text(ADDRESS_PAGE.format(out=str(out)))
    root = Path(APP).parent

    async def visit(port: int, xff: str | None) -> None:
        headers = {"X-Forwarded-For": xff} if xff else {}
        async with websockets.connect(f"ws://127.0.0.1:{port}/_stcore/stream", additional_headers=headers,
                                      subprotocols=["streamlit"]) as ws:
            message = BackMsg()
            message.rerun_script.query_string = ""
            await ws.send(message.SerializeToString())
            lines = len(out.read_text().splitlines()) if out.exists() else 0
            for _ in range(100):  # until the page has run
                await asyncio.sleep(0.1)
                if out.exists() and len(out.read_text().splitlines()) > lines:
                    return

    def addresses(xffs: list[str | None]) -> list[str]:
        out.unlink(missing_ok=True)
        port = free_port()
        env = {**os.environ, "WORKBENCH_HOME": str(home), "PYTHONPATH": str(root)}
        env.pop("FORWARDED_ALLOW_IPS", None)
        proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(page), "--server.headless", "true",
                                 "--server.address", "127.0.0.1", "--server.port", str(port),
                                 "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
                                cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert health(port) == "ok"
            for xff in xffs:
                asyncio.run(visit(port, xff))
            return out.read_text().splitlines()
        finally:
            stop(proc)

    forged = [None, "9.9.9.9", "....", "6.6.6.6, 198.51.100.4", "2001:db8::7"]
    assert addresses(forged) == ["local"] * 5
    save_settings(Settings(trusted_proxies=["127.0.0.1", "::1"]), home)  # now a proxy on this machine is believed
    assert addresses(forged) == ["local", "9.9.9.9", "local", "198.51.100.4", "2001:db8::/64"]
