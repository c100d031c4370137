"""Generation with each distinct prompt prefilled once vs every copy prefilled (the plain path,
what TRL's and verl's HF generation do), on GRPO-shaped batches: ``--prompts`` prompts x ``--G``.

Run: .venv/bin/python bench/generation_prefill_bench.py --model smollm2-135m --prompts 2 --G 8 --max-len 48 --repeats 5

Same model, prompts (bench/grpo_pair.py's task rows, chat-templated for smollm2-135m), seed and
sampling settings (temperature 1, top_p 1, fp32, one thread) for both; the two alternate for
``--repeats`` rounds (each round: one shared, one plain, the same seed). Prints the seconds of each
and the per-round ratio shared / plain (min/median/max); the completions are checked equal.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the workbench package of this checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # grpo_pair beside this file

from grpo_pair import Work, quiet, spread, work_rows  # noqa: E402

torch.set_num_threads(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    quiet()
    from workbench.engine.models import load_policy
    from workbench.engine.rollout import hf_generate

    work = Work(model=args.model, G=args.G, prompts=args.prompts, max_len=args.max_len, steps=1, warmup=0)
    model, tok = load_policy(args.model)
    prompts = [row["prompt"] for row in work_rows(work)[: args.prompts] for _ in range(args.G)]
    sampling = dict(temperature=1.0, top_p=1.0, max_new_tokens=args.max_len)
    print(work.describe())

    def timed(share: bool, seed: int):
        t0 = time.perf_counter()
        out = hf_generate(model, tok, prompts, seed=seed, share_prefill=share, **sampling)
        return time.perf_counter() - t0, out

    timed(True, 0), timed(False, 0)  # warm-up
    shared, plain, ratios, same = [], [], [], 0
    for seed in range(1, args.repeats + 1):
        (s, a), (p, b) = timed(True, seed), timed(False, seed)
        shared.append(s), plain.append(p), ratios.append(s / p)
        same += int(torch.equal(a.completion_ids, b.completion_ids))
    print(f"shared prefill s/call min/median/max {spread(shared, '.3f')}")
    print(f"plain  prefill s/call min/median/max {spread(plain, '.3f')}")
    print(f"ratio shared / plain per round min/median/max {spread(ratios, '.3f')} (median {statistics.median(ratios):.3f})")
    print(f"identical completions in {same} of {args.repeats} rounds")


if __name__ == "__main__":
    main()
