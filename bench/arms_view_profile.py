"""Where the arms view's render goes: cProfile of the Compare page's script run (the thread
Streamlit runs the page in; a profile of the calling thread sees only AppTest's polling sleep),
10 arms x 3 seeds x 1,000 steps, each run after one step was appended to every run (``--mode new``,
as runs train) or with the page's caches cleared (``--mode first``), as bench/ui_bench.py times
them. Prints the top functions by cumulative and by own time.

    OMP_NUM_THREADS=1 PYTHONPATH=. nice .venv/bin/python bench/arms_view_profile.py [--mode new --repeats 3 --top 45]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ui_bench import MODES, SCRATCH, fill_store  # noqa: E402


def profile_renders(arms: int, steps: int, seeds: int, repeats: int, mode: str) -> pstats.Stats:
    """The profile of ``repeats`` script runs of the arms view in ``mode`` (the first, warm-up run excluded)."""
    import streamlit as st
    from streamlit.runtime.scriptrunner import script_runner
    from streamlit.testing.v1 import AppTest

    from tests.ui.seed import metrics_event
    from workbench.runs import RunStore

    ids = fill_store(Path(tempfile.mkdtemp(dir=SCRATCH)), arms, steps, seeds)
    store = RunStore()
    at = AppTest.from_string("from workbench.ui import compare_page\ncompare_page.render()\n", default_timeout=120)
    at.run()
    profile, run_script = cProfile.Profile(), script_runner.ScriptRunner._run_script

    def profiled(self, *args, **kwargs):
        profile.enable()
        try:
            return run_script(self, *args, **kwargs)
        finally:
            profile.disable()

    script_runner.ScriptRunner._run_script = profiled
    try:
        for k in range(repeats):
            if mode == "first":
                st.cache_resource.clear()
            for run_id in ids if mode == "new" else ():
                store.ingest(run_id, [metrics_event(steps + k, float(steps + k))])
            at.run()
    finally:
        script_runner.ScriptRunner._run_script = run_script
    assert not at.exception
    return pstats.Stats(profile)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--mode", choices=["first", "new"], default="new", help=str(MODES))
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    stats = profile_renders(10, 1000, 3, args.repeats, args.mode)
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top // 2)
    sys.stdout.flush()
    os._exit(0)  # the app's collector threads would otherwise poll the stores until exit


if __name__ == "__main__":
    main()
