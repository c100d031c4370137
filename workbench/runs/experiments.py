"""Canned experiments: a claim from a paper, the arms x seeds that test it, and the metric that shows it.

An experiment is pure data: presets, a sweep (field -> values) and shared overrides, exactly what
``plan_runs`` takes, so its arms are labelled and validated like any launch (``grpo · mu=4``), plus
the metric that should move, the direction the paper reports, and the citation. ``experiment_plan``
turns one into PlannedRuns for ``launch_planned``; ``experiment_frame`` reads a finished group
back as the long frame of ``workbench.analysis`` with the experiment's derived metrics added.

Two effects have no metric the trainer logs, so they are derived here from what it does log:

- ``completions/wrong_mean_length``: mean length of the completions whose reward is below the
  task's "correct" reward, per step, from the ``samples`` rows (the experiment logs every
  completion of the batch as a sample: ``logging.samples_per_step`` = prompts x G);
- ``kl/step_change``: |kl_t - kl_{t-1}|, the step-to-step change of the batch-mean KL estimate.
  Over a few steps the true KL drifts slowly, so this is dominated by the estimator's sampling
  noise: for a batch mean of N token estimates with per-token std s, E|noise_t - noise_{t-1}| =
  2 s / sqrt(pi N). The per-token std s itself is logged as ``kl/token_std``.

Torch-free (listing experiments must not load torch); the store is only read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from workbench.analysis.window import DEFAULT_WINDOW_FRAC
from workbench.runs.names import check_group

if TYPE_CHECKING:
    from workbench.runs.service import PlannedRun
    from workbench.runs.store import RunStore

EXPERIMENT_GROUP_PREFIX = "exp-"  # group of the n-th launch of experiment KEY: exp-KEY-n
BATCH_SAMPLES = "logging.samples_per_step=32"  # every completion of the presets' batch (4 prompts x G = 8)


@dataclass(frozen=True)
class Expectation:
    """What the paper reports, as a check on the verdict table: on the experiment's ``metric``, arm
    ``higher`` should score above arm ``lower`` (the 95% interval of higher - lower excluding 0)."""

    higher: str
    lower: str


@dataclass(frozen=True)
class Experiment:
    """Arms x seeds + the metric that shows the effect + what the paper reports.

    presets, sweep, overrides: ``plan_runs(presets, sweep=sweep, overrides=overrides)``; the arms
    are presets x the sweep grid. metric: the verdict table's metric; also: further metrics worth
    a table. expect: the paper's direction on ``metric``.
    """

    key: str
    title: str
    question: str
    presets: tuple[str, ...]
    metric: str
    expect: Expectation
    paper: str  # what the paper reports, in a sentence or two
    citation: str
    sweep: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()
    also: tuple[str, ...] = ()
    seeds: int = 3
    window: float = DEFAULT_WINDOW_FRAC  # the verdict's final window (fraction of each run's logged steps); 1.0: the whole run
    note: str = ""  # why the settings differ from the preset, what the tiny model can and cannot show

    @property
    def metrics(self) -> tuple[str, ...]:
        return (self.metric, *self.also)


# -- the registry ---------------------------------------------------------------------------------
EXPERIMENTS: dict[str, Experiment] = {e.key: e for e in [
    Experiment(
        key="clip-higher",
        title="DAPO clip-higher and entropy",
        question="Does a wider upper clip (eps_high 0.28 instead of 0.2) keep the policy's entropy up?",
        presets=("dapo",),
        sweep={"algorithm.eps_high": [0.2, 0.28]},
        # clipping only bites off-policy: with one minibatch and mu = 1 the ratio is exactly 1, so
        # both arms would be the same run. Four minibatches make updates 2-4 of a step off-policy,
        # as in the paper (a rollout batch split into several gradient updates).
        overrides=("train.minibatches=4",),
        metric="entropy",
        also=("clip_ratio/high_mean", "reward"),
        expect=Expectation(higher="dapo · eps_high=0.28", lower="dapo · eps_high=0.2"),
        paper="With the symmetric clip (0.2) the actor's entropy collapses early in training; raising only the upper "
              "bound to 0.28 lets low-probability tokens grow, keeps entropy higher and improves AIME accuracy "
              "(Fig. 2).",
        citation="Yu et al. 2025, DAPO: An Open-Source LLM Reinforcement Learning System at Scale, arXiv:2503.14476, §3.1",
        note="train.minibatches=4 so that the clip can act at all (mu = 1 with one minibatch is exactly on-policy).",
    ),
    Experiment(
        key="dr-grpo-length",
        title="Dr. GRPO vs GRPO: length of wrong answers",
        question="Does GRPO's per-sequence mean (and std scaling) let wrong answers grow longer than Dr. GRPO does?",
        presets=("grpo", "dr_grpo"),
        # both without KL (Dr. GRPO's paper trains without it), so the arms differ only in the std
        # scaling and the aggregation; 16 tokens of room so that length can move at all
        overrides=("algorithm.kl_coef=0", "sampling.max_completion_length=16", BATCH_SAMPLES),
        metric="completions/wrong_mean_length",
        also=("completions/mean_length", "reward"),
        expect=Expectation(higher="grpo", lower="dr_grpo"),
        paper="GRPO's 1/|o_i| per-sequence normalisation penalises long wrong answers less per token, so incorrect "
              "responses keep getting longer during training; Dr. GRPO (no std scaling, constant normaliser) keeps "
              "them short at the same reward (Fig. 1 right, Fig. 5).",
        citation="Liu et al. 2025, Understanding R1-Zero-Like Training: A Critical Perspective, arXiv:2503.20783, §3",
        note="kl_coef 0 in both arms; sampling.max_completion_length=16 leaves room to grow; every completion is "
             "logged as a sample so the wrong ones can be measured (wrong: reward below 1, i.e. exact_match = 0).",
    ),
    Experiment(
        key="mu-reuse",
        title="mu = 1 vs mu = 4: clipping and KL",
        question="What does reusing each batch for 4 passes do to the clip ratio and the KL to the reference?",
        presets=("grpo",),
        sweep={"train.mu": [1, 4]},
        metric="clip_ratio/region_mean",
        also=("kl", "reward"),
        # the claim is about every update, not the end state: once the policy has converged its
        # ratios barely move, so the last steps would hide what reuse does over the run
        window=1.0,
        expect=Expectation(higher="grpo · mu=4", lower="grpo · mu=1"),
        paper="GRPO's outer loop takes mu policy updates per batch of samples; with mu = 1 the importance ratio is "
              "exactly 1 and the clip never acts, so the clipped surrogate only matters with mu > 1, where the ratio "
              "leaves [1 - eps, 1 + eps] on a growing share of tokens and the policy moves further per batch.",
        citation="Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, §4.1 and Algorithm 1; Schulman et al. 2017, "
                 "Proximal Policy Optimization Algorithms, arXiv:1707.06347, §3",
        note="Scored over the whole run (window 1.0): the claim is about every update, and a converged policy's "
             "ratios barely move in the last steps.",
    ),
    Experiment(
        key="kl-k1-vs-k3",
        title="k1 vs k3 KL estimator: variance",
        question="Is the k3 estimator of KL(pi || ref) less noisy than k1 (log pi - log ref)?",
        presets=("grpo",),
        sweep={"algorithm.kl_estimator": ["k1", "k3"]},
        # The KL is measured, not optimised: with a negligible coefficient both arms of a seed
        # train (almost exactly) the same trajectory, so the two estimators are compared on the
        # same policies (with GRPO's 0.04, k1 in the loss has zero expected gradient and the KL
        # itself runs away). lr 1e-4 keeps the policy near the reference (KL ~ 0.1 nats), the
        # regime of the claim; at the presets' 1e-3 the KL reaches ~0.5 and k3's advantage is gone.
        overrides=("algorithm.kl_coef=1.0e-6", "optim.lr=1.0e-4"),
        metric="kl/token_std",
        also=("kl", "kl/step_change"),
        expect=Expectation(higher="grpo · kl_estimator=k1", lower="grpo · kl_estimator=k3"),
        paper="k1 = log(pi/ref) is unbiased but has high variance (it is negative for about half the samples); "
              "k3 = (r - 1) - log r with r = ref/pi is unbiased too, always >= 0, and has much lower variance while "
              "pi is close to ref.",
        citation="Schulman 2020, Approximating KL Divergence, http://joschu.net/blog/kl-approx.html",
        note="kl_coef=1.0e-6 and lr=1.0e-4: the KL is measured on the same near-reference trajectories, not "
             "optimised. kl/token_std is the per-token standard deviation of the estimator over the batch's "
             "completion tokens (TRL logs only the mean, kl); kl/step_change, |kl_t - kl_{t-1}|, "
             "is the noise of its batch mean step to step.",
    ),
    Experiment(
        key="smollm2-arithmetic",
        title="A real model learns in a coffee break: SmolLM2-135M on one-digit sums",
        question="Does GRPO raise SmolLM2-135M-Instruct's accuracy on one-digit sums and differences, in training "
                 "and on held-out questions, within 20 minutes on a 2-core CPU, beyond what sampling noise gives "
                 "a policy that barely moves?",
        presets=("grpo",),
        # The control arm samples, scores and steps exactly as the other, at a learning rate 200x
        # smaller: over 16 steps its policy stays where it started, so its curves are the untrained
        # model's under the same sampling noise (a frozen policy would need an lr of 0, which no
        # optimiser setting allows). The seeds pair the arms' held-out questions and sampling.
        sweep={"optim.lr": [1.0e-7, 2.0e-5]},
        overrides=(
            "model=smollm2-135m",
            "task=reasoning_gym/basic_arithmetic",
            "task_config={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1, operators: ['+', '-'], "
            "allow_negation: false, allow_parentheses: false}",
            "system_prompt=Reply with just the number.",
            "reward_funcs=[final_number]",
            "algorithm.kl_coef=0",
            "sampling.max_completion_length=24",
            "train.steps=16",
            "train.threads=1",
            "eval.every=8",
            "eval.num_prompts=32",
            "eval.pass_k=4",
            "logging.samples_per_step=4",
        ),
        metric="reward",
        also=("eval/pass@1", "eval/pass@k", "completions/mean_length"),
        window=0.5,
        expect=Expectation(higher="grpo · lr=2e-05", lower="grpo · lr=1e-07"),
        paper="RL with a verifiable reward raises a pretrained model's accuracy on the task it is rewarded for, "
              "held-out questions included (DeepSeekMath's GRPO on GSM8K and MATH; verl's quick-start trains "
              "Qwen2.5-0.5B-Instruct on GSM8K with PPO, on GPUs). Here: within 16 steps on a CPU.",
        citation="Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, §4 (GRPO); model: Allal et al. 2025, SmolLM2, "
                 "arXiv:2502.02737",
        note="The de-quantised SmolLM2-135M never closes <answer> tags (README, Status), so the reward is "
             "final_number: 1 when the last number of the reply equals the answer (lm-evaluation-harness's "
             "flexible extract), under a one-line system prompt asking for the number only. kl_coef 0 (TRL's "
             "default); 16 steps of 4 prompts x G = 8, 24 tokens, one thread per run. The verdict window is the "
             "second half of each run (8 steps; the last 10% would be 2 steps of 32 completions each). Held-out "
             "accuracy: eval/pass@1 (greedy) and eval/pass@k (any of 4 samples at temperature 1) on 32 questions "
             "of reasoning-gym's eval split, at steps 0, 8 and after the last update.",
    ),
]}


def get_experiment(key: str) -> Experiment:
    if key not in EXPERIMENTS:
        raise ValueError(f"experiment={key!r} is not allowed; choose one of: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[key]


def experiment_plan(experiment: Experiment, seeds: int | None = None, *, target: str = "local",
                    num_processes: int = 1) -> list[PlannedRun]:
    """The experiment's runs (arms x seeds, each validated for ``target``), for ``launch_planned``."""
    from workbench.runs.service import plan_runs

    return plan_runs(list(experiment.presets), seeds=experiment.seeds if seeds is None else seeds,
                     sweep={k: list(v) for k, v in experiment.sweep.items()}, overrides=list(experiment.overrides),
                     target=target, num_processes=num_processes)


def experiment_groups(experiment: Experiment, groups: Sequence[str]) -> list[str]:
    """The groups among ``groups`` that are launches of ``experiment`` (exp-KEY-n), newest (largest n) first."""
    pattern = re.compile(rf"^{re.escape(EXPERIMENT_GROUP_PREFIX + experiment.key)}-(\d+)$")
    numbered = [(int(m.group(1)), g) for g in groups if (m := pattern.match(str(g)))]
    return [g for _, g in sorted(numbered, reverse=True)]


def next_group(experiment: Experiment, groups: Sequence[str]) -> str:
    """exp-KEY-(n+1) for the largest n among ``groups`` (exp-KEY-1 for the first launch)."""
    existing = experiment_groups(experiment, groups)
    n = int(existing[0].rsplit("-", 1)[1]) + 1 if existing else 1
    return check_group(f"{EXPERIMENT_GROUP_PREFIX}{experiment.key}-{n}")


# -- derived metrics ------------------------------------------------------------------------------
CORRECT_REWARD = 1.0  # built-in tasks: exact_match (weight 1) + format (0.2): a right answer scores >= 1


def wrong_mean_length(samples: pd.DataFrame, correct_reward: float = CORRECT_REWARD) -> pd.DataFrame:
    """Per (run, step): the mean ``length`` of the samples with ``reward < correct_reward``.

    samples: rows of ``RunStore.samples`` (``run_id``, ``step``, ``reward``, ``length``) ->
    columns ``run_id``, ``step``, ``completions/wrong_mean_length``; a step without a wrong
    sample has no row (its mean is undefined, not 0).
    """
    wrong = samples[pd.to_numeric(samples["reward"], errors="coerce") < correct_reward]
    means = wrong.assign(length=wrong["length"].astype(float)).groupby(["run_id", "step"], as_index=False)["length"].mean()
    return means.rename(columns={"length": "completions/wrong_mean_length"})


def step_change(frame: pd.DataFrame, metric: str) -> pd.Series:
    """|metric_t - metric_{t-1}| between consecutive logged steps of each run (NaN at a run's first step).

    frame: long frame with ``run_id``, ``step`` and ``metric`` -> Series aligned with ``frame``.
    """
    ordered = frame.sort_values(["run_id", "step"], kind="stable")
    change = ordered.groupby("run_id", sort=False)[metric].diff().abs()
    return change.reindex(frame.index)


@dataclass(frozen=True)
class DerivedMetric:
    """A metric computed from logged ones: ``inputs`` (trainer metrics it reads) and ``add``,
    (store, run ids, arm_metrics frame) -> the frame with the metric's column added."""

    inputs: frozenset[str]
    add: Callable[[RunStore, list[str], pd.DataFrame], pd.DataFrame]


def _add_wrong_mean_length(store: RunStore, ids: list[str], frame: pd.DataFrame) -> pd.DataFrame:
    samples = pd.concat([store.samples(run_id) for run_id in ids], ignore_index=True)
    return frame.merge(wrong_mean_length(samples), on=["run_id", "step"], how="left")


def _add_kl_step_change(store: RunStore, ids: list[str], frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(**{"kl/step_change": step_change(frame, "kl")})


DERIVED_METRICS: dict[str, DerivedMetric] = {
    "completions/wrong_mean_length": DerivedMetric(frozenset({"reward"}), _add_wrong_mean_length),  # from samples
    "kl/step_change": DerivedMetric(frozenset({"kl"}), _add_kl_step_change),
}


def experiment_frame(store: RunStore, run_ids: Sequence[str], experiment: Experiment) -> pd.DataFrame:
    """``store.arm_metrics(run_ids)`` with the experiment's derived metrics added (columns as named in
    ``experiment.metrics``; NaN where undefined). Empty frame (same columns) when nothing is logged yet."""
    ids = list(run_ids)
    frame = store.arm_metrics(ids)
    for name in experiment.metrics:
        if name in DERIVED_METRICS and "step" in frame and len(frame):
            frame = DERIVED_METRICS[name].add(store, ids, frame)
    return frame


def logged_metric_inputs(experiment: Experiment) -> set[str]:
    """The trainer metrics the experiment reads: its metrics, a derived one replaced by its inputs."""
    return set().union(*(DERIVED_METRICS[m].inputs if m in DERIVED_METRICS else {m} for m in experiment.metrics))


def reproduced(pairs: pd.DataFrame, expectation: Expectation) -> bool | None:
    """Whether a ``pairwise`` table shows the paper's direction: True if the 95% interval of
    higher - lower lies above 0, False if it does not, None if the pair is not in the table."""
    for a, b, sign in ((expectation.higher, expectation.lower, 1), (expectation.lower, expectation.higher, -1)):
        row = pairs[(pairs["a"] == a) & (pairs["b"] == b)]
        if len(row):
            low, high = float(row["diff_ci_low"].iloc[0]), float(row["diff_ci_high"].iloc[0])
            return bool(np.isfinite(low) and (low > 0 if sign > 0 else high < 0))
    return None


def paper_direction(frame: pd.DataFrame, experiment: Experiment, window_frac: float | None = None) -> bool | None:
    """``reproduced`` for the experiment's metric in ``experiment_frame`` (None: not both arms scored yet)."""
    from workbench.analysis import final_window_values, pairwise

    values = final_window_values(frame, experiment.metric, experiment.window if window_frac is None else window_frac)
    return reproduced(pairwise(values), experiment.expect) if len(values) > 1 else None


def report(store: RunStore, group: str, experiment: Experiment, window_frac: float | None = None) -> str:
    """The verdict of each of the experiment's metrics for a launched group, as text (the README's numbers)."""
    from workbench.analysis import arm_summary, final_window_values, pairwise

    window_frac = experiment.window if window_frac is None else window_frac
    ids = [run.id for runs in store.arms(group).values() for run in runs]
    frame = experiment_frame(store, ids, experiment)
    lines = [f"{experiment.title} (group {group}, {len(ids)} runs; final {window_frac:.0%} of steps)"]
    for metric in experiment.metrics:
        values = final_window_values(frame, metric, window_frac)
        for row in arm_summary(values).itertuples():
            lines.append(f"  {metric:32s} {row.arm:28s} mean {row.mean:+.4g}  95% CI [{row.ci_low:.4g}, {row.ci_high:.4g}]"
                         f"  (n={row.n})")
        for row in pairwise(values).itertuples():
            lines.append(f"  {metric:32s} {row.a} - {row.b}: {row.diff:+.4g} [{row.diff_ci_low:.4g}, {row.diff_ci_high:.4g}],"
                         f" P(A>B)={row.p_improvement:.2f}; {row.verdict}")
    outcome = paper_direction(frame, experiment, window_frac)
    lines.append(f"  paper's direction ({experiment.expect.higher} > {experiment.expect.lower} on "
                 f"{experiment.metric}): {'reproduced' if outcome else 'not reproduced'}")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m workbench.runs.experiments KEY GROUP [WINDOW]: a launched experiment's verdicts
    import sys

    from workbench.runs.store import RunStore as _Store

    print(report(_Store(), sys.argv[2], get_experiment(sys.argv[1]), float(sys.argv[3]) if len(sys.argv) > 3 else None))
