"""Keep a page change from being undone by the page the user has just left.

A live page (Compare, Runs) redraws its fragments on a timer (``st.fragment(run_every=...)``): the
browser sends a fragment rerun carrying the page it believes is current. When the user clicks
another page, the browser clears its timers and asks for the new page, but a fragment run that was
already under way on the server announces its timer again, the browser re-arms it, and its next
tick still names the old page. Streamlit (1.67) accepts that tick while the new page runs (the
fragment is only dropped at the end of that run), queues it, and runs it afterwards *as the old
page*: the browser's address and current page flip back, and the user's next click on the new page
(a selectbox, a button) reruns the old one. Seen on a loaded machine: the Runs page opened from a
live Compare page bounced back to Compare.

The guard: a session remembers the page of the last request that was not a fragment rerun (the
user's own navigation or interaction); a fragment rerun that names another page is dropped, as
Streamlit already drops one whose fragment no longer exists.
"""

from __future__ import annotations

import logging

_LOG = logging.getLogger(__name__)
_INTENT = "_wb_page_intent"  # attribute set on each AppSession: the page its user is on


def stale_fragment_rerun(intent: str | None, client_state) -> bool:
    """True when ``client_state`` reruns a fragment of a page other than ``intent`` (the page the
    session's last full request asked for). An empty page hash means "the current page" and a
    session with no recorded intent accepts everything."""
    return bool(client_state is not None and client_state.fragment_id and intent
                and client_state.page_script_hash and client_state.page_script_hash != intent)


def install() -> None:
    """Wrap ``AppSession.request_rerun`` once per process (idempotent)."""
    from streamlit.runtime.app_session import AppSession

    if getattr(AppSession.request_rerun, "_wb_page_guard", False):
        return
    original = AppSession.request_rerun

    def request_rerun(self, client_state=None):
        intent = getattr(self, _INTENT, None)
        if stale_fragment_rerun(intent, client_state):
            _LOG.info("dropped a fragment rerun of page %s: the session is on page %s",
                      client_state.page_script_hash, intent)
            return None
        if client_state is not None and not client_state.fragment_id and client_state.page_script_hash:
            setattr(self, _INTENT, client_state.page_script_hash)
        return original(self, client_state)

    request_rerun._wb_page_guard = True
    AppSession.request_rerun = request_rerun
