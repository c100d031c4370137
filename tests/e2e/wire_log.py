"""What the browser and the Streamlit server said to each other over the page's websocket, kept
for a failing browser test's message: the reruns the browser asked for (page, fragment, timer
tick or not) and what the server answered (a run's page and fragments, navigation, fragment
timers armed and stopped, runs finished). A page that never shows its content is then explained
by its session's last exchanges, not only by a screenshot."""

from __future__ import annotations

import time
from collections import deque

from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

KEPT = 400  # the newest exchanges a failure message can show


def _back(raw: bytes) -> str | None:
    message = BackMsg()
    message.ParseFromString(raw)
    if message.WhichOneof("type") != "rerun_script":
        return None
    rerun = message.rerun_script
    tick = " tick" if rerun.is_auto_rerun else ""
    return f"-> rerun page={rerun.page_script_hash[:6] or '-'} fragment={rerun.fragment_id[:6] or '-'}{tick}"


def _forward(raw: bytes, deltas: list[int]) -> str | None:
    """``deltas``: one counter, the elements received since the last run started."""
    message = ForwardMsg()
    message.ParseFromString(raw)
    kind = message.WhichOneof("type")
    if kind in ("delta", "ref_hash"):
        deltas[0] += 1
        return None
    if kind == "new_session":
        deltas[0] = 0
        session = message.new_session
        run = message.metadata.run
        fragments = ",".join(f[:6] for f in run.fragment_ids) or "-"
        return f"<- run {run.script_run_id[:6]} page={session.page_script_hash[:6]} fragments={fragments}"
    if kind == "navigation":
        return f"<- navigation page={message.navigation.page_script_hash[:6]}"
    if kind == "auto_rerun":
        return f"<- timer fragment={message.auto_rerun.fragment_id[:6]} every {message.auto_rerun.interval:g} s"
    if kind == "stop_auto_rerun":
        return f"<- stop timers {','.join(f[:6] for f in message.stop_auto_rerun.fragment_ids)}"
    if kind == "script_finished":
        return (f"<- finished {message.metadata.run.script_run_id[:6]} "
                f"{ForwardMsg.ScriptFinishedStatus.Name(message.script_finished)} after {deltas[0]} elements")
    if kind == "page_not_found":
        return "<- page not found"
    return None


class WireLog:
    """Attach to a Playwright page before it opens the app; ``text()`` is the newest exchanges,
    one per line, with seconds since the log started. The seconds are when this process handled
    the frame: Playwright's sync client delivers events only inside its calls, so a frame stamped
    late may have waited out a ``time.sleep`` of the test's (``test_browser.pause``)."""

    def __init__(self, page) -> None:
        self.start = time.time()
        self.lines: deque[str] = deque(maxlen=KEPT)
        self.deltas = [0]
        page.on("websocket", self._watch)

    def _watch(self, socket) -> None:
        if "_stcore/stream" not in socket.url:
            return
        socket.on("framesent", lambda payload: self._note(_back, payload))
        socket.on("framereceived", lambda payload: self._note(lambda raw: _forward(raw, self.deltas), payload))

    def _note(self, decode, payload) -> None:
        if isinstance(payload, str):
            return
        try:
            line = decode(payload)
        except Exception as err:  # a frame this Streamlit's protos cannot read: say so, go on
            line = f"?? {type(err).__name__}"
        if line:
            self.lines.append(f"{time.time() - self.start:7.2f} {line}")

    def text(self, last: int = 60) -> str:
        return "\n".join(list(self.lines)[-last:])
