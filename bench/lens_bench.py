"""Cost of the same-batch lens relative to a training step (workbench/engine/lens.py).

Runs the same recipe twice on the built-in tiny model, the lens off and on every step (same
seed, so the same batches), and reports the median step time of each, the median lens time and
the ratios. The lens stays off by default (``logging.lens_every = 0``) if it costs > 30 %.

    python bench/lens_bench.py [--preset grpo] [--steps 8] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import torch

torch.set_num_threads(1)


def run(preset: str, overrides: list[str], run_dir: Path) -> list[dict]:
    from workbench.engine.events import read_events
    from workbench.engine.trainer import Trainer
    from workbench.recipe import load_recipe

    status = Trainer(load_recipe(preset, overrides), run_dir).run()
    if status != "finished":
        raise SystemExit(f"{preset} {overrides}: run {status}")
    return [e["metrics"] for e in read_events(run_dir) if e["kind"] == "metrics"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="grpo")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="lens-bench-"))
    cached = Path.home() / ".workbench" / "models" / "tiny-v1"  # reuse a built tiny model if there is one
    if cached.exists():
        shutil.copytree(cached, home / "models" / "tiny-v1")
    os.environ["WORKBENCH_HOME"] = str(home)
    base = [f"train.steps={args.steps}", *args.set]
    off = run(args.preset, base, home / "off")
    on = run(args.preset, [*base, "logging.lens_every=1"], home / "on")
    skip = 1  # the first step pays one-off costs (allocations, caches)
    series = {"step time, lens off": [m["perf/step_time"] for m in off[skip:]],
              "step time, lens on ": [m["perf/step_time"] for m in on[skip:]],
              "lens time          ": [m["perf/lens_time"] for m in on[skip:]]}
    t_off, t_on, t_lens = (statistics.median(v) for v in series.values())
    print(f"preset={args.preset} steps={args.steps} overrides={args.set} device={'cuda' if torch.cuda.is_available() else 'cpu'}")
    for label, v in series.items():
        print(f"median {label}: {statistics.median(v) * 1e3:8.1f} ms   (min {min(v) * 1e3:.1f}, max {max(v) * 1e3:.1f}, n={len(v)})")
    print(f"lens / step (lens off)     : {t_lens / t_off:8.2f}  (> 0.30: keep logging.lens_every = 0 by default)")
    print(f"step on / step off         : {t_on / t_off:8.2f}")
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
