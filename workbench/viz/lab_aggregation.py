"""Loss-aggregation lab: how much gradient each token gets under each aggregation mode.

The weight of token (i, t) is w_it = dL / d l_it, where L = aggregate_loss(mode, l, m): taken by
autograd through ``workbench.core.aggregate_loss`` itself, never re-derived here. For the RLHF
book's example (per-token losses l = R A with R = 1, A = 2; masks of 4 and 7 tokens; L_max = 7)
the gradient with respect to R is w A: 0.25 / 0.1429 (seq-mean-token-mean), 0.1429 / 0.1429
(seq-mean-token-sum-norm, B = 2: TRL's dr_grpo and verl >= 0.9), 0.2857 / 0.2857
(token-sum-norm: verl < 0.9 divided by L_max only); token-mean gives w = 1/11 = 0.0909 (the
book's printed line, which drops A: with A = 2 it is 0.1818).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.colors import qualitative

from workbench.core import LOSS_AGGREGATIONS, PolicyLossConfig, aggregate_loss, compute_policy_loss

# Every mode registered in core, in its order: a mode added there shows up here.
LAB_MODES: tuple[str, ...] = LOSS_AGGREGATIONS.names()
MODE_COLORS: dict[str, str] = {m: qualitative.Plotly[i % len(qualitative.Plotly)] for i, m in enumerate(LAB_MODES)}
BOOK_EXAMPLE: tuple[tuple[float, ...], ...] = ((2.0,) * 4, (2.0,) * 7)  # l = R A, R = 1, A = 2


def parse_sequences(text: str) -> list[list[float]]:
    """One sequence of per-token losses per line, numbers separated by commas.
    '2,2,2,2\\n2,2,2,2,2,2,2' -> [[2, 2, 2, 2], [2, 2, 2, 2, 2, 2, 2]]; ValueError naming the field."""
    seqs = []
    for n, line in enumerate(text.strip().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            seqs.append([float(x) for x in line.replace(";", ",").split(",") if x.strip()])
        except ValueError:
            raise ValueError(f"per-token losses line {n}={line!r}: expected numbers separated by commas, e.g. 2, 2, 2") from None
        if not seqs[-1]:
            raise ValueError(f"per-token losses line {n} is empty: give at least one token loss")
    if not seqs:
        raise ValueError("per-token losses is empty: give one line of comma-separated numbers per sequence")
    return seqs


def padded(seqs: Sequence[Sequence[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged per-token losses -> (losses (B, T) float64, mask (B, T)), T = the longest sequence."""
    T = max(len(s) for s in seqs)
    losses = torch.zeros(len(seqs), T, dtype=torch.float64)
    mask = torch.zeros(len(seqs), T, dtype=torch.float64)
    for i, s in enumerate(seqs):
        losses[i, : len(s)] = torch.tensor(s, dtype=torch.float64)
        mask[i, : len(s)] = 1.0
    return losses, mask


def token_weights(mode: str, losses: torch.Tensor, mask: torch.Tensor, max_len: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(aggregated loss (), per-token weight dL/dl (B, T)) by autograd through core's aggregation."""
    leaf = losses.detach().clone().requires_grad_(True)
    value = aggregate_loss(mode, leaf, mask, max_len=max_len)
    (grad,) = torch.autograd.grad(value, leaf)
    return value.detach(), grad * mask


def aggregation_table(seqs: Sequence[Sequence[float]], max_len: int | None = None,
                      modes: Sequence[str] = LAB_MODES) -> pd.DataFrame:
    """One row per (mode, sequence, token): loss value L of the mode, the token's loss l, its
    weight dL/dl and dL/dR = weight * l (for losses l = R A at R = 1, the book's ``ratio.grad``)."""
    losses, mask = padded(seqs)
    max_len = max_len or losses.shape[1]
    rows = []
    for mode in modes:
        value, w = token_weights(mode, losses, mask, max_len)
        for i, s in enumerate(seqs):
            for t in range(len(s)):
                rows.append({"mode": mode, "seq": i, "token": t, "length": len(s), "loss": float(value),
                             "token_loss": s[t], "weight": float(w[i, t]), "grad_wrt_ratio": float(w[i, t] * losses[i, t])})
    return pd.DataFrame(rows)


def aggregation_figure(table: pd.DataFrame, value: str = "grad_wrt_ratio") -> go.Figure:
    """Grouped bars: x = token (sequence i, position t), one bar series per mode."""
    fig = go.Figure()
    for mode, part in table.groupby("mode", sort=False):
        fig.add_trace(go.Bar(x=[f"s{i} t{t}" for i, t in zip(part["seq"], part["token"])], y=part[value], name=mode,
                             marker_color=MODE_COLORS.get(mode)))
    label = {"grad_wrt_ratio": "dL / dR per token", "weight": "dL / dl per token (weight)",
             "grad_logp": "dJ / d log pi per token"}.get(value, value)
    fig.update_layout(barmode="group", yaxis_title=label, xaxis_title="token", height=380, margin={"t": 30})
    return fig


LOSS_OLD_PROB = 0.1  # pi_old of every token in the policy-loss view (DPPO reads probabilities)


def loss_gradient_table(loss: str, seqs: Sequence[Sequence[float]], max_len: int | None = None,
                        cfg: PolicyLossConfig = PolicyLossConfig(), log_ratio: float = 0.0,
                        modes: Sequence[str] = LAB_MODES) -> pd.DataFrame:
    """The book's tokens through a registered policy loss, then every aggregation: token (i, t)
    has advantage A_it = seqs[i][t] (the book's l = R A at R = 1) and log-ratio ``log_ratio``
    (pi_old = LOSS_OLD_PROB). -> one row per (mode, seq, token): length, grad_logp = dJ / d log pi_it
    with J = -aggregate(mode, compute_policy_loss(loss, ...)), by autograd through both.

    At log_ratio 0 every loss hands each token A (its policy gradient), so grad_logp = weight x A:
    the aggregation alone sets the per-token weight, whatever the loss (GSPO's and GMPO's
    sequence ratios included, since d s_i / d log pi_t = s_i / n_i over n_i tokens)."""
    adv, mask = padded(seqs)
    max_len = max_len or adv.shape[1]
    old = torch.full_like(adv, math.log(LOSS_OLD_PROB)) * mask
    logp = (old + log_ratio * mask).requires_grad_(True)
    per_token, _ = compute_policy_loss(loss, logp, old, adv, mask, cfg)
    rows = []
    for mode in modes:
        (grad,) = torch.autograd.grad(-aggregate_loss(mode, per_token, mask, max_len=max_len), logp, retain_graph=True)
        rows += [{"mode": mode, "seq": i, "token": t, "length": len(s), "grad_logp": float(grad[i, t])}
                 for i, s in enumerate(seqs) for t in range(len(s))]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# empirical


def run_batch_weights(diag: Mapping, max_len: int, modes: Sequence[str] = LAB_MODES) -> pd.DataFrame:
    """For a diagnostics batch (its ``mask`` (n, T) and ``loss_mask``), the weight each token would
    get under every mode, with its completion's length. -> columns mode, seq, length, weight,
    total (the sequence's summed weight = weight * length)."""
    mask = torch.as_tensor(diag.get("loss_mask", diag["mask"]), dtype=torch.float64)
    lengths = torch.as_tensor(diag["mask"], dtype=torch.float64).sum(dim=1)
    rows = []
    for mode in modes:
        _, w = token_weights(mode, torch.ones_like(mask), mask, max_len)
        per_token = w.sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # every valid token of a row shares one weight
        for i in range(mask.shape[0]):
            if mask[i].sum() > 0:
                rows.append({"mode": mode, "seq": i, "length": int(lengths[i]), "weight": float(per_token[i]),
                             "total": float(w[i].sum())})
    return pd.DataFrame(rows, columns=["mode", "seq", "length", "weight", "total"])


def weight_vs_length_figure(weights: pd.DataFrame, run_mode: str | None = None) -> go.Figure:
    """Per-token weight against completion length, one series per mode (the run's own mode bold)."""
    fig = go.Figure()
    for mode, part in weights.groupby("mode", sort=False):
        part = part.sort_values("length")
        fig.add_trace(go.Scatter(x=part["length"], y=part["weight"], mode="lines+markers", name=mode + (" (this run)" if mode == run_mode else ""),
                                 line={"color": MODE_COLORS.get(mode), "width": 4 if mode == run_mode else 2}))
    fig.update_layout(xaxis_title="completion length (tokens)", yaxis_title="gradient weight per token", height=380, margin={"t": 30})
    return fig


def length_drift_figure(metrics: pd.DataFrame, labels: Mapping[str, str] | None = None,
                        column: str = "completions/mean_length") -> go.Figure:
    """Completion length over steps, one line per run (``store.metrics`` frame: run_id, step, ...);
    ``labels`` maps run ids to legend names (e.g. their aggregation mode)."""
    if column not in metrics.columns:
        raise ValueError(f"metrics has no column {column!r}; columns: {', '.join(map(str, metrics.columns))}")
    labels = labels or {}
    fig = go.Figure()
    for run, part in metrics.groupby("run_id", sort=False):
        part = part.sort_values("step")
        fig.add_trace(go.Scatter(x=part["step"], y=part[column], mode="lines", name=labels.get(run, run)))
    fig.update_layout(xaxis_title="step", yaxis_title=column, height=380, margin={"t": 30})
    return fig
