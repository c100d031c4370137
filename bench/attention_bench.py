"""Grouped-query attention read in place (``workbench.engine.attention``, the workbench's default)
vs transformers' ``sdpa``, which copies each key / value head per query head under a mask: HF
generation and a no-grad log-prob forward of the same GRPO-shaped batch, ``--prompts`` x ``--G``.

Run: .venv/bin/python bench/attention_bench.py --model smollm2-135m --prompts 4 --G 8 --max-len 64 --repeats 3

One model loaded twice (``load_policy(grouped_attention=True / False)``), the same prompts
(bench/grpo_pair.py's task rows, chat-templated for smollm2-135m), seed and sampling (temperature
1, top_p 1, fp32, one thread). The two alternate for ``--repeats`` rounds (a new seed each round).
Prints seconds per call of each and the per-round ratio grouped / stock (min/median/max), and
checks the completions and log-probs equal bit for bit. The built-in tiny model has no grouped
heads (4 key / value heads for 4 query heads): nothing to measure there.
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
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.repeats < 1 or args.prompts < 1 or args.G < 1 or args.max_len < 1:
        parser.error("--prompts, --G, --max-len and --repeats must be at least 1")
    quiet()
    from workbench.engine.forward import logprobs_and_entropy
    from workbench.engine.models import load_policy
    from workbench.engine.rollout import hf_generate

    work = Work(model=args.model, G=args.G, prompts=args.prompts, max_len=args.max_len, steps=1, warmup=0)
    (grouped_model, tok), (stock_model, _) = load_policy(args.model), load_policy(args.model, grouped_attention=False)
    models = {"grouped": grouped_model, "stock": stock_model}
    config = grouped_model.config
    grouped = (config._attn_implementation != stock_model.config._attn_implementation
               and config.num_key_value_heads < config.num_attention_heads)  # the tiny model: 4 and 4
    prompts = [row["prompt"] for row in work_rows(work)[: args.prompts] for _ in range(args.G)]
    print(work.describe() + f"; grouped attention {'on' if grouped else 'not applicable'}")

    def round_of(name: str, seed: int):
        t0 = time.perf_counter()
        out = hf_generate(models[name], tok, prompts, seed=seed, temperature=1.0, top_p=1.0, max_new_tokens=args.max_len)
        t1 = time.perf_counter()
        with torch.no_grad():
            logp, _ = logprobs_and_entropy(models[name], out, 1.0, with_entropy=False, shared_prefix=True)
        return t1 - t0, time.perf_counter() - t1, out, logp

    round_of("grouped", 0), round_of("stock", 0)  # warm-up
    times = {name: {"generate": [], "forward": []} for name in models}
    same = 0
    for seed in range(1, args.repeats + 1):
        runs = {name: round_of(name, seed) for name in ("grouped", "stock")}
        for name, (gen, fwd, _, _) in runs.items():
            times[name]["generate"].append(gen), times[name]["forward"].append(fwd)
        (_, _, a, la), (_, _, b, lb) = runs["grouped"], runs["stock"]
        same += int(torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.rollout_logp, b.rollout_logp)
                    and torch.equal(la, lb))
    for part in ("generate", "forward"):
        ratios = [g / s for g, s in zip(times["grouped"][part], times["stock"][part])]
        print(f"{part:8s} grouped s/call {spread(times['grouped'][part], '.3f')}, stock {spread(times['stock'][part], '.3f')} "
              f"(min/median/max); grouped / stock per round {spread(ratios, '.3f')} (median {statistics.median(ratios):.3f})")
    print(f"completions, rollout log-probs and no-grad log-probs identical bit for bit in {same} of {args.repeats} rounds")


if __name__ == "__main__":
    main()
