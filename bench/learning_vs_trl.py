"""GRPO learning, the workbench against TRL's GRPOTrainer, on the same work over several seeds.

    .venv/bin/python bench/learning_vs_trl.py [--seeds 0 1 2 3 4 5 --steps 200]

(``make bench`` installs TRL from requirements-bench.txt with the constraints file.)

Same model (the built-in ``tiny``), same rows (2,048 ``arithmetic_drill`` rows of data seed 0,
written to one JSONL), same reward functions and weights, G=8 completions x 4 prompts per step,
at most 8 new tokens, temperature 1, top_p 1, top_k 0, AdamW lr 1e-3 constant (betas 0.9/0.999,
eps 1e-8, no weight decay, no warm-up), grad-norm clip 1.0, no KL (no reference model), one pass
per batch, per-sequence mean loss (TRL ``loss_type="grpo"``, ``scale_rewards="group"``; the
workbench's ``seq-mean-token-mean``), fp32, one CPU thread. Run seed s drives both the prompt
order and the sampling of each system (they draw different completions; the seeds pair runs, not
samples).

Every run is its own subprocess (no state shared between TRL's and the workbench's accelerate
set-ups). Prints per seed: reward gain (mean of the last fifth of the steps - mean of the first
fifth) and the last fifth's mean reward for each system; then mean +- sd over seeds for each, and
the paired difference workbench - TRL with its 95% t confidence interval (n - 1 degrees of
freedom). The two learn alike when that interval holds 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TASK = "arithmetic_drill"
ROWS = 2048


def shared_settings(args) -> dict:
    return dict(G=args.G, prompts=args.prompts, max_len=args.max_len, lr=args.lr, steps=args.steps)


def trl_rewards(seed: int, s: dict, dataset: Path, model_dir: str, out_dir: str) -> list[float]:
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from workbench.engine.tasks import get_task
    from workbench.engine.models import load_policy

    class Rewards(TrainerCallback):
        def __init__(self):
            self.rewards = []

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                self.rewards.append(logs["reward"])

    task = get_task(TASK)
    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    model, tok = load_policy(model_dir)
    config = GRPOConfig(
        output_dir=out_dir, max_steps=s["steps"], per_device_train_batch_size=s["G"] * s["prompts"],
        num_generations=s["G"], max_completion_length=s["max_len"], temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, loss_type="grpo", scale_rewards="group", num_iterations=1, learning_rate=s["lr"],
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, reward_weights=list(task.reward_weights),
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, logging_steps=1, report_to="none",
        save_strategy="no", dataloader_num_workers=0, seed=seed, disable_tqdm=True,
    )
    log = Rewards()
    trainer = GRPOTrainer(model=model, reward_funcs=task.reward_functions(), args=config,
                          train_dataset=Dataset.from_list(rows), processing_class=tok, callbacks=[log])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return log.rewards


def workbench_rewards(seed: int, s: dict, dataset: Path, model_dir: str, out_dir: str) -> list[float]:
    from workbench.engine.trainer import Trainer
    from workbench.recipe import load_recipe

    recipe = load_recipe("grpo", [
        f"task={TASK}", f"dataset={dataset}", "algorithm.kl_coef=0.0", "algorithm.grpo_scale=group",
        "algorithm.aggregation=seq-mean-token-mean", f"sampling.num_generations={s['G']}",
        f"sampling.prompts_per_step={s['prompts']}", f"sampling.max_completion_length={s['max_len']}",
        "sampling.temperature=1.0", "sampling.top_p=1.0", f"optim.lr={s['lr']}", "optim.schedule=constant",
        "optim.warmup_steps=0", "optim.max_grad_norm=1.0", "optim.weight_decay=0.0", f"train.steps={s['steps']}",
        "train.mu=1", f"train.seed={seed}", "train.threads=1", "logging.samples_per_step=0", "logging.diagnostics_every=0",
    ])
    trainer = Trainer(recipe, Path(out_dir))
    trainer.setup()
    try:
        return [trainer.step(step)["reward"] for step in range(s["steps"])]
    finally:
        trainer.rollout_backend.close()
        trainer.events.close()


SYSTEMS = {"trl": trl_rewards, "workbench": workbench_rewards}


def one_run(system: str, seed: int, s: dict, dataset: Path, model_dir: str) -> None:
    """Child process: one run; prints its per-step rewards as one JSON line."""
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix=f"learning-{system}-") as out:
        rewards = SYSTEMS[system](seed, s, dataset, model_dir, out)
    print(json.dumps(rewards))


def fifths(rewards: list[float]) -> tuple[float, float]:
    """(gain, last): mean of the last fifth of the steps - mean of the first fifth; the last fifth's mean."""
    k = max(1, len(rewards) // 5)
    first, last = statistics.mean(rewards[:k]), statistics.mean(rewards[-k:])
    return last - first, last


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the t confidence interval of the mean (n - 1 degrees of freedom)."""
    from scipy.stats import t

    n = len(values)
    mean = statistics.mean(values)
    half = t.ppf(0.5 + level / 2, n - 1) * statistics.stdev(values) / n ** 0.5
    return mean, mean - half, mean + half


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):+.3f} +- {statistics.stdev(values):.3f} (min {min(values):+.3f}, max {max(values):+.3f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-len", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--systems", nargs="+", choices=sorted(SYSTEMS), default=["trl", "workbench"])
    p.add_argument("--one", choices=sorted(SYSTEMS), help=argparse.SUPPRESS)  # child process
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    p.add_argument("--dataset", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if len(args.seeds) < 2 or args.steps < 10:
        p.error("need at least 2 seeds (for a spread) and 10 steps (for fifths)")
    s = shared_settings(args)
    if args.one:
        one_run(args.one, args.seed, s, args.dataset, args.model_dir)
        return

    from workbench.engine.tasks import get_task
    from workbench.engine.tiny import ensure_tiny_model

    model_dir = str(ensure_tiny_model())
    print(f"tiny model, {ROWS} {TASK} rows, G={args.G} x {args.prompts} prompts, max {args.max_len} tokens, "
          f"lr {args.lr:g}, {args.steps} steps, seeds {args.seeds}; gain = last fifth - first fifth", flush=True)
    results: dict[str, dict[int, tuple[float, float]]] = {name: {} for name in args.systems}
    with tempfile.TemporaryDirectory(prefix="learning_vs_trl-") as tmp:
        dataset = Path(tmp) / f"{TASK}.jsonl"
        dataset.write_text("".join(json.dumps(r) + "\n" for r in get_task(TASK).make_dataset(ROWS, 0)))
        for seed in args.seeds:
            line = [f"seed {seed}:"]
            for name in args.systems:
                cmd = [sys.executable, __file__, "--one", name, "--seed", str(seed), "--dataset", str(dataset),
                       "--model-dir", model_dir, "--steps", str(args.steps), "--G", str(args.G), "--prompts",
                       str(args.prompts), "--max-len", str(args.max_len), "--lr", str(args.lr)]
                done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
                if done.returncode:
                    sys.exit(f"{name} seed {seed} failed:\n{done.stderr[-3000:]}")
                rewards = json.loads(done.stdout.strip().splitlines()[-1])
                results[name][seed] = fifths(rewards)
                line.append(f"{name} gain {results[name][seed][0]:+.3f} last {results[name][seed][1]:.3f}")
            print("  ".join(line), flush=True)
    for name in args.systems:
        gains, lasts = zip(*results[name].values())
        print(f"{name:9s} gain {spread(list(gains))}; last fifth {spread(list(lasts))}")
    if len(args.systems) == 2:
        a, b = args.systems
        for k, label in ((0, "gain"), (1, "last fifth")):
            diffs = [results[b][seed][k] - results[a][seed][k] for seed in args.seeds]
            mean, low, high = t_interval(diffs)
            print(f"paired {b} - {a}, {label}: {mean:+.3f}, 95% CI [{low:+.3f}, {high:+.3f}] over {len(diffs)} seeds")


if __name__ == "__main__":
    main()
