"""KL lab: k1, k2, k3 against the true KL(pi || ref) for two small categorical distributions.

For x ~ pi the per-sample estimators (``workbench.core.kl``) are functions of d = log ref(x) -
log pi(x). Their mean and variance are exact sums over the support (no sampling noise):

    E[k] = sum_x pi(x) k(x),   Var[k] = sum_x pi(x) (k(x) - E[k])^2,

and the mean of n i.i.d. samples has bias E[k] - KL (independent of n) and variance Var[k] / n.
k1 is unbiased; k3 is unbiased until core's clamp |k3| <= 10 (verl's) cuts outcomes where ref
is far above pi; k2 = d^2/2 is biased (its expectation is a second-order approximation of the
KL). A seeded Monte Carlo run next to the exact curves shows the same thing on samples.
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from workbench.algorithms import FAMILIES
from workbench.core import kl_per_token
from workbench.recipe import load_recipe, preset_names

# Line colours of the estimators, in the order the lab shows them (k1, k2, k3, abs, then any added later).
KL_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def lab_estimators() -> tuple[str, ...]:
    """The KL estimators the lab compares, from the specs in registry order: every registered
    estimator with a value of its own (a straight-through k1+ has k1's value, ``same_value_as``)."""
    return tuple(n for n, s in FAMILIES["kl_estimator"].specs.items() if s.same_value_as is None)


def kl_color(name: str) -> str:
    """The line colour of estimator ``name`` (its place among ``lab_estimators``)."""
    shown = lab_estimators()
    return KL_PALETTE[shown.index(name) % len(KL_PALETTE)] if name in shown else KL_PALETTE[-1]


def categorical(probs: Sequence[float], field_name: str) -> torch.Tensor:
    """Normalised probabilities (K,), float64; ValueError naming the field for bad input."""
    p = torch.tensor(list(probs), dtype=torch.float64)
    if p.ndim != 1 or len(p) < 2 or (p <= 0).any():
        raise ValueError(f"{field_name}={list(probs)}: need at least two strictly positive probabilities")
    return p / p.sum()


def normalisation_note(probs: Sequence[float], field_name: str) -> str | None:
    """What :func:`categorical` did to ``probs`` when they do not sum to 1 (None when they do,
    within float rounding): the page says so instead of renormalising silently."""
    total = float(sum(probs))
    if abs(total - 1.0) <= 1e-9:
        return None
    scaled = ", ".join(f"{p / total:.4g}" for p in probs)
    return f"{field_name} sums to {total:.6g}, not 1: divided by {total:.6g}, it is used as {scaled}."


# |bias| below this many ulps of the quantities it is the difference of is float rounding, not bias.
NOISE_ULPS = 64


def snap_rounding_noise(diff: float, *scale: float) -> float:
    """``diff`` (a difference of floats of size ``scale``), or exactly 0.0 when it is within
    NOISE_ULPS float64 ulps of them: E[k3] - KL = 1.1e-16 is rounding, and printed as a bias."""
    tolerance = NOISE_ULPS * torch.finfo(torch.float64).eps * max([1.0, *map(abs, scale)])
    return 0.0 if abs(diff) <= tolerance else diff


def true_kl(pi: torch.Tensor, ref: torch.Tensor) -> float:
    """KL(pi || ref) = sum_x pi(x) log(pi(x) / ref(x))."""
    return float((pi * (pi.log() - ref.log())).sum())


def per_outcome_estimates(pi: torch.Tensor, ref: torch.Tensor, estimator: str) -> torch.Tensor:
    """k(x) for every outcome x of the support (K,), from core's ``kl_per_token``."""
    logp, ref_logp = pi.log()[None, :], ref.log()[None, :]
    return kl_per_token(estimator, logp, ref_logp, torch.ones_like(logp))[0]


def estimator_moments(pi: torch.Tensor, ref: torch.Tensor, estimators: Sequence[str] | None = None) -> pd.DataFrame:
    """Exact single-sample mean, bias and variance of each estimator (default: ``lab_estimators``) under x ~ pi."""
    kl = true_kl(pi, ref)
    rows = []
    for name in estimators or lab_estimators():
        k = per_outcome_estimates(pi, ref, name)
        mean = float((pi * k).sum())
        rows.append({"estimator": name, "true KL": kl, "mean": mean, "bias": snap_rounding_noise(mean - kl, mean, kl),
                     "variance": float((pi * (k - mean) ** 2).sum())})
    return pd.DataFrame(rows)


def bias_variance_vs_samples(pi: torch.Tensor, ref: torch.Tensor, sample_counts: Sequence[int],
                             estimators: Sequence[str] | None = None) -> pd.DataFrame:
    """Bias and standard deviation of the n-sample mean estimate, exact, for each n and estimator.
    -> columns estimator, n, bias, std, rmse."""
    moments = estimator_moments(pi, ref, estimators)
    rows = []
    for _, m in moments.iterrows():
        for n in sample_counts:
            std = (m["variance"] / n) ** 0.5
            rows.append({"estimator": m["estimator"], "n": int(n), "bias": m["bias"], "std": std,
                         "rmse": (m["bias"] ** 2 + std ** 2) ** 0.5})
    return pd.DataFrame(rows)


def monte_carlo(pi: torch.Tensor, ref: torch.Tensor, sample_counts: Sequence[int], trials: int = 200, seed: int = 0,
                estimators: Sequence[str] | None = None) -> pd.DataFrame:
    """Seeded simulation: for each n, ``trials`` estimates from n samples x ~ pi. -> columns
    estimator, n, mean, std (over trials)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for n in sample_counts:
        x = torch.multinomial(pi.expand(trials, -1), int(n), replacement=True, generator=gen)  # (trials, n)
        logp, ref_logp = pi.log()[x], ref.log()[x]
        for name in estimators or lab_estimators():
            est = kl_per_token(name, logp, ref_logp, torch.ones_like(logp)).mean(dim=1)
            rows.append({"estimator": name, "n": int(n), "mean": float(est.mean()),
                         "std": float(est.std()) if trials > 1 else 0.0})
    return pd.DataFrame(rows)


def kl_figure(exact: pd.DataFrame, kl: float, mc: pd.DataFrame | None = None) -> go.Figure:
    """Left: mean estimate +- 1 std against n (exact bands, Monte Carlo points), true KL dashed.
    Right: std of the estimate against n (log-log)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("estimate (mean +- std) vs samples n", "std of the estimate vs n"))
    for name, part in exact.groupby("estimator", sort=False):
        c = kl_color(name)
        mean = kl + part["bias"]
        fig.add_trace(go.Scatter(x=part["n"], y=mean, mode="lines", name=f"{name} expectation", line={"color": c}), row=1, col=1)
        fig.add_trace(go.Scatter(x=list(part["n"]) + list(part["n"])[::-1], y=list(mean + part["std"]) + list(mean - part["std"])[::-1],
                                 fill="toself", line={"width": 0}, fillcolor=c, opacity=0.15, name=f"{name} +- std", showlegend=False,
                                 hoverinfo="skip"), row=1, col=1)
        fig.add_trace(go.Scatter(x=part["n"], y=part["std"], mode="lines", name=f"{name} std", line={"color": c}, showlegend=False), row=1, col=2)
    if mc is not None:
        for name, part in mc.groupby("estimator", sort=False):
            fig.add_trace(go.Scatter(x=part["n"], y=part["mean"], mode="markers", name=f"{name} Monte Carlo",
                                     marker={"color": kl_color(name), "symbol": "x"},
                                     error_y={"type": "data", "array": part["std"], "visible": True}), row=1, col=1)
    fig.add_hline(y=kl, line_dash="dash", annotation_text=f"true KL = {kl:.4f}", row=1, col=1)
    fig.update_xaxes(type="log", title_text="samples n")
    fig.update_yaxes(type="log", row=1, col=2)
    fig.update_layout(height=400, margin={"t": 40})
    return fig


def placement_table() -> pd.DataFrame:
    """Which KL estimator and placement each preset (algorithm) uses, read from recipes/."""
    rows = []
    for name in preset_names():
        a = load_recipe(name).algorithm
        rows.append({"preset": name, "kl_coef": a.kl_coef, "estimator": a.kl_estimator if a.kl_coef else "-",
                     "placement": a.kl_placement if a.kl_coef else "no KL term (no reference model)"})
    return pd.DataFrame(rows)

