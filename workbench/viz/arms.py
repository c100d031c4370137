"""The arms view of Live / Compare and the sweep view: figures over arms x seeds (no Streamlit).

Input is ``RunStore.arm_metrics(...)``: one row per (run, step) with ``run_id``, ``arm``, ``seed``,
``step``, ``time`` and the logged metrics. Per arm a panel draws the mean curve over its seeds and
the 95% confidence band around it (``workbench.analysis.mean_curve_with_band``: each seed is
smoothed first, then seeds are averaged), optionally each seed as a faint line. The statistics
live in ``workbench.analysis``; this module only draws them.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.analysis import aggregation_caption, mean_curve_with_band
from workbench.viz.curves import LEGEND_PLACE, TITLE_PLACE, X_LABELS, Panel, colour, ema, plotted, resolve_panel, with_x

BAND_ALPHA = 0.2  # the band's fill opacity: the mean line stays readable on top of it
SEED_OPACITY = 0.3
_DASHES = ("solid", "dash", "dot", "dashdot")  # distinguishes the metrics of one panel; colours distinguish arms


class ArmChart(NamedTuple):
    """One panel of the arms view: its figure and the caption saying what each curve aggregates."""

    figure: go.Figure
    caption: str


def fill_colour(hex_colour: str, alpha: float = BAND_ALPHA) -> str:
    """'#636efa' -> 'rgba(99,110,250,0.2)'."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def band_polygon(xs: np.ndarray, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The closed outline of a band for a ``fill="toself"`` trace: along x on ``high``, back on
    ``low``. Points where the band is undefined (NaN: fewer than 2 seeds) are left out; each
    stretch of defined points is its own polygon, stretches separated by a NaN (a gap plotly
    closes each side of). xs, low, high: (N,) -> (x, y), each (M,) float64; empty if no band."""
    ok = np.isfinite(low) & np.isfinite(high)
    starts = np.flatnonzero(ok & ~np.r_[False, ok[:-1]])
    ends = np.flatnonzero(ok & ~np.r_[ok[1:], False]) + 1
    px, py = [], []
    for start, end in zip(starts, ends):
        sl = slice(start, end)
        px += [xs[sl], xs[sl][::-1], [np.nan]]
        py += [high[sl], low[sl][::-1], [np.nan]]
    if not px:
        return np.empty(0), np.empty(0)
    return np.concatenate(px[:-1]).astype(np.float64), np.concatenate(py[:-1]).astype(np.float64)


def _smoother(smoothing: float):
    return partial(ema, weight=smoothing) if smoothing > 0 else None


def _seed_traces(df: pd.DataFrame, arm: str, metric: str, x: str, smoothing: float, name: str, line: dict):
    """The arm's seeds as faint lines (each smoothed as it is before averaging)."""
    rows = df[(df["arm"] == arm) & df[metric].notna()]
    for (run_id, seed), run in rows.groupby(["run_id", "seed"], sort=False, dropna=False):
        ys = run[metric].to_numpy(dtype=np.float64)
        yield go.Scatter(x=run[x].to_numpy(dtype=np.float64), y=plotted(ema(ys, smoothing) if smoothing > 0 else ys),
                         name=f"{name} · seed {seed}", mode="lines", showlegend=False, opacity=SEED_OPACITY,
                         line={**line, "width": 1}, legendgroup=name, hoverinfo="skip")


def _arm_chart(frame: pd.DataFrame, panel: Panel, arms: list[str], x: str, smoothing: float, show_seeds: bool,
               confidence: float, height: int) -> ArmChart:
    """``arm_figure`` of a frame that already has its ``x`` column, arms in colour order."""
    present = [m for m in panel.metrics if m in frame.columns and frame[m].notna().any()]
    fig, captions = go.Figure(), []
    for m, metric in enumerate(present):
        curve = mean_curve_with_band(frame, metric, x, smoothing=_smoother(smoothing), confidence=confidence)
        captions.append(aggregation_caption(curve, x, confidence))
        for arm, rows in curve.groupby("arm", sort=False):
            name = arm if len(present) == 1 else f"{arm} · {metric.split('/', 1)[-1]}"
            hue = colour(arms.index(arm))
            line = {"color": hue, "dash": _DASHES[m % len(_DASHES)], "width": 2}
            if show_seeds:
                fig.add_traces(list(_seed_traces(frame, arm, metric, x, smoothing, name, line)))
            bx, by = band_polygon(*(rows[c].to_numpy(dtype=np.float64) for c in ("x", "ci_low", "ci_high")))
            if len(bx):
                fig.add_trace(go.Scatter(x=bx, y=plotted(by), name=f"{name} ({confidence:.0%} CI)", mode="lines",
                                         fill="toself", fillcolor=fill_colour(hue), line={"width": 0},
                                         showlegend=False, legendgroup=name, hoverinfo="skip"))
            fig.add_trace(go.Scatter(x=rows["x"].to_numpy(dtype=np.float64), y=plotted(rows["mean"]),
                                     customdata=rows["n_seeds"].to_numpy(), name=name, mode="lines", line=line,
                                     legendgroup=name,
                                     hovertemplate="%{y:.4g} (mean of %{customdata} seeds)<extra>" + name + "</extra>"))
    fig.update_layout(
        title={"text": panel.title, "font": {"size": 14}, **TITLE_PLACE}, height=height,
        margin={"l": 40, "r": 10, "t": 70, "b": 40}, xaxis_title=X_LABELS[x], legend=LEGEND_PLACE,
        uirevision="keep")
    return ArmChart(fig, captions[0] if captions else "")


def arm_figures(df: pd.DataFrame, panels: list[str], *, x: str = "step", smoothing: float = 0.0,
                show_seeds: bool = False, confidence: float = 0.95, height: int = 300) -> dict[str, ArmChart]:
    """``arm_figure`` of each chart key (``PANELS`` key or ``metric:NAME``), in the given order
    (the x values computed once)."""
    frame = with_x(df, x)
    arms = [str(a) for a in pd.unique(frame["arm"])]  # vectorised: iterating 30k arrow strings took ~20 ms
    return {key: _arm_chart(frame, resolve_panel(key), arms, x, smoothing, show_seeds, confidence, height) for key in panels}


def arm_figure(df: pd.DataFrame, panel: Panel | str, **kwargs) -> ArmChart:
    """One panel over arms: per (arm, metric present) a filled band trace (``ARM (95% CI)``, not in
    the legend, where >= 2 seeds), then the mean line (``ARM``, or ``ARM · metric`` in panels of
    several metrics; its hover gives the seeds behind each point); with ``show_seeds`` each seed
    first as a faint line (``ARM · seed S``). Arms keep one colour across panels (order of first
    appearance in ``df``). The caption is ``aggregation_caption`` of the panel's first metric.
    kwargs: ``x`` (an ``X_AXES`` key), ``smoothing`` (EMA weight, each seed smoothed before the
    mean), ``show_seeds``, ``confidence``, ``height``."""
    panel = resolve_panel(panel) if isinstance(panel, str) else panel
    frame = with_x(df, kwargs.get("x", "step"))
    arms = [str(a) for a in pd.unique(frame["arm"])]
    return _arm_chart(frame, panel, arms, **{"x": "step", "smoothing": 0.0, "show_seeds": False, "confidence": 0.95,
                                              "height": 300, **kwargs})


def sweep_figures(table: pd.DataFrame, metric: str, height: int = 300) -> dict[str, go.Figure]:
    """One figure per swept field from ``workbench.analysis.sweep_table``: the final ``metric``
    against the field's values, mean with its CI as error bars, a trace per combination of the
    other swept fields (``others``; ``all`` pools them: the field's main effect). Numeric values
    on a numeric axis, others as categories in sweep order."""
    figures = {}
    for field, rows in table.groupby("field", sort=False):
        fig = go.Figure()
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in rows["value"])
        for i, (others, group) in enumerate(rows.groupby("others", sort=False)):
            xs = group["value"].tolist() if numeric else [str(v) for v in group["value"]]
            mean = group["mean"].to_numpy(dtype=np.float64)
            fig.add_trace(go.Scatter(
                x=xs, y=mean, name=others or metric, mode="lines+markers" if numeric else "markers",
                line={"color": colour(i), "dash": "dot" if others == "all" else "solid"},
                error_y={"type": "data", "symmetric": False, "array": group["ci_high"].to_numpy(dtype=np.float64) - mean,
                         "arrayminus": mean - group["ci_low"].to_numpy(dtype=np.float64)},
                customdata=group["n"].to_numpy(),
                hovertemplate="%{y:.4g} (%{customdata} seeds)<extra>" + (others or metric) + "</extra>"))
        fig.update_layout(title={"text": f"{metric} (final window) vs {field}", "font": {"size": 14}, **TITLE_PLACE},
                          height=height, margin={"l": 40, "r": 10, "t": 70, "b": 40}, xaxis_title=field,
                          yaxis_title=metric, legend=LEGEND_PLACE,
                          xaxis={"type": "linear" if numeric else "category"})
        figures[str(field)] = fig
    return figures
