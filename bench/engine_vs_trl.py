"""The workbench engine against TRL's GRPOTrainer, at equal work, in one process.

Run: .venv/bin/python bench/engine_vs_trl.py [--steps 20 --warmup 3 --G 8 --prompts 4 --max-len 16]
(``make bench`` runs it after installing requirements-bench.txt with the constraints file.)

Same model (the built-in ``tiny``), same rows (the ``arithmetic`` task written to one JSONL), same
reward functions and weights, same settings: G completions per prompt, prompts per step, max
completion length, temperature 1, top_p 1, no KL (beta 0, no reference model), one pass per batch,
per-sequence mean loss (TRL ``loss_type="grpo"`` = ``seq-mean-token-mean``), AdamW lr 1e-3,
grad-norm clip 1.0, fp32, no gradient checkpointing, one CPU thread, a log line every step.

Prints:
1. seconds per step of TRL and of the workbench (steady state: wall time between the ends of
   step ``warmup`` and the last step, divided by the steps in between; the two alternate for
   ``--rounds`` rounds and the best round of each counts) and their ratio (target: workbench
   <= 0.67x TRL), with every round's time and the min/median/max of the per-round ratios;
2. the engine's overhead on identical batches: for each step s, the rollout alone
   (``Trainer.rollout(s)``), a bare forward + backward of the policy on that rollout (HF forward,
   log-softmax gather, masked mean, backward; no optimiser step), then the full
   ``Trainer.step(s)``, which regenerates the same completions (same weights, same seed).
   Overhead = sum(step) / sum(rollout + forward-backward) (target <= 1.2), with the min/median/max
   of the per-step ratios;
3. generation throughput, vLLM (in-process, weights synced each call, as in training) vs HF
   ``generate``, on the same prompts: valid completion tokens per second (min/median/max over the
   repeats); and the workbench's s/step with ``train.rollout=vllm`` (one run).

vLLM is imported last so that nothing it changes in the process touches the TRL / HF timings.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

torch.set_num_threads(1)


def spread(values: list[float], fmt: str = ".4f") -> str:
    """min/median/max of a figure's repeats."""
    return "/".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))


def steady_state(ends: list[float], warmup: int) -> float:
    """Seconds per step from the wall-clock end time of each step, skipping ``warmup`` steps."""
    return (ends[-1] - ends[warmup - 1]) / (len(ends) - warmup)


# ---- TRL --------------------------------------------------------------------------------------


def run_trl(args, rows, model_dir: str, out_dir: str) -> tuple[float, list[float]]:
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from workbench.engine.tasks import get_task
    from workbench.engine.models import load_policy

    class StepEnds(TrainerCallback):
        def __init__(self):
            self.ends, self.rewards = [], []

        def on_step_end(self, a, state, control, **kw):
            self.ends.append(time.perf_counter())

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                self.rewards.append(logs["reward"])

    task = get_task("arithmetic")
    model, tok = load_policy(model_dir)
    config = GRPOConfig(
        output_dir=out_dir, max_steps=args.steps, per_device_train_batch_size=args.G * args.prompts,
        num_generations=args.G, max_completion_length=args.max_len, temperature=1.0, top_p=1.0,
        beta=0.0, loss_type="grpo", scale_rewards="group", num_iterations=1, learning_rate=1e-3,
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, weight_decay=0.0,
        reward_weights=list(task.reward_weights), use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, logging_steps=1, report_to="none", save_strategy="no",
        dataloader_num_workers=0, dataloader_pin_memory=False, seed=0, disable_tqdm=True,
    )
    timer = StepEnds()
    trainer = GRPOTrainer(model=model, reward_funcs=task.reward_functions(), args=config,
                          train_dataset=Dataset.from_list(rows), processing_class=tok, callbacks=[timer])
    trainer.remove_callback(PrinterCallback)  # its per-step print of the log dict is not the benchmark
    trainer.train()
    return steady_state(timer.ends, args.warmup), timer.rewards


# ---- workbench --------------------------------------------------------------------------------


def workbench_recipe(args, dataset: Path, rollout: str = "hf"):
    from workbench.recipe import load_recipe

    return load_recipe("grpo", [
        "task=arithmetic", f"dataset={dataset}", "algorithm.kl_coef=0.0", "algorithm.aggregation=seq-mean-token-mean",
        f"sampling.num_generations={args.G}", f"sampling.prompts_per_step={args.prompts}",
        f"sampling.max_completion_length={args.max_len}", "sampling.temperature=1.0", "sampling.top_p=1.0",
        "optim.lr=1e-3", "optim.max_grad_norm=1.0", f"train.steps={args.steps}", "train.mu=1",
        "train.seed=0", f"train.rollout={rollout}", "train.threads=1",
    ])


def run_workbench(args, dataset: Path, run_dir: Path, rollout: str = "hf") -> tuple[float, list[float]]:
    from workbench.engine.trainer import Trainer

    trainer = Trainer(workbench_recipe(args, dataset, rollout), run_dir)
    trainer.setup()
    ends, rewards = [], []
    try:
        for s in range(args.steps):
            rewards.append(trainer.step(s)["reward"])
            ends.append(time.perf_counter())
    finally:
        trainer.rollout_backend.close()
        trainer.events.close()
    return steady_state(ends, args.warmup), rewards


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


def engine_overhead(args, dataset: Path, run_dir: Path) -> dict[str, float]:
    from workbench.engine.trainer import Trainer

    trainer = Trainer(workbench_recipe(args, dataset), run_dir)
    trainer.setup()
    policy = trainer.accelerator.unwrap_model(trainer.policy)
    gen, fb, step = [], [], []
    for s in range(args.steps):
        t0 = time.perf_counter()
        _, out = trainer.rollout(s)
        t1 = time.perf_counter()
        bare_forward_backward(policy, out)
        t2 = time.perf_counter()
        trainer.step(s)
        t3 = time.perf_counter()
        if s >= args.warmup:
            gen.append(t1 - t0), fb.append(t2 - t1), step.append(t3 - t2)
    trainer.events.close()
    return {"generation": statistics.mean(gen), "forward_backward": statistics.mean(fb), "step": statistics.mean(step),
            "overhead": sum(step) / (sum(gen) + sum(fb)), "per_step": [s / (g + f) for s, g, f in zip(step, gen, fb)]}


# ---- generation throughput -------------------------------------------------------------------


def generation_throughput(args, rows, model_dir: str) -> dict[str, tuple[float, list[float]]]:
    """Valid completion tokens per second, HF generate vs the vLLM backend, same prompts."""
    from workbench.engine.rollout import ROLLOUT_BACKENDS, hf_generate
    from workbench.engine.models import load_policy

    model, tok = load_policy(model_dir)
    prompts = [r["prompt"] for r in rows[: args.gen_prompts]]
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

    hf = tokens_per_s(lambda seed: hf_generate(model, tok, prompts, seed=seed, **sampling))
    backend = ROLLOUT_BACKENDS.get("vllm")(model_dir, precision="fp32", seed=0)
    try:
        vl = tokens_per_s(lambda seed: backend.generate(model, tok, prompts, seed=seed, **sampling))
    finally:
        backend.close()
    return {"hf": hf, "vllm": vl}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-len", type=int, default=16)
    p.add_argument("--gen-prompts", type=int, default=64)
    p.add_argument("--gen-len", type=int, default=32)
    p.add_argument("--gen-repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3, help="alternating TRL / workbench runs; the best of each counts")
    p.add_argument("--skip-trl", action="store_true", help="only the workbench's numbers")
    args = p.parse_args()
    if not 1 <= args.warmup < args.steps:
        p.error(f"--warmup={args.warmup} must be at least 1 and below --steps={args.steps}")
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)

    from workbench.engine.tasks import get_task
    from workbench.engine.tiny import ensure_tiny_model

    model_dir = str(ensure_tiny_model())
    rows = get_task("arithmetic").make_dataset(2048, 0)
    with tempfile.TemporaryDirectory(prefix="engine_vs_trl-") as tmp:
        tmp = Path(tmp)
        dataset = tmp / "arithmetic.jsonl"
        dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"tiny model, arithmetic task, G={args.G} x {args.prompts} prompts = {args.G * args.prompts} completions, "
              f"max {args.max_len} tokens, no KL, 1 thread; {args.steps} steps, first {args.warmup} not timed", flush=True)
        # TRL and the workbench alternate for --rounds rounds; the best round of each is kept (on a
        # shared machine, load from other processes only ever adds time)
        times: dict[str, list[float]] = {"trl": [], "wb": []}
        rewards: dict[str, list[float]] = {}
        for rnd in range(args.rounds):
            if not args.skip_trl:
                t, rw = run_trl(args, rows, model_dir, str(tmp / f"trl{rnd}"))
                times["trl"].append(t), rewards.setdefault("trl", rw)
            t, rw = run_workbench(args, dataset, tmp / f"wb{rnd}")
            times["wb"].append(t), rewards.setdefault("wb", rw)
        for key, label in (("trl", "TRL GRPOTrainer        "), ("wb", "workbench (hf rollout) ")):
            if times[key]:
                rw = rewards[key]
                print(f"{label} {min(times[key]):.4f} s/step   (rounds: {', '.join(f'{t:.4f}' for t in times[key])}; "
                      f"reward first/last 5 steps: {statistics.mean(rw[:5]):.3f} / {statistics.mean(rw[-5:]):.3f})", flush=True)
        if times["trl"]:
            per_round = [w / t for w, t in zip(times["wb"], times["trl"])]
            print(f"ratio workbench / TRL   {min(times['wb']) / min(times['trl']):.3f}x best / best; per round (alternating "
                  f"pairs) min/median/max {spread(per_round, '.3f')}; median / median "
                  f"{statistics.median(times['wb']) / statistics.median(times['trl']):.3f}x   (target <= 0.67)", flush=True)
        o = engine_overhead(args, dataset, tmp / "overhead")
        print(f"engine overhead         {o['overhead']:.3f}   = step {o['step']:.4f} s / (rollout {o['generation']:.4f} s "
              f"+ forward-backward {o['forward_backward']:.4f} s); per step min/median/max {spread(o['per_step'], '.3f')}   (target <= 1.2)", flush=True)
        tput = generation_throughput(args, rows, model_dir)
        (hf, hf_rep), (vl_tok, vl_rep) = tput["hf"], tput["vllm"]
        print(f"generation, {args.gen_prompts} prompts x <= {args.gen_len} tokens: HF {hf:.0f} tok/s (repeats min/median/max "
              f"{spread(hf_rep, '.0f')}), vLLM {vl_tok:.0f} tok/s ({spread(vl_rep, '.0f')}), vLLM / HF {vl_tok / hf:.2f}x", flush=True)
        vl, vl_rewards = run_workbench(args, dataset, tmp / "wb_vllm", rollout="vllm")
        print(f"workbench (vllm rollout) {vl:.4f} s/step, one run  (reward first/last 5: "
              f"{statistics.mean(vl_rewards[:5]):.3f} / {statistics.mean(vl_rewards[-5:]):.3f})", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
