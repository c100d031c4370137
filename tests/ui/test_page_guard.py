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


async def _pages_after_a_stale_tick(port: int, change: str) -> list[str]:
    """Open page A, go to B (``change``: "link", the browser asks for B as a sidebar link does;
    "button", A's button calls st.switch_page), and once B runs send A's fragment tick, as the
    browser's re-armed timer does. The pages the server then says the session is on ("A" / "B",
    in order: its navigation and new-session messages)."""
    import websockets

    async with websockets.connect(f"ws://127.0.0.1:{port}/_stcore/stream", subprotocols=["streamlit"]) as ws:
        hashes: dict[str, str] = {}
        seen: list[str] = []
        state = {"fragment": None, "finished": 0, "button": None}

        async def pump(until, stop_when=lambda: False):
            while time.time() < until and not stop_when():
                try:
                    raw = await asyncio.wait_for(ws.recv(), timeout=max(0.01, until - time.time()))
                except asyncio.TimeoutError:
                    return
                message = ForwardMsg()
                message.ParseFromString(raw)
                kind = message.WhichOneof("type")
                if kind == "navigation":
                    hashes.update({p.url_pathname or "a": p.page_script_hash for p in message.navigation.app_pages})
                    seen.append(message.navigation.page_script_hash)
                elif kind == "new_session":
                    seen.append(message.new_session.page_script_hash)
                elif kind == "auto_rerun":
                    state["fragment"] = message.auto_rerun.fragment_id
                elif kind == "script_finished":
                    state["finished"] += 1
                elif kind == "delta" and message.delta.new_element.WhichOneof("type") == "button":
                    state["button"] = message.delta.new_element.button.id

        def send(widgets=(), **fields):
            message = BackMsg()
            for name, value in fields.items():
                setattr(message.rerun_script, name, value)
            message.rerun_script.widget_states.widgets.extend(widgets)
            return ws.send(message.SerializeToString())

        await send(query_string="")  # the browser opens the app: page A
        await pump(time.time() + 60, lambda: state["fragment"] and state["finished"] and state["button"])
        if change == "link":
            await send(page_script_hash=hashes["b"])
        else:
            await send(page_script_hash=hashes["a"], widgets=[WidgetState(id=state["button"], trigger_value=True)])
        await pump(time.time() + 60, lambda: seen and seen[-1] == hashes["b"])  # B runs (3 s)
        finished = state["finished"]
        await send(page_script_hash=hashes["a"], fragment_id=state["fragment"], is_auto_rerun=True)  # A's tick
        await pump(time.time() + 60, lambda: state["finished"] > finished)  # B ends
        await pump(time.time() + 3)  # and anything queued behind it
        names = {h: name.upper() for name, h in hashes.items()}
        return [names.get(h, "main") for h in seen]


def _serve_and_race(tmp_path, guard: str, change: str) -> list[str]:
    script = tmp_path / f"app{len(guard)}.py"
    script.write_text(APP.format(guard=guard))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(script), "--server.headless", "true",
                             "--server.address", "127.0.0.1", "--server.port", str(port),
                             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "WORKBENCH_HOME": str(tmp_path)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert health(port) == "ok"
        return asyncio.run(_pages_after_a_stale_tick(port, change))
    finally:
        stop(proc)


@pytest.mark.parametrize("change", ["link", "button"])
def test_a_stale_fragment_tick_does_not_take_the_session_back(tmp_path, change):
    """A sidebar link, and a button calling st.switch_page (Runs -> "Export this run", where the
    page the browser shows went blank: the session's page was then learnt only from the browser)."""
    pytest.importorskip("websockets")
    unguarded = _serve_and_race(tmp_path, guard="", change=change)
    assert unguarded[-1] == "A" and "B" in unguarded, unguarded  # the bounce, without the guard
    guarded = _serve_and_race(tmp_path, guard=GUARD, change=change)
    assert guarded[-1] == "B", guarded
    assert guarded.count("A") == unguarded.count("A") - 1  # only the stale tick's run is gone


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


def test_one_script_thread_per_session():
    """Rule 4: the guard turns Streamlit's fast reruns off (each session reads the option at each
    request), so a click never starts a run beside a stopping one that shares its page registry."""
    from streamlit import config

    from workbench.ui import page_guard

    page_guard.install()
    assert config.get_option("runner.fastReruns") is False
