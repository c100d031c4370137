"""UI benchmarks: (1) server-side render time of the Live / Compare page with 10 runs x 1,000
steps (target < 1 s), against a 1 run x 10 steps baseline in the same script; (2) the same for the
arms view (mean curves with 95% bands, verdict table) of 10 arms x 3 seeds x 1,000 steps, against
2 arms x 2 seeds x 10 steps (target: at most 1.5x that baseline; the ratio is reported with its
spread); (3) live-update latency from a step's event being written to
events.jsonl to the browser's chart showing it (real `streamlit run` + Debian chromium via
Playwright; needs /usr/bin/chromium).

    .venv/bin/python bench/ui_bench.py [--runs 10 --steps 1000 --arms 10 --seeds 3 --repeats 5 --latency-steps 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SCRATCH = tempfile.mkdtemp(prefix="wb-ui-bench-")
ARMS_RATIO_TARGET = 1.5  # the arms view's big case at most this many times its small baseline


def fill_store(home: Path, runs: int, steps: int, seeds: int = 1) -> list[str]:
    """``runs`` arms x ``seeds`` finished runs in one group, ``steps`` ingested steps each (metrics +
    samples); arm r's reward is offset by 0.01 r, seed s's by 0.003 s (bands of some width)."""
    os.environ["WORKBENCH_HOME"] = str(home)
    from tests.ui.seed import metrics_event, samples_event
    from workbench.recipe import load_recipe
    from workbench.runs import RunStore

    store, ids, t0 = RunStore(), [], time.time() - steps
    for r in range(runs):
        for seed in range(seeds):
            run_id = f"bench{r}" if seeds == 1 else f"bench{r}s{seed}"
            yaml_text = load_recipe("grpo", [f"train.seed={seed}"]).to_yaml()
            store.create_run(run_id=run_id, name=f"run{r}", algorithm="grpo", recipe_yaml=yaml_text, total_steps=steps,
                             target="local", launcher="local", host="localhost", created_by="bench",
                             run_dir=str(home / "runs" / run_id), group="bench", arm=f"arm{r}")
            events = [{"kind": "status", "step": 0, "time": t0, "status": "running"}]
            for s in range(steps):
                events += [metrics_event(s, t0 + s, 0.01 * r + 0.003 * seed), samples_event(s, t0 + s)]
            store.ingest(run_id, events)
            store.set_status(run_id, "finished")
            ids.append(run_id)
    return ids


def render_times(runs: int, steps: int, repeats: int, seeds: int = 1, cold: bool = True) -> list[float]:
    """Wall seconds of one full script run of the Compare page (AppTest, in-process): the per-run
    view with ``seeds`` = 1, the arms view (bands, verdict table) otherwise. ``cold``: the page's
    caches (the arms view keeps the decoded metrics and its charts per data stamp) are cleared
    before each run, as when new steps have arrived; else the same data is drawn again, as on a
    widget change."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    # Homes stay until the process ends: the app's collector thread keeps polling their stores.
    tmp = tempfile.mkdtemp(dir=SCRATCH)
    ids = fill_store(Path(tmp), runs, steps, seeds)
    at = AppTest.from_string("from workbench.ui import compare_page\ncompare_page.render()\n", default_timeout=120)
    at.run()  # imports and first-time caches
    assert at.radio(key="compare_view").value == ("arms" if seeds > 1 else "per run")
    assert len(at.get("plotly_chart")) == 11, "every panel should render"
    assert not at.exception
    if seeds > 1:
        assert len(at.dataframe[0].value) == runs, "the verdict table should have a row per arm"
    times = []
    for _ in range(repeats):
        if cold:
            st.cache_resource.clear()
        t = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - t)
    from workbench.runs import RunStore
    from workbench.viz.arms import arm_figures
    from workbench.viz.curves import available_panels, compare_figures

    store = RunStore()
    t = time.perf_counter()
    df = store.metrics(ids) if seeds == 1 else store.arm_metrics(ids)
    t_query = time.perf_counter() - t
    t = time.perf_counter()
    compare_figures(df) if seeds == 1 else arm_figures(df, available_panels(df), smoothing=0.6)
    t_figs = time.perf_counter() - t
    what = f"{runs} runs" if seeds == 1 else f"{runs} arms x {seeds} seeds"
    print(f"  {what} x {steps} steps: store query {t_query * 1e3:.0f} ms, figures {t_figs * 1e3:.0f} ms (one run each)")
    return times


def spread(times: list[float]) -> str:
    """'median 0.412 s (min 0.398, max 0.455, n 5)'."""
    return f"median {statistics.median(times):.3f} s (min {min(times):.3f}, max {max(times):.3f}, n {len(times)})"


def report(label: str, base: list[float], big: list[float], ratio_target: float | None = None) -> None:
    """The big case against its small baseline: medians with min/max, the target (< 1 s, or at
    most ``ratio_target`` x the baseline's median), the ratio of medians and its spread (the
    fastest big run over the slowest baseline run, and the slowest over the fastest)."""
    med, ratio = statistics.median(big), statistics.median(big) / statistics.median(base)
    target = (f"target <= {ratio_target:g}x baseline: {'met' if ratio <= ratio_target else 'MISSED'}" if ratio_target
              else f"target < 1 s: {'met' if med < 1 else 'MISSED'}")
    print(f"  baseline: {spread(base)}")
    print(f"  {label}: {spread(big)} ({target}); ratio to baseline "
          f"{ratio:.2f}x (spread {min(big) / max(base):.2f}-{max(big) / min(base):.2f}x)")


def latency(steps: int) -> list[float]:
    """Seconds from writing step k's event to the browser's reward chart having k+1 points."""
    from playwright.sync_api import sync_playwright

    from tests.e2e.conftest import free_port
    from tests.ui.seed import LiveRun
    from workbench.runs import RunStore

    tmp = tempfile.mkdtemp(dir=SCRATCH)
    if True:
        os.environ["WORKBENCH_HOME"] = tmp
        store = RunStore()
        live = LiveRun(store, name="live", total=10_000)
        live.step(0)
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.address",
             "127.0.0.1", "--server.port", str(port), "--server.fileWatcherType", "none"], cwd=ROOT, env={**os.environ, "WORKBENCH_HOME": tmp},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out = []
        try:
            for _ in range(120):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
                    break
                except OSError:
                    time.sleep(0.5)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"http://127.0.0.1:{port}/compare")
                from tests.e2e.test_browser import REWARD_POINTS

                deadline = time.time() + 120
                while (page.evaluate(REWARD_POINTS) or [0])[0] < 1 and time.time() < deadline:
                    time.sleep(0.05)
                for k in range(1, steps + 1):
                    written = live.step(k)
                    while (page.evaluate(REWARD_POINTS) or [0])[0] < k + 1:
                        if time.time() - written > 30:
                            raise RuntimeError(f"step {k} never reached the browser")
                        time.sleep(0.02)
                    out.append(time.time() - written)
                    time.sleep(0.3)  # steps arrive at different phases of the polling loops
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
            live.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--arms", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--latency-steps", type=int, default=10)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    print("Compare page, per-run view, server-side render (AppTest script run):")
    report(f"{args.runs} runs x {args.steps} steps", render_times(1, 10, args.repeats),
           render_times(args.runs, args.steps, args.repeats))
    print("Compare page, arms view (mean +- 95% band per arm, verdict table), server-side render:")
    base = render_times(2, 10, args.repeats, seeds=2)
    # issue 19: the arms view of 10 arms x 3 seeds x 1,000 steps within 1.5x of this small baseline
    report(f"{args.arms} arms x {args.seeds} seeds x {args.steps} steps, cold (new data)", base,
           render_times(args.arms, args.steps, args.repeats, seeds=args.seeds), ratio_target=ARMS_RATIO_TARGET)
    report(f"{args.arms} arms x {args.seeds} seeds x {args.steps} steps, warm (same data, a widget changed)", base,
           render_times(args.arms, args.steps, args.repeats, seeds=args.seeds, cold=False), ratio_target=ARMS_RATIO_TARGET)
    sys.stdout.flush()
    if args.latency_steps:
        lat = latency(args.latency_steps)
        lat.sort()
        print(f"Live update, event written -> browser chart ({len(lat)} steps): median {statistics.median(lat):.2f} s, "
              f"max {lat[-1]:.2f} s (collector every 0.25 s + fragment every 1 s)")
    import shutil

    shutil.rmtree(SCRATCH, ignore_errors=True)
    os._exit(0)  # daemon collector threads would otherwise poll the removed homes until exit


if __name__ == "__main__":
    main()
