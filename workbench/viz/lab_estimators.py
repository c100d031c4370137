"""Estimator walkthroughs: every advantage estimator on the same editable inputs, the known
biases as worked examples, and the per-token gradients of PPO clip, GSPO and CISPO on one
sequence. Every number is a ``workbench.core`` call.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Sequence

import pandas as pd
import plotly.graph_objects as go
import torch

from workbench.core import AdvantageConfig, PolicyLossConfig, compute_advantages, compute_policy_loss

from .lab_aggregation import token_weights


@dataclass(frozen=True)
class Variant:
    """A named estimator setting: registered core estimator + AdvantageConfig overrides."""

    label: str
    estimator: str
    overrides: dict = field(default_factory=dict)


# Sequence-level view of all estimators (token-level ones on one-token sequences, where the
# terminal reward is the only token reward; with gamma = 1 that is their sequence value).
SEQUENCE_VARIANTS: tuple[Variant, ...] = (
    Variant("GRPO", "grpo", {"scale": "group"}),
    Variant("Dr. GRPO", "grpo", {"scale": "none"}),
    Variant("GRPO (batch std)", "grpo", {"scale": "batch"}),
    Variant("RLOO", "rloo"),
    Variant("REINFORCE (batch mean)", "reinforce"),
    Variant("REINFORCE++", "reinforce_pp"),
    Variant("REINFORCE++ baseline", "reinforce_pp_baseline"),
)


def parse_numbers(text: str, field_name: str = "rewards") -> list[float]:
    """'1, 0, 0.5' -> [1.0, 0.0, 0.5]; ValueError naming the field and value otherwise."""
    try:
        values = [float(x) for x in text.replace(";", ",").split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{field_name}={text!r}: expected numbers separated by commas, e.g. 1, 0, 0.5") from None
    if not values:
        raise ValueError(f"{field_name} is empty: enter at least one number")
    return values


def sequence_advantages(rewards: Sequence[float], group_size: int, eps: float = 1e-6,
                        variants: Sequence[Variant] = SEQUENCE_VARIANTS) -> pd.DataFrame:
    """Advantage of each completion (rows, grouped contiguously by ``group_size``) under every
    variant (columns), computed by ``compute_advantages`` on one-token sequences."""
    r = torch.tensor(list(rewards), dtype=torch.float64)
    if group_size < 1 or len(r) % group_size:
        raise ValueError(f"group size={group_size} must be >= 1 and divide the number of rewards ({len(r)})")
    mask = torch.ones(len(r), 1, dtype=torch.float64)
    columns: dict[str, list] = {"group": [i // group_size for i in range(len(r))], "reward": list(map(float, rewards))}
    for v in variants:
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
        r = torch.tensor(list(g), dtype=torch.float64)
        mask = torch.ones(len(r), 1, dtype=torch.float64)
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


def per_token_policy_gradients(log_ratios: Sequence[float], advantage: float, clip: PolicyLossConfig,
                               gspo: PolicyLossConfig, cispo: PolicyLossConfig) -> pd.DataFrame:
    """One sequence with the given per-token log-ratios log(pi/pi_old): the ratio each loss uses
    and the gradient -dloss/dlogpi_t of PPO clip (token ratio), GSPO (sequence ratio s) and CISPO
    (clipped stop-grad weight), each summed over tokens (no aggregation)."""
    d = torch.tensor([list(log_ratios)], dtype=torch.float64)
    mask = torch.ones_like(d)
    adv = torch.full_like(d, float(advantage))
    out = {"token": list(range(d.shape[1])), "log ratio": d[0].tolist()}
    for label, name, cfg in (("PPO clip", "clip", clip), ("GSPO", "gspo", gspo), ("CISPO", "cispo", cispo)):
        logp = d.clone().requires_grad_(True)
        loss, diag = compute_policy_loss(name, logp, torch.zeros_like(d), adv, mask, cfg)
        (g,) = torch.autograd.grad(-loss.sum(), logp)
        out[f"{label} ratio"] = diag.ratio[0].tolist()
        out[f"{label} grad"] = g[0].tolist()
    return pd.DataFrame(out)


def policy_gradient_figure(table: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for label in ("PPO clip", "GSPO", "CISPO"):
        fig.add_trace(go.Bar(x=table["token"], y=table[f"{label} grad"], name=label))
    fig.update_layout(barmode="group", xaxis_title="token t", yaxis_title="-d loss / d log pi_t", height=340, margin={"t": 30})
    return fig


def source_of(*functions: Callable) -> str:
    """The project's own implementation, as the page shows it (``inspect.getsource``)."""
    return "\n\n".join(inspect.getsource(f) for f in functions)
