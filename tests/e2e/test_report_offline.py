"""The downloads of Live / Compare in a real browser against `streamlit run app.py` (a chart as PNG,
made by Kaleido when clicked; the group's report), and the comparison report opened from disk in a real Chromium with the network cut (every request
but the file itself aborted): every figure renders (plotly.js is inlined, nothing is fetched) and
the console stays clean. The group is a sweep with the presets' real recipes and logged metrics."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.e2e.conftest import ROOT, SERVER_FLAGS, free_port, wait_healthy
from tests.ui.seed import metrics_event
from workbench.runs import RunStore, plan_runs
from workbench.viz.curves import PANELS, has_data

SWEEP = {"algorithm.kl_coef": [0.0, 0.04]}


def _sweep_group(home) -> int:
    """grpo and rloo x kl_coef 0 / 0.04 x seeds 0, 1, 5 steps of the trainer's metric lines; returns
    the figures the report must draw: each fixed panel with data, and one sweep chart."""
    store = RunStore(home / "runs.db")
    for i, planned in enumerate(plan_runs(["grpo", "rloo"], seeds=2, sweep=SWEEP)):
        run_id = f"run-{i}"
        store.create_run(run_id=run_id, name=planned.recipe.name, algorithm=planned.recipe.name,
                         recipe_yaml=planned.recipe.to_yaml(), total_steps=5, target="local", launcher="local",
                         host="localhost", created_by="t", run_dir=str(home / "runs" / run_id), group="sweep",
                         arm=planned.arm, sweep=planned.sweep)
        store.ingest(run_id, [metrics_event(t, 100.0 + t, offset=0.1 * i) for t in range(5)])
        store.set_status(run_id, "finished")
    frame = store.arm_metrics([r.id for runs in store.arms("sweep").values() for r in runs])
    return sum(has_data(frame, key) for key in PANELS) + len(SWEEP)


def test_the_report_renders_every_figure_offline(chromium, tmp_path):
    from playwright.sync_api import sync_playwright

    home = tmp_path / "home"
    home.mkdir()
    expected = _sweep_group(home)
    out = tmp_path / "report.html"
    env = {**os.environ, "WORKBENCH_HOME": str(home), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "workbench", "report", "sweep", "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert out.read_text().count('class="plotly-graph-div"') == expected
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        fetched, problems = [], []

        def only_the_file(route):
            fetched.append(route.request.url)
            route.continue_() if route.request.url == out.as_uri() else route.abort()

        page.route("**/*", only_the_file)
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda err: problems.append(str(err)))
        page.goto(out.as_uri())
        page.wait_for_function(f"document.querySelectorAll('.plot-container').length >= {expected}", timeout=60_000)
        page.wait_for_timeout(500)
        assert page.locator(".plot-container").count() == expected
        # each figure drew its plot area, and curves in it
        assert page.locator(".plot-container svg.main-svg >> nth=0").count() == 1
        drawn = page.evaluate("[...document.querySelectorAll('.plot-container')].map("
                              "c => c.querySelectorAll('svg.main-svg').length > 0 && c.querySelectorAll('.scatterlayer .trace').length > 0)")
        assert drawn == [True] * expected
        assert page.locator("h2", has_text="Sweep").count() == 1
        browser.close()
    assert fetched == [out.as_uri()]  # nothing but the file itself was asked for
    assert problems == []


def test_the_page_downloads_a_chart_as_png_and_the_group_report(chromium, tmp_path):
    from playwright.sync_api import sync_playwright

    home = tmp_path / "home"
    home.mkdir()
    _sweep_group(home)
    port = free_port()
    env = {**os.environ, "WORKBENCH_HOME": str(home), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("WORKBENCH_PASSWORD", None)  # on 127.0.0.1 without a password: no sign-in
    log = home / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", *SERVER_FLAGS, "--server.port",
                                 str(port)], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc, log=log)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
            page.set_default_timeout(90_000)
            page.goto(f"{url}/compare")
            page.get_by_role("button", name="PNG").first.wait_for()
            with page.expect_download() as png:
                page.get_by_role("button", name="PNG").first.click()
            data = open(png.value.path(), "rb").read()
            assert data[:8] == b"\x89PNG\r\n\x1a\n" and png.value.suggested_filename == "reward-batch-mean.png"
            with page.expect_download() as report:
                page.get_by_role("button", name="Download report (HTML)").click()
            text = open(report.value.path(), encoding="utf-8").read()
            assert report.value.suggested_filename == "report-sweep.html"
            assert "<h1>Comparison report: sweep</h1>" in text and "<h2>Sweep</h2>" in text
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
