"""A page change is not undone by the live page the user left (workbench/ui/page_guard.py).

A real `streamlit run` server and a websocket client that sends what the browser sends in the race
seen on a loaded machine (the Runs page opened from a live Compare page bounced back to Compare):
the user's click to page B, then a fragment tick of page A's live fragment that the browser had
re-armed. Without the guard Streamlit runs that tick after B *as page A* (its session and the
browser's address flip back to A: the control case, proof the race is real on this version); with
it the session stays on B.
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

from tests.ui.test_server import ROOT, free_port, health, stop
from workbench.ui.page_guard import stale_fragment_rerun

# Page A: a live fragment. Page B: slow enough that a tick arrives while it runs.
APP = """
import time

import streamlit as st
{guard}

def a():
    st.write("page A")
    st.fragment(lambda: st.write(time.time()), run_every=0.3)()


def b():
    time.sleep(3)
    st.write("page B")


st.navigation([st.Page(a, title="A", url_path="a", default=True), st.Page(b, title="B", url_path="b")]).run()
"""
GUARD = "from workbench.ui import page_guard; page_guard.install()"


async def _pages_after_a_stale_tick(port: int) -> list[str]:
    """Open page A, click to B, and once B runs send A's fragment tick; the pages the server then
    says the session is on ("A" / "B", in order: navigation and new-session messages)."""
    import websockets

    async with websockets.connect(f"ws://127.0.0.1:{port}/_stcore/stream", subprotocols=["streamlit"]) as ws:
        hashes: dict[str, str] = {}
        seen: list[str] = []
        state = {"fragment": None, "finished": 0}

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

        def send(**fields):
            message = BackMsg()
            for name, value in fields.items():
                setattr(message.rerun_script, name, value)
            return ws.send(message.SerializeToString())

        await send(query_string="")  # the browser opens the app: page A
        await pump(time.time() + 60, lambda: state["fragment"] and state["finished"])
        await send(page_script_hash=hashes["b"])  # the click on B
        await pump(time.time() + 60, lambda: seen[-1] == hashes["b"])  # B runs (3 s)
        finished = state["finished"]
        await send(page_script_hash=hashes["a"], fragment_id=state["fragment"], is_auto_rerun=True)  # A's tick
        await pump(time.time() + 60, lambda: state["finished"] > finished)  # B ends
        await pump(time.time() + 3)  # and anything queued behind it
        names = {h: name.upper() for name, h in hashes.items()}
        return [names.get(h, "main") for h in seen]


def _serve_and_race(tmp_path, guard: str) -> list[str]:
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
        return asyncio.run(_pages_after_a_stale_tick(port))
    finally:
        stop(proc)


def test_a_stale_fragment_tick_does_not_take_the_session_back(tmp_path):
    pytest.importorskip("websockets")
    unguarded = _serve_and_race(tmp_path, guard="")
    assert unguarded[-1] == "A" and "B" in unguarded, unguarded  # the bounce, without the guard
    guarded = _serve_and_race(tmp_path, guard=GUARD)
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
