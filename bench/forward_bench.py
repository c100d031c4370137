"""One training forward + backward of a GRPO micro-batch: the forward before issue 20 against its two levers.

Run: .venv/bin/python bench/forward_bench.py [--model tiny --prompts 4 --G 8 --max-len 16 --rounds 7]
     .venv/bin/python bench/forward_bench.py --model smollm2-135m --prompts 2 --G 8 --max-len 48 --rounds 5

The batch is real: the workbench's own rollout of step 0 (``bench/grpo_pair.py``'s recipe: the
model's task, chat template for smollm2-135m, G completions per prompt, temperature 1), its rows
shuffled as a minibatch shuffle leaves them. Each variant computes the per-token log-probs and
entropies of the completions (``workbench.engine.forward``) and backpropagates
sum(logp) + 0.01 sum(H) over valid tokens; gradients are dropped between calls:

- ``plain``: the forward before issue 20: the LM head at all P + T positions, then sliced, the
  log-softmax and entropy over the whole (B, T, V) tensor at once;
- ``keep``: logits only at the completion positions (``logits_to_keep``), row-chunked
  log-softmax / entropy (``train.shared_prefix=false``);
- ``shared``: ``keep`` plus the shared-prefix forward, each distinct prompt run once
  (``train.shared_prefix=true``, the default).

The variants alternate within each of ``--rounds`` rounds (their order rotating), after one
untimed warm-up round. Prints each variant's seconds (min/median/max over rounds), its ratio to
``plain`` (median of the per-round ratios, with min/max), and the largest log-prob difference to
``plain``. Peak memory: CUDA's max_memory_allocated per variant when on a GPU; on the CPU none (a
process's maxrss only grows, so interleaved variants cannot be told apart; torch keeps no CPU
allocator statistics).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the workbench package of this checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # grpo_pair beside this file

from grpo_pair import SETTINGS, Work, peak_memory, quiet, reset_peak_memory, spread, step_end, workbench_recipe  # noqa: E402

torch.set_num_threads(1)

VARIANTS = ("plain", "keep", "shared")


def plain_logprobs_and_entropy(model, batch, temperature: float):
    """The forward as it was before issue 20 (the baseline): full logits, sliced; unchunked maths."""
    from workbench.core import entropy_from_logits, logprobs_from_logits
    from workbench.engine.forward import completion_logits

    L = max(1, int(batch.completion_mask.sum(1).max()))
    ids = batch.completion_ids[:, :L]
    logits = completion_logits(model, batch.prompt_ids, batch.prompt_mask, ids, batch.completion_mask[:, :L], keep_only=False)
    return logprobs_from_logits(logits, ids, temperature), entropy_from_logits(logits, temperature)


def forward_backward(variant: str, model, batch, temperature: float) -> tuple[float, torch.Tensor]:
    """(seconds, log-probs (B, L)) of one forward + backward of ``variant``."""
    from workbench.engine.forward import logprobs_and_entropy

    model.zero_grad(set_to_none=True)
    start = step_end()
    if variant == "plain":
        logp, ent = plain_logprobs_and_entropy(model, batch, temperature)
    else:
        logp, ent = logprobs_and_entropy(model, batch, temperature, entropy_grad=True, shared_prefix=variant == "shared")
    L = max(1, int(batch.completion_mask.sum(1).max()))  # plain: (B, L); the others padded to (B, T)
    mask = batch.completion_mask[:, :L]
    ((logp[:, :L] * mask).sum() + 0.01 * (ent[:, :L] * mask).sum()).backward()
    return step_end() - start, logp[:, :L].detach() * mask


def grpo_batch(work: Work, run_dir: Path):
    """(policy, the step-0 rollout with its rows shuffled, temperature, prompt / completion sizes)."""
    from workbench.engine.trainer import Trainer

    trainer = Trainer(workbench_recipe(work), run_dir)
    trainer.setup()
    try:
        _, out = trainer.rollout(0)
    finally:
        trainer.rollout_backend.close()
        trainer.events.close()
    order = torch.randperm(out.completion_mask.shape[0], generator=torch.Generator().manual_seed(0))
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask"):
        setattr(out, name, getattr(out, name)[order])
    model = trainer.accelerator.unwrap_model(trainer.policy)
    sizes = dict(P=out.prompt_ids.shape[1], T=int(out.completion_mask.sum(1).max()),
                 valid_prompt=float(out.prompt_mask.float().sum(1).mean()), valid_completion=float(out.completion_mask.sum(1).mean()))
    return model, out, trainer.recipe.sampling.temperature, sizes


def measure(model, batch, temperature: float, rounds: int) -> dict:
    """Per variant: seconds per round, ratio to plain per round, peak CUDA bytes, max |logp - plain|."""
    times = {v: [] for v in VARIANTS}
    peaks, logps = {}, {}
    for r in range(rounds + 1):  # round 0 warms up, untimed
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[: r % len(VARIANTS)]
        for v in order:
            reset_peak_memory()
            seconds, logps[v] = forward_backward(v, model, batch, temperature)
            peaks[v] = peak_memory()
            if r:
                times[v].append(seconds)
    ratios = {v: [t / p for t, p in zip(times[v], times["plain"])] for v in VARIANTS}
    diffs = {v: float((logps[v] - logps["plain"]).abs().max()) for v in VARIANTS}
    return dict(times=times, ratios=ratios, peaks=peaks, diffs=diffs)


def report(result: dict) -> None:
    for v in VARIANTS:
        t, q = result["times"][v], result["ratios"][v]
        peak = result["peaks"][v]
        memory = f", peak CUDA {peak / 2**20:.0f} MiB" if peak is not None else ""
        print(f"{v:7s} {statistics.median(t):.4f} s (min/median/max {spread(t)}); / plain {statistics.median(q):.3f}x "
              f"(per round min/median/max {spread(q, '.3f')}); max |logp - plain| {result['diffs'][v]:.1e}{memory}", flush=True)
    if result["peaks"]["plain"] is None:
        print("peak memory: not measured on the CPU (see the module docstring)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(SETTINGS), default="tiny", help="tiny (arithmetic) or smollm2-135m (reasoning-gym, chat template)")
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-len", type=int, default=16)
    p.add_argument("--rounds", type=int, default=7, help="timed rounds (variants alternate within each); one more warms up")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = p.parse_args()
    quiet()
    work = Work(args.model, args.G, args.prompts, args.max_len, steps=1, warmup=0, precision=args.precision)
    with tempfile.TemporaryDirectory() as tmp:
        model, batch, temperature, sizes = grpo_batch(work, Path(tmp) / "run")
    device = "cuda" if torch.cuda.is_available() else "cpu, 1 thread"
    print(f"{work.describe().split(';')[0]}; {device}; micro-batch {batch.completion_mask.shape[0]} rows, "
          f"prompt {sizes['P']} positions (valid {sizes['valid_prompt']:.0f} on average), completions up to "
          f"{sizes['T']} (valid {sizes['valid_completion']:.1f} on average); {args.rounds} rounds", flush=True)
    with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
        report(measure(model, batch, temperature, args.rounds))


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s)", flush=True)
