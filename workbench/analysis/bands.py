"""Mean curves across seeds with confidence bands, for the arms view of Live / Compare.

Input is a long metrics frame, one row per (run, step): ``run_id``, ``arm`` (a recipe minus its
seed, supplied by the caller), the x column and the metric. The x column is ``step`` or one the
caller adds per run (``tokens``, ``wall time``: the x-axis functions of ``workbench.viz.curves``;
this layer sits below viz and does not import it). Smoothing is also the caller's function (e.g.
``functools.partial(workbench.viz.curves.ema, weight=0.6)``), applied to each seed's curve before
seeds are averaged, so the band shows the spread of the smoothed curves the user sees.

Live runs are at different steps: a point aggregates the seeds that have reached it, the count is
returned with it (``n_seeds``) and the band exists only where n_seeds >= 2.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from workbench.analysis.stats import check_columns, check_fraction, finite, in_arm_order, mean_interval

Smoother = Callable[[np.ndarray], np.ndarray]  # (N,) -> (N,): one seed's values in x order
CURVE_COLUMNS = ["arm", "x", "mean", "std", "ci_low", "ci_high", "n_seeds"]


def _seed_curves(df: pd.DataFrame, metric: str, x: str, smoothing: Smoother | None):
    """Yield (arm, xs, ys) per run: its finite points sorted by x (stable, so equal x keep step
    order), ys smoothed if asked. xs, ys: (N_run,) float64."""
    values = pd.DataFrame({"run_id": df["run_id"], "arm": df["arm"].astype(str),
                           "step": df["step"] if "step" in df.columns else 0,
                           "x": pd.to_numeric(df[x], errors="coerce").astype(np.float64),
                           "y": pd.to_numeric(df[metric], errors="coerce").astype(np.float64)})
    values = values[finite(values["x"]) & finite(values["y"])]
    for _, run in values.sort_values(["x", "step"], kind="stable").groupby("run_id", sort=False):
        ys = run["y"].to_numpy(dtype=np.float64)
        yield run["arm"].iloc[0], run["x"].to_numpy(dtype=np.float64), (smoothing(ys) if smoothing else ys)


def _on_grid(xs: np.ndarray, ys: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A seed's curve linearly interpolated at the grid points inside its own x range (no
    extrapolation: a seed that has not reached x yet does not count at x)."""
    inside = (grid >= xs[0]) & (grid <= xs[-1])
    return grid[inside], np.interp(grid[inside], xs, ys)


def mean_curve_with_band(df: pd.DataFrame, metric: str, x: str = "step", *, smoothing: Smoother | None = None,
                         confidence: float = 0.95, interpolate: bool | None = None,
                         grid_points: int | None = None) -> pd.DataFrame:
    """Per arm and x: the mean over seeds of ``metric`` and its Student-t band over seeds.

    At each x with values y_1..y_n from the n seeds present there:

        mean = (1/n) sum_i y_i,   band = mean -+ t_{(1+confidence)/2, n-1} s / sqrt(n)

    (s with ddof = 1; ``stats.mean_interval``). The band is NaN where n < 2.

    x alignment. ``step`` is shared by all seeds, so seeds are matched at equal steps, no
    interpolation. ``tokens`` and ``wall time`` differ from seed to seed, so (``interpolate``,
    default: x is not ``step``) every seed is linearly interpolated onto one grid of
    ``grid_points`` evenly spaced x values (default: as many as the longest seed has points) from
    the smallest to the largest x of all runs, shared by every arm, and counted only inside its own
    x range.

    Returns one row per (arm, x), arms in order of first appearance, x ascending: ``arm``, ``x``,
    ``mean``, ``std``, ``ci_low``, ``ci_high``, ``n_seeds``.
    """
    check_columns(df, ("run_id", "arm", x, metric))
    confidence = check_fraction("confidence", confidence)
    if grid_points is not None and (type(grid_points) is not int or grid_points < 2):
        raise ValueError(f"grid_points={grid_points!r} is not allowed; use an integer >= 2")
    curves = list(_seed_curves(df, metric, x, smoothing))
    if not curves:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    if x != "step" if interpolate is None else interpolate:
        grid = np.linspace(min(xs[0] for _, xs, _ in curves), max(xs[-1] for _, xs, _ in curves),
                           grid_points or max(2, max(len(xs) for _, xs, _ in curves)))
        curves = [(arm, *_on_grid(xs, ys, grid)) for arm, xs, ys in curves]
    points = pd.DataFrame({"arm": np.concatenate([[arm] * len(xs) for arm, xs, _ in curves]),
                           "x": np.concatenate([xs for _, xs, _ in curves]),
                           "y": np.concatenate([ys for _, _, ys in curves])})
    by_x = points.groupby(["arm", "x"], sort=False)["y"].agg(mean="mean", std="std", n_seeds="count").reset_index()
    curve = in_arm_order(by_x, list(dict.fromkeys(arm for arm, _, _ in curves)), "x")
    curve["ci_low"], curve["ci_high"] = mean_interval(curve["mean"], curve["std"], curve["n_seeds"], confidence)
    return curve[CURVE_COLUMNS]


def _segments(n_seeds: np.ndarray, xs: np.ndarray) -> list[tuple[int, float]]:
    """Runs of equal seed counts along x: [(count, last x of the run)]."""
    ends = np.flatnonzero(np.diff(n_seeds)).tolist() + [len(n_seeds) - 1]
    return [(int(n_seeds[i]), float(xs[i])) for i in ends]


def _seeds(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


X_POSITIONS = {"step": "step {:g}", "tokens": "{:g} tokens", "wall time": "{:g} s"}  # how a caption names an x


def aggregation_caption(curve: pd.DataFrame, x: str = "step", confidence: float = 0.95) -> str:
    """What each arm's mean curve aggregates, for the chart's caption, from ``mean_curve_with_band``'s
    frame drawn against x-axis ``x``. E.g. ``grpo: 3 seeds to step 40, then 2 to step 55 · rloo: 3
    seeds · band: 95% t-interval over seeds where >= 2``. More than 3 changes of count are
    summarised as a range."""
    position = X_POSITIONS.get(x, "{:g}").format
    parts = []
    for arm, rows in curve.groupby("arm", sort=False):
        segments = _segments(rows["n_seeds"].to_numpy(), rows["x"].to_numpy())
        if len(segments) == 1:
            text = _seeds(segments[0][0])
        elif len(segments) <= 3:
            text = ", then ".join(f"{_seeds(n) if i == 0 else n} to {position(end)}"
                                  for i, (n, end) in enumerate(segments))
        else:
            text = f"{rows['n_seeds'].min()}-{rows['n_seeds'].max()} seeds per point"
        parts.append(f"{arm}: {text}")
    return " · ".join(parts + [f"band: {confidence:.0%} t-interval over seeds where >= 2"])
