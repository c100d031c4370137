"""The same-batch lens: every advantage estimator x every policy loss on one sampled batch.

Every ``logging.lens_every`` steps the trainer hands this module the step's batch. After the
step's real optimisation the lens evaluates, for each combination k of (advantage estimator,
policy loss),

    g_k = grad_theta  L_k,   L_k = core.policy_objective(logp, old, A_k; policy loss k, the run's
                                   masks, weights, in-loss KL, entropy bonus, aggregation and
                                   global-batch normalisers)

so every row differs from the run's objective only in its estimator and its policy loss. The
row of the run's own (estimator, loss) is the reference g_run: the trainer's objective
(Trainer.run_objective, the same core function with the same OPSM and off-policy masks, IS
weights, top-entropy tokens, KL and entropy terms, on the advantages the run trained on). At
theta_before with mu = 1 and one minibatch of one micro-batch it IS the gradient the run
stepped with (tests/engine/test_lens.py checks cosine 1 and equal norm with all three of IS
weights, top-entropy and the off-policy mask on); with several minibatches or micro-batches it
is the same objective over the whole batch (the top-entropy threshold over the whole batch too).

The two points, with old = the log-probs the batch was sampled with (the run's rule at theta_before:
logp itself for a single pass, else the trainer's old log-probs):

- ``before``: theta_before, the parameters the batch was sampled with. The ratio is 1 there, so
  every policy loss gives the same gradient (GSPO's sequence ratio too: d s_i / d logp_t = 1/n_i
  over n_i tokens, and every aggregation weighs the tokens of a sequence alike); what differs is
  the advantage estimator. This is the direction each algorithm would have started the step in.
- ``after``: theta_after, the parameters after the step's updates. Now the ratio has moved, the
  clip, GSPO and CISPO differ (their share of zero-gradient tokens is reported), and the cosine
  with the step just taken says whether each algorithm would keep going or pull back.

Each row: loss, ||g_k||, cos(g_k, g_run), cos(g_k, theta_before - theta_after) (the update
actually taken, after the optimiser, clipping, mu passes and minibatches) and the zero-gradient
token share. The parameters are back at theta_after before training goes on, so the lens never
changes a run. The entropy coefficient is the one the step's first update used (adaptive entropy
control may have moved it since).

On-policy distillation: when the run has a teacher, the run's own estimator also appears shaped
by every registered advantage shaping (core.ADVANTAGE_SHAPINGS, e.g. "grpo + opd": A - lambda
(log pi_theta - log pi_T)), computed from the teacher log-probs the step already scored (the
teacher is not run again). That shaped row is the run's reference g_run, since it is what the
run trained on; the unshaped row beside it shows what the teacher adds. Only the run's own
estimator is shaped: one more estimator's worth of cost instead of doubling it, and with
teacher.mode=only every shaped estimator would give the same row anyway.

Left out on purpose: the value loss (the lens compares policy gradients; the critic has its own
parameters). Identity the tests check: RLOO = G/(G-1) * Dr. GRPO, so their gradients have cosine 1
when the run has no in-loss KL and no entropy bonus; those terms do not scale with the
advantages, so with them the two rows agree exactly only where their gradients vanish (the k2 /
k3 KL at step 0, where the policy is the reference) and approximately elsewhere.

Cost: two forwards and 2K backward passes (K = estimators x losses) per lens step; measured by
``bench/lens_bench.py``. Memory: a few parameter-sized vectors (theta_before/after, the update, g_run).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Mapping, Sequence

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from workbench.core import (
    ADVANTAGE_ESTIMATORS,
    BASELINE_ESTIMATORS,
    CRITIC_ESTIMATORS,
    POLICY_STAT_ESTIMATORS,
    GRPO_SCALES,
    POLICY_LOSSES,
    ADVANTAGE_SHAPINGS,
    AdvantageConfig,
    DistillationConfig,
    Objective,
    ObjectiveConfig,
    PolicyLossConfig,
    compute_advantages,
    masked_mean,
    policy_objective,
    shape_advantages,
)
from workbench.engine.ranks import global_counts

#: (logp (B, T), entropy (B, T) or None, advantages (B, T), policy loss name) -> the row's
#: objective (core.policy_objective with everything else fixed).
RowObjective = Callable[[torch.Tensor, "torch.Tensor | None", torch.Tensor, str], Objective]

# The names users know for GRPO's std choices (a scale added to core.GRPO_SCALES appears as
# grpo_<scale>).
_GRPO_SCALE_KEYS = {"group": "grpo", "none": "dr_grpo", "batch": "grpo_batch_std"}


def lens_key(advantage: str, grpo_scale: str = "group") -> str:
    """The lens key of a recipe's estimator (GRPO's scale picks among its variants)."""
    if advantage != "grpo":
        return advantage
    return _GRPO_SCALE_KEYS.get(grpo_scale, f"grpo_{grpo_scale}")


def lens_estimators() -> dict[str, tuple[str, dict]]:
    """lens key -> (core estimator, AdvantageConfig overrides): every registered advantage
    estimator, GRPO once per std scale. Read from the registry at call time, so an estimator
    registered later joins the lens with no list to edit here."""
    known = list(_GRPO_SCALE_KEYS)  # display order: grpo, dr_grpo, grpo_batch_std, then new scales
    scales = sorted(GRPO_SCALES, key=lambda s: known.index(s) if s in known else len(known))
    out: dict[str, tuple[str, dict]] = {}
    for name in ADVANTAGE_ESTIMATORS.names():
        if name == "grpo":
            out.update({lens_key(name, scale): (name, {"scale": scale}) for scale in scales})
        else:
            out[name] = (name, {})
    return out


def lens_advantages(rewards: torch.Tensor, mask: torch.Tensor, base: AdvantageConfig, *,
                    kl: torch.Tensor | None = None, values: torch.Tensor | None = None,
                    baselines: torch.Tensor | None = None, keep: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Advantages (B, T) of every lens estimator on one batch, with the run's settings ``base``
    (group size, eps, gamma, lambda, in-reward KL, whitening). rewards (B,), mask (B, T).
    Estimators that read a critic's values join only when ``values`` is given; those that need a
    greedy baseline (ReMax) only when the run generated one (``baselines`` (B,)). ``keep`` (B, T):
    the run's rollout-rejection mask, so each row is what a run with that estimator would train on."""
    out = {}
    for key, (name, overrides) in lens_estimators().items():
        if (name in CRITIC_ESTIMATORS and values is None) or (name in BASELINE_ESTIMATORS and baselines is None):
            continue
        if name in POLICY_STAT_ESTIMATORS:  # needs the policy's old log-probs and sum pi^2, which the lens has not
            continue
        out[key] = compute_advantages(name, rewards, mask, replace(base, **overrides), kl=kl, values=values,
                                      baselines=baselines, keep=keep).advantages
    return out


def shaped_key(key: str, shaping: str) -> str:
    """The lens key of estimator ``key`` shaped by ``shaping`` (e.g. 'grpo + opd')."""
    return f"{key} + {shaping}"


def lens_shaped(advantages: Mapping[str, torch.Tensor], keys: Sequence[str], student_logp: torch.Tensor,
                teacher_logp: torch.Tensor, mask: torch.Tensor, cfg: DistillationConfig) -> dict[str, torch.Tensor]:
    """``advantages`` with, right after each estimator in ``keys``, that estimator shaped by every
    registered advantage shaping (read at call time: a shaping registered later joins with no
    list to edit), on the step's own student / teacher log-probs. (B, T) each; cfg: the run's."""
    out: dict[str, torch.Tensor] = {}
    for key, adv in advantages.items():
        out[key] = adv
        if key in keys:
            out.update({shaped_key(key, s): shape_advantages(s, adv, student_logp, teacher_logp, mask, cfg)
                        for s in ADVANTAGE_SHAPINGS.names()})
    return out


def _cosine(a: torch.Tensor, b: torch.Tensor | None) -> float | None:
    """cos(a, b) in float64; None when either vector is zero (the angle is undefined)."""
    if b is None:
        return None
    na, nb = a.norm(), b.norm()
    if na == 0 or nb == 0:
        return None
    return float(torch.dot(a, b) / (na * nb))


def flat_grad(value: torch.Tensor, params: Sequence[torch.Tensor], retain_graph: bool = True,
              grad_outputs: torch.Tensor | None = None) -> torch.Tensor:
    """d value / d params (a vector-Jacobian product with ``grad_outputs`` for a non-scalar value)
    as one float64 vector (zeros for parameters the value does not use)."""
    grads = torch.autograd.grad(value, params, grad_outputs=grad_outputs, retain_graph=retain_graph, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).double() for g, p in zip(grads, params)])


def lens_report(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: Mapping[str, torch.Tensor],
    mask: torch.Tensor,
    params: Sequence[torch.Tensor],
    *,
    losses: Sequence[str],
    loss_cfg: PolicyLossConfig = PolicyLossConfig(),
    aggregation: str = "token-mean",
    norm: Mapping,
    run: tuple[str, str],
    update: torch.Tensor | None = None,
    reduce: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
    share: Callable[[list], list] = lambda x: x,
    objective: RowObjective | None = None,
    entropy: torch.Tensor | None = None,
    reference: dict | None = None,
) -> list[dict]:
    """Loss, gradient norm and cosines of every (advantage key, policy loss) on one batch.

    logp (B, T) differentiable in ``params``; old_logp, mask and each advantage (B, T).
    ``objective``: a row's objective (default: the bare policy loss, core.policy_objective with
    ``loss_cfg`` and ``aggregation`` and no mask or weight besides ``mask``); ``norm``: its
    max_len / num_tokens / num_seqs for the default (global counts under data parallelism).
    ``entropy`` (B, T): passed to ``objective``; when it carries a gradient (an entropy bonus)
    the rows' gradients flow through it too. ``reduce`` sums a local tensor over ranks
    (identity on one process); ``share`` gathers a list of picklable objects from every rank
    (identity on one process). ``run``: (advantage key, loss) whose gradient is the reference
    g_run; ``update``: the flat parameter change theta_before - theta_after (or None).
    ``reference``: a dict that receives g_run under "g_run" (a flat float64 vector), for tests.
    Returns one dict per combination.
    """
    if objective is None:
        def objective(lp, h, adv, name):
            cfg = ObjectiveConfig(policy_loss=name, loss=loss_cfg, aggregation=aggregation)
            return policy_objective(lp, old_logp, adv, mask, mask, cfg, entropy=h, **norm)
    combos = [(a, l) for a in advantages for l in losses]
    if run in combos:  # the reference first, so every other gradient can be compared with it
        combos.remove(run)
        combos.insert(0, run)
    # Every objective depends on theta only through logp (and the entropy, with an entropy
    # bonus), so g_k = J^T v_k with v_k = dL_k / d(logp, H), cheap to get through the small loss
    # graph. Equal v's share one backward pass, and the distinct ones go through the model
    # together (a batched vector-Jacobian product).
    outputs = torch.stack([logp, entropy.to(logp.dtype)]) if entropy is not None and entropy.requires_grad else logp
    lp, h = outputs.unbind(0) if outputs is not logp else (logp, entropy)
    n_valid = reduce(mask.sum().double()).clamp(min=1)
    rows, vs = [], []
    for adv_key, loss_name in combos:
        obj = objective(lp, h, advantages[adv_key], loss_name)
        (v,) = torch.autograd.grad(obj.loss, outputs, retain_graph=True)
        vs.append(v.detach())
        zero = reduce((obj.diagnostics.zero_grad.double() * mask).sum()) / n_valid
        rows.append({"advantage": adv_key, "policy_loss": loss_name, "loss": float(reduce(obj.loss.detach().double())),
                     "zero_grad": float(zero)})
    unique: list[torch.Tensor] = []
    which = []
    for v in vs:
        j = next((j for j, u in enumerate(unique) if torch.equal(u, v)), None)
        if j is None:
            unique.append(v)
            j = len(unique) - 1
        which.append(j)
    local = vjp_many(outputs, params, unique)
    # Rows share a summed gradient only where they share a v on every rank: the ranks' groupings
    # differ, and every rank must run the same reductions in the same order.
    groups: dict[tuple, torch.Tensor] = {}
    signatures = list(zip(*share([which])))
    for i, sig in enumerate(signatures):
        if sig not in groups:
            groups[sig] = reduce(local[which[i]])
    g_run = groups[signatures[0]] if combos and combos[0] == run else None
    if reference is not None:
        reference["g_run"] = g_run
    for row, sig in zip(rows, signatures):
        g = groups[sig]
        row.update({"grad_norm": float(g.norm()), "cos_run": _cosine(g, g_run), "cos_update": _cosine(g, update)})
    return rows


def vjp_many(logp: torch.Tensor, params: Sequence[torch.Tensor], vs: Sequence[torch.Tensor], chunk: int = 8) -> list[torch.Tensor]:
    """[J^T v for v in vs] as flat float64 vectors, J = d logp / d params (``logp``: any output
    of the model, e.g. log-probs and entropies stacked, each v shaped like it). Batched (vmap
    over the backward) in chunks of ``chunk``; one backward per v where the model's ops do not vmap."""
    out: list[torch.Tensor] = []
    for start in range(0, len(vs), chunk):
        part = torch.stack(list(vs[start:start + chunk]))
        try:
            grads = torch.autograd.grad(logp, params, grad_outputs=part, retain_graph=True,
                                        allow_unused=True, is_grads_batched=True)
            flat = torch.cat([(g if g is not None else torch.zeros(len(part), *p.shape, dtype=p.dtype, device=p.device))
                              .reshape(len(part), -1).double() for g, p in zip(grads, params)], dim=1)
            out += list(flat)
        except RuntimeError:
            out += [flat_grad(logp, params, retain_graph=True, grad_outputs=v) for v in part]
    return out


class SameBatchLens:
    """Trainer glue: ``snapshot()`` before the step's optimisation, ``evaluate(...)`` after it.
    ``keep_reference``: keep the last evaluation's g_run per point in ``reference`` (tests)."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.every = trainer.recipe.logging.lens_every
        self._before: torch.Tensor | None = None
        self._entropy_coef = 0.0
        self.keep_reference = False
        self.reference: dict[str, torch.Tensor | None] = {}

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def _params(self) -> list[torch.Tensor]:
        model = self.trainer.accelerator.unwrap_model(self.trainer.policy)
        return [p for p in model.parameters() if p.requires_grad]

    def snapshot(self) -> None:
        """theta_before, and the entropy coefficient the step's first update will use."""
        self._before = parameters_to_vector(self._params()).detach().clone()
        self._entropy_coef = self.trainer.entropy_coef_now()

    def evaluate(self, batch, g_rewards, g_mask, g_kl, n_sequences: int, g_baselines=None, g_keep=None) -> dict:
        """The lens payload for the step whose ``snapshot()`` was taken (see module docstring).
        g_baselines (B_global,): ReMax's greedy rewards when the run generated them; g_keep
        (B_global, T): rollout rejection's keep-mask when the run rejects."""
        from workbench.engine.forward import logprobs_and_entropy  # the engine's own forward

        t0 = time.perf_counter()
        tr, r = self.trainer, self.trainer.recipe
        acc, a, ranks = tr.accelerator, r.algorithm, tr.ranks
        params = self._params()
        after = parameters_to_vector(params).detach().clone()
        update = (self._before - after).double()
        g_values = ranks.gather(batch.old_values) if batch.old_values is not None else None
        advantages = lens_advantages(g_rewards, g_mask, tr.advantage_config(), kl=g_kl, values=g_values, baselines=g_baselines,
                                     keep=g_keep)
        run = (lens_key(a.advantage, a.grpo_scale), a.policy_loss)
        distilled = tr.distill_inputs if tr.teacher is not None else None
        if distilled is not None:  # the teacher log-probs this step scored: reused, never recomputed
            advantages = lens_shaped(advantages, [run[0]], distilled["student_logp"], distilled["teacher_logp"],
                                     distilled["mask"],
                                     r.distillation_config())
            run = (shaped_key(run[0], distilled["shaping"]), run[1])  # what the run trained on
        B = batch.completion_mask.shape[0]
        local = {k: v[ranks.rows(B)] for k, v in advantages.items()}
        local[run[0]] = batch.advantages  # the reference row: the very advantages the run trained on
        num_tokens, num_seqs = global_counts(ranks, batch.loss_mask, batch.completion_mask)
        coef = self._entropy_coef
        model = acc.unwrap_model(tr.policy)
        points, reference = {}, {}
        vector_to_parameters(self._before, params)
        try:
            with torch.enable_grad(), acc.autocast():
                for point in ("before", "after"):
                    if point == "after":
                        vector_to_parameters(after, params)
                    logp, entropy = logprobs_and_entropy(model, batch, r.sampling.temperature, entropy_grad=coef > 0,
                                                          shared_prefix=r.train.shared_prefix)
                    if point == "before":  # the run's ratio denominator at theta_before, kept for theta_after
                        old = tr.ratio_old_logp(logp, batch)

                    def objective(lp, h, adv, loss_name, old=old):
                        return tr.run_objective(batch, lp, h, old, entropy_coef=coef, num_tokens=num_tokens,
                                                num_seqs=num_seqs, advantages=adv, policy_loss=loss_name)

                    reference[point] = {}
                    points[point] = lens_report(
                        logp, old, local, batch.loss_mask, params, losses=POLICY_LOSSES.names(), norm={}, run=run,
                        update=update, reduce=ranks.sum, share=ranks.gather_objects, objective=objective, entropy=entropy, reference=reference[point])
                    del logp, entropy
        finally:
            vector_to_parameters(after, params)
            self._before = None
        self.reference = {k: v.get("g_run") for k, v in reference.items()} if self.keep_reference else {}
        n = min(n_sequences, B)
        teacher = {} if distilled is None else {"teacher": {"shaping": distilled["shaping"], **vars(r.distillation_config())}}
        return {
            "run": {"advantage": run[0], "policy_loss": run[1]},
            **teacher,
            "aggregation": a.aggregation,
            "update_norm": float(update.norm()),
            "points": points,
            # per-sequence mean advantage of the first n sequences of this rank, per estimator
            "advantages": {k: masked_mean(v[:n], batch.completion_mask[:n], dim=1) for k, v in local.items()},
            "time": time.perf_counter() - t0,
        }
