"""One GRPO workload run by the workbench and by TRL's GRPOTrainer, timed alike (shared by
``engine_vs_trl.py`` and ``gpu_bench.py``).

A :class:`Work` fixes everything both systems are given: model, task (its rows and reward
functions, as the workbench's ``load_rows`` / ``reward_setup`` build them), G completions per
prompt, prompts per step, max completion length, temperature 1, top_p 1, top_k 0, no KL (no
reference model), one pass per batch, per-sequence mean loss (TRL ``loss_type="grpo"`` = the
workbench's ``seq-mean-token-mean``), AdamW constant lr, grad-norm clip 1.0, one log line per step,
and the precision (fp32, or bf16 autocast over fp32 weights: accelerate's ``mixed_precision`` in
both). Each system draws its own prompt order and samples from the same row pool, so the work per
step is equal in size, not token for token: tokens/s is reported beside s/step for that reason.

Timing: steady state = wall time between the ends of step ``warmup`` and of the last step,
divided by the steps in between (CUDA synchronised at each step end); TRL and the workbench
alternate for several rounds (:func:`alternate`), so drift on a shared machine hits both.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

#: model -> (task, task_config) the benchmarks train it on: the tiny model's own built-in task; a
#: pretrained instruct model a reasoning-gym task in TRL's conversational format (chat template).
SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny": ("arithmetic", {}),
    "smollm2-135m": ("reasoning_gym/basic_arithmetic", {"min_terms": 2, "max_terms": 2, "max_digits": 1}),
}


@dataclass(frozen=True)
class Work:
    """What both systems are asked to do (see the module docstring for the fixed settings)."""

    model: str
    G: int
    prompts: int
    max_len: int
    steps: int
    warmup: int
    precision: str = "fp32"  # fp32 | bf16 (autocast over fp32 weights)
    lr: float = 1e-3
    threads: int = 1
    seed: int = 0

    @property
    def task(self) -> tuple[str, dict[str, Any]]:
        return SETTINGS[self.model]

    def describe(self) -> str:
        task, config = self.task
        return (f"{self.model}, task {task}{' ' + str(config) if config else ''}, G={self.G} x {self.prompts} prompts = "
                f"{self.G * self.prompts} completions, max {self.max_len} tokens, {self.precision}, no KL; "
                f"{self.steps} steps, first {self.warmup} not timed")


@dataclass
class Timing:
    """One system's run: steady-state seconds per step, completion tokens per second over the same
    window, per-step mean rewards, peak CUDA memory (None on CPU)."""

    s_per_step: float
    tokens_per_s: float
    rewards: list[float]
    peak_memory_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def quiet() -> None:
    """No warnings, transformers' info logs or weight-loading progress bars in a benchmark's output."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    hf_logging.disable_progress_bar()


def spread(values: list[float], fmt: str = ".4f") -> str:
    """min/median/max of a figure's repeats."""
    return "/".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))


def steady_state(ends: list[float], warmup: int) -> float:
    """Seconds per step from the wall-clock end time of each step, skipping ``warmup`` steps."""
    return (ends[-1] - ends[warmup - 1]) / (len(ends) - warmup)


def steady_tokens_per_s(ends: list[float], cumulative_tokens: list[float], warmup: int) -> float:
    """Completion tokens per second over the steady-state window (same window as steady_state)."""
    return (cumulative_tokens[-1] - cumulative_tokens[warmup - 1]) / (ends[-1] - ends[warmup - 1])


def step_end() -> float:
    """perf_counter at a step's end, after the GPU's queued work (a no-op wait on CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def reset_peak_memory() -> None:
    """Free the previous run's tensors and start a fresh CUDA high-water mark."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory() -> int | None:
    """torch.cuda.max_memory_allocated since :func:`reset_peak_memory`; None on CPU."""
    return int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else None


# ---- the workbench ------------------------------------------------------------------------------


def workbench_recipe(work: Work, rollout: str = "hf"):
    from workbench.recipe import load_recipe

    task, config = work.task
    overrides = [
        f"model={work.model}", f"task={task}", "algorithm.kl_coef=0.0", "algorithm.aggregation=seq-mean-token-mean",
        f"sampling.num_generations={work.G}", f"sampling.prompts_per_step={work.prompts}",
        f"sampling.max_completion_length={work.max_len}", "sampling.temperature=1.0", "sampling.top_p=1.0",
        f"optim.lr={work.lr}", "optim.max_grad_norm=1.0", f"train.steps={work.steps}", "train.mu=1",
        f"train.seed={work.seed}", f"train.rollout={rollout}", f"train.threads={work.threads}",
        f"train.precision={work.precision}",
    ]
    if config:
        overrides.append("task_config={" + ", ".join(f"{k}: {v}" for k, v in config.items()) + "}")
    return load_recipe("grpo", overrides)


def work_rows(work: Work) -> list[dict]:
    """The rows the workbench trains on for ``work`` (TRL gets the same list)."""
    from workbench.engine.trainer import load_rows

    return load_rows(workbench_recipe(work))


def run_workbench(work: Work, run_dir: Path, rollout: str = "hf") -> Timing:
    from workbench.engine.trainer import Trainer

    reset_peak_memory()
    trainer = Trainer(workbench_recipe(work, rollout), run_dir)
    trainer.setup()
    ends, tokens, rewards = [], [], []
    try:
        for s in range(work.steps):
            m = trainer.step(s)
            ends.append(step_end())
            rewards.append(m["reward"]), tokens.append(m["perf/tokens"])  # cumulative completion tokens
    finally:
        trainer.rollout_backend.close()
        trainer.events.close()
    return Timing(steady_state(ends, work.warmup), steady_tokens_per_s(ends, tokens, work.warmup), rewards, peak_memory())


# ---- TRL ----------------------------------------------------------------------------------------


def trl_config(work: Work, out_dir: str, reward_weights: list[float]):
    """GRPOConfig for ``work`` (the settings listed in the module docstring)."""
    from trl import GRPOConfig

    cuda = torch.cuda.is_available()
    return GRPOConfig(
        output_dir=out_dir, max_steps=work.steps, per_device_train_batch_size=work.G * work.prompts,
        num_generations=work.G, max_completion_length=work.max_len, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, loss_type="grpo", scale_rewards="group", num_iterations=1, learning_rate=work.lr,
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, reward_weights=reward_weights,
        use_cpu=not cuda, bf16=work.precision == "bf16", fp16=work.precision == "fp16",
        gradient_checkpointing=False, logging_steps=1, report_to="none", save_strategy="no",
        dataloader_num_workers=0, dataloader_pin_memory=False, seed=work.seed, disable_tqdm=True,
    )


def run_trl(work: Work, rows: list[dict], out_dir: str) -> Timing:
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from workbench.engine.models import load_policy
    from workbench.engine.trainer import reward_setup

    batch = work.G * work.prompts

    class StepEnds(TrainerCallback):
        def __init__(self):
            self.ends, self.rewards, self.tokens = [], [], []

        def on_step_end(self, a, state, control, **kw):
            self.ends.append(step_end())

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                self.rewards.append(logs["reward"])
                # completions/mean_length: mean completion tokens (EOS included) of the step's batch
                self.tokens.append((self.tokens[-1] if self.tokens else 0.0) + logs["completions/mean_length"] * batch)

    reset_peak_memory()
    recipe = workbench_recipe(work)
    funcs, weights = reward_setup(recipe)
    # the model as transformers loads it for a TRL user (not the workbench's grouped attention)
    model, tok = load_policy(recipe.model, device="cuda" if torch.cuda.is_available() else "cpu", grouped_attention=False)
    timer = StepEnds()
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=trl_config(work, out_dir, weights),
                          train_dataset=Dataset.from_list(rows), processing_class=tok, callbacks=[timer])
    trainer.remove_callback(PrinterCallback)  # its per-step print of the log dict is not the benchmark
    trainer.train()
    return Timing(steady_state(timer.ends, work.warmup), steady_tokens_per_s(timer.ends, timer.tokens, work.warmup),
                  timer.rewards, peak_memory())


# ---- both, alternating --------------------------------------------------------------------------


SYSTEMS = {"trl": "TRL", "wb": "workbench"}


def run_system(system: str, work: Work, rows: list[dict], out_dir: Path) -> Timing:
    """One run of ``system`` (a ``SYSTEMS`` key) in this process."""
    return run_trl(work, rows, str(out_dir)) if system == "trl" else run_workbench(work, out_dir)


def run_isolated(system: str, work: Work, out_dir: Path) -> Timing:
    """``run_system`` in a fresh Python process (same work, its rows rebuilt there), so that its
    peak resident memory is its own: ``Timing.extra["peak_rss_bytes"]`` (getrusage's ru_maxrss of
    the child: model, optimiser, activations, and the libraries each system imports)."""
    code = ("import dataclasses, json, resource, sys; from pathlib import Path; sys.path[:0] = sys.argv[1:3]\n"
            "import grpo_pair as g, torch; g.quiet(); work = g.Work(**json.loads(sys.argv[3]))\n"
            "torch.set_num_threads(work.threads)\n"
            "t = g.run_system(sys.argv[4], work, g.work_rows(work), Path(sys.argv[5]))\n"
            "t.extra['peak_rss_bytes'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024\n"
            "print('TIMING ' + json.dumps(dataclasses.asdict(t)))\n")
    here = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-c", code, str(here.parent), str(here), json.dumps(dataclasses.asdict(work)),
                           system, str(out_dir)], capture_output=True, text=True, check=False)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("TIMING ")), None)
    if done.returncode or line is None:
        raise RuntimeError(f"{SYSTEMS[system]} run failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return Timing(**json.loads(line[len("TIMING "):]))


def alternate(work: Work, rows: list[dict], tmp: Path, rounds: int, with_trl: bool = True,
              progress=print, isolate: bool = False) -> dict[str, list[Timing]]:
    """{"trl": [...], "wb": [...]}: TRL then the workbench, ``rounds`` times (on a shared machine
    load from other processes only ever adds time, so the best round of each is the cleanest);
    ``isolate``: each run in its own process (``run_isolated``: peak memory per system)."""
    runs: dict[str, list[Timing]] = {"trl": [], "wb": []}
    for rnd in range(rounds):
        for system in ("trl", "wb") if with_trl else ("wb",):
            out_dir = tmp / f"{system}{rnd}"
            runs[system].append(run_isolated(system, work, out_dir) if isolate else run_system(system, work, rows, out_dir))
            progress(f"  round {rnd + 1}/{rounds}: {SYSTEMS[system]} {runs[system][-1].s_per_step:.4f} s/step")
    return runs


def ratio_summary(runs: dict[str, list[Timing]]) -> dict[str, Any]:
    """Workbench / TRL s/step: best / best, per-round (alternating pairs) min/median/max, median / median."""
    wb, trl = [t.s_per_step for t in runs["wb"]], [t.s_per_step for t in runs["trl"]]
    per_round = [w / t for w, t in zip(wb, trl)]
    return {"best_over_best": min(wb) / min(trl), "per_round": per_round,
            "per_round_min_median_max": [min(per_round), statistics.median(per_round), max(per_round)],
            "median_over_median": statistics.median(wb) / statistics.median(trl)}
