"""Curve smoothing as TensorBoard and W&B draw it: a debiased exponential moving average.

One function (``ema``) used by every chart that smooths: the per-run view, the arms view (each
seed smoothed before the mean and band over seeds: ``bands.mean_curve_with_band``'s
``smoothing``) and the comparison report. The verdict table never smooths: a run's score is the
mean of its raw logged values over the final window (``RAW_VERDICT_NOTE`` says so under it).

Below viz and runs (pure numpy / scipy), so the analysis captions can name the weight.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

MAX_SMOOTHING = 0.99  # the slider's and ``--smooth``'s upper end (TensorBoard's slider stops at 0.999)
RAW_VERDICT_NOTE = "verdicts use the raw logged values (smoothing applies to the curves only)"


def check_smoothing(weight, field: str = "smoothing") -> float:
    """``weight`` as a float when it is a finite number in [0, ``MAX_SMOOTHING``]; ValueError in
    one line naming ``field``, the value and what is allowed otherwise."""
    ok = isinstance(weight, (int, float, np.integer, np.floating)) and not isinstance(weight, (bool, np.bool_))
    if not ok or not math.isfinite(weight) or not 0.0 <= weight <= MAX_SMOOTHING:
        raise ValueError(f"{field}={weight!r} is not allowed; an EMA weight from 0 (off) to {MAX_SMOOTHING:g}")
    return float(weight)


def ema(values, weight: float) -> np.ndarray:
    """TensorBoard's smoothing (``resmoothDataset`` of its line chart; W&B's EMA is the same).

    With w = ``weight`` and x_t the finite values in order (s_0 = 0, n_t = finite values so far):

        s_t = w s_{t-1} + (1 - w) x_t
        smoothed_t = s_t / (1 - w^{n_t})     (debiasing: the first point is x_0, not (1 - w) x_0)

    i.e. the weighted mean sum_i w^(t-i) x_i / sum_i w^(t-i) of the values so far. A non-finite
    value (NaN: the metric was not logged at that step; +-inf) is returned as it is and does not
    advance the average. A series whose values are all equal is returned unchanged (TensorBoard's
    constant-series rule: the division above would be off by an ulp). ``weight`` in
    [0, ``MAX_SMOOTHING``]: 0 returns the values unchanged.

    values: (N,) -> (N,) float64, a new array.
    """
    weight = check_smoothing(weight)
    x = np.array(values, dtype=np.float64)
    ok = np.isfinite(x)
    if weight == 0.0 or not ok.any() or np.all(x == x[0]):
        return x
    x[ok] = _debiased_ema(x[ok][None, :], weight)[0]
    return x


def _debiased_ema(rows: np.ndarray, weight: float) -> np.ndarray:
    """``ema``'s two lines on finite values, row by row: s_t = w s_{t-1} + (1 - w) x_t, then
    s_t / (1 - w^{n_t}). rows: (R, N) finite -> (R, N)."""
    from scipy.signal import lfilter  # the recursion as an IIR filter (b = [1 - w], a = [1, -w])

    # a Python loop took ~0.4 s for the 30 seeds x 16 metrics x 1,000 steps of the arms view; w^n
    # as a running product (within ~n ulp of pow, and 2x faster than the filter itself)
    s = lfilter([1.0 - weight], [1.0, -weight], rows, axis=-1)
    return s / (1.0 - np.cumprod(np.full(rows.shape[-1], weight)))


def ema_rows(rows, weight: float) -> np.ndarray:
    """``ema`` of each row of ``rows``, the same numbers, in one filter call for all rows (the arms
    view smooths 30 seeds x 11 charts per redraw: a call per seed cost ~0.2 ms each).

    rows: (R, N) -> (R, N) float64, a new array. A row with a non-finite value goes through ``ema``
    alone (its average skips those values; the rows would no longer share one w^n)."""
    weight = check_smoothing(weight)
    x = np.array(rows, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"rows of shape {x.shape} are not allowed; a 2-d array (runs, values)")
    if weight == 0.0 or not x.size:
        return x
    plain = np.isfinite(x).all(axis=1) & ~(x == x[:, :1]).all(axis=1)  # rows ema filters (not constant)
    x[plain] = _debiased_ema(x[plain], weight)
    for i in np.flatnonzero(~np.isfinite(x).all(axis=1)):
        x[i] = ema(x[i], weight)
    return x


class EMA(NamedTuple):
    """The smoothing of the charts as a ``bands.Smoother``: ``EMA(w)(values)`` is ``ema(values, w)``
    for one seed, ``EMA(w).rows(values)`` is ``ema_rows`` for many of one length at once."""

    weight: float

    def __call__(self, values) -> np.ndarray:
        return ema(values, self.weight)

    def rows(self, rows) -> np.ndarray:
        return ema_rows(rows, self.weight)


def smoothing_caption(weight: float) -> str:
    """What a chart's caption says of its smoothing: '' when off, else e.g. 'each seed smoothed
    first (EMA weight 0.6, debiased as in TensorBoard), then averaged: the band spreads the
    smoothed seeds'."""
    weight = check_smoothing(weight)
    if weight == 0.0:
        return ""
    return (f"each seed smoothed first (EMA weight {weight:g}, debiased as in TensorBoard), then averaged: "
            "the band spreads the smoothed seeds")
