"""What a slow reward function costs a step, with the behaviour forwards run while it scores
(``workbench.engine.trainer.run_alongside``, what ``Trainer.sample`` does) and one after the other.

One rollout of the recipe (default: the rloo preset, so a reference forward and the old
log-probs are both needed), then, per repeat, the reward scoring + behaviour forwards phase timed
both ways, with a reward that sleeps ``--sleep`` seconds per call (a verifier, a remote judge)
and with one that does not. Reports the medians (min-max) and what the sleep adds to the phase:
one after the other it adds the whole sleep; alongside, only what the forwards do not cover.

    python bench/overlap_rewards_bench.py [--preset rloo] [--sleep 0.1] [--repeats 5] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

torch.set_num_threads(1)
SLEEP_ENV = "WB_BENCH_REWARD_SLEEP_S"


def sleeping_exact_match(completions, answer, **kwargs):
    """1 for an exact answer, after sleeping $WB_BENCH_REWARD_SLEEP_S seconds (one call per batch)."""
    time.sleep(float(os.environ.get(SLEEP_ENV, "0")))
    return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]


def phase_times(trainer, rows, out, repeats: int) -> dict[str, list[float]]:
    """Seconds of scoring + behaviour forwards, one after the other and alongside, interleaved."""
    from workbench.engine.trainer import run_alongside

    score = lambda: trainer.score(rows, out, 0)  # noqa: E731
    forwards = lambda: trainer.behaviour_forwards(out)  # noqa: E731
    times: dict[str, list[float]] = {"sequential": [], "alongside": [], "forwards": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        score()
        t1 = time.perf_counter()
        forwards()
        t2 = time.perf_counter()
        run_alongside(score, forwards)
        t3 = time.perf_counter()
        times["sequential"].append(t2 - t0)
        times["forwards"].append(t2 - t1)
        times["alongside"].append(t3 - t2)
    return times


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:7.1f} ms ({min(xs) * 1e3:.1f}-{max(xs) * 1e3:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="rloo")
    parser.add_argument("--sleep", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    from workbench.engine.trainer import Trainer
    from workbench.recipe import load_recipe

    sys.path.insert(0, str(Path(__file__).parent))
    recipe = load_recipe(args.preset, ["train.threads=1", "reward_funcs=['overlap_rewards_bench:sleeping_exact_match']", *args.set])
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(recipe, Path(tmp))
        trainer.setup()
        rows, out = trainer.rollout(0)
        print(f"{args.preset} {' '.join(args.set)}: batch {tuple(out.completion_ids.shape)}, {args.repeats} repeats, "
              f"median (min-max) of scoring + behaviour forwards")
        results = {}
        for sleep in (0.0, args.sleep):
            os.environ[SLEEP_ENV] = str(sleep)
            results[sleep] = phase_times(trainer, rows, out, args.repeats)
            for name, xs in results[sleep].items():
                print(f"  reward sleeps {sleep:.3f} s  {name:10s} {spread(xs)}")
        for name in ("sequential", "alongside"):
            added = statistics.median(results[args.sleep][name]) - statistics.median(results[0.0][name])
            print(f"the {args.sleep * 1e3:.0f} ms reward adds {added * 1e3:6.1f} ms to the phase {name}")


if __name__ == "__main__":
    main()
