"""The training process: one recipe, one run directory, one event stream.

Per step (DESIGN "data flow"): sample prompts -> rollout (G completions each; by the policy of
train.staleness updates ago; DAPO dynamic sampling re-samples groups without a reward spread; ReMax
adds one greedy completion per prompt) -> rewards (several functions combined per
multi_objective_aggregation) -> old / reference log-probs, values and rollout-correction weights
(no grad) -> advantages over the *global* batch (core) ->
mu passes x minibatches x gradient-accumulation micro-batches of policy loss (+ KL, - entropy,
+ value loss), each normalised by the global minibatch's token / sequence counts -> optimiser
step -> metrics, samples and per-token diagnostics appended to the run's events.

Runs under ``accelerate launch`` (data parallel over ranks; on CPU ``--multi_gpu`` with
``Accelerator(cpu=True)`` and gloo) or as a plain process. Every maths step is a
``workbench.core`` call (the whole per-token objective is ``core.policy_objective``, which the
same-batch lens calls too); this module only moves tensors and counts. Collectives go through
``ranks.Ranks``, seeds come from the named streams of ``seeds``, what a checkpoint carries
between steps is ``checkpoint.TrainState``, and a step's metrics are summed on the device
(``MetricSums``, read back once per step) and assembled by ``step_metrics``.
"""

from __future__ import annotations

import functools
import hashlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
import math
import os
import random
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import torch
from accelerate import Accelerator
from tqdm import tqdm
from transformers import get_scheduler

from workbench.core import (
    PADDING,
    REGION_NAMES,
    Objective,
    ObjectiveConfig,
    aggregate_loss,
    clipped_value_loss,
    combine_rewards,
    compute_advantages,
    equal_groups,
    high_entropy_mask,
    kl_per_token,
    length_metrics,
    masked_mean,
    policy_objective,
    reward_function_metrics,
    rejection_mask,
    reward_metrics,
    rollout_correction,
    sequence_clip_fractions,
    sequence_mean_kl,
    terminated_length_metrics,
    token_std_metric,
    truncation_mask,
)
from workbench.core.choices import BASELINE_ESTIMATORS, POLICY_STAT_ESTIMATORS
from workbench.core.kl_control import KL_CONTROLLERS
from workbench.core.entropy_control import EntropyControl, EntropyControlState, applied_entropy_coef, update_entropy_control
from workbench.core.distillation import distillation_metrics, shape_advantages
from workbench.engine import checkpoint, rundir, seeds
from workbench.engine.events import EVENTS_FILE, EventWriter, stdout_mirror
from workbench.engine.forward import ValueModel, logprobs_and_entropy, logprobs_and_sum_pi_squared
from workbench.engine.lens import SameBatchLens
from workbench.engine.ranks import Ranks, global_counts
from workbench.engine.rewards import RewardFunctionError, RewardLogs, compute_rewards, load_reward_function, reward_weights_for
from workbench.engine.rollout import ROLLOUT_BACKENDS, concat_rollouts, select_rows, valid_token_lists
from workbench.engine.evaluation import Evaluator, eval_due
from workbench.engine.distill import load_teacher
from workbench.engine.models import (AdapterDisabledReference, adapters_swapped, load_policy, load_policy_state, policy_state,
                                     prepare_policy, resolve_model, trainable_parameters)
from workbench.engine.tasks import load_dataset_rows, resolve_task
from workbench.engine.trackers import conclude_trackers, tracker_metrics, tracker_project, trackers_for
from workbench.machine import check_processes_divide
from workbench.recipe import Recipe

PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}
TASK_DATASET_SIZE = 2048
ADDITIVE_METRICS = frozenset({"loss/policy", "loss/value"})
#: TRL 1.16's per-sequence clip extremes: per micro-batch the nanmin / nanmax over every rank's
#: sequences of their clip fraction (core.sequence_clip_fractions), averaged over the step's
#: micro-batches (TRL appends one value per compute_loss call and logs the mean of the list).
SEQUENCE_EXTREMES = {"clip_ratio/low_min": "min", "clip_ratio/high_max": "max"}


# Both are BaseExceptions, as KeyboardInterrupt is: the signal may arrive inside user code (a reward
# function, a dataset loader) whose ``except Exception`` wrappers must not turn it into a failure.
class Cancelled(BaseException):
    """SIGTERM / SIGINT reached the run: the user cancelled it."""


class Interrupted(BaseException):
    """SIGTERM reached a run whose scheduler decides its fate (``SIGTERM_ENV`` = ``interrupt``)."""


#: What SIGTERM means to the trainer. Unset or ``cancel``: the user's cancel (the local and ssh
#: launchers send it), recorded as ``cancelled``. ``interrupt`` (the sbatch script sets it): SLURM's
#: notice that the job's processes end -- an admin's scancel, the time limit, a node failure or a
#: preemption, after which SLURM may requeue the job -- so the trainer stops without writing a final
#: status and the job's final state says what happened (the SLURM launcher reads it; a requeued job
#: continues the run from its newest checkpoint). SIGINT is always the user's cancel.
SIGTERM_ENV = "WORKBENCH_SIGTERM"


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite."""


def read_floats(values: list) -> list[float]:
    """Scalar tensors (or numbers) as Python floats, read back from the device in one transfer."""
    if not values:
        return []
    device = values[0].device if torch.is_tensor(values[0]) else None
    return torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device) for v in values]).tolist()


def nan_extreme(values: torch.Tensor, how: str) -> torch.Tensor:
    """nanmin / nanmax of a 1-D tensor without leaving the device; NaN when every value is NaN
    (or there is none)."""
    valid = ~torch.isnan(values)
    if values.numel() == 0:
        return torch.full((), math.nan, dtype=values.dtype, device=values.device)
    fill = math.inf if how == "min" else -math.inf
    filled = torch.where(valid, values, torch.full_like(values, fill))
    out = filled.amin() if how == "min" else filled.amax()
    return torch.where(valid.any(), out, torch.full_like(out, math.nan))


class MetricSums:
    """The micro-batches' metrics of one step, summed on the device in float64 (the order and
    precision of Python float sums: 0.0 + x, then + each next micro-batch's value) and read back
    once by ``means``. Names in ``per_micro`` keep one value per micro-batch instead (NaN where a
    micro-batch had none; their mean leaves those out, 0 when none had a value)."""

    def __init__(self, per_micro: tuple[str, ...] = ()) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.per_micro: dict[str, list[torch.Tensor]] = {k: [] for k in per_micro}
        self.count = 0

    def add(self, metrics: dict[str, torch.Tensor | float]) -> None:
        for k, v in metrics.items():
            v = torch.as_tensor(v).detach()
            if k in self.per_micro:
                self.per_micro[k].append(v)
            else:
                start = self.sums[k] if k in self.sums else torch.zeros((), dtype=torch.float64, device=v.device)
                self.sums[k] = start + v.double()
        self.count += 1

    def means(self, updates: int) -> tuple[dict[str, float], dict[str, float]]:
        """(summed metrics, per-micro-batch ones). Losses of the micro-batches add up to their
        minibatch's loss: averaged per optimiser update (``updates``); every other metric is a
        rate: averaged per micro-batch."""
        names = list(self.sums)
        values = read_floats([self.sums[k] for k in names] + [v for vs in self.per_micro.values() for v in vs])
        out = {k: v / (updates if k in ADDITIVE_METRICS else self.count) for k, v in zip(names, values)}
        rest, extremes = values[len(names):], {}
        for k, vs in self.per_micro.items():  # 0 when no micro-batch had a valid token (nothing clipped)
            mine, rest = rest[:len(vs)], rest[len(vs):]
            finite = [v for v in mine if not math.isnan(v)]
            extremes[k] = sum(finite) / len(finite) if finite else 0.0
        return out, extremes


def check_finite(losses: list[torch.Tensor], ranks: Ranks) -> None:
    """Raise NonFiniteLossError when any micro-batch loss of an update, on any rank, is NaN or
    infinite: called once per update before the optimiser step (one device sync, not one per
    micro-batch), so a non-finite loss never changes the weights and every rank stops together."""
    values = torch.stack(losses)
    bad = ~torch.isfinite(values)
    if float(ranks.sum(bad.any().float())) > 0:
        what = f"the loss is {values[bad][0].item()}" if bool(bad.any()) else "another rank's loss is not finite"
        raise NonFiniteLossError(f"{what}; stopping before the update")


# ---------------------------------------------------------------------------------------------
# data


@dataclass
class StepBatch:
    """This rank's slice of one step's batch; every tensor has B_local rows."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    old_logp: torch.Tensor | None
    ref_logp: torch.Tensor | None
    old_values: torch.Tensor | None
    is_weights: torch.Tensor | None = None  # (B, T) rollout-correction weights, None = off
    rollout_logp: torch.Tensor | None = None  # (B, T) the rollout engine's log-probs (off_policy_mask_threshold)

    def rows(self, idx: torch.Tensor) -> "StepBatch":
        return replace(self, **{f.name: getattr(self, f.name)[idx] for f in fields(self) if getattr(self, f.name) is not None})


class BehaviourForwards(NamedTuple):
    """What the step needs from the models before the update, none of it from the rewards: the
    behaviour policy's log-probs ``old_logp`` (B, T) (None when nothing reads them; bypass_mode:
    the rollout engine's), ``sum_pi_squared`` (B, T) for the optimal token baselines, the
    reference's ``ref_logp`` (B, T), the critic's ``old_values`` (B, T) and the per-token ``kl`` (B, T)."""

    old_logp: torch.Tensor | None
    sum_pi_squared: torch.Tensor | None
    ref_logp: torch.Tensor | None
    old_values: torch.Tensor | None
    kl: torch.Tensor | None


class GlobalBatch(NamedTuple):
    """A step's batch over every rank as its advantages saw it: the training ``rewards`` (B,),
    ``mask`` (B, T), the in-reward ``kl`` (B, T) or None, the ``advantages`` (B, T) and rollout
    rejection's ``keep`` (B, T) or None (off)."""

    rewards: torch.Tensor
    mask: torch.Tensor
    kl: torch.Tensor | None
    advantages: torch.Tensor
    keep: torch.Tensor | None


class Sample(NamedTuple):
    """One step's sampled batch: dataset ``rows``, the rollout ``out``, ``rewards`` (B,),
    ``per_fn`` (name -> (B,)), sampling ``metrics`` and ``alongside``: what ``Trainer.sample``'s
    ``alongside_scoring`` returned (None when not asked)."""

    rows: list
    out: Any
    rewards: torch.Tensor
    per_fn: dict[str, torch.Tensor]
    metrics: dict[str, float]
    alongside: Any = None


def run_alongside(main: Callable[[], Any], worker: Callable[[], Any]) -> tuple[Any, Any]:
    """(main(), worker()), with ``worker`` in a thread of its own while ``main`` runs on this one;
    an exception of either is raised here (``main``'s first). Torch's kernels release the GIL, so a
    forward in the worker and Python (or sleeping, or waiting on a server) in ``main`` overlap."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="behaviour-forwards") as pool:
        pending = pool.submit(worker)
        first = main()
        return first, pending.result()


def recipe_task(recipe: Recipe):
    """The recipe's task (built-in or reasoning-gym, configured), or None for a dataset run without one."""
    return resolve_task(recipe.task, recipe.task_config, system_prompt=recipe.system_prompt) if recipe.task else None


def load_splits(recipe: Recipe) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, held-out eval rows; [] when eval is off). A dataset run's eval rows are
    the first eval.num_prompts of eval.dataset; a task's come from its disjoint eval split."""
    n_eval = recipe.eval.num_prompts if recipe.eval.enabled else 0
    if recipe.dataset:
        held_out = load_dataset_rows(recipe.eval.dataset, limit=n_eval) if n_eval else []
        return load_dataset_rows(recipe.dataset), held_out
    return recipe_task(recipe).splits(TASK_DATASET_SIZE, n_eval, recipe.train.seed)


def load_rows(recipe: Recipe) -> list[dict[str, Any]]:
    """The training rows (held-out eval prompts removed when eval is on)."""
    return load_splits(recipe)[0]


def reward_setup(recipe: Recipe):
    """(functions, weights): the recipe's, else the task's defaults (precheck.reward_references)."""
    from workbench.engine.precheck import reward_references

    refs, weights = reward_references(recipe)
    return [load_reward_function(r) for r in refs], reward_weights_for(weights, refs)


def tracker_config(recipe: dict[str, Any], prefix: str = "") -> dict[str, int | float | str | bool]:
    """The recipe as flat ``section.field`` -> scalar pairs (``--set`` keys): TensorBoard's hparams
    accept only int / float / str / bool, so None and lists are written as their YAML-ish text."""
    flat: dict[str, int | float | str | bool] = {}
    for key, value in recipe.items():
        if isinstance(value, dict):
            flat.update(tracker_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


def prompts_for_step(rows: list[dict], step: int, prompts_per_step: int, rank: int, world: int, seed: int) -> list[dict]:
    """This rank's prompts of step ``step`` from a seeded, epoch-wise shuffled stream."""
    per_rank = prompts_per_step // world
    start = step * prompts_per_step + rank * per_rank
    out = []
    for k in range(start, start + per_rank):
        epoch, i = divmod(k, len(rows))
        out.append(rows[_epoch_order(len(rows), seed, epoch)[i]])
    return out


@functools.lru_cache(maxsize=4)
def _epoch_order(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    """The shuffled row order of one epoch (cached: reshuffling n rows per prompt cost ~3 ms each)."""
    order = list(range(n))
    random.Random(seeds.epoch_order_seed(seed, epoch)).shuffle(order)
    return tuple(order)


# ---------------------------------------------------------------------------------------------
# the run


class _StepRecord:
    """While a step's record is written (its metrics event, samples, diagnostics, lens and the
    trackers' log), a cancel or interrupt waits until the record is whole: a SIGTERM between the
    metrics event and the tracker's log left MLflow one step short of the run's own metrics."""

    writing = False
    pending: BaseException | None = None

    @classmethod
    @contextmanager
    def whole(cls) -> Iterator[None]:
        cls.writing, cls.pending = True, None
        try:
            yield
        finally:
            cls.writing = False
        if cls.pending is not None:  # reached only when the record was written: raise what arrived
            pending, cls.pending = cls.pending, None
            raise pending


@contextmanager
def _signals_cancel() -> Iterator[None]:
    term_interrupts = os.environ.get(SIGTERM_ENV, "cancel") == "interrupt"

    def handler(signum, frame):
        stop = (Interrupted("received SIGTERM") if signum == signal.SIGTERM and term_interrupts
                else Cancelled(f"received {signal.Signals(signum).name}"))
        if _StepRecord.writing:
            _StepRecord.pending = _StepRecord.pending or stop
            return
        raise stop

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class Trainer:
    """Holds the models, optimisers and event writer of one run."""

    def __init__(self, recipe: Recipe, run_dir: Path, *, stdout_events: bool = False, progress: bool = False,
                 resume: bool = False, claim: rundir.Claim | None = None) -> None:
        """``claim``: ``run_dir`` as claimed by the caller (the CLI claims it before the heavy imports;
        its ``resume`` decides, ``resume`` here is ignored); None claims it here with ``resume``:
        new, empty or launcher-prepared for a new run, the recorded recipe and an intact checkpoint
        for a resume (workbench/engine/rundir.py). Refusals raise RunDirError before anything is
        written; a set-up that fails after the claim abandons it (the directory as it was found)."""
        self.recipe = recipe
        self.run_dir = Path(run_dir)
        if claim is None:
            claim = rundir.claim(self.run_dir, recipe.to_yaml(), recipe.train.steps, resume=resume)
        self.claim = claim
        self.resume = claim.resume  # continue from the claim's checkpoint (checkpoint.resume)
        self.recipe_sha256 = claim.recipe_sha256  # into every checkpoint's manifest
        try:
            self._init(recipe, stdout_events)
        except BaseException:
            claim.abandon()  # no event written yet: a corrected rerun must find the directory as it was
            raise
        self.progress = progress

    def _init(self, recipe: Recipe, stdout_events: bool) -> None:
        """The rest of the set-up before ``run``: the events file is opened last, so a failure
        before it leaves nothing of this run in the directory."""
        self.snapshots: deque[dict[str, torch.Tensor]] = deque(maxlen=recipe.train.staleness + 1)
        self.behaviour = None  # the stale copy that generates when train.staleness > 0 (full fine-tuning)
        a = recipe.algorithm
        # adaptive entropy control (core.entropy_control): state carried across updates and checkpoints
        self.entropy_control = EntropyControl(a.entropy_target, a.entropy_coef_delta, a.entropy_coef_min,
                                              a.entropy_coef_max) if a.use_adaptive_entropy else None
        # what a checkpoint saves; kl_coef: beta of the next step (algorithm.kl_controller moves it)
        self.state = checkpoint.TrainState(entropy=EntropyControlState(coef=a.entropy_coef), kl_coef=a.kl_coef)
        # (sum of H over loss tokens, their count) of the current update: float64, added up on the device
        self._entropy_window: list[float | torch.Tensor] = [0.0, 0.0]
        self._entropy_coefs: list[float] = []  # the coefficient after each update of this step (TRL's entropy_coef)
        torch.set_num_threads(recipe.train.threads)
        self.accelerator = Accelerator(
            cpu=not torch.cuda.is_available(),
            mixed_precision=PRECISION[recipe.train.precision],
            log_with=trackers_for(recipe, self.run_dir, resume=bool(self.resume)) or None,
            project_dir=str(self.run_dir),
        )
        self.ranks = Ranks.of(self.accelerator)
        self.rank, self.world = self.ranks.rank, self.ranks.world
        self.objective = objective_config(recipe)
        check_processes_divide(recipe, self.world)  # the CLI checked it before the claim; direct use here
        if self.resume and self.accelerator.is_main_process:
            checkpoint.drop_torn_tail(self.run_dir / EVENTS_FILE)  # a kill -9 mid-line: append on a line of its own
        self.lens = SameBatchLens(self)
        self.events = EventWriter(self.run_dir, enabled=self.accelerator.is_main_process, mirror=stdout_mirror(stdout_events))

    # -- set-up -------------------------------------------------------------------------------
    def setup(self) -> None:
        r, acc = self.recipe, self.accelerator
        torch.manual_seed(r.train.seed)
        self.rows, eval_rows = load_splits(r)
        self.reward_funcs, self.reward_weights = reward_setup(r)
        policy, self.tokenizer = load_policy(r.model, device=acc.device)
        policy = prepare_policy(policy, r.lora, r.train.gradient_checkpointing)  # LoRA adapters, checkpointing
        self.reference = None
        if r.algorithm.uses_reference and r.lora.enabled:  # the base itself, adapters disabled: no copy
            self.reference = AdapterDisabledReference(policy)
        elif r.algorithm.uses_reference:  # no KL term -> no reference model in memory
            self.reference, _ = load_policy(r.model, device=acc.device)
            self.reference.eval().requires_grad_(False)
        # on-policy distillation: loaded once, after its tokenizer is checked against the student's
        self.teacher = load_teacher(r, self.tokenizer, device=acc.device) if r.teacher.enabled else None
        self.distill_metrics: dict[str, float] = {}
        self.distill_inputs: dict | None = None  # this step's shaping and its global inputs (the lens reuses them)
        total_updates = r.train.steps * r.train.mu * r.train.minibatches
        opt = torch.optim.AdamW(trainable_parameters(policy), lr=r.optim.lr, betas=r.optim.betas, weight_decay=r.optim.weight_decay)
        # One scheduler step per optimiser update on every rank. Not passed to acc.prepare: its
        # AcceleratedScheduler steps num_processes times per call (it assumes each rank's
        # dataloader batch is a slice of a num_processes-times larger one), which would run
        # warm-up and decay num_processes times too fast here.
        self.scheduler = get_scheduler(SCHEDULES[r.optim.schedule], opt, num_warmup_steps=r.optim.warmup_steps, num_training_steps=total_updates)
        self.policy, self.optimizer = acc.prepare(policy, opt)
        # built once; generate() always samples the policy's current weights (vllm: synced in)
        self.rollout_backend = ROLLOUT_BACKENDS.get(r.train.rollout)(
            resolve_model(r.model), precision=r.train.precision, seed=r.train.seed)
        task = recipe_task(r)
        self.evaluator = Evaluator(r, eval_rows, self.reward_funcs, self.reward_weights,
                                   task.correct_reward if task else None, rank=self.rank, world=self.world) if eval_rows else None
        self.critic = None
        if r.algorithm.critic:
            critic = ValueModel(acc.unwrap_model(self.policy), shared_prefix=r.train.shared_prefix).to(acc.device)
            copt = torch.optim.AdamW(trainable_parameters(critic), lr=r.optim.critic_lr or r.optim.lr, betas=r.optim.betas)
            self.critic, self.critic_optimizer = acc.prepare(critic, copt)
        if r.train.staleness:
            if not r.lora.enabled:  # LoRA swaps the stale adapters into the policy instead (sampling_model)
                self.behaviour, _ = load_policy(r.model, device=acc.device)
                self.behaviour.eval().requires_grad_(False)
            self.snapshot_weights()
        if r.logging.log_with:
            acc.init_trackers(tracker_project(r), config=tracker_config(r.to_dict()))

    # -- staleness ----------------------------------------------------------------------------
    def snapshot_weights(self) -> None:
        """Keep a CPU copy of the policy's weights (after each update, train.staleness > 0): the
        deque holds the last k + 1, so its oldest is the policy of k updates ago (LoRA: adapters only)."""
        if self.recipe.train.staleness:
            self.snapshots.append(policy_state(self.accelerator.unwrap_model(self.policy)))

    def generation_model(self):
        """The model that samples when it is one of its own: the current policy, or with
        train.staleness = k under full fine-tuning the behaviour copy loaded with the policy of k
        optimiser updates ago (of the first weights while fewer than k updates have run; a
        resumed run starts its deque afresh from the resumed weights). LoRA: see sampling_model."""
        if self.behaviour is None:
            return self.accelerator.unwrap_model(self.policy)
        load_policy_state(self.behaviour, self.snapshots[0])
        return self.behaviour

    @contextmanager
    def sampling_model(self) -> Iterator[torch.nn.Module]:
        """The model to sample with for one generation: :meth:`generation_model`, or with LoRA and
        train.staleness = k the policy itself with the adapters of k updates ago swapped in for
        the block and its trained adapters back after it (models.adapters_swapped): one base in
        memory, the optimiser's Parameters untouched in identity and requires_grad."""
        if self.behaviour is None and self.snapshots:
            with adapters_swapped(self.accelerator.unwrap_model(self.policy), self.snapshots[0]) as model:
                yield model
        else:
            yield self.generation_model()

    # -- one step -----------------------------------------------------------------------------
    def rollout(self, step: int, round_: int = 0):
        """This rank's prompts of ``step``, G completions each. Dynamic sampling's later rounds
        (round_ >= 1) draw other prompts (another seeded order) and other sampling seeds."""
        r = self.recipe
        G = r.sampling.num_generations
        rows = prompts_for_step(self.rows, step, r.sampling.prompts_per_step, self.rank, self.world,
                                seeds.prompt_order_seed(r.train.seed, round_))
        rows = [row for row in rows for _ in range(G)]  # groups contiguous
        with self.sampling_model() as model:
            out = self.rollout_backend.generate(
                model, self.tokenizer, [row["prompt"] for row in rows],
                temperature=r.sampling.temperature, top_p=r.sampling.top_p,
                max_new_tokens=r.sampling.max_completion_length,
                seed=seeds.rollout_seed(r.train.seed, step, self.rank, self.world, round_),
                system_prompt=r.system_prompt, max_prompt_length=r.sampling.max_prompt_length,
            )
        return rows, out

    def sample(self, step: int, alongside_scoring: Callable[[Any], Any] | None = None) -> Sample:
        """One rollout scored by the reward functions, or with sampling.dynamic_sampling DAPO's
        loop (verl filter_groups): groups whose G rewards are all equal (core's exact test; zero
        advantage under every group estimator) are dropped and new prompts sampled until every
        rank has prompts_per_step / world informative groups or dynamic_sampling_max_rounds rounds
        ran; then dropped groups fill what is missing, so the batch keeps its size. All ranks run
        the same number of rounds (the shortfall is summed over ranks). Logged:
        dynamic_sampling/rounds, dynamic_sampling/filled_groups.

        ``alongside_scoring(rollout)``: work that needs the final rollout but not its rewards (the
        behaviour forwards). With one round it runs in a worker thread while the reward functions
        score on this one, so a slow reward (a verifier, a remote judge) costs max(reward, forwards)
        instead of their sum; the numbers are those of running one after the other (nothing either
        side reads is written by the other). The rewards stay on the main thread: math-verify's
        and other timeouts use SIGALRM, which only the main thread may set. After dynamic
        sampling's rounds it runs after the selection, on this thread."""
        r = self.recipe
        rows, out = self.rollout(step)
        self.reward_logs = [RewardLogs(len(rows))]  # what reward functions log (log_extra / log_metric), per round
        if not r.sampling.dynamic_sampling:
            if alongside_scoring is None:
                return Sample(rows, out, *self.score(rows, out, step, self.reward_logs[0]), {})
            (rewards, per_fn), forwarded = run_alongside(lambda: self.score(rows, out, step, self.reward_logs[0]),
                                                     lambda: alongside_scoring(out))
            return Sample(rows, out, rewards, per_fn, {}, forwarded)
        rewards, per_fn = self.score(rows, out, step, self.reward_logs[0])
        G, need = r.sampling.num_generations, len(rows) // r.sampling.num_generations
        parts = [(rows, out, rewards, per_fn)]
        rounds = 1
        while True:
            informative = sum(int((~equal_groups(p[2].view(-1, G))[:, 0]).sum()) for p in parts)
            short = self.ranks.sum(torch.tensor(float(max(need - informative, 0)), device=self.accelerator.device))
            if float(short) == 0 or rounds == r.sampling.dynamic_sampling_max_rounds:
                break
            rows, out = self.rollout(step, rounds)
            self.reward_logs.append(RewardLogs(len(rows)))
            parts.append((rows, out, *self.score(rows, out, step, self.reward_logs[-1])))
            rounds += 1
        all_rows = [row for p in parts for row in p[0]]
        all_out = concat_rollouts([p[1] for p in parts], self.tokenizer.pad_token_id)
        all_rewards = torch.cat([p[2] for p in parts])
        equal = equal_groups(all_rewards.view(-1, G))[:, 0].tolist()
        groups = ([g for g, e in enumerate(equal) if not e] + [g for g, e in enumerate(equal) if e])[:need]
        filled = sum(equal[g] for g in groups)
        idx = [g * G + j for g in groups for j in range(G)]
        filled_t = self.ranks.sum(torch.tensor(float(filled), device=self.accelerator.device))
        per_fn = {name: torch.cat([p[3][name] for p in parts])[idx] for name in parts[0][3]}
        # prompts_truncated: per row it is not kept; the first round's count stands for the batch
        out = select_rows(all_out, idx, parts[0][1].prompts_truncated)
        self.reward_logs = [_select_logged_columns(self.reward_logs, idx)]
        return Sample([all_rows[i] for i in idx], out, all_rewards[idx], per_fn,
                      {"dynamic_sampling/rounds": float(rounds), "dynamic_sampling/filled_groups": float(filled_t)},
                      alongside_scoring(out) if alongside_scoring is not None else None)

    def greedy_baselines(self, rows, step: int) -> torch.Tensor:
        """ReMax's baselines (B,): the reward of one greedy completion (temperature 0) of each
        prompt by the policy that sampled, repeated over its G completions. Not trained on."""
        r = self.recipe
        G = r.sampling.num_generations
        prompt_rows = rows[::G]
        with self.sampling_model() as model:
            out = self.rollout_backend.generate(
                model, self.tokenizer, [row["prompt"] for row in prompt_rows],
                temperature=0.0, top_p=1.0, max_new_tokens=r.sampling.max_completion_length,
                seed=seeds.greedy_baseline_seed(r.train.seed, step, self.rank, self.world),
                system_prompt=r.system_prompt, max_prompt_length=r.sampling.max_prompt_length,
            )
        total, _ = self.score(prompt_rows, out, step)
        return total.repeat_interleave(G)

    def training_rewards(self, total: torch.Tensor, per_fn: dict[str, torch.Tensor]) -> torch.Tensor:
        """The reward the estimator sees (B,): the weighted sum (sum_then_normalize), or with
        normalize_then_sum (GDPO) each function's scores standardised within their group before
        the weighted sum (core.combine_rewards). A None score has no group statistics there, so
        normalize_then_sum refuses it, naming the function."""
        r = self.recipe
        if r.algorithm.multi_objective_aggregation == "sum_then_normalize":
            return total
        for name, values in per_fn.items():
            if torch.isnan(values).any():
                raise ValueError(f"reward function {name!r} returned None for some completions: "
                                 "algorithm.multi_objective_aggregation='normalize_then_sum' needs every score")
        per_func = torch.stack(list(per_fn.values()), dim=1).to(total.device)
        weights = torch.tensor(self.reward_weights, dtype=per_func.dtype, device=total.device)
        return combine_rewards(per_func, weights, "normalize_then_sum", group_size=r.sampling.num_generations)

    def score(self, rows, out, step: int, logs: RewardLogs | None = None):
        """(total (B,), per-function rewards); what the functions log through log_extra /
        log_metric goes to ``logs`` (None: discarded, as for ReMax's greedy baselines)."""
        ids = valid_token_lists(out.completion_ids, out.completion_mask)
        columns = {k: [row.get(k) for row in rows] for k in rows[0] if k != "prompt"}
        total, per_fn = compute_rewards(
            self.reward_funcs, self.reward_weights, [row["prompt"] for row in rows], out.completions, ids, columns,
            trainer_state={"step": step}, logs=logs,
        )
        return total.to(self.accelerator.device), per_fn

    @torch.no_grad()
    def behaviour_forwards(self, out) -> BehaviourForwards:
        """The forwards of the batch before the update, which need no reward: the behaviour
        policy's old log-probs, the reference's, the critic's values and the per-token KL."""
        r = self.recipe
        a = r.algorithm
        mask = out.completion_mask
        # The behaviour policy's log-probs come from the trainer's own forward whenever anything
        # besides the single-pass ratio (which uses logp.detach()) needs them: the ratio of later
        # passes, and the KL to the reference. The rollout engine's log-probs are other numbers
        # (vLLM: renormalised under top_p < 1, possibly bf16); verl and OpenRLHF recompute too.
        correct, reject = a.rollout_correction != "none", a.rollout_rejection != "none"
        for name, on in (("rollout_correction", correct), ("rollout_rejection", reject), ("bypass_mode", a.bypass_mode)):
            if on and out.rollout_logp is None:
                raise ValueError(f"algorithm.{name}={getattr(a, name)!r} needs the rollout engine's log-probs, "
                                 f"and rollout backend {r.train.rollout!r} gave none")
        # The optimal token baselines weigh each path by its score variance: sum_v pi_v^2 comes
        # from the same forward as the old log-probs.
        policy_stats = a.advantage in POLICY_STAT_ESTIMATORS
        needs_old = not r.train.single_pass or self.reference is not None or correct or reject or self.teacher is not None
        sum_pi_squared = None
        if a.bypass_mode:  # verl apply_bypass_mode: old := the rollout engine's log-probs, no forward
            old_logp = out.rollout_logp
        elif policy_stats:
            old_logp, sum_pi_squared = logprobs_and_sum_pi_squared(self.policy, out, r.sampling.temperature, r.train.shared_prefix)
        else:
            old_logp = logprobs_and_entropy(self.policy, out, r.sampling.temperature, False, shared_prefix=r.train.shared_prefix)[0] if needs_old else None
        ref_logp = logprobs_and_entropy(self.reference, out, r.sampling.temperature, False, shared_prefix=r.train.shared_prefix)[0] if self.reference is not None else None
        old_values = self.critic(out.prompt_ids, out.prompt_mask, out.completion_ids, mask) if self.critic is not None else None
        kl = kl_per_token(a.kl_estimator, old_logp, ref_logp, mask) if ref_logp is not None else None
        return BehaviourForwards(old_logp, sum_pi_squared, ref_logp, old_values, kl)

    @torch.no_grad()
    def prepare_batch(self, out, rewards: torch.Tensor, baselines: torch.Tensor | None = None,
                      forwards: BehaviourForwards | None = None) -> tuple[StepBatch, GlobalBatch]:
        """Old / reference log-probs, values, KL-in-reward (``forwards``: computed here when None),
        rollout-correction weights, the rollout-rejection mask (folded into loss_mask) and
        global-batch advantages. baselines (B,): ReMax's greedy rewards (advantage=remax)."""
        r = self.recipe
        a = r.algorithm
        mask = out.completion_mask
        correct, reject = a.rollout_correction != "none", a.rollout_rejection != "none"
        policy_stats = a.advantage in POLICY_STAT_ESTIMATORS
        old_logp, sum_pi_squared, ref_logp, old_values, kl = forwards if forwards is not None else self.behaviour_forwards(out)

        # advantages need the global batch (batch-level baselines, whitening): gather, compute, slice
        ranks = self.ranks
        g_rewards, g_mask = ranks.gather(rewards), ranks.gather(mask)
        g_kl = ranks.gather(kl) if kl is not None else None
        g_values = ranks.gather(old_values) if old_values is not None else None
        g_baselines = ranks.gather(baselines) if baselines is not None else None
        mine = ranks.rows(mask.shape[0])
        g_is_weights = g_keep = None
        # over the global batch, as verl's driver: batch_normalize's mean is the whole batch's (bypass
        # mode: inside the loss instead, core.objective.bypass_in_loss, as verl's bypass loss)
        if (correct or reject) and not a.bypass_mode:
            g_is_weights, g_keep = rollout_mismatch_masks(ranks.gather(old_logp), ranks.gather(out.rollout_logp), g_mask, a)
        is_weights = g_is_weights[mine] if g_is_weights is not None else None
        stats = {}
        if policy_stats:  # verl weighs the paths by rho^2 too when the rollout is corrected
            stats = dict(old_logp=ranks.gather(old_logp), sum_pi_squared=ranks.gather(sum_pi_squared),
                         is_weights=g_is_weights)
        # rejection holes the mask AFTER the reward and the in-reward KL sit on the full mask and BEFORE
        # the advantages, as verl's driver (apply_kl_penalty -> rollout correction -> compute_advantage)
        adv = compute_advantages(a.advantage, g_rewards, g_mask, self.advantage_config(), kl=g_kl, values=g_values,
                                 baselines=g_baselines, keep=g_keep, **stats)
        if self.teacher is not None:
            adv = adv._replace(advantages=self.distill(out, old_logp, g_mask, adv.advantages))  # returns (critic targets) stay
        loss_mask = truncation_mask(mask, out.truncated) if a.mask_truncated else mask
        if g_keep is not None:  # verl masks its response_mask: rejected tokens leave every denominator too
            loss_mask = loss_mask * g_keep[mine]
        batch = StepBatch(out.prompt_ids, out.prompt_mask, out.completion_ids, mask, loss_mask,
                          adv.advantages[mine], adv.returns[mine], old_logp, ref_logp, old_values, is_weights,
                          out.rollout_logp if a.off_policy_mask_threshold is not None else None)
        return batch, GlobalBatch(g_rewards, g_mask, g_kl, adv.advantages, g_keep)

    def advantage_config(self):
        """The recipe's advantage settings with this step's KL coefficient when the KL is in the
        reward: ``state.kl_coef`` (algorithm.kl_coef under the fixed controller, the adaptive
        controller's beta otherwise). The lens reads it too, before the step's controller update."""
        cfg = self.recipe.advantage_config()
        return replace(cfg, kl_coef=self.state.kl_coef) if self.recipe.algorithm.kl_placement == "in_reward" else cfg

    def update_kl_controller(self, g_kl: torch.Tensor | None, g_mask: torch.Tensor) -> dict[str, float]:
        """After the step's advantages were shaped with beta = ``state.kl_coef``: the controller's
        next beta from this step's KL, as verl's ``apply_kl_penalty`` (current_kl = the batch mean of
        each completion's mean KL, core.sequence_mean_kl; n_steps = the global batch's completions),
        and verl's figures: ``actor/reward_kl_penalty`` (current_kl) and ``actor/reward_kl_penalty_coeff``
        (the beta this step used). Only with a KL in the reward (verl use_kl_in_reward), else {}."""
        a = self.recipe.algorithm
        if g_kl is None or a.kl_placement != "in_reward":
            return {}
        beta, current_kl = self.state.kl_coef, sequence_mean_kl(g_kl, g_mask)
        self.state.kl_coef = KL_CONTROLLERS.get(a.kl_controller)(beta, current_kl, g_mask.shape[0], target_kl=a.kl_target,
                                                                  horizon=a.kl_horizon)
        return {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}

    def ratio_old_logp(self, logp: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        """The ratio's denominator for ``logp`` (rows of ``batch``): the batch's old log-probs
        (recomputed; with bypass_mode the rollout engine's), or at one update per batch sg(logp),
        which the recomputed ones equal up to rounding (so the ratio is exactly 1)."""
        if self.recipe.train.single_pass and not self.recipe.algorithm.bypass_mode:
            return logp.detach()
        return batch.old_logp

    def distill(self, out, old_logp: torch.Tensor, g_mask: torch.Tensor, g_adv: torch.Tensor) -> torch.Tensor:
        """On-policy distillation (core.distillation, slime OPD): the global batch's advantages shaped
        by the reverse KL of the student's log-probs (the trainer's, as slime) to the teacher's on
        the same completions, both at the sampling temperature (slime scores the teacher at the
        rollout temperature; tinker at 1, the same at temperature 1). Sets ``distill/*`` metrics."""
        r = self.recipe
        teacher_logp = logprobs_and_entropy(self.teacher, out, r.sampling.temperature, False, shared_prefix=r.train.shared_prefix)[0]
        g_student, g_teacher = self.ranks.gather(old_logp), self.ranks.gather(teacher_logp)
        self.distill_metrics = {k: float(v) for k, v in distillation_metrics(g_student, g_teacher, g_mask).items()}
        self.distill_inputs = {"shaping": "opd", "student_logp": g_student, "teacher_logp": g_teacher, "mask": g_mask}
        return shape_advantages(self.distill_inputs["shaping"], g_adv, g_student, g_teacher, g_mask, r.distillation_config())

    def run_objective(self, batch: StepBatch, logp: torch.Tensor, entropy: torch.Tensor | None, old_logp: torch.Tensor, *,
                      entropy_coef: float, num_tokens, num_seqs, advantages: torch.Tensor | None = None,
                      policy_loss: str | None = None) -> Objective:
        """The run's objective on rows ``batch`` (core.policy_objective with every mask and weight
        the recipe turns on; the top-entropy threshold over every rank's tokens). The lens calls it
        too, with other ``advantages`` / ``policy_loss`` for its comparison rows. Unscaled (one
        process's aggregate; see micro_loss for the data-parallel scale)."""
        cfg = self.objective if policy_loss is None else replace(self.objective, policy_loss=policy_loss)
        return policy_objective(
            logp, old_logp, batch.advantages if advantages is None else advantages, batch.loss_mask, batch.completion_mask,
            cfg, num_tokens=num_tokens, num_seqs=num_seqs, max_len=self.recipe.sampling.max_completion_length,
            entropy=entropy, entropy_coef=entropy_coef, rollout_logp=batch.rollout_logp, ref_logp=batch.ref_logp,
            is_weights=batch.is_weights, top_entropy=self.top_entropy_tokens)

    def micro_loss(self, mb: StepBatch, num_tokens, num_seqs):
        """Loss of one micro-batch, scaled so that the sum over micro-batches and the mean over
        ranks (DDP) equal the aggregated loss of the whole global minibatch."""
        r = self.recipe
        a = r.algorithm
        entropy_coef = self.entropy_coef_now()
        logp, entropy = logprobs_and_entropy(self.policy, mb, r.sampling.temperature, entropy_grad=entropy_coef > 0,
                                              shared_prefix=r.train.shared_prefix)
        obj = self.run_objective(mb, logp, entropy, self.ratio_old_logp(logp, mb), entropy_coef=entropy_coef, num_tokens=num_tokens, num_seqs=num_seqs)
        scale = float(self.world)  # DDP averages gradients over ranks; undo it
        policy_loss = obj.loss * scale
        metrics = obj.metrics
        metrics["loss/policy"] = metrics["loss/policy"] * scale
        if self.entropy_control is not None:  # TRL measures over the policy loss's tokens (top-entropy ones too)
            tokens = mb.loss_mask if obj.kept is None else mb.loss_mask * obj.kept
            self._entropy_window[0] = self._entropy_window[0] + (entropy.detach() * tokens).sum().double()
            self._entropy_window[1] = self._entropy_window[1] + tokens.sum().double()
        total = policy_loss
        if self.critic is not None:
            values = self.critic(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask)
            # the value loss covers the tokens num_tokens counts (mb.loss_mask): summing it over
            # the completion mask would inflate it whenever truncated completions are masked
            vl, vmetrics = clipped_value_loss(values, mb.old_values, mb.returns, mb.loss_mask, a.value_clip)
            norm = dict(max_len=r.sampling.max_completion_length, num_tokens=num_tokens, num_seqs=num_seqs)
            value_loss = aggregate_loss(a.aggregation, vl, mb.loss_mask, **norm) * scale
            total = total + a.vf_coef * value_loss
            metrics.update(vmetrics)
            metrics["loss/value"] = value_loss.detach()
        return total, metrics, logp.detach(), obj.diagnostics

    def top_entropy_tokens(self, entropy: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
        """top_entropy_quantile's mask (B_micro, T): the entropy threshold is the quantile over
        every rank's loss tokens of this micro-batch (TRL gathers them too), applied to mine."""
        rho = self.recipe.algorithm.top_entropy_quantile
        if self.world == 1:
            return high_entropy_mask(entropy.detach(), loss_mask, rho)
        g_entropy, g_mask = self.ranks.gather(entropy.detach()), self.ranks.gather(loss_mask)
        return high_entropy_mask(g_entropy, g_mask, rho)[self.ranks.rows(loss_mask.shape[0])]

    def optimise(self, batch: StepBatch, step: int):
        """mu passes x minibatches x micro-batches. Returns averaged metrics and last-pass
        per-token diagnostics (ratio, region, zero_grad) for every row. The micro-batches'
        metrics stay tensors on the device and are read back once, at the end (MetricSums)."""
        r = self.recipe
        B = batch.completion_mask.shape[0]
        sums = MetricSums(per_micro=tuple(SEQUENCE_EXTREMES))
        grad_norms = []
        last = {"ratio": torch.ones_like(batch.completion_mask), "region": torch.full_like(batch.completion_mask, -1, dtype=torch.long),
                "zero_grad": torch.zeros_like(batch.completion_mask, dtype=torch.bool)}
        first_logp = None
        gen = torch.Generator().manual_seed(seeds.minibatch_order_seed(r.train.seed, step))
        for _ in range(r.train.mu):
            order = torch.randperm(B, generator=gen) if r.train.minibatches > 1 else torch.arange(B)
            for mb_idx in order.chunk(r.train.minibatches):
                for metrics, logp in self.accumulate_gradients(batch, mb_idx.to(batch.completion_mask.device), last):
                    sums.add(metrics)
                    if first_logp is None and r.train.single_pass:
                        first_logp = logp
                grad_norms.append(self._step_optimisers())
        metrics, extremes = sums.means(updates=r.train.mu * r.train.minibatches)
        norms = read_floats(grad_norms)
        metrics["grad_norm"] = sum(norms) / len(norms)
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        metrics.update(extremes)
        if self._entropy_coefs:
            metrics["entropy_coef"] = sum(self._entropy_coefs) / len(self._entropy_coefs)
            self._entropy_coefs.clear()
        return metrics, last, first_logp

    # -- adaptive entropy control -----------------------------------------------------------
    def entropy_coef_now(self) -> float:
        """The entropy coefficient this update's loss uses: algorithm.entropy_coef, or with
        use_adaptive_entropy the controller's c * 1[H_prev <= target] (core.entropy_control)."""
        if self.entropy_control is None:
            return self.recipe.algorithm.entropy_coef
        return applied_entropy_coef(self.state.entropy, self.entropy_control)

    def _update_entropy_control(self) -> None:
        """After an optimiser update: the token-weighted mean entropy of its loss tokens over all
        ranks and micro-batches (TRL's window-global mean) moves the coefficient one step. TRL logs
        ``entropy_coef`` after every update whenever an entropy bonus is on (static too)."""
        if self.entropy_control is not None:
            window = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=self.accelerator.device) for v in self._entropy_window])
            window = self.ranks.sum(window)
            entropy = float(window[0] / window[1].clamp(min=1.0))
            self.state.entropy = update_entropy_control(self.state.entropy, entropy, self.entropy_control)
            self._entropy_window = [0.0, 0.0]
        if self.entropy_control is not None or self.recipe.algorithm.entropy_coef != 0.0:
            self._entropy_coefs.append(self.state.entropy.coef)

    def _sequence_clip_extremes(self, region: torch.Tensor) -> dict[str, torch.Tensor]:
        """TRL 1.16's ``clip_ratio/low_min`` / ``high_max`` of one micro-batch: the per-sequence clip
        fractions (core.sequence_clip_fractions over the loss's valid tokens) gathered over ranks,
        their nanmin / nanmax (NaN: no sequence has a valid token), as tensors on the device (no
        sync). Every rank runs the same number of equal-sized micro-batches, so the gathers line up."""
        return {name: nan_extreme(self.ranks.gather(fractions), SEQUENCE_EXTREMES[name])
                for name, fractions in sequence_clip_fractions(region, region != PADDING).items()}

    def accumulate_gradients(self, batch: StepBatch, mb_idx: torch.Tensor, last: dict):
        """Backward over one minibatch in ``train.grad_accum`` micro-batches, each normalised by
        the *global* minibatch's token / sequence counts, so the accumulated gradient equals the
        gradient of the whole minibatch's aggregated loss. Yields (metrics, logp) per micro-batch."""
        num_tokens, num_seqs = global_counts(self.ranks, batch.loss_mask[mb_idx], batch.completion_mask[mb_idx])
        losses = []
        for micro_idx in mb_idx.chunk(self.recipe.train.grad_accum):
            loss, metrics, logp, diag = self.micro_loss(batch.rows(micro_idx), num_tokens, num_seqs)
            self.accelerator.backward(loss)
            losses.append(loss.detach())
            last["ratio"][micro_idx], last["region"][micro_idx], last["zero_grad"][micro_idx] = diag.ratio, diag.region, diag.zero_grad
            yield {**metrics, **self._sequence_clip_extremes(diag.region)}, logp
        check_finite(losses, self.ranks)  # once per update, before the optimiser step

    def _step_optimisers(self) -> torch.Tensor:
        r, acc = self.recipe, self.accelerator
        max_norm = r.optim.max_grad_norm if r.optim.max_grad_norm is not None else math.inf
        norm = acc.clip_grad_norm_(self.policy.parameters(), max_norm)
        self.optimizer.step()
        if not self.optimizer.step_was_skipped:  # fp16 loss scaling skipped the update: so does the schedule
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.snapshot_weights()
        self._update_entropy_control()
        if self.critic is not None:
            acc.clip_grad_norm_(self.critic.parameters(), max_norm)
            self.critic_optimizer.step()
            self.critic_optimizer.zero_grad(set_to_none=True)
        return norm

    def evaluate(self, updates: int) -> dict[str, float]:
        """Held-out ``eval/...`` figures of the current policy (after ``updates`` updates), over
        every rank's share of the eval prompts (evaluation.py; training's RNGs untouched)."""
        t0 = time.perf_counter()
        acc = self.accelerator
        scores = self.ranks.gather_objects(
            self.evaluator.scores(self.rollout_backend, acc.unwrap_model(self.policy), self.tokenizer, acc.device))
        return {**self.evaluator.metrics(scores, updates), "perf/eval_time": time.perf_counter() - t0}

    def step(self, step: int) -> dict[str, float]:
        r, acc, ranks = self.recipe, self.accelerator, self.ranks
        final_step = step == r.train.steps - 1
        # the policy that samples this step (after `step` updates); the last line gets the final one
        evaluated = self.evaluate(step) if self.evaluator and eval_due(step, r.eval.every) and not final_step else {}
        t0 = time.perf_counter()
        # The behaviour forwards run while the rewards are scored, except with ReMax, whose greedy
        # rollout comes after the sample on the same model (a LoRA reference toggles its adapters).
        greedy = r.algorithm.advantage in BASELINE_ESTIMATORS
        rows, out, rewards, per_fn, sampled, forwards = self.sample(step, None if greedy else self.behaviour_forwards)
        baselines = self.greedy_baselines(rows, step) if greedy else None
        # with the rewards (dynamic sampling scores between rounds) and the behaviour forwards they overlap
        t_gen = time.perf_counter() - t0
        train_rewards = self.training_rewards(rewards, per_fn)
        batch, (g_train_rewards, g_mask, g_kl, _, g_keep) = self.prepare_batch(out, train_rewards, baselines, forwards)
        g_rewards = g_train_rewards if train_rewards is rewards else ranks.gather(rewards)
        lens_due = self.lens.due(step)
        if lens_due:
            self.lens.snapshot()  # parameters the batch was sampled with
        t1 = time.perf_counter()
        optimised, last, first_logp = self.optimise(batch, step)
        t_train = time.perf_counter() - t1
        g_baselines = ranks.gather(baselines) if baselines is not None else None
        lens = (self.lens.evaluate(batch, g_train_rewards, g_mask, g_kl, r.logging.diagnostics_sequences, g_baselines, g_keep)
                if lens_due else None)
        reward_kl = self.update_kl_controller(g_kl, g_mask)  # after the lens, which reads this step's beta

        # ---- the global batch's figures (every rank takes part in the same collectives) ----
        optimised = ranks_mean(ranks, optimised)
        reward_logged = self._reward_logged_metrics()
        g_per_fn = {name: ranks.gather(values.to(acc.device)).cpu() for name, values in per_fn.items()}
        g_truncated = ranks.gather(out.truncated.to(acc.device)).cpu()
        # the trainer's log-probs of the behaviour policy; bypass_mode's old log-probs are the rollout's
        trainer_logp = first_logp if r.algorithm.bypass_mode or batch.old_logp is None else batch.old_logp
        sampling = self._sampling_metrics(trainer_logp, out) if out.rollout_logp is not None and trainer_logp is not None else {}
        step_time = time.perf_counter() - t0
        timings = {"perf/step_time": step_time, "perf/generation_time": t_gen, "perf/train_time": t_train,
                   **({"perf/lens_time": lens["time"]} if lens is not None else {})}
        self.state.tokens_seen += float(g_mask.sum())
        self.state.num_tokens_seen += float(ranks.sum(out.prompt_mask.sum() + out.completion_mask.sum()))
        prompts_truncated = float(ranks.sum(torch.tensor(float(out.prompts_truncated), device=acc.device)))
        if self.evaluator and final_step:
            evaluated = self.evaluate(step + 1)
        metrics = step_metrics(
            optimised, g_rewards=g_rewards, group_size=r.sampling.num_generations, sampled=sampled, reward_kl=reward_kl,
            reward_logged=reward_logged, distill=self.distill_metrics, g_per_fn=g_per_fn, g_baselines=g_baselines,
            g_mask=g_mask, g_truncated=g_truncated, g_kl=g_kl, sampling=sampling, timings=timings,
            tokens_seen=self.state.tokens_seen, num_tokens_seen=self.state.num_tokens_seen, prompts_truncated=prompts_truncated,
            evaluated=evaluated, step=step)

        with _StepRecord.whole():  # the event file and the trackers hold the same steps
            self.events.emit("metrics", step, metrics=metrics)
            self._emit_samples(step, rows, out, rewards, batch.advantages)
            self._emit_diagnostics(step, batch, last)
            if lens is not None:
                self.events.emit("lens", step, **lens)
            if r.logging.log_with:
                acc.log(tracker_metrics(metrics), step=step)
        return metrics

    def _sampling_metrics(self, trainer_logp: torch.Tensor, out) -> dict[str, float]:
        """TRL's ``sampling/sampling_logp_difference/{mean,max}`` (|trainer - rollout engine|
        per token) and ``sampling/importance_sampling_ratio/{min,mean,max}`` (the weights
        rollout_correction applies; with it off, the raw token ratios pi_old / pi_rollout).
        Over ranks: the mean of the ranks' means, the min / max of their min / max. With batch
        normalisation or rejection on, verl's ``rollout_corr/*`` figures of the global batch too."""
        a = self.recipe.algorithm
        # the ratio metrics are of the weights before batch normalisation (verl's too)
        _, stats = rollout_correction(trainer_logp, out.rollout_logp, out.completion_mask,
                                      **{**correction_settings(a), "batch_normalize": False})
        stats = {k: self.ranks.reduce(v, k.rsplit("/", 1)[1]) for k, v in stats.items()}
        metrics = {k: float(v) for k, v in stats.items()}
        if a.rollout_correction_batch_normalize or a.rollout_rejection != "none":
            g_logp, g_rollout, g_mask = (self.ranks.gather(t) for t in (trainer_logp, out.rollout_logp, out.completion_mask))
            metrics.update(rollout_corr_metrics(g_logp, g_rollout, g_mask, a))
        return metrics

    def _reward_logged_metrics(self) -> dict[str, float]:
        """The metrics reward functions logged with log_metric this step, under their own names
        (as TRL logs them): sum / count of the values over every rank (TRL's reduction)."""
        local = self.reward_logs[0].metrics
        names = sorted(set(self.ranks.gather_objects(sorted(local))))  # every rank reduces the same names in order
        out = {}
        for name in names:
            values = local.get(name, [])
            stats = torch.tensor([sum(values), len(values)], dtype=torch.float64, device=self.accelerator.device)
            stats = self.ranks.sum(stats)
            out[name] = float(stats[0] / stats[1].clamp(min=1.0))
        return out

    def _emit_samples(self, step, rows, out, rewards, advantages) -> None:
        n = self.recipe.logging.samples_per_step
        if not n:
            return
        seq_adv = masked_mean(advantages, out.completion_mask, dim=1)
        samples = [
            {"prompt": rows[i]["prompt"], "completion": out.completions[i], "reward": float(rewards[i]),
             "advantage": float(seq_adv[i]), "length": int(out.completion_mask[i].sum()), "truncated": bool(out.truncated[i]),
             **{column: values[i] for column, values in self.reward_logs[0].extra.items()}}  # reward functions' log_extra
            for i in range(min(n, len(rows)))
        ]
        self.events.emit("samples", step, samples=samples)

    def _emit_diagnostics(self, step, batch: StepBatch, last) -> None:
        lg = self.recipe.logging
        if not lg.diagnostics_every or step % lg.diagnostics_every or not lg.diagnostics_sequences:
            return
        n = min(lg.diagnostics_sequences, batch.completion_mask.shape[0])
        self.events.emit(
            "diagnostics", step, region_names=list(REGION_NAMES),
            ratio=last["ratio"][:n], advantage=batch.advantages[:n], mask=batch.completion_mask[:n],
            loss_mask=batch.loss_mask[:n], region=last["region"][:n], zero_grad=last["zero_grad"][:n],
            length=batch.completion_mask[:n].sum(dim=1),
        )

    def _write_param_digest(self) -> None:
        """Multi-process runs leave one digest per rank (a cheap check that ranks agree)."""
        if self.world > 1 and hasattr(self, "policy"):
            digest = parameter_digest(self.accelerator.unwrap_model(self.policy))
            (self.run_dir / f"params.rank{self.rank}.sha256").write_text(digest)

    def _end_trackers(self, status: str, final_dir: Path | None) -> None:
        """Give the trackers the run's outcome and final-policy link, then finish them. A tracker
        that fails here (its server gone) is reported on stderr: the run, its events and its
        final policy are complete, so its status stays what training made it; end_training runs
        even then (it also ends the process group)."""
        for end in (lambda: conclude_trackers(self.accelerator.trackers, status, final_dir), self.accelerator.end_training):
            try:
                end()
            except Exception as err:  # noqa: BLE001 (any tracker's client error)
                print(f"warning: a tracker did not record the end of the run: {type(err).__name__}: {err}", file=sys.stderr)

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> str:
        """Train for ``train.steps`` steps; returns the final status (finished / failed / cancelled), or
        ``interrupted`` when the scheduler's SIGTERM stopped it (no final status event written then:
        see ``SIGTERM_ENV``)."""
        r = self.recipe
        status, error = "finished", None
        step = -1
        final_dir = None
        with _signals_cancel():
            try:
                self.events.emit("status", 0, status="starting", world_size=self.world, recipe=r.name)
                self.setup()
                start = checkpoint.resume(self, self.claim) if self.resume else 0
                self.events.emit("status", 0, status="running")
                bar = tqdm(total=r.train.steps, desc="train", unit="step", disable=not (self.progress and self.accelerator.is_main_process))
                for step in range(start, r.train.steps):
                    m = self.step(step)
                    checkpoint.save_if_due(self, step)
                    bar.set_postfix(reward=f"{m['reward']:.3f}", kl=f"{m['kl']:.3f}")
                    bar.update(1)
                bar.close()
                final_dir = checkpoint.save_final(self)
            except Cancelled as err:
                status, error = "cancelled", str(err)
            except Interrupted as err:
                status, error = "interrupted", str(err)
            except Exception as err:  # the run ends with the error recorded; nothing logged is lost
                status, error = "failed", f"{type(err).__name__}: {err}"
                self.events.emit("error", max(step, 0), error=error, exception=type(err).__name__,
                                 reward_function=isinstance(err, RewardFunctionError))
            finally:
                self._write_param_digest()
                if getattr(self, "rollout_backend", None) is not None:
                    self.rollout_backend.close()
                if status != "interrupted":  # the scheduler's job state is the run's final status
                    self.events.emit("status", max(step, 0), status=status, **({"error": error} if error else {}))
                if r.logging.log_with:
                    self._end_trackers(status, final_dir)
                self.events.close()
                self.claim.release()  # the run is over: another trainer may resume it now
        return status


def ranks_mean(ranks: Ranks, metrics: dict[str, float]) -> dict[str, float]:
    """This rank's optimisation metrics averaged over ranks (each a float32 on the device, as
    logged since the first multi-process runs), in one collective; unchanged on one process."""
    if ranks.world == 1:
        return metrics
    names = list(metrics)
    values = ranks.reduce(torch.stack([torch.tensor(metrics[k], device=ranks.device) for k in names]), "mean")
    return dict(zip(names, (float(v) for v in values)))


def step_metrics(optimised: dict[str, float], *, g_rewards, group_size: int, sampled: dict, reward_kl: dict, reward_logged: dict,
                 distill: dict, g_per_fn: dict, g_baselines, g_mask, g_truncated, g_kl, sampling: dict,
                 timings: dict[str, float], tokens_seen: float, num_tokens_seen: float, prompts_truncated: float,
                 evaluated: dict, step: int) -> dict[str, float]:
    """One step's ``metrics`` event from its global-batch figures (no collective, no state; the
    key order is the event's). optimised: optimise()'s metrics (averaged over ranks); reward_kl:
    update_kl_controller's verl figures ({} without a KL in the reward);
    g_rewards (B,), g_mask (B, T), g_truncated (B,), g_kl (B, T) or None, g_per_fn name -> (B,),
    g_baselines (B,) or None: gathered over ranks. timings: the ``perf/*_time`` figures, step time
    first. tokens_seen / num_tokens_seen: the run's cumulative counts after this step."""
    metrics = dict(optimised)
    metrics.update({k: float(v) for k, v in reward_metrics(g_rewards.cpu(), group_size).items()})
    metrics.update(sampled)
    metrics.update(reward_logged)
    metrics.update(distill)
    for name, g in g_per_fn.items():
        metrics.update({k: float(v) for k, v in reward_function_metrics(name, g).items()})
    if g_baselines is not None:
        metrics["remax/baseline_reward"] = float(g_baselines.mean())
    metrics.update({k: float(v) for k, v in length_metrics(g_mask.cpu(), g_truncated).items()})
    metrics.update({k: float(v) for k, v in terminated_length_metrics(g_mask.cpu(), g_truncated).items()})
    metrics["kl"] = float(masked_mean(g_kl, g_mask)) if g_kl is not None else 0.0
    metrics["kl/token_std"] = float(token_std_metric(g_kl, g_mask)) if g_kl is not None else 0.0
    metrics.update(reward_kl)
    metrics.update(sampling)
    metrics.update(timings)
    metrics["perf/tokens_per_s"] = float(g_mask.sum()) / timings["perf/step_time"]
    metrics["perf/tokens"] = tokens_seen  # cumulative completion tokens (the UI's tokens x-axis)
    metrics["num_tokens"] = num_tokens_seen  # TRL: cumulative prompt + completion tokens
    metrics["completions/count"] = float(g_mask.shape[0])  # the global batch, all ranks
    metrics["prompts/truncated_ratio"] = prompts_truncated / float(g_mask.shape[0])
    metrics.update(evaluated)
    metrics["step"] = step
    return metrics


def objective_config(recipe: Recipe) -> ObjectiveConfig:
    """core.policy_objective's settings from the recipe (the KL enters the loss only with
    kl_placement=in_loss; with in_reward it is already in the advantages)."""
    a = recipe.algorithm
    return ObjectiveConfig(
        policy_loss=a.policy_loss, loss=recipe.policy_loss_config(), aggregation=a.aggregation,
        opsm_delta=a.opsm_delta, off_policy_mask_threshold=a.off_policy_mask_threshold,
        top_entropy_quantile=a.top_entropy_quantile, kl_estimator=a.kl_estimator,
        kl_coef=a.kl_coef if a.kl_placement == "in_loss" else 0.0,
        # bypass mode: verl corrects and rejects inside the loss, against the current policy
        in_loss_correction=correction_settings(a) if a.bypass_mode and a.rollout_correction != "none" else None,
        in_loss_rejection=rejection_settings(a) if a.bypass_mode and a.rollout_rejection != "none" else None)


def correction_settings(a) -> dict[str, Any]:
    """core.rollout_correction's keywords for ``algorithm.rollout_correction`` ("{level}_{mode}"
    and its bounds); with it "none", unbounded token ratios (what the sampling metrics log)."""
    if a.rollout_correction == "none":
        return {"level": "token", "mode": "truncate", "clip_min": None, "clip_max": None}
    level, mode = a.rollout_correction.split("_")
    return {"level": level, "mode": mode, "clip_min": a.rollout_correction_min, "clip_max": a.rollout_correction_max,
            "batch_normalize": a.rollout_correction_batch_normalize}


def rejection_settings(a) -> dict[str, Any]:
    """core.rejection_mask's keywords for ``algorithm.rollout_rejection`` (a mode, not "none")."""
    return {"mode": a.rollout_rejection, "upper": a.rollout_rejection_max, "lower": a.rollout_rejection_min}


def rollout_mismatch_masks(g_old: torch.Tensor | None, g_rollout: torch.Tensor | None, g_mask: torch.Tensor,
                           a) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(IS weights, rejection keep-mask), each (B, T) over the global batch or None when its
    setting is off. The IS weights are computed on the whole completion mask, rejected tokens
    included (verl computes both from the same response_mask, independently); the keep-mask is
    g_mask with the rejected tokens 0. g_old / g_rollout: trainer / rollout engine log-probs."""
    is_weights = keep = None
    if a.rollout_correction != "none":  # w = pi_old / pi_rollout per token or sequence, bounded
        is_weights, _ = rollout_correction(g_old, g_rollout, g_mask, **correction_settings(a))
    if a.rollout_rejection != "none":
        keep, _ = rejection_mask(g_old, g_rollout, g_mask, **rejection_settings(a))
    return is_weights, keep


def rollout_corr_metrics(g_old: torch.Tensor, g_rollout: torch.Tensor, g_mask: torch.Tensor, a) -> dict[str, float]:
    """verl's ``rollout_corr/*`` figures of what the recipe turns on, over the global batch:
    ``rollout_is_batch_norm_factor`` (the mean weight divided out) and, for rejection,
    ``rollout_rs_{mode}_{mean,masked_fraction,seq_masked_fraction}`` (core.rejection_mask)."""
    metrics: dict[str, float] = {}
    if a.rollout_correction != "none" and a.rollout_correction_batch_normalize:
        _, stats = rollout_correction(g_old, g_rollout, g_mask, **correction_settings(a))
        metrics["rollout_corr/rollout_is_batch_norm_factor"] = float(stats["rollout_corr/rollout_is_batch_norm_factor"])
    if a.rollout_rejection != "none":
        _, stats = rejection_mask(g_old, g_rollout, g_mask, **rejection_settings(a))
        metrics.update({k: float(v) for k, v in stats.items()})
    return metrics


def _select_logged_columns(logs: list[RewardLogs], idx: list[int]) -> RewardLogs:
    """Dynamic sampling's rounds as one RewardLogs for the kept rows ``idx`` (into the rounds'
    rows, concatenated): a column a round did not log is None there (TRL fills missing columns
    with None); metric values of every round count."""
    out = RewardLogs(len(idx))
    for column in dict.fromkeys(c for part in logs for c in part.extra):
        values = [v for part in logs for v in part.extra.get(column, [None] * part.batch_size)]
        out.extra[column] = [values[i] for i in idx]
    for part in logs:
        for name, values in part.metrics.items():
            out.metrics.setdefault(name, []).extend(values)
    return out


def parameter_digest(model: torch.nn.Module) -> str:
    """SHA-256 of all parameters' bytes: equal on every rank iff data parallelism kept them in sync."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def train(recipe: Recipe, run_dir: Path, *, stdout_events: bool = False, progress: bool = False, resume: bool = False,
          claim: rundir.Claim | None = None) -> str:
    """Run a recipe into ``run_dir``; returns the final status."""
    return Trainer(recipe, run_dir, stdout_events=stdout_events, progress=progress, resume=resume, claim=claim).run()
