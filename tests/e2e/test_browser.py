"""End to end in chromium: sign in, launch a GRPO-vs-RLOO comparison on the tiny model, watch the
live chart gain points without a reload, cancel one run, export its sbatch script. Screenshots
go to a temporary folder; `make screenshots` saves them into docs/ (the README's pictures)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import sign_in
from workbench.runs import RunStore, cancel
from workbench.runs.authz import local_principal

DOCS = Path(__file__).resolve().parents[2] / "docs"


def tracked_pictures() -> dict[str, str]:
    """docs/*.png -> sha256 of its bytes (what a test must leave as it found it)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(DOCS.glob("*.png"))}
# Points per run in the reward chart as the browser holds it (x may be a plain array or plotly's
# base64 typed-array spec {dtype, bdata}; Streamlit's theme wraps the title in <b>).
REWARD_POINTS = """() => {
  const plot = Array.from(document.querySelectorAll('.js-plotly-plot'))
      .find(p => p.layout && p.layout.title && String(p.layout.title.text).includes('Reward (batch mean)'));
  const size = {f8: 8, f4: 4, i4: 4, i8: 8, u1: 1};
  const len = v => v == null ? 0 : (v.length !== undefined ? v.length : atob(v.bdata).length / (size[v.dtype] || 8));
  return plot ? plot.data.filter(t => !String(t.name).endsWith('(raw)')).map(t => len(t.x)) : null;
}"""


# Charts drawn right now: plots whose traces are on screen (a chart being remounted has none).
DRAWN_CHARTS = """() => Array.from(document.querySelectorAll('.js-plotly-plot'))
    .filter(p => p.layout && p.querySelector('.scatterlayer .trace'))
    .map(p => String(p.layout.title && p.layout.title.text))"""
FAILURE_SHOT = Path("/tmp") / "wb-e2e-failure.png"


def _show_charts(page) -> None:
    """Scroll the page's legend and first charts into the viewport for a screenshot (the README's
    pictures show the curves, not only the controls above them). In the page's own JavaScript: a
    live page replaces its elements while a locator holds one."""
    wait_until(lambda: page.evaluate("""() => {
        const help = Array.from(document.querySelectorAll('summary'))
            .find(e => e.innerText.includes('What these charts show'));  // just above the legend and charts
        if (help) help.scrollIntoView({block: 'start'});
        return !!help; }"""),
               30, "a chart to scroll to", page=page)
    wait_until(lambda: page.evaluate(DRAWN_CHARTS), 30, "the charts to be drawn", page=page)
    page.wait_for_timeout(1000)


# Every wait in the browser tests is a liveness bound, not a speed claim: `make test` runs this
# partition beside another on 2 cores, where a Streamlit rerun takes several times what it takes
# alone (a launch's message once took over 60 s to show there, seconds alone).
LOADED_MACHINE_FACTOR = 3


def pause(page, seconds: float) -> None:
    """Wait ``seconds`` while Playwright's sync client keeps serving the page: its route handlers
    and event listeners are Python callbacks that run only inside a Playwright call, so a
    ``time.sleep`` holds them. A websocket routed through the test (``ClickForger``) then holds
    every message the page sends: a click sent after ``click()`` returned reached the server only
    at the next Playwright call (a failure's screenshot, 180 s later, under CI's load)."""
    if page is None:
        time.sleep(seconds)
    else:
        page.wait_for_timeout(seconds * 1000)


def wait_until(predicate, timeout: float, what: str, poll: float = 0.5, page=None):
    """Poll ``predicate`` until it is truthy (returned) or ``timeout`` x LOADED_MACHINE_FACTOR
    seconds pass (fails with a screenshot, the page's messages and the start of its text).
    Between polls ``page``'s handlers are served (``pause``)."""
    timeout *= LOADED_MACHINE_FACTOR
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        pause(page, poll)
    text = ""
    if page is not None:
        page.screenshot(path=str(FAILURE_SHOT), full_page=True)
        alerts = [a.inner_text() for a in page.locator("[data-testid='stAlert'], [data-testid='stException']").all()]
        text = (f"address: {page.url}; messages: {alerts}; "
                + page.locator("section.main, [data-testid='stMain']").first.inner_text()[:1500])
        if hasattr(page, "wire"):
            text += f"\nthe websocket's last exchanges:\n{page.wire.text()}"
    pytest.fail(f"timed out after {timeout} s waiting for {what}; screenshot {FAILURE_SHOT}; page text: {text}")


def select_option(page, label: str, option: str) -> None:
    """Streamlit selectbox / multiselect: open it, type the option, pick it."""
    box = page.get_by_label(label, exact=True)
    box.click()
    box.fill(option)
    box.press("Enter")  # picks the first option that matches the typed text


@pytest.fixture
def store(e2e_home):
    """The server's run store; every run still active at the end is cancelled (they are detached)."""
    store = RunStore(e2e_home / "runs.db")
    yield store
    for run_id in store.list_runs(status=None)["id"]:
        cancel(run_id, principal=local_principal(), store=store, grace_s=5)


def test_launch_watch_cancel_export(browser_page, server, store, tmp_path, screenshots):
    page = browser_page
    pictures_before = tracked_pictures()

    # ---- sign in (the Launch page opened by its own address) -------------------------------------
    page.goto(f"{server}/launch")
    launch = page.get_by_role("button", name="Launch run")
    launch.wait_for()
    assert page.get_by_text("Page not found").count() == 0
    assert launch.is_disabled()
    assert "A workbench password is set" in page.get_by_test_id("stSidebar").inner_text()
    sign_in(page)

    # ---- configure: short runs, GRPO + RLOO in one group --------------------------------------
    page.get_by_role("tab", name="Training").click()
    steps = page.get_by_label("steps", exact=True)
    steps.fill("3000")  # long enough to cancel one while it runs (the other is cancelled at teardown)
    steps.press("Enter")
    compare = page.get_by_label("Compare with these algorithms", exact=False)
    compare.click()
    compare.fill("rloo")
    page.get_by_role("option", name="rloo").first.click()
    page.keyboard.press("Escape")
    go = page.get_by_role("button", name="Launch 2 runs")
    wait_until(lambda: go.is_enabled(), 30, "the launch button to be enabled", page=page)
    page.screenshot(path=str(screenshots / "launch.png"))
    go.click()
    page.get_by_text("Launched comparison group").wait_for()
    runs = store.list_runs()
    assert sorted(runs["algorithm"]) == ["grpo", "rloo"] and set(runs["created_by"]) == {"erin (password)"}
    rloo_id = runs.loc[runs["algorithm"] == "rloo", "id"].item()

    # ---- watch live: the chart gains points while the page is not reloaded -----------------------
    page.get_by_role("link", name="Open Live / Compare").click()
    page.evaluate("() => { window.__wbNoReload = 'still here'; }")
    first = wait_until(lambda: (n := page.evaluate(REWARD_POINTS)) and max(n) >= 1 and n, 180, "the first points", page=page)
    wait_until(lambda: (n := page.evaluate(REWARD_POINTS)) and sum(n) >= sum(first) + 3 and n, 120,
                       "the live chart to gain points", page=page)
    assert page.evaluate("() => window.__wbNoReload") == "still here"  # same document: no reload
    assert page.evaluate("() => performance.getEntriesByType('navigation').length") == 1
    # while both runs train, the charts stay on screen (they were blank for long stretches): a DOM
    # check every second for 30 s, a screenshot of any moment without a drawn reward chart
    blank = []
    for second in range(30):
        drawn = page.evaluate(DRAWN_CHARTS)
        if not any("Reward (batch mean)" in t for t in drawn):
            page.screenshot(path=str(screenshots / f"blank-{second}.png"))
            blank.append((second, len(drawn)))
        page.wait_for_timeout(1000)
    assert not blank, f"seconds without a drawn reward chart (second, charts drawn): {blank}; shots in {screenshots}"
    assert store.get_run(rloo_id)["status"] == "running"  # the check ran while the runs were live
    _show_charts(page)
    page.screenshot(path=str(screenshots / "app.png"))

    # ---- cancel the RLOO run -------------------------------------------------------------------------
    page.get_by_test_id("stSidebar").get_by_role("link", name="Runs").click()
    # the Runs page opens and stays open: a live Compare page's late fragment tick once took the
    # session back to Compare (workbench/ui/page_guard.py), and the Run box below was Compare's
    heading = page.get_by_role("heading", name="Manage a run")
    wait_until(heading.is_visible, 60, "the Runs page", page=page)
    select_option(page, "Run", rloo_id)
    wait_until(lambda: page.get_by_label("Name", exact=True).input_value() == "rloo", 30, "the run to be selected", page=page)
    assert page.url.split("?")[0].endswith("/runs"), page.url
    cancel = page.get_by_role("button", name="Cancel run")
    wait_until(lambda: cancel.is_enabled(), 30, "the cancel button", page=page)
    cancel.click()
    wait_until(lambda: store.get_run(rloo_id)["status"] == "cancelled", 60, "the run to be cancelled", page=page)
    page.get_by_text("Status: cancelled").wait_for()  # the status line updates in place
    # nothing on the page still says it runs (the selector's label said "running" after the cancel)
    assert page.get_by_label("Run", exact=True).input_value() == f"rloo · {rloo_id}"
    wait_until(lambda: page.get_by_role("button", name="Cancel run").is_disabled(), 30, "cancel to be disabled", page=page)
    page.wait_for_timeout(2500)  # one refresh of the runs table (every 2 s while runs are live)
    page.screenshot(path=str(screenshots / "runs.png"))

    # ---- export its sbatch script ---------------------------------------------------------------------
    export = page.get_by_role("button", name="Export this run (YAML, bash, sbatch)")
    wait_until(export.is_visible, 60, "the Export button", page=page)
    export.click()
    sbatch_tab = page.get_by_role("tab", name="sbatch")
    wait_until(sbatch_tab.is_visible, 60, "the Export page", page=page)
    sbatch_tab.click()
    download_button = page.get_by_role("button", name="Download sbatch script")
    wait_until(download_button.is_visible, 60, "the sbatch script", page=page)
    assert page.url.split("?")[0].endswith("/export"), page.url
    with page.expect_download() as download:
        download_button.click()
    target = tmp_path / download.value.suggested_filename
    download.value.save_as(target)
    script = target.read_text()
    assert download.value.suggested_filename == "rloo.sbatch"
    assert "#SBATCH --job-name=rloo" in script and "-m workbench train" in script
    assert "advantage: rloo" in script and "steps: 3000" in script  # the run's own recipe, inlined
    page.screenshot(path=str(screenshots / "export.png"))
    assert page.evaluate("() => window.__wbNoReload") == "still here"  # navigation stayed client-side
    assert (screenshots / "app.png").stat().st_size > 0
    if screenshots.resolve() != DOCS.resolve():  # only `make screenshots` may rewrite the README's pictures
        assert tracked_pictures() == pictures_before


def test_every_lab_page_renders_its_figures(browser_page, server):
    """Each lab, opened by URL in chromium: no exception box, and the analytic figures are drawn."""
    from workbench.ui.labs import lab_pages
    from workbench.algorithms import FAMILIES

    walkthroughs = tuple(f"walkthrough-{f.slug}-" for f in FAMILIES.values())  # every registry family
    page = browser_page
    for _, title, url_path in lab_pages():
        page.goto(f"{server}/{url_path}")
        main = page.get_by_test_id("stMain")
        main.get_by_role("heading").first.wait_for()
        # a registry walkthrough's worked example is a table (a loss with a ratio curve adds a figure)
        if url_path.startswith(walkthroughs):
            wait_until(lambda: page.get_by_test_id("stDataFrame").count() > 1, 60, f"the worked example on {title}", page=page)
        elif url_path not in ("lab-lens", "lab-experiments"):  # these plot runs only: none here yet
            wait_until(lambda: page.locator(".js-plotly-plot").count() > 0, 60, f"a figure on {title}", page=page)
        page.wait_for_timeout(500)  # let the script run finish before looking for errors
        errors = page.get_by_test_id("stException")
        assert errors.count() == 0, f"{title}: {errors.first.inner_text()[:800]}"


# The arms view's reward chart as the browser holds it: names of the filled band traces.
REWARD_BANDS = """() => {
  const plot = Array.from(document.querySelectorAll('.js-plotly-plot'))
      .find(p => p.layout && p.layout.title && String(p.layout.title.text).includes('Reward (batch mean)'));
  return plot ? plot.data.filter(t => t.fill === 'toself').map(t => t.name) : null;
}"""


def test_arms_view_draws_bands_and_the_verdict(browser_page, server, store, e2e_home, screenshots):
    """Two arms x 3 seeds (finished runs in the server's store): Live / Compare opens on the arms
    view, the reward chart has a 95% band per arm, and the verdict table is drawn."""
    from tests.ui.seed import add_arm_run, metrics_event

    for arm, offset in (("grpo", 0.0), ("rloo", 0.3)):
        for seed in range(3):
            add_arm_run(store, f"arms-{arm}-{seed}", arm, seed,
                        [metrics_event(step, 1000.0 + step, offset + 0.02 * seed) for step in range(20)],
                        group="arms-e2e", home=e2e_home)
    page = browser_page
    page.goto(f"{server}/compare")  # opens on the newest group
    bands = wait_until(lambda: page.evaluate(REWARD_BANDS), 60, "the reward chart's bands", page=page)
    assert bands == ["grpo (95% CI)", "rloo (95% CI)"]
    page.get_by_text("Mean over seeds per arm: grpo: 3 seeds · rloo: 3 seeds").wait_for()
    assert page.get_by_test_id("stException").count() == 0
    _show_charts(page)
    page.screenshot(path=str(screenshots / "arms.png"))
    verdict = page.get_by_role("heading", name="Verdict")
    verdict.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    page.screenshot(path=str(screenshots / "verdict.png"))


def test_sidebar_groups_the_labs_and_reaches_every_lab_page(browser_page, server):
    """The sidebar showed 5 of 34 labs ("View 29 more") in one list. Now: the sections in the
    learner's order, every listed lab a sidebar link, no "View more", and each page merged out of
    the sidebar linked from the walkthrough that stands for it; a link opens its page."""
    from workbench.ui.labs import SECTIONS, labs

    page = browser_page
    page.goto(f"{server}/lab-kl")
    nav = page.get_by_test_id("stSidebarNav")
    nav.get_by_test_id("stNavSectionHeader").first.wait_for()
    headers = [h.strip() for h in nav.get_by_test_id("stNavSectionHeader").all_inner_texts()]
    assert headers == ["Workbench", *SECTIONS]
    assert page.get_by_test_id("stSidebarNavViewButton").count() == 0
    hrefs = {h.rstrip("/").rsplit("/", 1)[-1] for h in nav.locator("a").evaluate_all("as => as.map(a => a.href)")}
    assert {p.url for p in labs() if not p.hidden} <= hrefs
    assert not {p.url for p in labs() if p.hidden} & hrefs
    nav.locator('a[href$="/walkthrough-loss-gmpo"]').click()
    main = page.get_by_test_id("stMain")
    wait_until(lambda: "Loss walkthrough: GMPO" in main.get_by_role("heading").first.inner_text(), 60, "the GMPO page", page=page)
    hidden = {p.url for p in labs() if p.hidden}
    linked = set()
    for p in labs():
        if p.title.startswith("Walkthrough: "):
            page.goto(f"{server}/{p.url}")
            link = page.get_by_test_id("stPageLink").first
            link.wait_for()
            linked.add(link.locator("a").get_attribute("href").rstrip("/").rsplit("/", 1)[-1])
    assert linked == hidden
