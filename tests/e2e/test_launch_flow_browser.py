"""In chromium: a launch clicked at the bottom of /launch answers where the user is (the message
and the link inside the viewport), a burst of clicks starts one run, and the link opens that run
on Live / Compare (not the newest comparison group)."""

from __future__ import annotations

import time

from tests.e2e.conftest import sign_in
from tests.e2e.test_browser import store, wait_until  # noqa: F401  (the fixture cancels what the test started)

# Clicks the launch button every 50 ms from the page itself, like an impatient user, until the
# launch has answered: until the button, once drawn disabled, is enabled again (the launch is
# recorded), or the success message shows, or 4 s pass. Returns the number of clicks delivered
# to an enabled button.
CLICK_BURST = """async () => {
  const button = () => Array.from(document.querySelectorAll('button')).find(b => b.innerText.trim() === 'Launch run');
  let clicks = 0, seenDisabled = false;
  const end = Date.now() + 4000;
  while (Date.now() < end) {
    const b = button();
    if (document.body.innerText.includes('Launched run')) break;
    if (b && b.disabled) seenDisabled = true;
    else if (b && seenDisabled) break;
    else if (b) { b.click(); clicks += 1; }
    await new Promise(r => setTimeout(r, 50));
  }
  return clicks;
}"""


def in_viewport(locator, page) -> bool:
    box = locator.bounding_box()
    height = page.viewport_size["height"]
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= height


def test_a_launch_at_the_bottom_answers_there_once_and_opens_the_run(browser_page, server, store, e2e_home,  # noqa: F811
                                                                       monkeypatch):
    from tests.ui.seed import add_run

    monkeypatch.setenv("WORKBENCH_HOME", str(e2e_home))
    add_run(store, name="older", group=f"older-group-{int(time.time())}")  # the newest group, not what is launched
    page = browser_page
    page.goto(f"{server}/launch")
    sign_in(page)
    page.get_by_role("tab", name="Training").click()
    steps = page.get_by_label("steps", exact=True)
    steps.fill("2")
    steps.press("Enter")
    go = page.get_by_role("button", name="Launch run")
    wait_until(lambda: go.is_enabled(), 30, "the launch button to be enabled", page=page)

    # ---- at the bottom of the page, click (and keep clicking) -------------------------------------
    go.scroll_into_view_if_needed()
    page.mouse.move(700, 500)
    page.mouse.wheel(0, 20000)
    page.wait_for_timeout(500)
    assert in_viewport(go, page)
    before = set(store.list_runs(status=None)["id"])
    go.dblclick()
    page.evaluate(CLICK_BURST)
    message = page.get_by_text("Launched run")
    wait_until(lambda: message.is_visible(), 60, "the launch's message", page=page)
    page.wait_for_timeout(1500)  # a queued duplicate would have been recorded by now
    assert in_viewport(message, page), "the launch's message is outside the viewport"
    link = page.get_by_role("link", name="Open Live / Compare")
    assert in_viewport(link, page)
    wait_until(lambda: go.is_enabled(), 30, "the button to be enabled again once the launch is recorded", page=page)
    new = set(store.list_runs(status=None)["id"]) - before
    assert len(new) == 1, f"a burst of clicks launched {len(new)} runs: {sorted(new)}"
    [run_id] = new

    # ---- the link opens that run, not the newest group --------------------------------------------------
    link.click()
    page.get_by_role("heading", name="Live / Compare").wait_for()
    assert f"run={run_id}" in page.url
    runs_mode = page.get_by_role("radio", name="Runs")
    wait_until(lambda: runs_mode.is_checked(), 30, "Live / Compare to open in Runs mode", page=page)
    chosen = page.locator("[data-testid='stMultiSelect']").first
    wait_until(lambda: run_id in chosen.inner_text(), 30, "the launched run to be the one chosen", page=page)
