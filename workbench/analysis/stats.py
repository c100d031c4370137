"""The verdict table's statistics: arms x seeds -> per-arm intervals and per-pair verdicts.

Vocabulary. A *run* is one training process; an *arm* is a recipe minus its seed (a label the
caller supplies, e.g. ``grpo`` or ``eps_high=0.28 · token-mean``); the runs of an arm differ only
in their seed. Each run contributes ONE score (its final-window mean, below): the unit of
replication is the seed, never the step, because the steps of one run are not independent.

Choices (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice"; Henderson et al.
2018, "Deep RL that Matters"); scipy computes every statistic:

- score of a run = mean of the metric over the last ``window_frac`` of its logged steps;
- per arm: mean with a Student-t interval; IQM (25 % trimmed mean, rliable's ``aggregate_iqm``)
  with a seeded percentile-bootstrap interval once there are >= 5 seeds;
- per pair: Welch's t interval of the difference of means, the probability of improvement
  P(A > B) from the Mann-Whitney U statistic, a plain-language verdict, and the seeds per arm a
  two-sample t-test needs to detect the observed gap.

Why the mean's interval is Student-t and not a bootstrap: with n seeds the percentile bootstrap's
interval is about mean +- z s sqrt((n-1)/n) / sqrt(n). At n = 3 that is +-1.60 standard errors
against the t interval's +-4.30, so a "95 %" bootstrap interval covers about 75 % of the time for
normal scores. Few-seed comparisons are the norm here, so the interval that is exact under
normality is the honest one; the bootstrap is kept for the IQM, which has no closed form.

rliable itself is not used: it depends on ``arch`` (and statsmodels), seaborn and absl, and its
stratified bootstrap is over tasks x runs while a comparison here has one task.

No torch, no streamlit, no plotting: pure functions of numpy arrays and pandas frames.
"""

from __future__ import annotations

import math
import warnings
from itertools import combinations
from numbers import Real
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from workbench.analysis.window import DEFAULT_WINDOW_FRAC

RUN_KEY_COLUMNS = ("run_id", "arm", "seed", "step")  # the columns a metrics frame must carry besides the metric
IQM_TRIM = 0.25  # IQM: drop the lowest and highest 25 % (scipy.stats.trim_mean cuts int(0.25 n) each side)
MIN_SEEDS_IQM_INTERVAL = 5  # below this a bootstrap has < 126 distinct resamples: no IQM interval
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 0  # fixed: the same scores always give the same table
MAX_SEEDS_SEARCHED = 100_000  # seeds_needed answers None above this (a gap this small is not worth chasing)
SEARCH_WINDOW = 32  # candidate seed counts evaluated per vectorised power call

Scores = Mapping[str, Sequence[float] | np.ndarray]  # arm -> (n_arm,) per-seed scores


# -- checks ---------------------------------------------------------------------------------------
def check_fraction(name: str, value: float) -> float:
    """An open-interval probability such as confidence, alpha or power."""
    if not isinstance(value, Real) or not 0.0 < float(value) < 1.0:
        raise ValueError(f"{name}={value!r} is not allowed; use a number strictly between 0 and 1")
    return float(value)


def _check_scores(scores_by_arm: Scores) -> dict[str, np.ndarray]:
    """arm -> (n,) float64, each with n >= 1 finite values (a run without a score is left out by the
    caller, not passed as NaN)."""
    if not scores_by_arm:
        raise ValueError("scores_by_arm is empty; give at least one arm with at least one score")
    checked = {}
    for arm, scores in scores_by_arm.items():
        x = np.asarray(scores, dtype=np.float64)
        if x.ndim != 1 or x.size == 0 or not np.isfinite(x).all():
            raise ValueError(f"scores of arm {arm!r} = {scores!r} are not allowed; "
                             f"use a non-empty 1-D list of finite numbers (one per seed)")
        checked[str(arm)] = x
    return checked


class DuplicateSeedError(ValueError):
    """Two runs of one arm with the same seed: copies, not independent replicates."""


def check_independent_seeds(df: pd.DataFrame) -> None:
    """DuplicateSeedError when two runs (``run_id``) of one ``arm`` have the same ``seed``: the
    whole frame is refused (no verdict for any arm of it), not only the arm holding the copies.

    Each seed is one independent replicate; a second run with the same seed repeats the first
    (same data order, same sampling), so counting both would report n = 6 for three seeds and an
    interval narrowed by copies. The store refuses such runs since seeds became unique per arm;
    a file from before may still hold them (launches that raced). Runs of unknown seed are not
    checked."""
    first = _first_rows(df["run_id"])
    # the three columns' first rows alone: a take of the whole frame (every metric column) was
    # most of this check's ~3 ms per arms-view render
    runs = pd.DataFrame({c: df[c].iloc[first].reset_index(drop=True) for c in ("run_id", "arm", "seed")})
    runs = runs[runs["seed"].notna()]
    twice = runs[runs.duplicated(["arm", "seed"], keep=False)]
    if twice.empty:
        return
    pairs = [f"arm {arm!r} seed {seed}: runs {', '.join(map(str, group['run_id'].head(4)))}"
             for (arm, seed), group in twice.groupby(["arm", "seed"], sort=False)]
    raise DuplicateSeedError(f"{len(pairs)} seed(s) appear in more than one run of an arm ({'; '.join(pairs[:3])}"
                             f"{'; ...' if len(pairs) > 3 else ''}): a run with the same seed is a copy, not an independent "
                             "replicate, so no verdict is computed; delete all but one run of each seed "
                             "(`python -m workbench runs delete ID`)")


def _first_rows(run_id: pd.Series) -> np.ndarray:
    """Positions of each run's first row, runs in order of first appearance (one hash pass over the
    ids: a frame's ``drop_duplicates`` took ~7 ms for 30 runs x 1,000 steps, per render)."""
    codes, _ = pd.factorize(run_id, sort=False)
    _, first = np.unique(codes, return_index=True)
    return first


def check_columns(df: pd.DataFrame, needed: Sequence[str]) -> None:
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise ValueError(f"metrics frame lacks column(s) {missing}; it has {list(df.columns)}")


def finite(values: pd.Series) -> pd.Series:
    """True where a logged value is a finite number (a metric not logged at a step is NaN/None)."""
    return pd.Series(np.isfinite(pd.to_numeric(values, errors="coerce").astype(np.float64)), index=values.index)


def in_arm_order(frame: pd.DataFrame, arms: Sequence[str], then: str) -> pd.DataFrame:
    """``frame`` sorted by its ``arm`` column in the order of ``arms``, then by column ``then``."""
    rank = {arm: i for i, arm in enumerate(arms)}
    ordered = frame.assign(_rank=frame["arm"].map(rank)).sort_values(["_rank", then], kind="stable")
    return ordered.drop(columns="_rank").reset_index(drop=True)


# -- one score per run ----------------------------------------------------------------------------
# The verdict's default metric: the held-out eval reward once runs log one (``eval/*``, DESIGN.md),
# else the training batch's mean reward.
DEFAULT_METRICS = ("eval/reward", "reward")


def default_metric(df: pd.DataFrame) -> str | None:
    """The first of ``DEFAULT_METRICS`` with a logged (finite) value in ``df``, else None."""
    for metric in DEFAULT_METRICS:
        if metric in df.columns and finite(df[metric]).any():
            return metric
    return None


def window_length(n_steps: int, window_frac: float) -> int:
    """Steps in the final window: k = max(1, ceil(window_frac * n)), n = steps logged.

    The product is rounded to 9 decimals first so that 0.07 * 100 (= 7.000000000000001 in binary)
    gives 7, not 8.
    """
    return max(1, math.ceil(round(window_frac * n_steps, 9)))


def final_window_scores(df: pd.DataFrame, metric: str, window_frac: float = DEFAULT_WINDOW_FRAC) -> pd.DataFrame:
    """One score per run: the mean of ``metric`` over the run's final window.

    df: long frame, one row per (run, step), columns ``run_id``, ``arm``, ``seed``, ``step`` and
    ``metric`` (``RunStore.metrics`` plus the arm and seed of each run, added by the caller).
    For a run with n steps at which the metric is finite, the window is its last
    k = max(1, ceil(window_frac n)) such steps and

        score = (1/k) sum_{the last k steps t} metric_t

    A live run's window is its latest k steps. Runs that have not logged the metric yet are left out.
    A frame where two runs of one arm have the same seed is refused whole, no arm scored
    (``check_independent_seeds``).

    Returns one row per scored run, arms in order of first appearance, seeds ascending within an
    arm: ``run_id``, ``arm``, ``seed``, ``score``, ``window_steps`` (k), ``first_step`` and
    ``last_step`` (the window's bounds).
    """
    check_columns(df, (*RUN_KEY_COLUMNS, metric))
    check_independent_seeds(df)
    if not isinstance(window_frac, Real) or not 0.0 < float(window_frac) <= 1.0:
        raise ValueError(f"window_frac={window_frac!r} is not allowed; use a fraction of the steps in (0, 1]")
    columns = ["run_id", "arm", "seed", "score", "window_steps", "first_step", "last_step"]
    # each run's logged rows in step order, runs in order of first appearance in step order, as
    # arrays: a pandas group per run took ~4 ms each, and a sorted copy of the frame ~10 ms
    logged = np.flatnonzero(finite(df[metric]).to_numpy())  # (L,) positions in df
    steps = df["step"].to_numpy()[logged]
    by_step = np.argsort(steps, kind="stable")
    codes, run_ids = pd.factorize(df["run_id"].iloc[logged[by_step]], sort=False)
    order = by_step[np.argsort(codes, kind="stable")]  # (L,) into logged: by run, then step
    values = pd.to_numeric(df[metric].iloc[logged[order]]).to_numpy(dtype=np.float64)
    steps = steps[order]
    ends = np.r_[np.flatnonzero(np.diff(np.sort(codes, kind="stable"))) + 1, len(order)]
    starts = np.r_[0, ends[:-1]]
    firsts = logged[order[starts]] if len(order) else np.empty(0, dtype=np.intp)  # each run's first logged row
    rows = []
    for run_id, arm, seed, start, end in zip(run_ids, df["arm"].iloc[firsts], df["seed"].iloc[firsts], starts, ends):
        first = end - window_length(int(end - start), float(window_frac))
        rows.append({"run_id": run_id, "arm": str(arm), "seed": seed,
                     "score": float(values[first:end].mean()), "window_steps": int(end - first),
                     "first_step": int(steps[first]), "last_step": int(steps[end - 1])})
    return in_arm_order(pd.DataFrame(rows, columns=columns), list(pd.unique(df["arm"].astype(str))), "seed")


def final_window_values(df: pd.DataFrame, metric: str, window_frac: float = DEFAULT_WINDOW_FRAC) -> dict[str, np.ndarray]:
    """arm -> (n_seeds,) final-window scores (see ``final_window_scores``), seeds ascending."""
    scores = final_window_scores(df, metric, window_frac)
    return {arm: group["score"].to_numpy(dtype=np.float64) for arm, group in scores.groupby("arm", sort=False)}


# -- per arm --------------------------------------------------------------------------------------
def mean_interval(mean, std, n, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Student-t interval of a mean over n independent values, elementwise (NaN where n < 2):

        mean -+ t_{(1+confidence)/2, n-1} * std / sqrt(n),   std with ddof = 1

    mean, std, n: broadcastable arrays -> (low, high) arrays of their broadcast shape.
    """
    mean, std, n = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (mean, std, n)))
    half = np.full(mean.shape, np.nan)
    ok = n >= 2
    # t quantile times the standard error (not stats.t.interval: it answers NaN for a zero spread,
    # and seeds that all score 1.0 have the interval [1, 1]); the quantile once per distinct n
    # (a curve's 10,000 points have two or three seed counts; scipy per point took ~1.5 ms a chart)
    counted = n[ok]
    if len(counted) and (counted == counted[0]).all():  # one count (seeds that all reached every step): no sort
        counts, which = counted[:1], np.zeros(len(counted), dtype=np.intp)
    else:
        counts, which = np.unique(counted, return_inverse=True)
    quantile = stats.t.ppf((1 + confidence) / 2, counts - 1)[which.reshape(-1)]
    half[ok] = quantile * std[ok] / np.sqrt(n[ok])
    return mean - half, mean + half


def _iqm(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Interquartile mean: scipy.stats.trim_mean(x, 0.25), the mean of the middle values after
    dropping int(0.25 n) from each end (n = 3: nothing dropped; n = 4: the middle 2)."""
    return stats.trim_mean(x, IQM_TRIM, axis=axis)


def iqm_interval(x: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of the IQM of (n,) scores: scipy.stats.bootstrap with
    ``BOOTSTRAP_RESAMPLES`` resamples and a fixed generator (``BOOTSTRAP_SEED``), so the same
    scores give the same interval. (NaN, NaN) when n < ``MIN_SEEDS_IQM_INTERVAL``."""
    if len(x) < MIN_SEEDS_IQM_INTERVAL:
        return math.nan, math.nan
    if np.ptp(x) == 0.0:  # every resample has the same IQM; scipy would warn about a degenerate distribution
        return float(x[0]), float(x[0])
    ci = stats.bootstrap((x,), _iqm, vectorized=True, n_resamples=BOOTSTRAP_RESAMPLES, confidence_level=confidence,
                         method="percentile", rng=np.random.default_rng(BOOTSTRAP_SEED)).confidence_interval
    return float(ci.low), float(ci.high)


def _describe_rows(x: np.ndarray, confidence: float) -> dict[str, np.ndarray]:
    """n, mean, std (ddof = 1; NaN for one value) and the mean's t interval of K arms' (K, n)
    scores (one seed count): each statistic one call for all K rows, the same numbers as row by
    row (numpy reduces each row's contiguous values alike). -> (K,) arrays."""
    k, n = x.shape
    mean = np.mean(x, axis=-1)
    std = np.std(x, ddof=1, axis=-1) if n > 1 else np.full(k, math.nan)
    low, high = mean_interval(mean, std, n, confidence)
    return {"n": np.full(k, n), "mean": mean, "std": std, "ci_low": low, "ci_high": high}


def _describe(x: np.ndarray, confidence: float) -> dict[str, Any]:
    """``_describe_rows`` of one arm's (n,) scores, as Python numbers."""
    return {key: values[0].item() for key, values in _describe_rows(x[None], confidence).items()}


SUMMARY_COLUMNS = ["arm", "n", "mean", "std", "ci_low", "ci_high", "iqm", "iqm_ci_low", "iqm_ci_high", "note"]


def arm_summary(scores_by_arm: Scores, confidence: float = 0.95) -> pd.DataFrame:
    """One row per arm (input order) from arm -> (n,) per-seed scores.

    Columns: ``arm``, ``n`` (seeds), ``mean``, ``std`` (ddof = 1), ``ci_low`` / ``ci_high`` (the
    mean's Student-t interval, see ``mean_interval``; NaN for one seed), ``iqm`` (25 % trimmed mean),
    ``iqm_ci_low`` / ``iqm_ci_high`` (seeded percentile bootstrap, NaN below 5 seeds; see
    ``iqm_interval``) and ``note`` (what is missing and why, else empty). Arms of one seed count
    are described together (``_describe_rows``: a scipy call per arm was most of a 10-arm table).
    """
    confidence = check_fraction("confidence", confidence)
    scores = _check_scores(scores_by_arm)
    by_count: dict[int, list[str]] = {}
    for arm, x in scores.items():
        by_count.setdefault(len(x), []).append(arm)
    described: dict[str, dict[str, Any]] = {}
    for arms in by_count.values():
        stacked = np.stack([scores[arm] for arm in arms])
        stats_of = {**_describe_rows(stacked, confidence), "iqm": _iqm(stacked, axis=-1)}
        for j, arm in enumerate(arms):
            described[arm] = {key: values[j].item() for key, values in stats_of.items()}
    rows = []
    for arm, x in scores.items():
        iqm_low, iqm_high = iqm_interval(x, confidence)
        note = ("1 seed: no interval (needs >= 2)" if len(x) < 2 else
                f"IQM interval needs >= {MIN_SEEDS_IQM_INTERVAL} seeds" if len(x) < MIN_SEEDS_IQM_INTERVAL else "")
        rows.append({"arm": arm, **described[arm], "iqm_ci_low": iqm_low, "iqm_ci_high": iqm_high, "note": note})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


# -- per pair -------------------------------------------------------------------------------------
def probability_of_improvement(a: np.ndarray, b: np.ndarray):
    """P(A > B) of Agarwal et al. 2021: the share of the n_A n_B seed pairs in which A's score beats
    B's, ties counting 1/2. It is the Mann-Whitney U statistic of ``a`` (scipy) over n_A n_B:

        P(A > B) = U_A / (n_A n_B),  U_A = sum_i sum_j [a_i > b_j] + 1/2 [a_i = b_j]

    a: (n_A,), b: (n_B,) -> float; or K pairs at once, a: (K, n_A), b: (K, n_B) -> (K,) (one scipy
    call for all, as ``pairwise`` makes it)."""
    a, b = np.asarray(a), np.asarray(b)
    share = stats.mannwhitneyu(a, b, axis=-1).statistic / (a.shape[-1] * b.shape[-1])
    return float(share) if a.ndim == 1 else np.asarray(share, dtype=np.float64)


def welch_interval(a: np.ndarray, b: np.ndarray, confidence: float = 0.95):
    """Welch's interval of mean(a) - mean(b) and its two-sided p-value (scipy.stats.ttest_ind,
    equal_var=False):

        diff -+ t_{(1+confidence)/2, nu} sqrt(s_a^2/n_a + s_b^2/n_b),
        nu = (s_a^2/n_a + s_b^2/n_b)^2 / ((s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1))

    Both arms need >= 2 seeds. Returns (low, high, p_value); if both arms have zero spread the
    interval is the single point diff and p is 0 (they differ) or NaN (they are equal).
    a: (n_a,), b: (n_b,) -> three floats; a: (K, n_a), b: (K, n_b) -> three (K,) arrays.
    """
    a, b = np.asarray(a), np.asarray(b)
    with warnings.catch_warnings():  # identical scores (a converged reward of 1.0) make scipy warn about precision
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.ttest_ind(a, b, equal_var=False, axis=-1)
        ci = result.confidence_interval(confidence)
    values = (ci.low, ci.high, result.pvalue)
    return tuple(float(v) for v in values) if a.ndim == 1 else tuple(np.asarray(v, np.float64) for v in values)


def pooled_effect_size(a: np.ndarray, b: np.ndarray):
    """Cohen's d of the observed gap: |mean(a) - mean(b)| / s_p with the pooled standard deviation

        s_p = sqrt(((n_a - 1) s_a^2 + (n_b - 1) s_b^2) / (n_a + n_b - 2))

    (inf when both arms have zero spread and differ, 0 when the means are equal).
    a: (n_a,), b: (n_b,) -> float; a: (K, n_a), b: (K, n_b) -> (K,)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    n_a, n_b = a.shape[-1], b.shape[-1]
    gap = np.abs(np.mean(a, axis=-1) - np.mean(b, axis=-1))
    pooled_var = ((n_a - 1) * np.var(a, ddof=1, axis=-1) + (n_b - 1) * np.var(b, ddof=1, axis=-1)) / (n_a + n_b - 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(gap == 0.0, 0.0, np.where(pooled_var == 0.0, np.inf, gap / np.sqrt(pooled_var)))
    return float(d) if a.ndim == 1 else d


def t_test_power(effect_size: float, n, alpha: float = 0.05) -> np.ndarray:
    """Power of the two-sided two-sample t-test with n seeds per arm at true effect size d:

        nu = 2n - 2,  lambda = d sqrt(n / 2),  t* = t_{1 - alpha/2, nu}
        power = P(T'_{nu,lambda} > t*) + P(T'_{nu,lambda} < -t*)
              = P(T'_{nu,lambda} > t*) + P(T'_{nu,-lambda} > t*)

    T' is the noncentral t (scipy.stats.nct). The second line is the one computed: scipy's
    ``nct.cdf(-t*, nu, lambda)`` answers NaN once that tail is below ~1e-50 (d = 10, n = 3), its
    mirror ``nct.sf(t*, nu, -lambda)`` answers 0. n: int or (K,) ints >= 2 -> float or (K,) float64."""
    n = np.asarray(n, dtype=np.float64)
    nu, ncp = 2 * n - 2, effect_size * np.sqrt(n / 2)
    t_crit = stats.t.ppf(1 - alpha / 2, nu)
    return stats.nct.sf(t_crit, nu, ncp) + stats.nct.sf(t_crit, nu, -ncp)


def seeds_needed(effect_size: float, alpha: float = 0.05, power: float = 0.8) -> int | None:
    """Smallest n >= 2 seeds per arm with ``t_test_power(effect_size, n, alpha) >= power``.

    Textbook check: d = 1 -> 17, d = 0.5 -> 64 (alpha 0.05 two-sided, power 0.8). None when the gap
    is 0 or more than ``MAX_SEEDS_SEARCHED`` seeds would be needed; 2 when d is infinite (no spread).

    The search starts just below the normal approximation n0 = 2 ((z_{1-alpha/2} + z_power) / d)^2
    (Cohen 1988, section 2.4): the t-test needs about one seed more, so the first window of
    candidates, evaluated in one vectorised call, usually holds the answer. Power grows with n, so
    the first n that reaches it is the smallest.
    """
    return seeds_needed_each([effect_size], alpha, power)[0]


def seeds_needed_each(effect_sizes: Sequence[float], alpha: float = 0.05, power: float = 0.8) -> list[int | None]:
    """``seeds_needed`` of each of K effect sizes, the same numbers: the check that each search
    starts short of its answer and each first window of candidates are one vectorised power call
    for all K ((K,) and (K, SEARCH_WINDOW)); a search not settled there goes on alone. A verdict
    table of 10 arms asks 9 at once (a scipy call costs ~0.3 ms whatever its size)."""
    alpha, power = check_fraction("alpha", alpha), check_fraction("power", power)
    d = np.asarray(effect_sizes, dtype=np.float64).reshape(-1)
    out: list[int | None] = [2 if math.isinf(v) else None for v in d]
    todo = np.flatnonzero((d > 0.0) & np.isfinite(d))
    if not len(todo):
        return out
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    n0 = 2 * (z / d[todo]) ** 2
    start = np.maximum(2, np.floor(np.minimum(n0, MAX_SEEDS_SEARCHED + 1)) - 2).astype(np.int64)
    ns = start[:, None] + np.arange(SEARCH_WINDOW)  # (K, SEARCH_WINDOW) candidates
    reached = t_test_power(d[todo][:, None], ns, alpha) >= power  # (K, SEARCH_WINDOW)
    # the window must start short of it: the power at the start is the window's first (elementwise
    # functions: the same number as a call of its own, which cost ~2 ms of scipy a verdict)
    overshot = (start > 2) & reached[:, 0]
    enough = reached & (ns <= MAX_SEEDS_SEARCHED)
    for j, k in enumerate(todo):
        if overshot[j]:
            out[k] = _search_seeds(float(d[k]), int(start[j]), alpha, power, step_back=True)
        elif enough[j].any():
            out[k] = int(ns[j, enough[j].argmax()])
        else:
            out[k] = _search_seeds(float(d[k]), int(start[j]) + SEARCH_WINDOW, alpha, power)
    return out


def _search_seeds(effect_size: float, start: int, alpha: float, power: float, *, step_back: bool = False) -> int | None:
    """``seeds_needed``'s search from ``start`` on, window by window (``step_back``: first move the
    start back until the power there is short of ``power``)."""
    while step_back and start > 2 and t_test_power(effect_size, start, alpha) >= power:
        start = max(2, start - SEARCH_WINDOW)
    for first in range(start, MAX_SEEDS_SEARCHED + 1, SEARCH_WINDOW):
        ns = np.arange(first, min(first + SEARCH_WINDOW, MAX_SEEDS_SEARCHED + 1))
        enough = t_test_power(effect_size, ns, alpha) >= power
        if enough.any():
            return int(ns[enough.argmax()])
    return None


def _seeds_phrase(n_a: int, n_b: int) -> str:
    return f"{n_a} seeds" if n_a == n_b else f"{n_a} and {n_b} seeds"


def verdict(a_label: str, b_label: str, low: float, high: float, n_a: int, n_b: int) -> str:
    """The plain-language reading of the interval [low, high] of mean(A) - mean(B)."""
    if min(n_a, n_b) < 2:
        short = a_label if n_a < 2 else b_label
        return f"not enough seeds: {short} has 1 (an interval needs >= 2 per arm)"
    if low > 0:
        return f"{a_label} > {b_label}: the interval excludes 0"
    if high < 0:
        return f"{b_label} > {a_label}: the interval excludes 0"
    return f"no difference detectable with {_seeds_phrase(n_a, n_b)}"


PAIR_COLUMNS = ["a", "b", "n_a", "n_b", "diff", "diff_ci_low", "diff_ci_high", "p_value", "p_improvement",
                "effect_size", "seeds_needed", "verdict"]


def pairwise(scores_by_arm: Scores, confidence: float = 0.95, *, baseline: str | None = None,
             alpha: float = 0.05, power: float = 0.8) -> pd.DataFrame:
    """One row per pair of arms (A, B): every pair in input order (A before B), or with ``baseline``
    every other arm against it (B = baseline). B vs A is the mirror row: -diff, interval negated,
    1 - P(A > B).

    Columns: ``a``, ``b``, ``n_a``, ``n_b``, ``diff`` = mean(A) - mean(B), ``diff_ci_low`` /
    ``diff_ci_high`` and ``p_value`` (Welch, see ``welch_interval``; NaN unless both arms have >= 2
    seeds), ``p_improvement`` = P(A > B) (``probability_of_improvement``), ``effect_size`` (observed
    Cohen's d, ``pooled_effect_size``), ``seeds_needed`` (per arm, to detect that d at ``alpha``
    with ``power``: a planning number, as noisy as the few-seed d it starts from; <NA> when there is
    no gap, too few seeds to estimate d, or more than ``MAX_SEEDS_SEARCHED``) and ``verdict``.
    """
    confidence = check_fraction("confidence", confidence)
    alpha, power = check_fraction("alpha", alpha), check_fraction("power", power)
    scores = _check_scores(scores_by_arm)
    if baseline is not None and baseline not in scores:
        raise ValueError(f"baseline={baseline!r} is not allowed; choose one of the arms: {', '.join(scores)}")
    pairs = (combinations(scores, 2) if baseline is None else ((arm, baseline) for arm in scores if arm != baseline))
    pairs = list(pairs)
    tests = _pair_tests(scores, pairs, confidence)
    needed = seeds_needed_each([d for *_, d in tests], alpha, power)  # None where d is NaN (one seed)
    rows = []
    for (a_label, b_label), (low, high, p_value, p_improvement, d), n in zip(pairs, tests, needed):
        a, b = scores[a_label], scores[b_label]
        rows.append({"a": a_label, "b": b_label, "n_a": len(a), "n_b": len(b),
                     "diff": float(np.mean(a) - np.mean(b)), "diff_ci_low": low, "diff_ci_high": high,
                     "p_value": p_value, "p_improvement": p_improvement, "effect_size": d,
                     "seeds_needed": n, "verdict": verdict(a_label, b_label, low, high, len(a), len(b))})
    frame = pd.DataFrame(rows, columns=PAIR_COLUMNS)
    return frame.astype({"seeds_needed": "Int64"})


def _pair_tests(scores: Mapping[str, np.ndarray], pairs: list[tuple[str, str]],
                confidence: float) -> list[tuple[float, float, float, float, float]]:
    """(Welch low, high, p, P(A > B), Cohen's d) per pair, in order; the first three and d NaN
    where an arm has one seed. Pairs of equal seed counts (n_a, n_b) are stacked, (K, n_a) against
    (K, n_b), and each test runs once per stack: 45 pairs of 3-seed arms are two scipy calls, not 90
    (a scipy call costs ~1 ms whatever its size)."""
    out: list[tuple[float, ...]] = [()] * len(pairs)
    by_shape: dict[tuple[int, int], list[int]] = {}
    for k, (a_label, b_label) in enumerate(pairs):
        by_shape.setdefault((len(scores[a_label]), len(scores[b_label])), []).append(k)
    for (n_a, n_b), ks in by_shape.items():
        a = np.stack([scores[pairs[k][0]] for k in ks])
        b = np.stack([scores[pairs[k][1]] for k in ks])
        nan = np.full(len(ks), math.nan)
        low, high, p_value = welch_interval(a, b, confidence) if min(n_a, n_b) >= 2 else (nan, nan, nan)
        d = pooled_effect_size(a, b) if min(n_a, n_b) >= 2 else nan
        p_improvement = probability_of_improvement(a, b)
        for j, k in enumerate(ks):
            out[k] = (float(low[j]), float(high[j]), float(p_value[j]), float(p_improvement[j]), float(d[j]))
    return out


# -- sweeps ---------------------------------------------------------------------------------------
def _value_order(values: list[Any]) -> list[Any]:
    """Distinct values: ascending if all are numbers (not bools), else in order of first appearance."""
    distinct = list(dict.fromkeys(values))
    numeric = all(isinstance(v, Real) and not isinstance(v, bool) for v in distinct)
    return sorted(distinct) if numeric else distinct


def sweep_table(scores_by_arm: Scores, arm_values: Mapping[str, Mapping[str, Any]],
                confidence: float = 0.95) -> pd.DataFrame:
    """Final metric against each swept value, for error-bar charts (one chart per swept field).

    arm_values: arm -> {swept field: its value in that arm}, e.g. ``{"eps_high=0.28 · token-mean":
    {"eps_high": 0.28, "aggregation": "token-mean"}}``; every arm must name the same fields.

    For each field F and each value v of F, one row per combination of the other swept fields
    (``others``, e.g. ``aggregation=token-mean``; "" when F is the only field): that arm's seeds.
    With more than one field there is also a row ``others = "all"`` pooling the seeds of every arm
    with F = v (the main effect of F; its interval treats seeds of different arms as one sample, so
    it also carries the spread between those arms).

    Columns: ``field``, ``value``, ``others``, ``arms`` (arms pooled), ``n`` (seeds), ``mean``,
    ``std``, ``ci_low`` / ``ci_high`` (Student-t, see ``mean_interval``). Values ascending when
    numeric, else in order of first appearance.
    """
    confidence = check_fraction("confidence", confidence)
    scores = _check_scores(scores_by_arm)
    missing = [arm for arm in scores if arm not in arm_values]
    if missing:
        raise ValueError(f"arm_values lacks arm(s) {missing}; it names {list(arm_values)}")
    fields = list(dict.fromkeys(f for arm in scores for f in arm_values[arm]))
    for arm in scores:
        if set(arm_values[arm]) != set(fields):
            raise ValueError(f"arm {arm!r} sets fields {sorted(arm_values[arm])}; every arm must set {sorted(fields)}")
    rows = []
    for field in fields:
        # the label of each arm's other swept values: "aggregation=token-mean" when sweeping eps_high
        others_of = {arm: " · ".join(f"{f}={arm_values[arm][f]}" for f in fields if f != field) for arm in scores}
        groups = list(dict.fromkeys(others_of.values())) + (["all"] if len(fields) > 1 else [])
        for value in _value_order([arm_values[arm][field] for arm in scores]):
            for others in groups:
                arms = [arm for arm in scores if arm_values[arm][field] == value and others in ("all", others_of[arm])]
                if arms:
                    pooled = np.concatenate([scores[arm] for arm in arms])
                    rows.append({"field": field, "value": value, "others": others, "arms": len(arms),
                                 **_describe(pooled, confidence)})
    return pd.DataFrame(rows, columns=["field", "value", "others", "arms", "n", "mean", "std", "ci_low", "ci_high"])
