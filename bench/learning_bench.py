"""What a first-time user sees: learning within minutes on this CPU, and the length probe.

    python bench/learning_bench.py [--part quick|length|presets|all] [--seeds 0 1 2] [--set key=value ...]

1. quick: the app's *Quick comparison* (``quickstart_plan()``: GRPO, RLOO, PPO x 3 seeds) launched
   as one comparison group through ``workbench.runs``, real detached processes queued for the
   CPU slots, as the button does. Prints the wall time from the click to the last run's end and,
   per arm, each seed's reward gain (last fifth of steps - first fifth: each run is its own
   baseline) with the 95% t interval of the mean gain over seeds. ``--first-seed 3`` checks seeds
   the settings were not tuned on.
2. length: the ``length_probe`` task (reward ignores length) trained with the same seed under
   three aggregation modes; prints completions/mean_length over the first and last 20 steps, so
   the drift caused by the aggregation alone is visible side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QUICK_GAIN_WINDOW = 0.2  # quick: a run's gain compares its first and last fifth of steps


def _home() -> Path:
    """A fresh workbench home holding the tiny model (built once, ~20 s)."""
    home = Path(tempfile.mkdtemp(prefix="wb-learning-"))
    os.environ["WORKBENCH_HOME"] = str(home)
    from workbench.engine.tiny import ensure_tiny_model

    ensure_tiny_model()
    return home


def _gain(values: list[float], window: int = 20) -> tuple[float, float]:
    """(mean of last window - mean of first window, its standard error)."""
    first, last = values[:window], values[-window:]
    se = (statistics.variance(first) / len(first) + statistics.variance(last) / len(last)) ** 0.5
    return statistics.mean(last) - statistics.mean(first), se


def run_gain(rewards: list[float], frac: float = QUICK_GAIN_WINDOW) -> float:
    """A run's reward gain: mean over its last ``frac`` of steps - mean over its first ``frac``
    (k = max(1, ceil(frac n)) steps each, as the verdict table's final window)."""
    from workbench.analysis.stats import window_length

    k = window_length(len(rewards), frac)
    return statistics.mean(rewards[-k:]) - statistics.mean(rewards[:k])


def quick(first_seed: int, seeds: int) -> None:
    """The Quick comparison as the button launches it (GRPO, RLOO, PPO x ``seeds`` seeds, all queued
    at once, ``cpu_slots`` of them training at a time); per arm the reward gain of each seed and
    the 95% t interval of the mean gain over seeds."""
    from workbench.analysis import arm_summary
    from workbench.runs import RunStore, launch_planned, load_settings, quickstart_plan, wait

    _home()
    store = RunStore()
    planned = quickstart_plan(seeds=seeds, first_seed=first_seed)
    clicked = time.time()
    ids = launch_planned(planned, group="quick", created_by="bench", store=store)
    statuses = [wait(run_id, store=store, timeout_s=900) for run_id in ids]
    wall = time.time() - clicked
    frame = store.arm_metrics(ids)
    gains: dict[str, list[float]] = {}
    for run_id in ids:
        rows = frame[frame.run_id == run_id].sort_values("step")
        gains.setdefault(rows.arm.iloc[0], []).append(run_gain(rows.reward.tolist()))
    print(f"Quick comparison: {len(ids)} runs ({', '.join(sorted(set(statuses)))}), seeds {first_seed}-"
          f"{first_seed + seeds - 1}, cpu_slots={load_settings().cpu_slots}: wall time {wall:.0f} s from the click "
          f"to the last run's end; reward gain = last {QUICK_GAIN_WINDOW:.0%} - first {QUICK_GAIN_WINDOW:.0%} of steps")
    for row in arm_summary(gains).itertuples():
        verdict = "excludes 0" if row.ci_low > 0 or row.ci_high < 0 else "includes 0"
        print(f"  {row.arm:5s} gains {' '.join(f'{g:+.3f}' for g in gains[row.arm])}; mean {row.mean:+.3f}, "
              f"95% CI [{row.ci_low:+.3f}, {row.ci_high:+.3f}] ({verdict})", flush=True)


def length() -> None:
    from workbench.engine.events import read_events
    from workbench.engine.trainer import train
    from workbench.recipe import load_recipe

    home = _home()
    print("Length probe (reward ignores length), GRPO advantages, same seed; completions/mean_length:")
    for mode in ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"):
        recipe = load_recipe("grpo", ["task=length_probe", "train.steps=120", "algorithm.kl_coef=0",
                                      f"algorithm.aggregation={mode}", "sampling.max_completion_length=24",
                                      "logging.diagnostics_every=0", "logging.samples_per_step=0"])
        run_dir = home / "runs" / mode
        t0 = time.time()
        train(recipe, run_dir)
        lengths = [e["metrics"]["completions/mean_length"] for e in read_events(run_dir) if e["kind"] == "metrics"]
        gain, se = _gain(lengths)
        print(f"  {mode:24s} first 20 steps {statistics.mean(lengths[:20]):5.2f} -> last 20 "
              f"{statistics.mean(lengths[-20:]):5.2f}  drift {gain:+.2f} ({gain / se:+.1f} standard errors), "
              f"{time.time() - t0:.0f} s")


def presets(seeds: list[int], overrides: list[str]) -> None:
    from workbench.engine.events import read_events
    from workbench.engine.trainer import train
    from workbench.recipe import load_recipe, preset_names

    home = _home()
    print(f"Every preset with its defaults{' + ' + ' '.join(overrides) if overrides else ''}, seeds {seeds}; "
          "reward gain = last fifth - first fifth:")
    for name in preset_names():
        gains, seconds = [], []
        for seed in seeds:
            recipe = load_recipe(name, [*overrides, f"train.seed={seed}"])
            run_dir = home / "runs" / f"{name}-{seed}"
            t0 = time.time()
            train(recipe, run_dir)
            seconds.append(time.time() - t0)
            gains.append(run_gain([e["metrics"]["reward"] for e in read_events(run_dir) if e["kind"] == "metrics"], 0.2))
        sd = statistics.stdev(gains) if len(gains) > 1 else float("nan")
        print(f"  {name:12s} {recipe.task} {recipe.train.steps} steps: gains {' '.join(f'{g:+.3f}' for g in gains)}; "
              f"mean {statistics.mean(gains):+.3f} +- {sd:.3f}, min {min(gains):+.3f}; "
              f"{statistics.mean(seconds):.0f} s per run ({min(seconds):.0f}-{max(seconds):.0f})", flush=True)


def main() -> None:
    import torch

    torch.set_num_threads(1)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["quick", "length", "presets", "all"], default="all")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="presets: one run per seed")
    parser.add_argument("--first-seed", type=int, default=0, help="quick: seeds first-seed, first-seed + 1, ...")
    parser.add_argument("--quick-seeds", type=int, default=3, help="quick: seeds per arm")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="presets: overrides for every preset")
    args = parser.parse_args()
    if args.part in ("quick", "all"):
        quick(args.first_seed, args.quick_seeds)
    if args.part in ("length", "all"):
        length()
    if args.part in ("presets", "all"):
        presets(args.seeds, args.set)


if __name__ == "__main__":
    main()
