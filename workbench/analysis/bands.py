"""Mean curves across seeds with a band, for the arms view of Live / Compare.

Input is a long metrics frame, one row per (run, step): ``run_id``, ``arm`` (a recipe minus its
seed, supplied by the caller), the x column and the metric. The x column is ``step`` or one the
caller adds per run (``tokens``, ``wall time``: the x-axis functions of ``workbench.viz.curves``;
this layer sits below viz and does not import it). Smoothing is the caller's function (e.g.
``workbench.analysis.smoothing.EMA(0.6)``, which also smooths many seeds of one length at once),
applied to each seed's curve before seeds are averaged, so the band shows the spread of the
smoothed curves the user sees.

Live runs are at different steps: a point aggregates the seeds that have reached it, the count is
returned with it (``n_seeds``) and the band exists only where n_seeds >= 2.

The band is one of ``BANDS`` (the 95% t-interval of the mean by default, +-1 standard error, or
the min-max over seeds), clipped to the metric's possible range when the caller gives one
(``bounds``): a fraction's band never leaves [0, 1], a length's never goes below 0.

Everything is vectorised over runs and steps (one sort, ``np.*.reduceat`` per statistic): the
arms view computes ~15 curves of 30 seeds x 1,000 steps per redraw.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np
import pandas as pd

from workbench.analysis.smoothing import smoothing_caption
from workbench.analysis.stats import check_columns, check_fraction, mean_interval

Smoother = Callable[[np.ndarray], np.ndarray]  # (N,) -> (N,): one seed's values in x order
CURVE_COLUMNS = ["arm", "x", "mean", "std", "ci_low", "ci_high", "n_seeds"]
Bounds = tuple[float, float]  # (low, high) of a metric's possible values; -inf / inf when open
OPEN: Bounds = (-math.inf, math.inf)


class Band(NamedTuple):
    """One band choice: its caption text and its edges from the per-point statistics."""

    caption: Callable[[float], str]  # confidence -> 'band: ...' text
    label: Callable[[float], str]  # confidence -> the band trace's short name: '95% CI'
    # (mean, std, n, lo, hi, confidence) -> (low, high); arrays (P,), NaN where n < 2
    edges: Callable[..., tuple[np.ndarray, np.ndarray]]


def _ci_edges(mean, std, n, lo, hi, confidence):
    return mean_interval(mean, std, n, confidence)


def _se_edges(mean, std, n, lo, hi, confidence):
    """mean -+ s / sqrt(n) (s with ddof = 1), NaN where n < 2."""
    with np.errstate(invalid="ignore", divide="ignore"):
        half = np.where(n >= 2, std / np.sqrt(n), np.nan)
    return mean - half, mean + half


def _minmax_edges(mean, std, n, lo, hi, confidence):
    """The smallest and largest seed's value, NaN where n < 2."""
    return np.where(n >= 2, lo, np.nan), np.where(n >= 2, hi, np.nan)


# The band choices of the arms view. "ci": the 95% Student-t interval of the mean over seeds
# (exact under normality; with 2-3 seeds it is wide: t_{.975,1} = 12.7); "se": +-1 standard error
# (about a 68% interval for many seeds, narrower than "ci" by t: a spread, not a test); "minmax":
# the range the seeds actually covered (no model at all).
BANDS: dict[str, Band] = {
    "ci": Band(lambda c: f"{c:.0%} t-interval over seeds where >= 2", lambda c: f"{c:.0%} CI", _ci_edges),
    "se": Band(lambda c: "+-1 standard error over seeds where >= 2", lambda c: "±1 SE", _se_edges),
    "minmax": Band(lambda c: "min-max over seeds where >= 2", lambda c: "min-max", _minmax_edges),
}


def check_band(band: str) -> str:
    if band not in BANDS:
        raise ValueError(f"band={band!r} is not allowed; choose one of: {', '.join(BANDS)}")
    return band


def clip_band(mean: np.ndarray, low: np.ndarray, high: np.ndarray, bounds: Bounds) -> tuple[np.ndarray, np.ndarray]:
    """The band's edges inside the metric's range ``bounds``, widened to the mean where the mean
    itself lies outside (a k1 KL estimate's step mean can be < 0: the band keeps containing the
    line it surrounds). NaN edges stay NaN. (P,) arrays -> (P,), (P,)."""
    floor, ceil = np.minimum(bounds[0], mean), np.maximum(bounds[1], mean)
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(low), np.nan, np.clip(low, floor, ceil)), \
            np.where(np.isnan(high), np.nan, np.clip(high, floor, ceil))


class _Points(NamedTuple):
    """A metric's finite points, sorted by run (first appearance), then x, then step: (P,) each."""

    run: np.ndarray  # int run code
    arm: np.ndarray  # int arm code
    x: np.ndarray
    y: np.ndarray
    arms: list[str]  # arm code -> name (order of first appearance in the frame)
    layout: "_Layout | None" = None  # the frame's, when these are all of its rows as it has them


class _Layout(NamedTuple):
    """What every metric logged at every row of a frame shares for one x column: the x and step
    values (N,) float64, whether the rows are in (run, x, step) order already, and
    ``_aligned_blocks`` of them (None when not in order or not aligned)."""

    x: np.ndarray
    step: np.ndarray
    in_order: bool
    aligned: tuple[int, int] | None


class FrameCodes(NamedTuple):
    """A frame's runs and arms as integer codes in order of first appearance: (N,) each, and
    arm code -> name. Computed once by a caller that draws several metrics of one frame (factorizing
    the string ids was a third of a band's time, for every chart). ``layouts``: x column ->
    ``_Layout``, filled by the first curve of each x drawn from these codes (the order and
    alignment checks then run once per frame, not once per chart)."""

    run: np.ndarray
    arm: np.ndarray
    arms: list[str]
    layouts: dict[str, _Layout] | None = None


def frame_codes(df: pd.DataFrame) -> FrameCodes:
    run, _ = pd.factorize(df["run_id"], sort=False)
    arm, arms = pd.factorize(df["arm"].astype(str), sort=False)
    return FrameCodes(run, arm, [str(a) for a in arms], {})


def _layout(df: pd.DataFrame, x: str, codes: FrameCodes) -> _Layout:
    """``df``'s ``_Layout`` for ``x`` (kept in ``codes.layouts`` where it has them)."""
    kept = codes.layouts.get(x) if codes.layouts is not None else None
    if kept is not None:
        return kept
    xs = pd.to_numeric(df[x], errors="coerce").to_numpy(dtype=np.float64)
    step = df["step"].to_numpy(dtype=np.float64) if "step" in df.columns else np.zeros(len(df))
    in_order = _sorted_by(codes.run, xs, step)
    made = _Layout(xs, step, in_order, _aligned_blocks(codes.run, codes.arm, xs) if in_order else None)
    if codes.layouts is not None:
        codes.layouts[x] = made
    return made


def _points(df: pd.DataFrame, metric: str, x: str, codes: FrameCodes | None = None) -> _Points:
    """``metric``'s finite points (``_Points``); with the frame's ``_Layout`` when every row is
    one of them (the rows as the frame has them)."""
    codes = codes if codes is not None else frame_codes(df)
    run, arm, arms = codes.run, codes.arm, codes.arms
    if len(run) != len(df):
        raise ValueError(f"codes of {len(run)} rows given for a frame of {len(df)}; use frame_codes(df)")
    layout = _layout(df, x, codes)
    xs, step = layout.x, layout.step
    ys = pd.to_numeric(df[metric], errors="coerce").to_numpy(dtype=np.float64)
    ok = np.isfinite(xs) & np.isfinite(ys)
    if ok.all() and layout.in_order:  # a metric logged at every step of the arms view's frame
        return _Points(run, arm, xs, ys, list(arms), layout)
    if not ok.all():
        run, arm, xs, ys, step = run[ok], arm[ok], xs[ok], ys[ok], step[ok]
    order = None if _sorted_by(run, xs, step) else np.lexsort((step, xs, run))  # stable: equal x keep step order
    if order is None:  # rows already in (run, x, step) order: the arms view's frame, sorted once for all charts
        return _Points(run, arm, xs, ys, list(arms))
    return _Points(run[order], arm[order], xs[order], ys[order], list(arms))


def _sorted_by(*keys: np.ndarray) -> bool:
    """Whether rows are already in lexicographic order of ``keys`` (first key first): what
    ``np.lexsort(keys[::-1])`` would leave as it is, checked in O(N). keys: (N,) each."""
    ties = np.ones(max(len(keys[0]) - 1, 0), dtype=bool)  # rows equal on every key so far
    for key in keys:
        step_down, step_up = key[1:] < key[:-1], key[1:] > key[:-1]
        if (ties & step_down).any():
            return False
        ties &= ~step_up
    return True


def _starts(codes: np.ndarray) -> np.ndarray:
    """Indices where a run of equal codes starts (codes sorted into runs): (R,)."""
    if not len(codes):
        return np.empty(0, dtype=np.intp)
    change = np.empty(len(codes), dtype=bool)  # (np.r_ costs ~20 us a call: 100 calls per redraw)
    change[0] = True
    np.not_equal(codes[1:], codes[:-1], out=change[1:])
    return np.flatnonzero(change)


def _smoothed(p: _Points, smoothing: Smoother | None) -> np.ndarray:
    """Each run's ys through ``smoothing`` (its finite points in x order): (P,)."""
    if smoothing is None or not len(p.y):
        return p.y
    bounds = np.r_[_starts(p.run), len(p.run)]
    rows = getattr(smoothing, "rows", None)  # the smoother of many seeds of one length at once
    if rows is None:
        return np.concatenate([smoothing(p.y[a:b]) for a, b in zip(bounds[:-1], bounds[1:])])
    out, starts, lengths = np.empty_like(p.y), bounds[:-1], np.diff(bounds)
    if (lengths == lengths[0]).all():  # every run of one length: the rows are a (runs, length) view
        return rows(p.y.reshape(len(lengths), -1)).reshape(-1)
    for length in np.unique(lengths):  # seeds of equal length (all of them, once runs have finished)
        at = starts[lengths == length][:, None] + np.arange(length)  # (seeds, length) positions
        out[at] = rows(p.y[at])
    return out


def _on_grid(p: _Points, ys: np.ndarray, grid_points: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every run linearly interpolated at the points of one grid inside its own x range (no
    extrapolation: a seed that has not reached x yet does not count at x). The grid: ``grid_points``
    (default: as many as the longest run has points) evenly spaced x from the smallest to the
    largest x of all runs. Returns (arm, x, y), each (Q,)."""
    bounds = np.r_[_starts(p.run), len(p.run)]
    grid = np.linspace(p.x.min(), p.x.max(), grid_points or max(2, int(np.diff(bounds).max())))
    arm, xs, out = [], [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        inside = grid[(grid >= p.x[a]) & (grid <= p.x[b - 1])]
        arm.append(np.full(len(inside), p.arm[a]))
        xs.append(inside)
        out.append(np.interp(inside, p.x[a:b], ys[a:b]))
    return np.concatenate(arm), np.concatenate(xs), np.concatenate(out)


def _by_arm_then_x(arm: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """``np.lexsort((xs, arm))``: the order by arm code, then x, ties in input order. (Q,) -> (Q,).
    Where the arms come in blocks of ascending code (the arms view's frame: its seeds' runs follow
    each other), each block's x are sorted alone: their seeds' runs are each sorted already, which
    a stable sort merges in a pass or two, ~3x faster than lexsort for 30 seeds x 1,000 steps."""
    if len(arm) < 2 or (np.diff(arm) < 0).any():
        return np.lexsort((xs, arm))
    bounds = np.r_[_starts(arm), len(arm)]
    return np.concatenate([a + np.argsort(xs[a:b], kind="stable") for a, b in zip(bounds[:-1], bounds[1:])])


def _per_point(arm: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> dict[str, np.ndarray]:
    """Mean, std (ddof 1; NaN for one seed), count, min and max of ys per (arm, x), rows sorted by
    arm code then x. arm, xs, ys: (Q,) -> columns (P,). (Rows whose arms' seeds share their x:
    ``_per_point_aligned``, the same numbers without the sort.)"""
    order = _by_arm_then_x(arm, xs)
    arm, xs, ys = arm[order], xs[order], ys[order]
    key_change = np.r_[True, (arm[1:] != arm[:-1]) | (xs[1:] != xs[:-1])]
    starts = np.flatnonzero(key_change)
    n = np.diff(np.r_[starts, len(ys)])
    mean = np.add.reduceat(ys, starts) / n
    dev = ys - np.repeat(mean, n)
    with np.errstate(invalid="ignore", divide="ignore"):
        std = np.where(n >= 2, np.sqrt(np.add.reduceat(dev * dev, starts) / (n - 1)), np.nan)
    return {"arm": arm[starts], "x": xs[starts], "mean": mean, "std": std, "n_seeds": n,
            "min": np.minimum.reduceat(ys, starts), "max": np.maximum.reduceat(ys, starts)}


# Seeds per arm up to which a sum over seeds taken row by row is np.add.reduceat's own: reduceat
# adds a segment's first value to the plain running sum of the rest while the rest is shorter
# than numpy's pairwise-summation block (8); longer segments are summed pairwise.
MAX_ALIGNED_SEEDS = 8


def _aligned_blocks(run: np.ndarray, arm: np.ndarray, xs: np.ndarray) -> tuple[int, int] | None:
    """(seeds S, points L) when the rows are A arms x S runs x L points in that order, every run of
    an arm logged at the same strictly increasing x (every arm's seeds finished, or stepping
    together), 2 <= S <= ``MAX_ALIGNED_SEEDS``; else None. run, arm, xs: (Q,), rows sorted by run
    code then x, runs numbered in order (``_Points``)."""
    starts = _starts(run)
    runs, q = len(starts), len(run)
    if not runs or q % runs:
        return None
    length = q // runs
    run_arms = arm[starts]
    arm_starts = _starts(run_arms)
    seeds = runs // len(arm_starts)
    if (not 2 <= seeds <= MAX_ALIGNED_SEEDS or runs % len(arm_starts) or (np.diff(starts) != length).any()
            or (np.diff(arm_starts) != seeds).any() or (np.diff(run_arms) < 0).any()):
        return None
    x = xs.reshape(len(arm_starts), seeds, length)
    if not ((x == x[:, :1]).all() and (x[:, 0, 1:] > x[:, 0, :-1]).all()):
        return None
    return seeds, length


def _running_sum(values: np.ndarray) -> np.ndarray:
    """Sum over axis 1 of (A, S, L) in np.add.reduceat's order for S <= ``MAX_ALIGNED_SEEDS``:
    v_0 + (((v_1 + v_2) + v_3) + ...). -> (A, L)."""
    rest = values[:, 1].copy()
    for i in range(2, values.shape[1]):
        rest += values[:, i]
    return values[:, 0] + rest


def _per_point_aligned(arm: np.ndarray, xs: np.ndarray, ys: np.ndarray, seeds: int, length: int) -> dict[str, np.ndarray]:
    """``_per_point`` of rows that are A arms x S seeds x L shared x (``_aligned_blocks``), over
    axis 1 of (A, S, L): no sort, no reduceat; the same numbers (sums in reduceat's order)."""
    y = ys.reshape(-1, seeds, length)
    mean = _running_sum(y) / seeds
    dev = y - mean[:, None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        std = np.sqrt(_running_sum(dev * dev) / (seeds - 1))
    points = y.shape[0] * length
    return {"arm": np.repeat(arm[::seeds * length], length), "x": xs.reshape(-1, seeds, length)[:, 0].reshape(-1),
            "mean": mean.reshape(-1), "std": std.reshape(-1), "n_seeds": np.full(points, seeds, dtype=np.intp),
            "min": y.min(axis=1).reshape(-1), "max": y.max(axis=1).reshape(-1)}


def mean_curve_with_band(df: pd.DataFrame, metric: str, x: str = "step", *, smoothing: Smoother | None = None,
                         confidence: float = 0.95, interpolate: bool | None = None,
                         grid_points: int | None = None, band: str = "ci", bounds: Bounds = OPEN,
                         codes: FrameCodes | None = None) -> pd.DataFrame:
    """Per arm and x: the mean over seeds of ``metric`` and a band over seeds.

    At each x with values y_1..y_n from the n seeds present there, mean = (1/n) sum_i y_i, s the
    std with ddof = 1, and the band (``BANDS[band]``, NaN where n < 2):

        "ci":     mean -+ t_{(1+confidence)/2, n-1} s / sqrt(n)   (``stats.mean_interval``)
        "se":     mean -+ s / sqrt(n)
        "minmax": [min_i y_i, max_i y_i]

    then clipped to ``bounds`` (the metric's possible range; ``clip_band``).

    x alignment. ``step`` is shared by all seeds, so seeds are matched at equal steps, no
    interpolation. ``tokens`` and ``wall time`` differ from seed to seed, so (``interpolate``,
    default: x is not ``step``) every seed is linearly interpolated onto one grid of
    ``grid_points`` evenly spaced x values (default: as many as the longest seed has points) from
    the smallest to the largest x of all runs, shared by every arm, and counted only inside its own
    x range.

    Returns one row per (arm, x), arms in order of first appearance in ``df``, x ascending:
    ``arm``, ``x``, ``mean``, ``std``, ``ci_low``, ``ci_high`` (the band's edges, whichever band),
    ``n_seeds``. ``codes``: ``frame_codes(df)`` when the caller already has them (several metrics
    of one frame); the result is the same.
    """
    return curve_arrays(df, metric, x, smoothing=smoothing, confidence=confidence, interpolate=interpolate,
                        grid_points=grid_points, band=band, bounds=bounds, codes=codes).frame()


class Curve(NamedTuple):
    """``mean_curve_with_band``'s rows as arrays (R,) each, ``arm`` as codes into ``arms`` (names):
    what the arms view draws from, without a DataFrame built and taken apart for every chart."""

    arm: np.ndarray
    x: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    n_seeds: np.ndarray
    arms: list[str]

    def frame(self) -> pd.DataFrame:
        """The rows as ``mean_curve_with_band`` returns them (CURVE_COLUMNS)."""
        if not len(self.x):
            return pd.DataFrame(columns=CURVE_COLUMNS)
        return pd.DataFrame({"arm": np.asarray(self.arms, dtype=object)[self.arm], "x": self.x, "mean": self.mean,
                             "std": self.std, "ci_low": self.ci_low, "ci_high": self.ci_high,
                             "n_seeds": self.n_seeds})[CURVE_COLUMNS]

    def arm_slices(self):
        """(arm name, slice of its rows) per arm, in order (an arm's rows are contiguous)."""
        if not len(self.arm):
            return []
        bounds = np.r_[_starts(self.arm), len(self.arm)]
        return [(self.arms[self.arm[a]], slice(a, b)) for a, b in zip(bounds[:-1], bounds[1:])]


def curve_arrays(df: pd.DataFrame, metric: str, x: str = "step", *, smoothing: Smoother | None = None,
                 confidence: float = 0.95, interpolate: bool | None = None, grid_points: int | None = None,
                 band: str = "ci", bounds: Bounds = OPEN, codes: FrameCodes | None = None) -> Curve:
    """``mean_curve_with_band`` as a ``Curve`` (same arguments, same numbers)."""
    check_columns(df, ("run_id", "arm", x, metric))
    confidence = check_fraction("confidence", confidence)
    chosen = BANDS[check_band(band)]
    if grid_points is not None and (type(grid_points) is not int or grid_points < 2):
        raise ValueError(f"grid_points={grid_points!r} is not allowed; use an integer >= 2")
    p = _points(df, metric, x, codes)
    if not len(p.y):
        empty = np.empty(0)
        return Curve(np.empty(0, dtype=np.intp), empty, empty, empty, empty, empty, np.empty(0, dtype=np.intp), p.arms)
    ys = _smoothed(p, smoothing)
    if (x != "step") if interpolate is None else interpolate:
        c = _per_point(*_on_grid(p, ys, grid_points))
    else:  # where every arm's seeds were logged at the same x: over (seeds, x) blocks, the same numbers
        blocks = p.layout.aligned if p.layout is not None else _aligned_blocks(p.run, p.arm, p.x)
        c = _per_point_aligned(p.arm, p.x, ys, *blocks) if blocks else _per_point(p.arm, p.x, ys)
    low, high = chosen.edges(c["mean"], c["std"], c["n_seeds"], c["min"], c["max"], confidence)
    low, high = clip_band(c["mean"], np.asarray(low, np.float64), np.asarray(high, np.float64), bounds)
    return Curve(c["arm"], c["x"], c["mean"], c["std"], low, high, c["n_seeds"], p.arms)


def _segments(n_seeds: np.ndarray, xs: np.ndarray) -> list[tuple[int, float]]:
    """Runs of equal seed counts along x: [(count, last x of the run)]."""
    ends = np.flatnonzero(np.diff(n_seeds)).tolist() + [len(n_seeds) - 1]
    return [(int(n_seeds[i]), float(xs[i])) for i in ends]


def _seeds(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


# how a caption names an x: steps and tokens are counts (an interpolated grid point of the tokens
# axis is a fraction of a token: shown rounded, "3,843 tokens", never "3842.81 tokens")
X_POSITIONS = {"step": lambda v: f"step {v:g}", "tokens": lambda v: f"{round(v):,} tokens",
               "wall time": lambda v: f"{v:.3g} s"}


def clip_note(bounds: Bounds) -> str:
    """'band clipped to the metric's range [0, 1]' for a metric with a finite bound ('' otherwise):
    said under the chart, since the drawn edge is then not the statistic's (``clip_band``)."""
    low, high = (bool(np.isfinite(b)) for b in bounds)
    if low and high:
        return f"band clipped to the metric's range [{bounds[0]:g}, {bounds[1]:g}]"
    if low or high:
        return f"band clipped at the metric's {'floor' if low else 'ceiling'} {bounds[0 if low else 1]:g}"
    return ""


def aggregation_caption(curve: pd.DataFrame | Curve, x: str = "step", confidence: float = 0.95, band: str = "ci",
                        smoothing: float = 0.0) -> str:
    """What each arm's mean curve aggregates, for the chart's caption, from ``mean_curve_with_band``'s
    frame drawn against x-axis ``x`` with band ``band``, each seed smoothed first with EMA weight
    ``smoothing`` (0: raw, and the caption says nothing of it). E.g. ``grpo: 3 seeds to step 40,
    then 2 to step 55 · rloo: 3 seeds · band: 95% t-interval over seeds where >= 2 · each seed
    smoothed first (EMA weight 0.6, ...)``. More than 3 changes of count are summarised as a range."""
    position = X_POSITIONS.get(x, lambda v: f"{v:g}")
    parts = []
    # an arm's rows are contiguous: slice at the changes of arm (a pandas groupby per chart was
    # ~10 ms, on every live redraw)
    if not isinstance(curve, Curve):
        codes, names = pd.factorize(curve["arm"], sort=False)
        curve = Curve(codes, curve["x"].to_numpy(), *(np.empty(0),) * 4, curve["n_seeds"].to_numpy(), list(names))
    # every point of every arm over the same number of seeds (finished runs): one check, not one per arm
    same = bool(len(curve.n_seeds)) and bool((curve.n_seeds == curve.n_seeds[0]).all())
    for arm, rows in curve.arm_slices():
        n_seeds, xs = curve.n_seeds[rows], curve.x[rows]
        segments = [(int(n_seeds[0]), float(xs[-1]))] if same else _segments(n_seeds, xs)
        if len(segments) == 1:
            text = _seeds(segments[0][0])
        elif len(segments) <= 3:
            text = ", then ".join(f"{_seeds(n) if i == 0 else n} to {position(end)}"
                                  for i, (n, end) in enumerate(segments))
        else:
            text = f"{n_seeds.min()}-{n_seeds.max()} seeds per point"
        parts.append(f"{arm}: {text}")
    return " · ".join(filter(None, parts + [f"band: {BANDS[check_band(band)].caption(confidence)}",
                                            smoothing_caption(smoothing)]))
