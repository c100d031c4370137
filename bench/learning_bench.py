"""What a first-time user sees: learning within minutes on this CPU, and the length probe.

    python bench/learning_bench.py [--part quick|length|presets|all] [--seeds 0 1 2] [--set key=value ...]

1. quick: the app's *Quick comparison* (``quickstart_recipes()``: GRPO, RLOO, PPO on
   ``arithmetic_drill``) launched as one comparison group through ``workbench.runs`` — three
   real detached processes at once, as the button does. Prints, per run, the wall time from the
   click to the first and last logged step and the mean reward per 20 steps. Baseline in the same
   script: each run's own first 20 steps (the gain is last-20 minus first-20, with its
   standard error).
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


def quick() -> None:
    from workbench.runs import RunStore, launch_group, quickstart_recipes, wait

    _home()
    store = RunStore()
    clicked = time.time()
    ids = launch_group(quickstart_recipes(), group="quick", created_by="bench", store=store)
    for run_id in ids:
        wait(run_id, store=store, timeout_s=900)
    frame = store.metrics(ids)
    print("Quick comparison (3 runs at once, as the button launches them):")
    for run_id in ids:
        rows = frame[frame.run_id == run_id].sort_values("step")
        rewards = rows.reward.tolist()
        by20 = [round(statistics.mean(rewards[k:k + 20]), 2) for k in range(0, len(rewards), 20)]
        gain, se = _gain(rewards)
        print(f"  {store.get_run(run_id)['algorithm']:5s} first step after {rows.time.iloc[0] - clicked:5.1f} s, "
              f"last ({len(rewards)}) after {rows.time.iloc[-1] - clicked:5.1f} s; reward per 20 steps {by20}; "
              f"gain {gain:+.3f} ({gain / se:.1f} standard errors)")


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


def _fifths_gain(values: list[float]) -> float:
    """Mean of the last fifth - mean of the first fifth."""
    k = max(1, len(values) // 5)
    return statistics.mean(values[-k:]) - statistics.mean(values[:k])


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
            gains.append(_fifths_gain([e["metrics"]["reward"] for e in read_events(run_dir) if e["kind"] == "metrics"]))
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
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="presets: overrides for every preset")
    args = parser.parse_args()
    if args.part in ("quick", "all"):
        quick()
    if args.part in ("length", "all"):
        length()
    if args.part in ("presets", "all"):
        presets(args.seeds, args.set)


if __name__ == "__main__":
    main()
