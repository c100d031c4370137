"""Estimator walkthroughs: every advantage estimator on the same editable inputs, the known
biases as worked examples, and the per-token gradients of PPO clip, GSPO and CISPO on one
sequence. Every number is a ``workbench.core`` call.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
import torch

from workbench.algorithms import FAMILIES
from workbench.core import REGION_NAMES, REWARD_DTYPE, AdvantageConfig, PolicyLossConfig, compute_advantages, compute_policy_loss

from .lab_aggregation import padded, token_weights


@dataclass(frozen=True)
class Variant:
    """A named estimator setting: registered core estimator + AdvantageConfig overrides."""

    label: str
    estimator: str
    overrides: dict = field(default_factory=dict)


def sequence_variants() -> tuple[Variant, ...]:
    """The all-estimators table's columns, read from the advantage specs when called (a spec
    registered later shows up): every estimator whose worked example needs nothing beside the
    rewards (no critic values, baseline rollout or policy statistics: ``example_inputs``), under
    each of its spec's ``example_variants`` (GRPO: group / none = Dr. GRPO / batch std), else once
    under its title. Token-level ones run on one-token sequences, where the terminal reward is the
    only token reward; with gamma = 1 that is their sequence value."""
    return tuple(Variant(label, s.name, dict(overrides))
                 for s in FAMILIES["advantage"].specs.values() if not example_inputs(s)
                 for label, overrides in (s.example_variants or ((s.title, {}),)))


def parse_numbers(text: str, field_name: str = "rewards") -> list[float]:
    """'1, 0, 0.5' -> [1.0, 0.0, 0.5]; ValueError naming the field and value otherwise (also for
    'nan' and 'inf', which float() accepts but no worked example can use)."""
    try:
        values = [float(x) for x in text.replace(";", ",").split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{field_name}={text[:80]!r}: expected numbers separated by commas, e.g. 1, 0, 0.5") from None
    if not values:
        raise ValueError(f"{field_name} is empty: enter at least one number")
    bad = next((v for v in values if not math.isfinite(v)), None)
    if bad is not None:
        raise ValueError(f"{field_name}={text[:80]!r}: {bad} is not a finite number; enter finite numbers")
    return values


# A worked example is a table with one column per token position, computed in the app's process.
MAX_EXAMPLE_COMPLETIONS = 256
MAX_EXAMPLE_LENGTH = 256


@dataclass(frozen=True)
class ExampleInput:
    """One per-completion input of the advantage example besides the rewards, read by the estimators
    whose spec has a capability (``ADVANTAGE_INPUTS``): ``keyword`` of ``advantage_example``, the
    page's label and default text, and the open / closed interval its values must lie in."""

    keyword: str
    label: str
    default: str
    above: float | None = None  # values must be > above
    at_most: float | None = None  # values must be <= at_most

    def check(self, values: Sequence[float]) -> None:
        for v in values:
            if (self.above is not None and not v > self.above) or (self.at_most is not None and not v <= self.at_most):
                raise ValueError(f"{self.keyword}={v}: each value must lie in ({self.above}, {self.at_most}]")


#: Spec capability -> the inputs its estimators read beside the rewards, one value per completion.
ADVANTAGE_INPUTS: dict[str, tuple[ExampleInput, ...]] = {
    "needs_critic": (ExampleInput("values", "Critic value V on every token of each completion",
                                  "0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5"),),
    "needs_baseline_rollout": (ExampleInput("baselines", "Baseline reward of each completion (ReMax: its prompt's greedy "
                                            "completion, repeated over the group)", "0, 0, 0, 0, 1, 1, 1, 1"),),
    "needs_policy_stats": (ExampleInput("token_probs", "pi_old of the sampled tokens of each completion",
                                        "0.9, 0.5, 0.2, 0.7, 0.9, 0.6, 0.3, 0.5", above=0.0, at_most=1.0),
                           ExampleInput("sum_pi_squared", "sum_v pi_v^2 at each position of each completion",
                                        "0.82, 0.3, 0.1, 0.5, 0.82, 0.4, 0.15, 0.3", above=0.0, at_most=1.0)),
}


def example_inputs(spec) -> tuple[ExampleInput, ...]:
    """The extra inputs of an advantage estimator's worked example, from its spec's capabilities."""
    return tuple(i for capability, inputs in ADVANTAGE_INPUTS.items() if getattr(spec, capability) for i in inputs)


def sequence_advantages(rewards: Sequence[float], group_size: int, eps: float = 1e-6,
                        variants: Sequence[Variant] | None = None) -> pd.DataFrame:
    """Advantage of each completion (rows, grouped contiguously by ``group_size``) under every
    variant (columns), computed by ``compute_advantages`` on one-token sequences, in the dtype the
    engine scores rewards in (REWARD_DTYPE): the numbers a run's Samples table shows. ``variants``:
    the columns (default: ``sequence_variants()``)."""
    r = torch.tensor(list(rewards), dtype=REWARD_DTYPE)
    if group_size < 1 or len(r) % group_size:
        raise ValueError(f"group size={group_size} must be >= 1 and divide the number of rewards ({len(r)})")
    mask = torch.ones(len(r), 1, dtype=REWARD_DTYPE)
    columns: dict[str, list] = {"group": [i // group_size for i in range(len(r))], "reward": list(map(float, rewards))}
    for v in variants if variants is not None else sequence_variants():
        cfg = AdvantageConfig(group_size=group_size, eps=eps, **v.overrides)
        columns[v.label] = compute_advantages(v.estimator, r, mask, cfg).advantages[:, 0].tolist()
    return pd.DataFrame(columns)


def advantages_figure(table: pd.DataFrame) -> go.Figure:
    """Grouped bars: x = completion, one series per estimator."""
    fig = go.Figure()
    x = [f"#{i} (r={r:g})" for i, r in enumerate(table["reward"])]
    for col in table.columns:
        if col in ("group", "reward"):
            continue
        fig.add_trace(go.Bar(x=x, y=table[col], name=col))
    fig.update_layout(barmode="group", yaxis_title="advantage", height=360, margin={"t": 30})
    return fig


def gae_table(token_rewards: Sequence[float], values: Sequence[float], gamma: float, lam: float) -> pd.DataFrame:
    """One sequence through GAE (core's ``gae`` estimator): per token the reward r_t, value V_t,
    TD error delta_t, advantage A_t and return A_t + V_t; REINFORCE++'s returns-to-go alongside.

    Per-token rewards enter core as the in-reward KL channel (kl = -r_t, kl_coef = 1, terminal
    reward 0), which is exactly how core builds token rewards: r_t = -kl_coef kl_t (+ r on the last).
    """
    if len(token_rewards) != len(values):
        raise ValueError(f"values has {len(values)} entries but rewards has {len(token_rewards)}: give one value per token")
    rt = torch.tensor([list(token_rewards)], dtype=torch.float64)
    v = torch.tensor([list(values)], dtype=torch.float64)
    mask = torch.ones_like(rt)
    zero = torch.zeros(1, dtype=torch.float64)
    cfg = AdvantageConfig(gamma=gamma, lam=lam, kl_coef=1.0)
    gae = compute_advantages("gae", zero, mask, cfg, kl=-rt, values=v)
    td = compute_advantages("gae", zero, mask, AdvantageConfig(gamma=gamma, lam=0.0, kl_coef=1.0), kl=-rt, values=v)
    mc = compute_advantages("gae", zero, mask, AdvantageConfig(gamma=gamma, lam=1.0, kl_coef=1.0), kl=-rt, values=v)
    return pd.DataFrame({
        "token": range(rt.shape[1]), "reward": rt[0].tolist(), "value": v[0].tolist(),
        "delta (= A at lambda 0)": td.advantages[0].tolist(),
        "A (GAE)": gae.advantages[0].tolist(), "return (A + V)": gae.returns[0].tolist(),
        "A (lambda 1: G_t - V_t)": mc.advantages[0].tolist(),
    })


def gae_figure(table: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for col in ("reward", "value", "delta (= A at lambda 0)", "A (GAE)", "A (lambda 1: G_t - V_t)"):
        fig.add_trace(go.Scatter(x=table["token"], y=table[col], mode="lines+markers", name=col))
    fig.update_layout(xaxis_title="token t", height=340, margin={"t": 30})
    return fig


# ---------------------------------------------------------------------------------------------
# known biases, worked


STD_BIAS_GROUPS: tuple[tuple[float, ...], ...] = ((1, 0, 0, 0), (0.1, 0, 0, 0), (1, 1, 0, 0), (1, 1, 1, 0))


def std_bias_example(groups: Sequence[Sequence[float]] = STD_BIAS_GROUPS, eps: float = 1e-6) -> pd.DataFrame:
    """Std normalisation (GRPO) vs none (Dr. GRPO): the advantage of the best answer (highest
    reward, the first on ties) in each group. Dividing by the group std gives the rare answer,
    right or wrong, the largest |A| (1.5 in a group of 4), and cancels the reward scale:
    (0.1, 0, 0, 0) gets the same 1.5 as (1, 0, 0, 0), where Dr. GRPO gives 0.075 and 0.75."""
    rows = []
    for g in groups:
        r = torch.tensor(list(g), dtype=REWARD_DTYPE)
        mask = torch.ones(len(r), 1, dtype=REWARD_DTYPE)
        out = {"group rewards": ", ".join(f"{x:g}" for x in g)}
        for label, scale in (("GRPO A(best)", "group"), ("Dr. GRPO A(best)", "none")):
            adv = compute_advantages("grpo", r, mask, AdvantageConfig(group_size=len(r), scale=scale, eps=eps)).advantages[:, 0]
            out[label] = float(adv[int(torch.argmax(r))])
        rows.append(out)
    return pd.DataFrame(rows)


def length_bias_example(short: int = 4, long: int = 7, advantage: float = 1.0, max_len: int | None = None) -> pd.DataFrame:
    """Length bias of per-sequence normalisation: a correct short answer (+A) and a wrong long one
    (-A). Per-token push dL/dlogpi = weight * A under each mode; seq-mean-token-mean pushes the
    long wrong answer's tokens less, so long wrong answers are penalised less than short ones."""
    losses = torch.zeros(2, max(short, long), dtype=torch.float64)
    mask = torch.zeros_like(losses)
    mask[0, :short] = 1
    mask[1, :long] = 1
    rows = []
    for mode in ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"):
        _, w = token_weights(mode, losses, mask, max_len or max(short, long))
        rows.append({"mode": mode, f"push per token, correct ({short} tokens, +A)": float(w[0, 0] * advantage),
                     f"push per token, wrong ({long} tokens, -A)": float(-w[1, 0] * advantage)})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# the policy losses on one sequence


def per_token_policy_gradients(log_ratios: Sequence[float], advantage: float,
                               losses: Mapping[str, tuple[str, PolicyLossConfig]]) -> pd.DataFrame:
    """One sequence with the given per-token log-ratios log(pi/pi_old) through each registered
    policy loss of ``losses`` (label -> (name, config)): the ratio it uses ('<label> ratio': the
    token ratio, GSPO's sequence ratio s, ...) and its gradient -dloss/dlogpi_t ('<label> grad'),
    summed over tokens (no aggregation)."""
    d = torch.tensor([list(log_ratios)], dtype=torch.float64)
    mask = torch.ones_like(d)
    adv = torch.full_like(d, float(advantage))
    out = {"token": list(range(d.shape[1])), "log ratio": d[0].tolist()}
    for label, (name, cfg) in losses.items():
        logp = d.clone().requires_grad_(True)
        loss, diag = compute_policy_loss(name, logp, torch.zeros_like(d), adv, mask, cfg)
        (g,) = torch.autograd.grad(-loss.sum(), logp)
        out[f"{label} ratio"] = diag.ratio[0].tolist()
        out[f"{label} grad"] = g[0].tolist()
    return pd.DataFrame(out)


def policy_gradient_figure(table: pd.DataFrame, labels: Sequence[str]) -> go.Figure:
    """Grouped bars of each loss's per-token gradient (the '<label> grad' columns)."""
    fig = go.Figure()
    for label in labels:
        fig.add_trace(go.Bar(x=table["token"], y=table[f"{label} grad"], name=label))
    fig.update_layout(barmode="group", xaxis_title="token t", yaxis_title="-d loss / d log pi_t", height=340, margin={"t": 30})
    return fig


def source_of(*functions: Callable) -> str:
    """The project's own implementation, as the page shows it (``inspect.getsource``)."""
    return "\n\n".join(inspect.getsource(f) for f in functions)


# ---------------------------------------------------------------------------------------------
# registry walkthroughs: any registered estimator / loss on a small batch


def config_fields(config_class: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(config_class))


def knobs_read(fn: Callable, config_class: type) -> tuple[str, ...]:
    """The ``config_class`` fields that ``fn``'s own source reads as ``cfg.<field>``, in field
    order: the knobs of a function registered without an explanation entry."""
    read = set(re.findall(r"\bcfg\.(\w+)", inspect.getsource(fn)))
    return tuple(f for f in config_fields(config_class) if f in read)


def token_columns(x: torch.Tensor, mask: torch.Tensor, prefix: str) -> dict[str, list]:
    """(B, T) -> {'<prefix>0': [...], ...}, None on padding (an empty cell, not a 0)."""
    return {f"{prefix}{t}": [float(v) if m else None for v, m in zip(x[:, t].tolist(), mask[:, t].tolist())]
            for t in range(x.shape[1])}


def advantage_example(name: str, rewards: Sequence[float], lengths: Sequence[int], cfg: AdvantageConfig, *,
                      values: Sequence[float] | None = None, baselines: Sequence[float] | None = None,
                      token_probs: Sequence[float] | None = None,
                      sum_pi_squared: Sequence[float] | None = None) -> pd.DataFrame:
    """One batch through ``compute_advantages(name, ...)``: completion i has reward r_i and
    lengths[i] tokens, groups of cfg.group_size contiguous. values (B,): the critic's V on every
    token of completion i (critic estimators); baselines (B,) (baseline estimators); token_probs
    and sum_pi_squared (B,): pi_old of each sampled token and sum_v pi_v^2 at each position of
    completion i (policy-statistics estimators: old_logp = log token_probs). Rewards in
    REWARD_DTYPE, as the engine. -> one row per completion: group, reward, length, A_t0.. per
    token (empty on padding), and R_t0.. (returns) where they differ from the advantages."""
    if len(rewards) > MAX_EXAMPLE_COMPLETIONS:
        raise ValueError(f"rewards has {len(rewards)} entries: a worked example takes at most {MAX_EXAMPLE_COMPLETIONS}")
    if len(lengths) != len(rewards):
        raise ValueError(f"lengths has {len(lengths)} entries but rewards has {len(rewards)}: give one length per completion")
    if any(not 1 <= n <= MAX_EXAMPLE_LENGTH or n != int(n) for n in lengths):
        raise ValueError(f"lengths={list(lengths)[:8]}: each completion needs a whole number of tokens from 1 to "
                         f"{MAX_EXAMPLE_LENGTH}")
    given_inputs = {"values": values, "baselines": baselines, "token_probs": token_probs, "sum_pi_squared": sum_pi_squared}
    checks = {i.keyword: i for inputs in ADVANTAGE_INPUTS.values() for i in inputs}
    for label, given in given_inputs.items():
        if given is not None and len(given) != len(rewards):
            raise ValueError(f"{label} has {len(given)} entries but rewards has {len(rewards)}: give one per completion")
        if given is not None:
            checks[label].check(given)
    if token_probs is not None and sum_pi_squared is not None:  # the sampled token's own pi^2 is in the sum
        for i, (p, s2) in enumerate(zip(token_probs, sum_pi_squared)):
            if s2 < p * p:
                raise ValueError(f"sum_pi_squared={s2} of completion {i} is below token_probs^2 = {p * p:.6g}: the sum "
                                 "over the vocabulary includes the sampled token's own pi^2")
    G = cfg.group_size
    if G < 1 or len(rewards) % G:
        raise ValueError(f"group size={G} must be >= 1 and divide the number of rewards ({len(rewards)})")
    r = torch.tensor(list(rewards), dtype=REWARD_DTYPE)
    _, mask = padded([[0.0] * int(n) for n in lengths])
    mask = mask.to(REWARD_DTYPE)
    b = None if baselines is None else torch.tensor(list(baselines), dtype=REWARD_DTYPE)
    def per_token(given: Sequence[float] | None) -> torch.Tensor | None:
        return None if given is None else torch.tensor(list(given), dtype=REWARD_DTYPE)[:, None] * mask

    old_logp = None if token_probs is None else torch.log(torch.tensor(list(token_probs), dtype=REWARD_DTYPE))[:, None] * mask
    out = compute_advantages(name, r, mask, cfg, values=per_token(values), baselines=b, old_logp=old_logp,
                             sum_pi_squared=per_token(sum_pi_squared))
    table = {"group": [i // G for i in range(len(r))], "reward": [float(x) for x in r], "length": [int(n) for n in lengths]}
    table.update(token_columns(out.advantages.double(), mask, "A_t"))
    if not torch.equal(out.returns, out.advantages):
        table.update(token_columns(out.returns.double(), mask, "R_t"))
    return pd.DataFrame(table)


EXAMPLE_OLD_PROB = 0.1  # pi_old of every token in the policy-loss example


def policy_loss_example(name: str, log_ratios: Sequence[Sequence[float]], advantages: Sequence[float],
                        cfg: PolicyLossConfig) -> tuple[pd.DataFrame, dict[str, float]]:
    """One batch through ``compute_policy_loss(name, ...)``: sequence i has per-token log-ratios
    log(pi/pi_old) (every old probability EXAMPLE_OLD_PROB, which the probability-based losses
    read; so a log-ratio may not exceed -log EXAMPLE_OLD_PROB) and advantage A_i on every token. -> one row per valid token: seq, token, log ratio, the ratio
    the loss used, its region, zero gradient, loss and -d loss / d log pi (autograd), and the
    loss's metrics."""
    if len(advantages) != len(log_ratios):
        raise ValueError(f"advantages has {len(advantages)} entries but there are {len(log_ratios)} sequences: give one per sequence")
    d, mask = padded(log_ratios)
    top = -math.log(EXAMPLE_OLD_PROB)
    if (d > top).any():
        raise ValueError(f"log-ratios={[list(r) for r in log_ratios]}: each must be <= {top:.4f}, since pi = "
                         f"{EXAMPLE_OLD_PROB} x e^(log-ratio) is a probability")
    old = torch.full_like(d, math.log(EXAMPLE_OLD_PROB)) * mask
    logp = (old + d).clone().requires_grad_(True)
    adv = torch.tensor(list(advantages), dtype=torch.float64)[:, None] * mask
    loss, diag = compute_policy_loss(name, logp, old, adv, mask, cfg)
    (grad,) = torch.autograd.grad(-loss.sum(), logp)
    rows, cols = torch.nonzero(mask, as_tuple=True)
    table = pd.DataFrame({
        "seq": rows.tolist(), "token": cols.tolist(), "advantage": adv[rows, cols].tolist(),
        "log ratio": d[rows, cols].tolist(), "ratio used": diag.ratio[rows, cols].tolist(),
        "region": [REGION_NAMES[c] for c in diag.region[rows, cols].tolist()],
        "zero grad": diag.zero_grad[rows, cols].tolist(),
        "loss": loss.detach()[rows, cols].tolist(), "-d loss / d log pi": grad[rows, cols].tolist(),
    })
    return table, {k: float(v) for k, v in diag.metrics.items()}


def shaping_example(name: str, advantages: Sequence[float], student_logp: Sequence[float], teacher_logp: Sequence[float],
                    cfg) -> pd.DataFrame:
    """One completion's tokens: the estimator's A_t, both log-probs, d_t and the shaped A'_t, computed
    by the registered shaping (core.distillation.shape_advantages). ValueError for lengths that differ."""
    from workbench.core.distillation import reverse_kl_per_token, shape_advantages

    n = len(advantages)
    if not (len(student_logp) == len(teacher_logp) == n):
        raise ValueError(f"advantages, student and teacher log-probs have {n}, {len(student_logp)}, {len(teacher_logp)} "
                         "entries: give one per token")
    if any(v > 0 for v in (*student_logp, *teacher_logp)):
        raise ValueError("log-probs must be <= 0 (log of a probability)")
    a, s, t = (torch.tensor([list(v)], dtype=torch.float64) for v in (advantages, student_logp, teacher_logp))
    mask = torch.ones_like(a)
    shaped = shape_advantages(name, a, s, t, mask, cfg)
    d = reverse_kl_per_token(s, t, mask)  # the d_t the shaping used, from core: not re-derived here
    return pd.DataFrame({"token": list(range(n)), "A_t": a[0].tolist(), "log pi_theta": s[0].tolist(),
                         "log pi_T": t[0].tolist(), "d_t": d[0].tolist(), "A'_t": shaped[0].tolist()})
