"""The arms view of Live / Compare and the sweep view: figures over arms x seeds (no Streamlit).

Input is ``RunStore.arm_metrics(...)``: one row per (run, step) with ``run_id``, ``arm``, ``seed``,
``step``, ``time`` and the logged metrics. Per arm a panel draws the mean curve over its seeds and
a band around it (``workbench.analysis.mean_curve_with_band``: each seed is smoothed first, then
seeds are averaged; the 95% t-interval by default, or +-1 SE, or min-max, clipped to the metric's
range from ``Panel.meta``), optionally each seed as a faint line. The statistics live in
``workbench.analysis``; this module only draws them. The page around the charts draws one legend
(``legend_html``): an arm has one colour on every chart, and the charts keep their whole width.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.analysis import aggregation_caption
from workbench.analysis.bands import BANDS, Curve, FrameCodes, clip_note, curve_arrays, frame_codes
from workbench.analysis.smoothing import EMA, check_smoothing
from workbench.viz.wire import WireFigure, narrowed
from workbench.viz.curves import (_DASHES, LEGEND_PLACE, LEGEND_SIDE, TITLE_PLACE, X_LABELS, Panel, colour, drawn_metrics,
                                  ema, line_styles, plotted, resolve_panel, with_x, y_range)

BAND_ALPHA = 0.2  # the band's fill opacity: the mean line stays readable on top of it
SEED_OPACITY = 0.3


class ArmChart(NamedTuple):
    """One panel of the arms view: its figure, the caption saying what each curve aggregates (band
    and seeds), and which line style is which metric ("" for a one-metric chart: the page's legend
    names the arms, so a chart names only its metrics)."""

    figure: go.Figure
    caption: str
    styles: str = ""
    note: str = ""  # 'band clipped to the metric's range [0, 1]' where it has one (``clip_note``)


# Points drawn per curve at most: the plot area's width in pixels of a chart of the page's
# 2-column grid in a 1,400-px window (~400 px), so a curve never has more points than pixel
# columns to draw them on. A longer curve is cut into buckets of k consecutive points and keeps,
# per bucket, the points where the mean is lowest and highest and where the band reaches lowest
# and highest (``keep_extremes``): a one-step spike of the mean or of the band is drawn at its
# height, never stepped over as taking every k-th point would (a reward collapse at one step of
# 1,000 vanished from the chart). The statistics at a kept point are computed from all seeds'
# full curves (smoothing included) first: thinning picks rows, it never averages or changes them.
MAX_POINTS = 400
EXTREMES_PER_BUCKET = 4  # the mean's min and max, the band's lowest low and highest high


@lru_cache(maxsize=256)
def fill_colour(hex_colour: str, alpha: float = BAND_ALPHA) -> str:
    """'#636efa' -> 'rgba(99,110,250,0.2)'."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def band_polygon(xs: np.ndarray, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The closed outline of a band for a ``fill="toself"`` trace: along x on ``high``, back on
    ``low``. Points where the band is undefined (NaN: fewer than 2 seeds) are left out; each
    stretch of defined points is its own polygon, stretches separated by a NaN (a gap plotly
    closes each side of). xs, low, high: (N,) -> (x, y), each (M,) float64 (x as ``xs``, integers
    kept, where the band is one stretch: no NaN to separate); empty if no band."""
    ok = np.isfinite(low) & np.isfinite(high)
    if ok.all() and len(ok):  # one stretch (a band everywhere): what the loop below makes of it, directly
        return np.concatenate([xs, xs[::-1]]), np.concatenate([high, low[::-1]]).astype(np.float64)
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


def _bucket_extreme(values: np.ndarray, k: int, pick) -> np.ndarray:
    """Per row and bucket of k consecutive points, the index (in its row) of ``pick``'s (np.argmin
    / np.argmax) value, NaN never chosen over a number (an all-NaN bucket gives its first point).
    (A, N) -> (A, ceil(N/k))."""
    a, n = values.shape
    buckets = -(-n // k)
    worst = np.inf if pick is np.argmin else -np.inf  # padding and NaN lose against every number
    if n == buckets * k and not np.isnan(values).any():  # nothing to pad or replace: no copy
        padded = values
    else:
        padded = np.full((a, buckets * k), worst)
        padded[:, :n] = np.where(np.isnan(values), worst, values)
    return np.arange(buckets) * k + pick(padded.reshape(a, buckets, k), axis=2)


def kept_points(mean: np.ndarray, low: np.ndarray, high: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """``keep_extremes`` of A curves of one length at once, as a mask: (A, N) each -> (A, N) bool."""
    a, n = mean.shape
    if n <= max_points:
        return np.ones((a, n), dtype=bool)
    k = -(-n // max(1, max_points // EXTREMES_PER_BUCKET))
    keep, row = np.zeros((a, n), dtype=bool), np.arange(a)[:, None]
    for values, pick in ((mean, np.argmin), (mean, np.argmax), (low, np.argmin), (high, np.argmax)):
        keep[row, _bucket_extreme(values, k, pick)] = True
    keep[:, [0, n - 1]] = True
    return keep


def keep_extremes(mean: np.ndarray, low: np.ndarray, high: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices (ascending) of the points of a curve drawn when it has more than ``max_points``:
    the curve is cut into buckets of k = ceil(N / (max_points / EXTREMES_PER_BUCKET)) consecutive
    points and each bucket keeps its points of lowest and highest ``mean``, of lowest ``low`` and
    of highest ``high`` (NaN where the band is undefined is never preferred), plus the curve's
    first and last point. Every spike of the mean or of the band's edges is kept at its height
    (min/max per bucket, as a renderer decimating to pixel columns does), so a curve drawn from
    the kept points looks as the full one does at the chart's width. mean, low, high: (N,) ->
    (K,) int, K <= max_points + 2; all N points when N <= max_points."""
    return np.flatnonzero(kept_points(mean[None], low[None], high[None], max_points)[0])


def _seed_hover(n_seeds: np.ndarray, name: str) -> dict:
    """A mean line's hover: its value and the seeds behind it. Per point (``customdata``) where the
    count changes along the line (live runs at different steps); written into the template where
    every point has the same count (finished runs: one array fewer of 2-3 sent per arm and chart
    on every redraw). n_seeds: (K,) int."""
    tail = " seeds)<extra>" + name + "</extra>"
    if len(n_seeds) and (n_seeds == n_seeds[0]).all():
        return {"hovertemplate": f"%{{y:.4g}} (mean of {int(n_seeds[0])}" + tail}
    return {"customdata": n_seeds, "hovertemplate": "%{y:.4g} (mean of %{customdata}" + tail}


def _smoother(smoothing: float):
    """The per-seed smoother ``mean_curve_with_band`` applies before averaging (None: raw)."""
    return EMA(smoothing) if smoothing > 0 else None


def _seed_traces(df: pd.DataFrame, arm: str, metric: str, x: str, smoothing: float, name: str, line: dict):
    """The arm's seeds as faint lines (each smoothed as it is before averaging)."""
    rows = df[(df["arm"] == arm) & df[metric].notna()]
    for (run_id, seed), run in rows.groupby(["run_id", "seed"], sort=False, dropna=False):
        ys = run[metric].to_numpy(dtype=np.float64)
        yield {"type": "scatter", "x": run[x].to_numpy(dtype=np.float64),
               "y": plotted(ema(ys, smoothing) if smoothing > 0 else ys), "name": f"{name} · seed {seed}",
               "mode": "lines", "showlegend": False, "opacity": SEED_OPACITY, "line": {**line, "width": 1},
               "legendgroup": name, "hoverinfo": "skip"}


def _arm_rows(curve: Curve):
    """Yield (arm, columns) per arm of ``curve`` (arms in its order), each column thinned to about
    ``MAX_POINTS`` keeping every spike (``keep_extremes``): x (integers where every x is a whole
    number, as steps are: the narrowest type that holds them all, ``wire.narrowed``; else float64),
    mean, ci_low, ci_high (float64), n_seeds, and the mean and edges as drawn (``plotted``:
    drawn_mean, drawn_low, drawn_high).
    Every arm's kept rows are taken and rounded in one call per column, then cut per arm (views):
    a take per arm and column was ~80 small numpy calls per chart."""
    slices = curve.arm_slices()
    keeps = _kept_rows(curve, slices)
    kept = np.concatenate(keeps) if keeps else np.empty(0, dtype=np.intp)
    columns = {"x": curve.x[kept], "mean": curve.mean[kept], "ci_low": curve.ci_low[kept],
               "ci_high": curve.ci_high[kept], "n_seeds": curve.n_seeds[kept]}
    columns.update(drawn_mean=plotted(columns["mean"]), drawn_low=plotted(columns["ci_low"]),
                   drawn_high=plotted(columns["ci_high"]))
    whole = columns["x"].astype(np.int64)
    if (whole == columns["x"]).all():  # steps: sent as plotly.js integers (int16 for < 32,768 steps,
        columns["x"] = narrowed(whole)  # a quarter of float64's bytes in every live redraw), the same values
    ends = np.cumsum([len(keep) for keep in keeps])
    for (arm, _), end, length in zip(slices, ends, map(len, keeps)):
        yield arm, {name: values[end - length:end] for name, values in columns.items()}


def _kept_rows(curve: Curve, slices: list[tuple[str, slice]]) -> list[np.ndarray]:
    """Per arm slice, the curve's row indices ``keep_extremes`` keeps of it; arms of one length
    (every arm, once runs have finished) thinned in one call."""
    lengths = {rows.stop - rows.start for _, rows in slices}
    if len(lengths) != 1:
        return [rows.start + keep_extremes(curve.mean[rows], curve.ci_low[rows], curve.ci_high[rows])
                for _, rows in slices]
    shape = (len(slices), lengths.pop())  # the slices tile the curve's rows in order
    keep = kept_points(*(getattr(curve, c).reshape(shape) for c in ("mean", "ci_low", "ci_high")))
    return [rows.start + np.flatnonzero(row) for (_, rows), row in zip(slices, keep)]


def _arm_chart(frame: pd.DataFrame, panel: Panel, colours: dict[str, str], x: str, smoothing: float,
               show_seeds: bool, confidence: float, height: int, band: str, secondary: bool, legend: bool,
               codes: FrameCodes | None = None) -> ArmChart:
    """``arm_figure`` of a frame that already has its ``x`` column; ``colours``: arm -> colour;
    ``codes``: ``frame_codes(frame)``, shared by the charts of one frame. Traces are built as plain dicts."""
    present = drawn_metrics(frame, panel, secondary)
    traces, captions, means, lows, highs = [], [], [], [], []
    for m, metric in enumerate(present):
        curve = curve_arrays(frame, metric, x, smoothing=_smoother(smoothing), confidence=confidence,
                             band=band, bounds=panel.meta(metric).bounds, codes=codes)
        captions.append(aggregation_caption(curve, x, confidence, band, smoothing))
        for arm, rows in _arm_rows(curve):
            name = arm if len(present) == 1 else f"{arm} · {metric.split('/', 1)[-1]}"
            hue = colours[arm]
            line = {"color": hue, "dash": _DASHES[m % len(_DASHES)], "width": 2}
            if show_seeds:
                traces += list(_seed_traces(frame, arm, metric, x, smoothing, name, line))
            means.append(rows["drawn_mean"]), lows.append(rows["drawn_low"]), highs.append(rows["drawn_high"])
            bx, by = band_polygon(rows["x"], rows["drawn_low"], rows["drawn_high"])
            if len(bx):
                traces.append({"type": "scatter", "x": bx, "y": by, "mode": "lines", "fill": "toself",
                               "name": f"{name} ({BANDS[band].label(confidence)})", "fillcolor": fill_colour(hue),
                               "line": {"width": 0}, "showlegend": False, "legendgroup": name, "hoverinfo": "skip"})
            traces.append({"type": "scatter", "x": rows["x"], "y": rows["drawn_mean"], "name": name, "mode": "lines",
                           "line": line, "legendgroup": name, "showlegend": legend, **_seed_hover(rows["n_seeds"], name)})
    kind = panel.meta(present[0]) if present else panel.kind
    yaxis = {"title": {"text": kind.axis}}
    if means:
        fixed = y_range(*(np.concatenate(v) for v in (means, lows, highs)), kind.bounds, drawn=True)
        if fixed:
            yaxis.update(range=fixed, autorange=False)
    # _validate=False: plotly's per-property validation of ~20 traces per chart (each array
    # copied and probed for a dataframe type) took half of the figure's time; the traces are
    # built here from a fixed set of keys, and a test validates every chart in full instead
    fig = WireFigure(_validate=False, data=traces, layout={
        "title": {"text": panel.title, "font": {"size": 14}, **TITLE_PLACE}, "height": height,
        "margin": {"l": 50, "r": 10, "t": 40, "b": 40}, "xaxis": {"title": {"text": X_LABELS[x]}}, "yaxis": yaxis,
        "showlegend": legend, "legend": LEGEND_SIDE, "uirevision": "keep"})
    return ArmChart(fig, captions[0] if captions else "", line_styles(present), clip_note(kind.bounds) if means else "")


def arm_colours(df: pd.DataFrame) -> dict[str, str]:
    """arm -> its colour on every chart of the page: arms in order of first appearance in ``df``
    (run, then step order), the i-th gets ``colour(i)``."""
    ordered = df.sort_values(["run_id", "step"], kind="stable") if len(df) else df
    return {str(a): colour(i) for i, a in enumerate(pd.unique(ordered["arm"].astype(str)))} if len(df) else {}


def arm_figures(df: pd.DataFrame, panels: list[str], *, x: str = "step", smoothing: float = 0.0,
                show_seeds: bool = False, confidence: float = 0.95, height: int = 300, band: str = "ci",
                secondary: bool = False, legend: bool = False) -> dict[str, ArmChart]:
    """``arm_figure`` of each chart key (``PANELS`` key or ``metric:NAME``), in the given order
    (the x values computed once). No chart has its own legend by default: the page draws
    ``legend_html(arm_colours(df))`` once, every arm in one colour on every chart."""
    smoothing = check_smoothing(smoothing)
    frame = with_x(df, x)  # sorted by run id, then step: its arms' order of first appearance is arm_colours'
    codes = frame_codes(frame)
    colours = {arm: colour(i) for i, arm in enumerate(codes.arms)}
    return {key: _arm_chart(frame, resolve_panel(key), colours, x, smoothing, show_seeds, confidence, height, band,
                            secondary, legend, codes) for key in panels}


def arm_figure(df: pd.DataFrame, panel: Panel | str, **kwargs) -> ArmChart:
    """One panel over arms: per (arm, metric drawn) a filled band trace (``ARM (95% CI)``, or the
    chosen band's name; not in the legend; where >= 2 seeds), then the mean line (``ARM``, or
    ``ARM · metric`` in panels of several metrics; its hover gives the seeds behind each point);
    with ``show_seeds`` each seed first as a faint line (``ARM · seed S``). Arms keep one colour
    across panels (``arm_colours``). The band is clipped to the metric's range (``Panel.meta``);
    the y-axis has the metric's unit as its title and follows the means where the band would
    swamp them (``y_range``); each curve is thinned to about ``MAX_POINTS``, keeping
    every spike (``keep_extremes``). Secondary series (min /
    max / per-region) are drawn only with ``secondary``. The caption is ``aggregation_caption`` of
    the panel's first metric drawn. kwargs: ``x`` (an ``X_AXES`` key), ``smoothing`` (EMA weight,
    each seed smoothed before the mean), ``show_seeds``, ``confidence``, ``height``, ``band`` (a
    ``BANDS`` key), ``secondary``, ``legend`` (default True here: a chart drawn alone names its
    arms in a legend right of the plot area)."""
    panel = resolve_panel(panel) if isinstance(panel, str) else panel
    options = {"x": "step", "smoothing": 0.0, "show_seeds": False, "confidence": 0.95, "height": 300, "band": "ci",
               "secondary": False, "legend": True, **kwargs}
    options["smoothing"] = check_smoothing(options["smoothing"])
    frame = with_x(df, options["x"])
    return _arm_chart(frame, panel, arm_colours(frame), **options)


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
