"""Sign-in through a real OpenID Connect provider, in chromium: PyPI ``oidc-provider-mock`` on
127.0.0.1 (its authorise page has a button per user, with their claims), the real app
(`streamlit run app.py`) with an ``[auth]`` secrets file written to a temporary folder and passed
with ``--secrets.files`` (the repository's .streamlit/ is never written), and roles from the
settings' mapping: Vic (another domain) is a viewer, Mel (lab.org) a member, Ada (group wb-admins)
an admin. What each may do is checked where it counts, in the server's store: a viewer launches
nothing, a member launches but cannot cancel the admin's run, an admin cancels anyone's. Clicks
on buttons drawn disabled are forged on the websocket (the client's own protobuf message, with a
trigger for that button's widget added) and refused, and obeyed for the admin (the forger's
control); a click on a button drawn enabled for a role the settings have since taken away is
refused too. Sign-out ends the session; the audit page shows the sign-ins to the admin and
refuses the member.

Under CI=true a missing oidc-provider-mock or chromium fails; elsewhere the module is skipped.
"""

from __future__ import annotations

import csv
import io
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, SERVER_FLAGS, free_port, wait_healthy
from tests.e2e.test_browser import pause, wait_until
from tests.e2e.wire_log import WireLog
from tests.helpers import home_with_tiny_model, missing_component
from workbench.runs import RunStore, cancel
from workbench.runs.authz import local_principal
from workbench.runs.settings import RoleMapping, Settings, save_settings

USERS = {
    "ada": {"sub": "ada", "email": "ada@lab.org", "email_verified": True, "name": "Ada Admin", "groups": ["wb-admins"]},
    "mel": {"sub": "mel", "email": "mel@lab.org", "email_verified": True, "name": "Mel Member", "groups": ["staff"]},
    "vic": {"sub": "vic", "email": "vic@elsewhere.org", "email_verified": True, "name": "Vic Viewer"},
}
ROLES = RoleMapping(admin_groups=["wb-admins"], member_domains=["lab.org"])
# One CPU slot, held by the admin's running run: the member's launch queues instead of training.
SETTINGS = Settings(cpu_slots=1, gpu_slots=0, roles=ROLES)


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    """oidc-provider-mock on 127.0.0.1 with the three users; yields its issuer URL."""
    try:
        import oidc_provider_mock  # noqa: F401
    except ImportError:
        missing_component("PyPI oidc-provider-mock is not installed (pip install -r requirements-dev.txt)")
    port, log_path = free_port(), tmp_path_factory.mktemp("oidc") / "provider.log"
    users = [arg for user in USERS.values() for arg in ("--user-claims", json.dumps(user))]
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "oidc_provider_mock", "-p", str(port), "-H", "127.0.0.1", *users],
                                stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/.well-known/openid-configuration", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail(f"oidc-provider-mock did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def oidc_home(tmp_path_factory, tiny_model_dir):
    home = home_with_tiny_model(tmp_path_factory.mktemp("oidchome"), tiny_model_dir)
    save_settings(SETTINGS, home)
    return home


@pytest.fixture(scope="module")
def app(oidc_home, provider, tmp_path_factory):
    """The app with the provider in its secrets (no password); yields its URL. The redirect URI
    names 127.0.0.1, the host the browser uses (localhost there would break the callback)."""
    port, secrets_dir = free_port(), tmp_path_factory.mktemp("secrets")
    (secrets_dir / "secrets.toml").write_text(
        "[auth]\n"
        f'redirect_uri = "http://127.0.0.1:{port}/oauth2callback"\n'
        f'cookie_secret = "{secrets.token_hex(32)}"\n'
        'client_id = "workbench-e2e"\n'
        'client_secret = "e2e-client-secret"\n'
        f'server_metadata_url = "{provider}/.well-known/openid-configuration"\n')
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBENCH_PASSWORD", "WORKBENCH_ADMIN_PASSWORD")}
    env |= {"WORKBENCH_HOME": str(oidc_home), "OMP_NUM_THREADS": "1"}
    log_path = oidc_home / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", *SERVER_FLAGS, "--server.port", str(port),
                                 "--secrets.files", str(secrets_dir / "secrets.toml")],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log=log_path)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def store(oidc_home):
    """The app's store; every run still active at the end is cancelled (they are detached)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORKBENCH_HOME", str(oidc_home))
        store = RunStore(oidc_home / "runs.db")
        yield store
        for run_id in store.list_runs(status=None)["id"]:
            cancel(run_id, principal=local_principal(), store=store, grace_s=5)


@pytest.fixture(scope="module")
def admins_run(store, oidc_home):
    """The admin's live run (a `sleep` posing as its trainer, holding the only CPU slot); its id."""
    from tests.ui.seed import LiveRun

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORKBENCH_HOME", str(oidc_home))
        run = LiveRun(store, name="adas-run", owner=USERS["ada"]["email"])
    yield run.run_id
    run.stop()


@pytest.fixture(scope="module")
def browser(chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


class ClickForger:
    """Watches a page's Streamlit websocket and can send a click the page would not: the page's own
    last rerun message with a trigger for a button added (its widget id read from the server's
    messages by label). What Streamlit before 1.61 took from a crafted client. Every message of
    the page passes through this process's handlers, which Playwright's sync client runs only
    inside a Playwright call: the test waits with ``pause`` / ``wait_until(page=...)``, never
    ``time.sleep``, while the page may send."""

    def __init__(self, page):
        self.ids: dict[str, str] = {}
        self.last = None
        self.server = None
        page.route_web_socket("**/_stcore/stream", self._route)

    def _route(self, ws) -> None:
        from streamlit.proto.BackMsg_pb2 import BackMsg
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        server = self.server = ws.connect_to_server()

        def from_server(message) -> None:
            if isinstance(message, bytes):
                msg = ForwardMsg.FromString(message)
                if msg.WhichOneof("type") == "delta" and msg.delta.WhichOneof("type") == "new_element":
                    element = msg.delta.new_element
                    if element.WhichOneof("type") == "button":
                        self.ids[element.button.label] = element.button.id
            ws.send(message)

        def from_page(message) -> None:
            if isinstance(message, bytes):
                msg = BackMsg.FromString(message)
                # a whole-page rerun: a fragment's (run_every) would not draw the forged button
                if msg.WhichOneof("type") == "rerun_script" and not msg.rerun_script.fragment_id:
                    self.last = msg
            server.send(message)

        server.on_message(from_server)
        ws.on_message(from_page)

    def click(self, label: str) -> None:
        from streamlit.proto.BackMsg_pb2 import BackMsg

        assert self.last is not None and label in self.ids, (label, sorted(self.ids))
        forged = BackMsg()
        forged.CopyFrom(self.last)
        forged.rerun_script.is_auto_rerun = False
        widget = forged.rerun_script.widget_states.widgets.add()
        widget.id, widget.trigger_value = self.ids[label], True
        self.server.send(forged.SerializeToString())


@contextmanager
def user_page(browser):
    """A fresh browser context (its own cookies) and page, with a click forger; nothing leaves
    127.0.0.1 (the provider's pages link a stylesheet on a CDN)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    context.route("https://**/*", lambda route: route.abort())
    page = context.new_page()
    page.set_default_timeout(180_000)  # a liveness bound on a machine shared with the other test partition
    page.wire = WireLog(page)  # the websocket's exchanges, for a failure's message (wait_until)
    forger = ClickForger(page)
    try:
        yield page, forger
    finally:
        context.close()


def provider_sign_in(page, app: str, user: str) -> None:
    """Sign in through the provider, in the `sign_in` helper's style: the sidebar's button, then
    the provider's authorise page (a button per user), then wait for the app to say who. The
    provider sends the browser back to the app's first page (Launch)."""
    page.goto(f"{app}/launch")
    page.get_by_test_id("stSidebar").get_by_role("button", name="Sign in", exact=True).click()
    page.get_by_role("button", name=user, exact=True).click()  # on the provider's page
    page.get_by_text("Signed in as").wait_for()


def wait_idle(page) -> None:
    """Wait until the app's script has finished its run (and stays so for a moment): a button the
    test clicks is then the one drawn last, not one a running rerun is about to replace."""
    for _ in range(2):
        page.locator("[data-test-script-state='notRunning']").first.wait_for()
        page.wait_for_timeout(500)


def sidebar_text(page) -> str:
    return page.get_by_test_id("stSidebar").inner_text()


def select_run(page, run_id: str) -> None:
    box = page.get_by_label("Run", exact=True)
    box.click()
    box.fill(run_id)
    box.press("Enter")
    wait_until(lambda: run_id in page.get_by_label("Run", exact=True).input_value(), 30, f"run {run_id} selected", page=page)
    wait_idle(page)


def click_until(page, button, done, what: str, wait_s: float = 20) -> None:
    """Click ``button`` until ``done()`` (at most twice): Streamlit can drop a click that lands
    while a fragment of the page (the Runs page's, every 1-2 s while runs are live) reruns, which
    on a loaded machine takes long. The action is idempotent; a second click is only sent while
    the button is still enabled."""
    for attempt in range(2):
        button.click()
        deadline = time.time() + wait_s
        while time.time() < deadline:
            if done():
                return
            pause(page, 0.5)  # the page's websocket is routed through this process (ClickForger)
        if attempt == 0 and not button.is_enabled():
            break
    wait_until(done, 1, what, page=page)  # fails with a screenshot and the page's text


def runs_by(store: RunStore, owner: str) -> list[str]:
    runs = store.list_runs(status=None)
    return runs.loc[runs["created_by"] == owner, "id"].tolist()


def test_viewer_member_admin_through_the_identity_provider(browser, app, store, admins_run, oidc_home):

    # ---- the viewer: reads; launch and cancel refused, also as forged clicks; no audit log ------
    with user_page(browser) as (page, forger):
        provider_sign_in(page, app, "vic")
        assert "Vic Viewer (vic@elsewhere.org) (viewer)" in sidebar_text(page)
        launch = page.get_by_role("button", name="Launch run")
        assert launch.is_disabled()
        forger.click("Launch run")
        page.wait_for_timeout(3000)  # the forged click's rerun has come and gone
        assert runs_by(store, "vic@elsewhere.org") == [] and len(store.list_runs(status=None)) == 1
        page.get_by_test_id("stSidebar").get_by_role("link", name="Runs").click()
        select_run(page, admins_run)
        wait_until(lambda: page.get_by_role("button", name="Cancel run").is_disabled(), 30, "cancel disabled", page=page)
        forger.click("Cancel run")
        page.wait_for_timeout(3000)
        assert store.get_run(admins_run)["status"] == "running"
        page.goto(f"{app}/audit")
        page.get_by_text("Refused: permission denied: audit by vic@elsewhere.org (viewer, OpenID Connect)").wait_for()
        assert page.get_by_test_id("stDataFrame").count() == 0

    # ---- the member: launches (owns the run), cannot cancel the admin's run --------------------
    with user_page(browser) as (page, forger):
        provider_sign_in(page, app, "mel")
        assert "Mel Member (mel@lab.org) (member)" in sidebar_text(page)
        page.get_by_role("tab", name="Training").click()
        steps = page.get_by_label("steps", exact=True)
        steps.fill("2")
        steps.press("Enter")
        go = page.get_by_role("button", name="Launch run")
        wait_until(lambda: go.is_enabled(), 30, "the launch button to be enabled", page=page)
        wait_idle(page)  # the steps field's rerun done: the click lands on the button drawn last
        go.click()
        mels_run = wait_until(lambda: runs_by(store, "mel@lab.org"), 60, "the member's run in the store", page=page)[0]
        assert store.get_run(mels_run)["status"] == "queued"  # behind the admin's run, in the only CPU slot

        # a click on a button drawn for a role the settings have since taken away: refused
        page.goto(f"{app}/launch")
        wait_until(lambda: go.is_enabled(), 30, "the launch button to be enabled again", page=page)
        wait_idle(page)
        save_settings(SETTINGS.model_copy(update={"roles": ROLES.model_copy(update={"member_domains": []})}), oidc_home)
        try:
            go.click()
            wait_until(lambda: go.is_disabled(), 30, "the stale launch button to be redrawn disabled", page=page)
            page.wait_for_timeout(2000)
            assert runs_by(store, "mel@lab.org") == [mels_run]
        finally:
            save_settings(SETTINGS, oidc_home)

        page.get_by_test_id("stSidebar").get_by_role("link", name="Runs").click()
        select_run(page, admins_run)
        wait_until(lambda: page.get_by_role("button", name="Cancel run").is_disabled(), 30, "cancel disabled", page=page)
        forger.click("Cancel run")
        page.wait_for_timeout(3000)
        assert store.get_run(admins_run)["status"] == "running"
        page.goto(f"{app}/audit")
        page.get_by_text("Refused: permission denied: audit by mel@lab.org (member, OpenID Connect)").wait_for()
        assert page.get_by_test_id("stDataFrame").count() == 0

        # sign-out ends the session: through the provider's end-session page, back signed out, and
        # a reload (a new session, the browser's cookies as they are now) is still signed out
        page.get_by_test_id("stSidebar").get_by_role("button", name="Sign out").click()
        page.get_by_role("button", name="End session").click()  # the provider's end-session page
        sign_in = page.get_by_test_id("stSidebar").get_by_role("button", name="Sign in", exact=True)
        sign_in.wait_for()
        page.reload()
        sign_in.wait_for()
        assert "Signed in as" not in sidebar_text(page)
        assert page.get_by_role("button", name="Launch run").is_disabled()

    # ---- the admin: cancels the member's run and their own; reads and downloads the audit log ---
    with user_page(browser) as (page, forger):
        provider_sign_in(page, app, "ada")
        assert "Ada Admin (ada@lab.org) (admin)" in sidebar_text(page)
        page.get_by_test_id("stSidebar").get_by_role("link", name="Runs").click()
        select_run(page, mels_run)
        cancel_button = page.get_by_role("button", name="Cancel run")
        wait_until(lambda: cancel_button.is_enabled(), 30, "the admin's cancel button", page=page)
        click_until(page, cancel_button, lambda: store.get_run(mels_run)["status"] == "cancelled",
                    "the member's run cancelled")
        # the forger's control: the same forged click the others' were refused is obeyed for an admin
        select_run(page, admins_run)
        wait_until(lambda: page.get_by_role("button", name="Cancel run").is_enabled(), 30, "cancel enabled", page=page)
        forger.click("Cancel run")
        wait_until(lambda: store.get_run(admins_run)["status"] == "cancelled", 60, "the forged cancel obeyed", page=page)

        page.get_by_test_id("stSidebar").get_by_role("link", name="Audit").click()
        # the Audit page itself (the Runs page left behind has a table too)
        wait_until(lambda: page.get_by_role("button", name="Download CSV").count(), 60, "the Audit page", page=page)
        page.get_by_test_id("stDataFrame").wait_for()
        with page.expect_download() as download:
            page.get_by_role("button", name="Download CSV").click()
        rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    assert download.value.suggested_filename == "workbench-audit.csv"
    said = [(r["actor"], r["role"], r["auth"], r["action"], r["target"]) for r in rows]
    oidc = "OpenID Connect"
    for actor, role in (("vic@elsewhere.org", "viewer"), ("mel@lab.org", "member"), ("ada@lab.org", "admin")):
        assert said.count((actor, role, oidc, "sign_in", "")) == 1, said  # once, however many pages they opened
    assert (("mel@lab.org", "member", oidc, "launch", mels_run) in said
            and ("ada@lab.org", "admin", oidc, "cancel", mels_run) in said
            and ("ada@lab.org", "admin", oidc, "cancel", admins_run) in said), said
    assert [r["action"] for r in rows if r["actor"] == "vic@elsewhere.org"] == ["sign_in"]  # the refusals did nothing
    assert [r["action"] for r in rows if r["actor"] == "mel@lab.org"] == ["sign_out", "launch", "sign_in"]
    assert all(r["address"] == "local" for r in rows), rows  # the browser is on this machine
    times = [r["when (UTC)"] for r in rows]
    assert times == sorted(times, reverse=True)  # newest first
