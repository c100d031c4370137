"""PPO-region lab: the clipped objective and its gradient against the ratio, and where a run's
tokens actually fell.

Pure builders: numbers come from ``workbench.core`` (``compute_policy_loss`` evaluated on a grid
of ratios, gradients by autograd), figures are plotly. The six regions are the RLHF book's cases
(Lambert, *RLHF*, policy-gradient chapter, "Understanding the PPO objective"): for A > 0 and
A < 0, the ratio R below 1 - eps, inside the trust region, or above 1 + eps. verl's dual clip c
splits the sixth case (A < 0, R > 1 + eps) once more at R = c.

Gradients are shown per unit of log-probability, dJ/d log pi = R A inside the trust region (the
book's "grad R A", since grad R = R grad log pi): that is the number the backward pass hands to
the model, and it is comparable across PPO, GSPO and CISPO.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from workbench.core import REGION_NAMES, PolicyLossConfig, compute_policy_loss, dual_clip_cap

REGION_COLORS: dict[str, str] = {
    "trust": "#2ca02c",
    "clipped_high": "#d62728",
    "clipped_low": "#1f77b4",
    "dual_clipped": "#9467bd",
    "masked": "#7f7f7f",
}
RUN_SYMBOLS = ("circle", "x", "diamond", "triangle-up", "square", "star", "cross", "hexagon")
LOSS_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
FLOW_FILL, STOP_FILL, DUAL_FILL = "rgba(44,160,44,0.10)", "rgba(127,127,127,0.22)", "rgba(148,103,189,0.22)"


@dataclass(frozen=True)
class BookRegion:
    """One case of the clipped objective (RLHF book numbering, 1-3 for A > 0, 4-6 for A < 0)."""

    number: int
    sign: int  # +1 (A > 0) or -1 (A < 0)
    ratio_range: str
    objective: str
    gradient_flows: bool
    what_happens: str
    core_label: str  # the workbench.core region label of its tokens


BOOK_REGIONS: tuple[BookRegion, ...] = (
    BookRegion(1, +1, "R < 1 - eps_low", "R A", True, "normal policy-gradient update: increase likelihood", "trust"),
    BookRegion(2, +1, "1 - eps_low <= R <= 1 + eps_high", "R A", True, "trust region: normal update, increase likelihood", "trust"),
    BookRegion(3, +1, "R > 1 + eps_high", "(1 + eps_high) A", False, "clipped, NO UPDATE: the action is already more likely", "clipped_high"),
    BookRegion(4, -1, "R < 1 - eps_low", "(1 - eps_low) A", False, "clipped, NO UPDATE: the action is already less likely", "clipped_low"),
    BookRegion(5, -1, "1 - eps_low <= R <= 1 + eps_high", "R A", True, "trust region: normal update, decrease likelihood", "trust"),
    BookRegion(6, -1, "R > 1 + eps_high", "R A  (c A beyond the dual clip c: loss -c A)", True,
               "normal update, decrease likelihood (dual clip: no update once R > c)", "trust / dual_clipped"),
)


def book_regions_table() -> pd.DataFrame:
    """The six cases as a table for the page."""
    return pd.DataFrame(
        [{"case": r.number, "advantage": "A > 0" if r.sign > 0 else "A < 0", "ratio": r.ratio_range,
          "objective": r.objective, "gradient": "flows" if r.gradient_flows else "0", "what happens": r.what_happens,
          "core label": r.core_label} for r in BOOK_REGIONS]
    )


# ---------------------------------------------------------------------------------------------
# analytic curves (core evaluated on a grid)


def ratio_grid(r_min: float = 0.05, r_max: float = 2.5, n: int = 491) -> torch.Tensor:
    """Evenly spaced ratios (n,), float64, strictly positive (log R must exist)."""
    if not 0 < r_min < r_max:
        raise ValueError(f"ratio range r_min={r_min}, r_max={r_max}: need 0 < r_min < r_max")
    return torch.linspace(r_min, r_max, n, dtype=torch.float64)


def objective_and_gradient(loss: str, ratios: torch.Tensor, advantage: float, cfg: PolicyLossConfig):
    """J(R) = -loss and dJ/d log pi for one token per ratio, from ``compute_policy_loss``.

    Each ratio is its own one-token sequence (B = n, T = 1) with old log-prob 0, so log pi = log R
    and, for GSPO, the sequence ratio s equals R. ratios (n,) -> (objective (n,), grad (n,)).
    """
    logp = ratios.log().reshape(-1, 1).clone().requires_grad_(True)
    old = torch.zeros_like(logp)
    adv = torch.full_like(logp, float(advantage))
    mask = torch.ones_like(logp)
    per_token, _ = compute_policy_loss(loss, logp, old, adv, mask, cfg)
    objective = -per_token
    (grad,) = torch.autograd.grad(objective.sum(), logp)  # rows are independent: d J_i / d logp_i
    return objective.detach().reshape(-1), grad.reshape(-1)


def analytic_curves(
    losses: Mapping[str, tuple[str, PolicyLossConfig]],
    *,
    advantages: Sequence[float] = (1.0, -1.0),
    ratios: torch.Tensor | None = None,
) -> pd.DataFrame:
    """Long table (loss, advantage, ratio, objective, gradient): for each label of ``losses``
    (label -> (registered loss name, its config)) and each advantage value, one token's J(R) and
    dJ / d log pi. Only for losses whose per-token value is a function of the token's ratio alone
    (clip, GSPO / GMPO on one-token sequences, CISPO, SAPO, REINFORCE, GPG)."""
    ratios = ratio_grid() if ratios is None else ratios
    frames = []
    for label, (name, loss_cfg) in losses.items():
        for a in advantages:
            obj, grad = objective_and_gradient(name, ratios, a, loss_cfg)
            frames.append(pd.DataFrame({"loss": label, "advantage": float(a), "ratio": ratios.numpy(),
                                        "objective": obj.numpy(), "gradient": grad.numpy()}))
    return pd.concat(frames, ignore_index=True)


def region_bands(cfg: PolicyLossConfig, sign: int, r_max: float) -> list[tuple[float, float, str, str]]:
    """Ratio intervals of the book's cases for one sign of A: (lo, hi, label, fill)."""
    lo, hi = 1.0 - cfg.eps_low, 1.0 + cfg.eps_high
    if sign > 0:
        return [(0.0, lo, "1: R<1-eps, update", FLOW_FILL), (lo, hi, "2: trust region", FLOW_FILL),
                (hi, r_max, "3: clipped, no update", STOP_FILL)]
    cap = dual_clip_cap(cfg)
    bands = [(0.0, lo, "4: clipped, no update", STOP_FILL), (lo, hi, "5: trust region", FLOW_FILL)]
    if cap is None or cap >= r_max:
        bands.append((hi, r_max, "6: R>1+eps, update", FLOW_FILL))
    else:
        bands += [(hi, cap, "6: R>1+eps, update", FLOW_FILL), (cap, r_max, "6': dual clip, no update", DUAL_FILL)]
    return bands


def analytic_figure(curves: pd.DataFrame, cfg: PolicyLossConfig | None = None) -> go.Figure:
    """2 x 2 grid: rows A > 0 / A < 0, columns objective / gradient, one line per loss (colour and
    dash by its order in ``curves``); the book's regions of PPO clip with ``cfg`` shaded, if given."""
    advantages = sorted(curves["advantage"].unique(), reverse=True)
    fig = make_subplots(rows=len(advantages), cols=2, shared_xaxes=True, horizontal_spacing=0.08, vertical_spacing=0.1,
                        subplot_titles=[f"{what}, A = {a:g}" for a in advantages for what in ("objective J(R)", "dJ / d log pi")])
    r_max = float(curves["ratio"].max())
    labels = list(dict.fromkeys(curves["loss"]))
    colors = {label: qualitative.Plotly[i % len(qualitative.Plotly)] for i, label in enumerate(labels)}
    dashes = {label: LOSS_DASHES[i % len(LOSS_DASHES)] for i, label in enumerate(labels)}
    for row, a in enumerate(advantages, start=1):
        for loss, part in curves[curves["advantage"] == a].groupby("loss", sort=False):
            for col, y in ((1, "objective"), (2, "gradient")):
                fig.add_trace(go.Scatter(x=part["ratio"], y=part[y], mode="lines", name=loss, legendgroup=loss,
                                         showlegend=(row == 1 and col == 1),
                                         line={"dash": dashes[loss], "color": colors[loss]}),
                              row=row, col=col)
        if cfg is None:
            continue
        # shading after the traces: plotly skips shapes on subplots that hold no data yet
        for lo, hi, label, fill in region_bands(cfg, 1 if a > 0 else -1, r_max):
            for col in (1, 2):
                # the label on the objective only: any annotation_* argument makes an annotation,
                # and one without text is drawn as plotly.js's placeholder "new text"
                label_kw = ({"annotation_text": label, "annotation_position": "top left", "annotation_font_size": 10}
                            if col == 1 else {})
                fig.add_vrect(x0=lo, x1=hi, fillcolor=fill, line_width=0, layer="below", row=row, col=col, **label_kw)
    fig.update_xaxes(title_text="ratio R = pi / pi_old", row=len(advantages))
    fig.update_layout(height=320 * len(advantages), margin={"t": 40, "b": 40}, legend={"orientation": "h", "y": -0.12})
    return fig


# ---------------------------------------------------------------------------------------------
# empirical: a run's diagnostics events


def token_points(diag: Mapping) -> pd.DataFrame:
    """One row per completion token of a diagnostics payload (the engine's ``diagnostics`` event:
    ratio, advantage, mask, loss_mask, region, zero_grad, length, region_names as lists).

    Columns seq, pos, ratio, advantage, region (a name from ``region_names``, ``masked`` where
    the loss mask dropped the token), zero_grad, length. Padding is left out.
    """
    names = list(diag.get("region_names") or REGION_NAMES)
    ratio = torch.as_tensor(diag["ratio"], dtype=torch.float64)
    mask = torch.as_tensor(diag["mask"]).bool()
    rows, cols = torch.nonzero(mask, as_tuple=True)
    region = torch.as_tensor(diag["region"], dtype=torch.int64)[rows, cols]
    lengths = mask.sum(dim=1)
    return pd.DataFrame({
        "seq": rows.numpy(), "pos": cols.numpy(),
        "ratio": ratio[rows, cols].numpy(),
        "advantage": torch.as_tensor(diag["advantage"], dtype=torch.float64)[rows, cols].numpy(),
        "region": [names[c] if c >= 0 else "masked" for c in region.tolist()],
        "zero_grad": torch.as_tensor(diag["zero_grad"]).bool()[rows, cols].numpy(),
        "length": lengths[rows].numpy(),
    })


def zero_grad_fraction(points: pd.DataFrame) -> float:
    """Fraction of completion tokens whose policy gradient was exactly zero."""
    return float(points["zero_grad"].mean()) if len(points) else 0.0


def region_counts(points: pd.DataFrame) -> dict[str, int]:
    return {str(k): int(v) for k, v in points["region"].value_counts().items()}


def region_scatter(points_by_run: Mapping[str, pd.DataFrame], cfg: PolicyLossConfig | None = None) -> go.Figure:
    """Every token's (ratio, advantage), coloured by region, one marker symbol per run, all runs on
    the same axes; the book's six cases shaded in the (R, A) plane when ``cfg`` is given."""
    fig = go.Figure()
    a_max = max([float(p["advantage"].abs().max()) for p in points_by_run.values() if len(p)] + [1.0]) * 1.1
    r_max = max([float(p["ratio"].max()) for p in points_by_run.values() if len(p)] + [1.5]) * 1.05
    if cfg is not None:
        for sign, (y0, y1) in ((1, (0.0, a_max)), (-1, (-a_max, 0.0))):
            for lo, hi, label, fill in region_bands(cfg, sign, r_max):
                fig.add_shape(type="rect", x0=lo, x1=hi, y0=y0, y1=y1, fillcolor=fill, line_width=0, layer="below")
                fig.add_annotation(x=(lo + hi) / 2, y=y1 if sign > 0 else y0, text=label.split(":")[0], showarrow=False,
                                   yanchor="top" if sign > 0 else "bottom", font={"size": 11})
    for i, (run, points) in enumerate(points_by_run.items()):
        frac = zero_grad_fraction(points)
        for region, part in points.groupby("region", sort=True):
            fig.add_trace(go.Scatter(
                x=part["ratio"], y=part["advantage"], mode="markers",
                name=f"{run}: {region}" if len(points_by_run) > 1 else region,
                legendgroup=run, legendgrouptitle_text=f"{run} (zero grad {frac:.1%})",
                marker={"color": REGION_COLORS.get(region, "#000"), "symbol": RUN_SYMBOLS[i % len(RUN_SYMBOLS)], "size": 7,
                        "opacity": 0.75},
                customdata=part[["seq", "pos", "zero_grad"]].to_numpy(),
                hovertemplate="R=%{x:.4f}<br>A=%{y:.4f}<br>seq %{customdata[0]} token %{customdata[1]}<br>zero grad %{customdata[2]}",
            ))
    fig.update_layout(xaxis_title="ratio R", yaxis_title="advantage A", height=480, margin={"t": 30})
    return fig


def region_shares(diags_by_step: Mapping[int, Mapping]) -> pd.DataFrame:
    """Share of each region (and of zero-gradient tokens) among completion tokens, per step.
    -> columns step, region, share (shares of one step sum to 1 over regions)."""
    rows = []
    for step in sorted(diags_by_step):
        points = token_points(diags_by_step[step])
        total = max(len(points), 1)
        names = list(diags_by_step[step].get("region_names") or REGION_NAMES) + ["masked"]
        counts = region_counts(points)
        rows += [{"step": step, "region": name, "share": counts.get(name, 0) / total} for name in names]
        rows.append({"step": step, "region": "zero_grad", "share": zero_grad_fraction(points)})
    return pd.DataFrame(rows, columns=["step", "region", "share"])


def region_share_figure(shares_by_run: Mapping[str, pd.DataFrame], regions: Sequence[str] | None = None) -> go.Figure:
    """Region shares over steps: one line per (run, region); runs distinguished by dash."""
    dashes = ("solid", "dash", "dot", "dashdot", "longdash")
    fig = go.Figure()
    for i, (run, shares) in enumerate(shares_by_run.items()):
        for region, part in shares.groupby("region", sort=False):
            if regions is not None and region not in regions:
                continue
            fig.add_trace(go.Scatter(x=part["step"], y=part["share"], mode="lines+markers", name=f"{run}: {region}",
                                     line={"color": REGION_COLORS.get(region, "#000"), "dash": dashes[i % len(dashes)]}))
    fig.update_layout(xaxis_title="step", yaxis_title="share of tokens", yaxis_range=[0, 1], height=380, margin={"t": 30})
    return fig
