"""Keep a page change from being undone by the page the user has just left.

A live page (Compare, Runs) redraws its fragments on a timer (``st.fragment(run_every=...)``): the
browser's timer sends a fragment rerun naming the page the browser last heard it was on. Streamlit
(1.67) runs such a rerun under the page it names, even when the session has moved on: the
browser, told that a run of another page started, clears the page it shows (its elements and,
on a navigation message, its address) and the fragment, no longer there, draws nothing. The user
sees the page they opened go blank or flip back. It happens when a tick crosses a page change:

- the user clicks another page while a tick is on its way, or a tick fires while the page that
  will leave runs (a button that calls ``st.switch_page``: Runs -> "Export this run");
- Streamlit folds a tick that arrives while a full rerun is pending into that rerun and gives the
  result the *tick's* page (the newer request's), so a pending page change can be turned back
  into a rerun of the page being left.

Seen on loaded machines: the Runs page opened from a live Compare page bounced back to Compare,
and the Export page opened from Runs stayed blank.

The guard, installed once per process before the app draws a page:

1. each session knows its page: the page named by its latest full request, whether the user's
   (a click, an interaction; a request naming no page makes it unknown) or the script's own
   (``st.switch_page``, ``st.rerun``), and then the page its full run resolves in
   ``st.navigation``;
2. a fragment rerun naming another page is dropped, as Streamlit drops one whose fragment no
   longer exists;
3. a fragment rerun folded into a pending full rerun keeps the full rerun's page (the full rerun
   reruns the fragments anyway);
4. one script thread per session at a time (``runner.fastReruns`` off): with fast reruns a click
   stops the running thread and starts the next run's at once, and the two share the session's
   page registry, so a fragment run that had not yet reached its first stop check (a live page's
   tick, on a loaded machine) sets the page the new run then resolves, and the page the user
   clicked never opens. Without them the click is folded into the running thread's requests
   (rule 3) and taken at its next Streamlit call: a redraw already under way ends at its next
   element instead of at once;
5. a whole-app rerun the script asks for (``st.rerun`` after an action, ``st.switch_page``) while
   one the user asked for is pending is dropped: the user's is newer and reruns the app anyway.
   With one thread per session the user's click (Runs -> Audit, just after "Cancel run") waits
   for the running script's next Streamlit call, and Streamlit folds the script's own request over
   it, newer wins: the app drew the page it was redrawing and the page clicked never opened. With
   fast reruns the click had stopped the script first, so this is the order Streamlit itself keeps.
"""

from __future__ import annotations

import logging
from dataclasses import replace

_LOG = logging.getLogger(__name__)
_PAGE = "_wb_session_page"  # attribute set on each session's PagesManager: the page its user is on
_INSTALLED = "_wb_page_guard"


def stale_fragment_rerun(page: str | None, client_state) -> bool:
    """True when ``client_state`` reruns a fragment of a page other than ``page`` (the session's
    page). An empty page hash means "the current page" and a session whose page is unknown
    accepts everything."""
    return bool(client_state is not None and client_state.fragment_id and page
                and client_state.page_script_hash and client_state.page_script_hash != page)


def full_rerun(rerun_data) -> bool:
    """Whether a ``RerunData`` reruns the whole app (not only fragments)."""
    return not (rerun_data.fragment_id or rerun_data.fragment_id_queue or rerun_data.is_fragment_scoped_rerun)


def fold_into_pending(pending, new):
    """The request Streamlit should fold into ``pending``: ``new`` itself, except that a fragment
    rerun folded into a pending full rerun takes the full rerun's page, address and origin (else
    the newer request's page wins and a pending page change becomes a rerun of the old page)."""
    if pending is None or not full_rerun(pending) or full_rerun(new):
        return new
    return replace(new, page_script_hash=pending.page_script_hash, page_name=pending.page_name,
                   query_string=pending.query_string, is_auto_rerun=pending.is_auto_rerun,
                   context_info=pending.context_info)


def users_request_wins(pending, new, from_script: bool) -> bool:
    """Rule 5: whether ``new``, asked for by the script itself (``from_script``), is dropped in
    favour of ``pending``: both rerun the whole app. A pending whole-app request cannot be the
    script's own (the script stops at the request it makes), so it is the user's, and newer."""
    return from_script and pending is not None and full_rerun(pending) and full_rerun(new)


def _session_page(pages) -> str | None:
    return getattr(pages, _PAGE, None)


def _set_session_page(pages, page_script_hash: str | None) -> None:
    setattr(pages, _PAGE, page_script_hash or None)  # no page named: unknown until st.navigation resolves it


def _guard_the_users_requests(AppSession) -> None:
    """The browser's requests, at the session's door: a full request names the session's page,
    a fragment rerun of another page is dropped."""
    original = AppSession.request_rerun

    def request_rerun(self, client_state=None):
        pages = self._pages_manager
        if stale_fragment_rerun(_session_page(pages), client_state):
            _LOG.info("dropped a fragment rerun of page %s: the session is on page %s",
                      client_state.page_script_hash, _session_page(pages))
            return None
        if client_state is not None and not client_state.fragment_id:
            _set_session_page(pages, client_state.page_script_hash)
        return original(self, client_state)

    AppSession.request_rerun = request_rerun


def _learn_resolved_pages(ScriptRunContext) -> None:
    """The page each full run resolves in st.navigation."""
    original = ScriptRunContext.set_mpa_v2_page

    def set_mpa_v2_page(self, page_script_hash):
        _set_session_page(self.pages_manager, page_script_hash)
        return original(self, page_script_hash)

    ScriptRunContext.set_mpa_v2_page = set_mpa_v2_page


def _guard_the_folding(ScriptRequests, RERUN, get_script_run_ctx) -> None:
    """Where Streamlit folds a request into the pending one: a full request made by the script
    itself (st.switch_page, st.rerun) gives way to a pending one of the user's, else names the
    session's page at once; a fragment rerun folded into a pending full rerun keeps the full
    rerun's page."""
    original = ScriptRequests._request_rerun_locked

    def _request_rerun_locked(self, new_data):
        ctx = get_script_run_ctx(suppress_warning=True)  # None on the server's event loop (the browser's requests)
        pending = self._rerun_data if self._state == RERUN else None
        if users_request_wins(pending, new_data, from_script=ctx is not None):
            _LOG.info("kept the user's pending rerun of page %s over the script's of page %s",
                      pending.page_script_hash, new_data.page_script_hash)
            return True  # the script's next Streamlit call takes the user's request
        if ctx is not None and full_rerun(new_data):
            _set_session_page(ctx.pages_manager, new_data.page_script_hash)
        return original(self, fold_into_pending(pending, new_data))

    ScriptRequests._request_rerun_locked = _request_rerun_locked


def install() -> None:
    """Install the five rules once per process (idempotent)."""
    from streamlit import config
    from streamlit.runtime.app_session import AppSession
    from streamlit.runtime.scriptrunner_utils.script_requests import ScriptRequests, ScriptRequestType
    from streamlit.runtime.scriptrunner_utils.script_run_context import ScriptRunContext, get_script_run_ctx

    if getattr(AppSession, _INSTALLED, False):
        return
    _guard_the_users_requests(AppSession)
    _learn_resolved_pages(ScriptRunContext)
    _guard_the_folding(ScriptRequests, ScriptRequestType.RERUN, get_script_run_ctx)
    config.set_option("runner.fastReruns", False)  # read by each session at each request
    setattr(AppSession, _INSTALLED, True)
