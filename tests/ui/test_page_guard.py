"""A page change is not undone by the live page the user left (workbench/ui/page_guard.py).

A real `streamlit run` server and a websocket client that sends what the browser sends in the races
seen on loaded machines (the Runs page opened from a live Compare page bounced back to Compare; the
Export page opened by a Runs button stayed blank): the user goes from page A to page B by a link
or by a button that calls `st.switch_page`, then page A's live fragment ticks once more, as a
browser timer armed before the change does. Without the guard Streamlit runs that tick after B
*as page A* (the server's last word is page A, and the browser clears the page it shows: the
control case, proof the race is real on this version); with it the session stays on B. Then the
guard's rules one by one: which fragment reruns are stale, how a tick folds into a pending page
change, and one script thread per session.
"""

import asyncio
import os
import subprocess
import sys
import time

import pytest
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ClientState_pb2 import ClientState
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.proto.WidgetStates_pb2 import WidgetState

from tests.ui.test_server import ROOT, free_port, health, stop
from workbench.ui.page_guard import stale_fragment_rerun

# Page A: a live fragment and a button that switches to B. Page B: slow enough that a tick
# arrives while it runs.
APP = """
import time

import streamlit as st
{guard}

def a():
    st.write("page A")
    st.fragment(lambda: st.write(time.time()), run_every=0.3)()
    if st.button("go to B"):
        st.switch_page(PAGE_B)


def b():
    time.sleep(3)
    st.write("page B")


PAGE_B = st.Page(b, title="B", url_path="b")
st.navigation([st.Page(a, title="A", url_path="a", default=True), PAGE_B]).run()
"""
GUARD = "from workbench.ui import page_guard; page_guard.install()"


class Wire:
    """A websocket client speaking as the browser does: ``send`` a rerun request, ``pump`` the
    server's messages, noting the app's page hashes by URL path (``hashes``), the page of each run
    and navigation in order (``seen``), the newest fragment timer, finished runs and buttons."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.hashes: dict[str, str] = {}
        self.seen: list[str] = []
        self.fragment = self.button = None
        self.finished = self.buttons = 0

    async def pump(self, seconds: float, stop_when=lambda: False) -> None:
        until = time.time() + seconds
        while time.time() < until and not stop_when():
            try:
                raw = await asyncio.wait_for(self.ws.recv(), timeout=max(0.01, until - time.time()))
            except asyncio.TimeoutError:
                return
            message = ForwardMsg()
            message.ParseFromString(raw)
            kind = message.WhichOneof("type")
            if kind == "navigation":
                self.hashes.update({p.url_pathname or "a": p.page_script_hash for p in message.navigation.app_pages})
                self.seen.append(message.navigation.page_script_hash)
            elif kind == "new_session":
                self.seen.append(message.new_session.page_script_hash)
            elif kind == "auto_rerun":
                self.fragment = message.auto_rerun.fragment_id
            elif kind == "script_finished":
                self.finished += 1
            elif kind == "delta" and message.delta.new_element.WhichOneof("type") == "button":
                self.button = message.delta.new_element.button.id
                self.buttons += 1

    def send(self, widgets=(), **fields):
        message = BackMsg()
        for name, value in fields.items():
            setattr(message.rerun_script, name, value)
        message.rerun_script.widget_states.widgets.extend(widgets)
        return self.ws.send(message.SerializeToString())

    def click(self, page: str):
        return self.send(page_script_hash=self.hashes[page], widgets=[WidgetState(id=self.button, trigger_value=True)])

    def pages(self) -> list[str]:
        """``seen`` as page names ("A", "B"), in order."""
        names = {h: name.upper() for name, h in self.hashes.items()}
        return [names.get(h, "main") for h in self.seen]


async def _pages_after_a_stale_tick(wire: Wire, change: str) -> list[str]:
    """Open page A, go to B (``change``: "link", the browser asks for B as a sidebar link does;
    "button", A's button calls st.switch_page), and once B runs send A's fragment tick, as the
    browser's re-armed timer does. The pages the server then says the session is on ("A" / "B",
    in order: its navigation and new-session messages)."""
    await wire.send(query_string="")  # the browser opens the app: page A
    await wire.pump(60, lambda: wire.fragment and wire.finished and wire.button)
    await (wire.send(page_script_hash=wire.hashes["b"]) if change == "link" else wire.click("a"))
    await wire.pump(60, lambda: wire.seen and wire.seen[-1] == wire.hashes["b"])  # B runs (3 s)
    finished = wire.finished
    await wire.send(page_script_hash=wire.hashes["a"], fragment_id=wire.fragment, is_auto_rerun=True)  # A's tick
    await wire.pump(60, lambda: wire.finished > finished)  # B ends
    await wire.pump(3)  # and anything queued behind it
    return wire.pages()


def _serve(tmp_path, app: str, race, *args) -> list[str]:
    """Serve ``app`` with `streamlit run` and run ``race(wire, *args)`` against it; its result."""
    import websockets

    script = tmp_path / f"app{abs(hash(app))}.py"
    script.write_text(app)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(script), "--server.headless", "true",
                             "--server.address", "127.0.0.1", "--server.port", str(port),
                             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "WORKBENCH_HOME": str(tmp_path)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def connect_and_race():
        async with websockets.connect(f"ws://127.0.0.1:{port}/_stcore/stream", subprotocols=["streamlit"]) as ws:
            return await race(Wire(ws), *args)

    try:
        assert health(port) == "ok"
        return asyncio.run(connect_and_race())
    finally:
        stop(proc)


@pytest.mark.parametrize("change", ["link", "button"])
def test_a_stale_fragment_tick_does_not_take_the_session_back(tmp_path, change):
    """A sidebar link, and a button calling st.switch_page (Runs -> "Export this run", where the
    page the browser shows went blank: the session's page was then learnt only from the browser)."""
    pytest.importorskip("websockets")
    unguarded = _serve(tmp_path, APP.format(guard=""), _pages_after_a_stale_tick, change)
    assert unguarded[-1] == "A" and "B" in unguarded, unguarded  # the bounce, without the guard
    guarded = _serve(tmp_path, APP.format(guard=GUARD), _pages_after_a_stale_tick, change)
    assert guarded[-1] == "B", guarded
    assert guarded.count("A") == unguarded.count("A") - 1  # only the stale tick's run is gone


# Page A: a button whose action takes a while and then redraws the page (st.rerun), as the Runs
# page's "Cancel run" does; page B: another page.
ACTION_APP = """
import time

import streamlit as st
{guard}

def a():
    st.write("page A")
    if st.button("act"):
        time.sleep(4)  # the action (a cancel: signals, the store, the audit log)
        st.rerun()


def b():
    st.write("page B")


st.navigation([st.Page(a, title="A", url_path="a", default=True), st.Page(b, title="B", url_path="b")]).run()
"""
ONE_THREAD = "from streamlit import config; config.set_option('runner.fastReruns', False)"


async def _pages_after_a_click_during_an_action(wire: Wire) -> list[str]:
    """Open page A, click its button, and while the action runs ask for page B (a sidebar link).
    The pages the server then runs and navigates to, in order."""
    await wire.send(query_string="")  # the browser opens the app: page A
    await wire.pump(60, lambda: wire.finished and wire.button)
    await wire.click("a")
    # the click's run draws the button, then acts for 4 s: B is asked for at once, well inside the
    # action even on a loaded machine (asked after it, B would open without the guard too)
    await wire.pump(60, lambda: wire.buttons == 2)
    await wire.send(page_script_hash=wire.hashes["b"])  # the user goes to B while the action runs
    await wire.pump(12)  # the action ends, and everything queued behind it runs
    return wire.pages()


def test_a_page_clicked_during_an_action_opens_after_it(tmp_path):
    """Rule 5, on a real server: the user clicks page B while page A's button runs its action, which
    ends in st.rerun() (the Runs page's "Cancel run", then Audit in the sidebar: the admin's Audit
    page never showed). With one script thread and Streamlit's fold the script's own rerun, newer,
    wins: the session stays on A (the control). With the guard B opens, as with Streamlit's
    default fast reruns, where the click stops the script before it asks."""
    pytest.importorskip("websockets")
    race = _pages_after_a_click_during_an_action
    assert _serve(tmp_path, ACTION_APP.format(guard=""), race)[-1] == "B"  # Streamlit's defaults
    one_thread = _serve(tmp_path, ACTION_APP.format(guard=ONE_THREAD), race)
    assert one_thread[-1] == "A" and "B" not in one_thread, one_thread  # the race, with rule 4 alone
    guarded = _serve(tmp_path, ACTION_APP.format(guard=GUARD), race)
    assert guarded[-1] == "B", guarded


def test_the_app_installs_the_guard():
    """app.py installs it before it draws a page (the real app's first lines, not a copy)."""
    source = (ROOT / "app.py").read_text()
    assert source.index("page_guard.install()") < source.index("st.navigation(")


def _state(page: str = "", fragment: str = "") -> ClientState:
    return ClientState(page_script_hash=page, fragment_id=fragment)


@pytest.mark.parametrize("intent, state, stale", [
    ("B", _state("A", "f1"), True),    # a fragment of the page the user left
    ("B", _state("B", "f1"), False),   # a fragment of the page the user is on
    ("B", _state("A"), False),         # a full request (the user's own navigation): never dropped
    (None, _state("A", "f1"), False),  # no page recorded yet (a new session, or a reload)
    ("B", _state("", "f1"), False),    # no page named: "the current page"
    ("B", None, False),                # a rerun with the previous client state
])
def test_stale_fragment_rerun(intent, state, stale):
    assert stale_fragment_rerun(intent, state) is stale


def _rerun(page: str, fragment: str | None = None, **fields):
    from streamlit.runtime.scriptrunner_utils.script_requests import RerunData

    return RerunData(page_script_hash=page, page_name=page.lower(), query_string=f"q={page}", fragment_id=fragment,
                     **fields)


@pytest.mark.parametrize("first, then, page, fragments", [
    (_rerun("B"), _rerun("A", "f1", is_auto_rerun=True), "B", []),  # a tick folded into a page change
    (_rerun("A", "f1", is_auto_rerun=True), _rerun("B"), "B", []),  # a page change after a tick
    (_rerun("B"), _rerun("C"), "C", []),                            # two full requests: the newer
    (_rerun("A", "f1"), _rerun("A", "f2"), "A", ["f1", "f2"]),      # two fragment reruns: both run
])
def test_a_fragment_rerun_folded_into_a_pending_full_rerun_keeps_its_page(first, then, page, fragments):
    """Streamlit's own folding, with the guard installed (in this process, as app.py installs it):
    the pending request the runner will run next."""
    from streamlit.runtime.scriptrunner_utils.script_requests import ScriptRequests

    from workbench.ui import page_guard

    page_guard.install()
    requests = ScriptRequests()
    assert requests.request_rerun(first) and requests.request_rerun(then)
    pending = requests._rerun_data
    assert (pending.page_script_hash, pending.page_name, pending.query_string) == (page, page.lower(), f"q={page}")
    assert pending.fragment_id_queue == fragments


def test_fold_into_pending_is_streamlits_fold_but_for_the_page():
    """The rule alone: only a fragment rerun folded into a pending full rerun changes."""
    from workbench.ui.page_guard import fold_into_pending

    tick = _rerun("A", "f1", is_auto_rerun=True)
    folded = fold_into_pending(_rerun("B"), tick)
    assert (folded.page_script_hash, folded.page_name, folded.query_string, folded.is_auto_rerun) == ("B", "b", "q=B", False)
    assert folded.fragment_id == "f1" and folded.widget_states is tick.widget_states
    for pending, new in [(None, tick), (_rerun("A", "f0"), tick), (_rerun("B"), _rerun("C"))]:
        assert fold_into_pending(pending, new) is new


def test_users_request_wins():
    """Rule 5 alone: only the script's whole-app request over a pending whole-app one gives way."""
    from workbench.ui.page_guard import users_request_wins

    tick = _rerun("A", "f1", is_auto_rerun=True)
    assert users_request_wins(_rerun("B"), _rerun("A"), from_script=True)
    for pending, new, from_script in [(_rerun("B"), _rerun("A"), False),  # the user's newer request: Streamlit's fold
                                      (None, _rerun("A"), True),           # nothing pending
                                      (tick, _rerun("A"), True),           # a tick pending: the script's full rerun
                                      (_rerun("B"), tick, True)]:          # a fragment's own rerun: rule 3
        assert not users_request_wins(pending, new, from_script)


def test_a_scripts_rerun_gives_way_to_the_users_pending_request():
    """On Streamlit's own ScriptRequests: the user's request is pending when the script, on its own
    thread (a script run context), asks to rerun its page; the runner then takes the user's."""
    import threading

    from streamlit.runtime.scriptrunner_utils.script_requests import ScriptRequests, ScriptRequestType
    from streamlit.runtime.scriptrunner_utils.script_run_context import ScriptRunContext, add_script_run_ctx

    from workbench.ui import page_guard

    page_guard.install()
    requests = ScriptRequests()
    assert requests.request_rerun(_rerun("B"))  # the user's, from the server's event loop (no context)
    result = {}

    def script():
        result["accepted"] = requests.request_rerun(_rerun("A"))

    thread = threading.Thread(target=script)
    ctx = ScriptRunContext.__new__(ScriptRunContext)  # only its presence on the thread matters here
    add_script_run_ctx(thread, ctx)
    thread.start()
    thread.join()
    assert result["accepted"] and requests._state == ScriptRequestType.RERUN
    assert requests._rerun_data.page_script_hash == "B"


def test_one_script_thread_per_session():
    """Rule 4: the guard turns Streamlit's fast reruns off (each session reads the option at each
    request), so a click never starts a run beside a stopping one that shares its page registry."""
    from streamlit import config

    from workbench.ui import page_guard

    page_guard.install()
    assert config.get_option("runner.fastReruns") is False
