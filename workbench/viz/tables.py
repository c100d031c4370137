"""Tables of the pages (pure pandas): the Runs page's table (filter, sort and shape
``RunStore.list_runs()``) and the verdict table of Live / Compare and the Experiments lab."""

from __future__ import annotations

from typing import Iterable, NamedTuple

import numpy as np
import pandas as pd

from workbench.analysis.stats import MAX_SEEDS_SEARCHED, PAIR_COLUMNS, arm_summary, final_window_scores, pairwise
from workbench.analysis.window import DEFAULT_WINDOW_FRAC
from workbench.viz.curves import progress, step_label

# Sort keys the page offers: label -> column of the shaped table.
SORT_KEYS = {"created": "created", "name": "name", "status": "status", "algorithm": "algorithm",
             "reward": "reward", "progress": "progress", "owner": "owner"}
TABLE_COLUMNS = ["id", "name", "status", "progress", "step", "algorithm", "target", "owner", "reward", "group",
                 "tags", "notes", "created"]


def runs_table(runs: pd.DataFrame) -> pd.DataFrame:
    """list_runs() rows -> the displayed columns: progress in [0, 1], 'step' as 'k/N' steps done,
    owner, creation time as a timestamp, tags joined by ', '."""
    if runs.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    out = pd.DataFrame({
        "id": runs["id"],
        "name": runs["name"],
        "status": runs["status"],
        "progress": [progress(int(s), int(t)) for s, t in zip(runs["last_step"], runs["total_steps"])],
        "step": [step_label(s, t) for s, t in zip(runs["last_step"], runs["total_steps"])],
        "algorithm": runs["algorithm"],
        "target": runs["target"] if "target" in runs else runs["launcher"],
        "owner": runs["created_by"],
        "reward": pd.to_numeric(runs["reward"], errors="coerce"),
        "group": runs["group"].fillna(""),
        "tags": [", ".join(t) for t in runs["tags"]],
        "notes": runs["notes"],
        "created": pd.to_datetime(runs["created_at"], unit="s"),
    })
    return out.reset_index(drop=True)


def filter_runs(table: pd.DataFrame, *, statuses: Iterable[str] = (), group: str | None = None,
                tag: str | None = None, search: str = "", sort: str = "created", descending: bool = True) -> pd.DataFrame:
    """Rows of ``runs_table`` matching every filter given, sorted by ``SORT_KEYS[sort]``.

    ``search`` matches (case-insensitively, as plain text) id, name, algorithm, owner and notes.
    Runs without a value in the sort column (no reward yet) go last either way.
    """
    if sort not in SORT_KEYS:
        raise ValueError(f"sort={sort!r} is not allowed; choose one of: {', '.join(SORT_KEYS)}")
    keep = pd.Series(True, index=table.index)
    statuses = list(statuses)
    if statuses:
        keep &= table["status"].isin(statuses)
    if group:
        keep &= table["group"] == group
    if tag:
        keep &= table["tags"].map(lambda t: tag in [x.strip() for x in t.split(",")])
    if search.strip():
        needle = search.strip().lower()
        text = table[["id", "name", "algorithm", "owner", "notes"]].astype(str).agg(" ".join, axis=1).str.lower()
        keep &= text.str.contains(needle, regex=False)
    view = table[keep]
    return view.sort_values(SORT_KEYS[sort], ascending=not descending, na_position="last", kind="stable").reset_index(drop=True)


def all_tags(table: pd.DataFrame) -> list[str]:
    return sorted({t.strip() for tags in table.get("tags", []) for t in tags.split(",") if t.strip()})


# -- the verdict table (arms x seeds; the statistics are workbench.analysis.stats) ------------------
CONFIDENCE = 0.95  # the intervals' level (the column names say 95%)
ARM_TABLE_COLUMNS = ["arm", "seeds", "mean", "95% CI", "IQM", "IQM 95% CI", "note"]
PAIR_TABLE_COLUMNS = ["A", "B", "A − B", "95% CI", "P(A > B)", "p (Welch)", "seeds needed", "verdict"]


def interval_text(low: float, high: float) -> str:
    """'[0.412, 0.523]' (3 significant digits), '—' where there is no interval (NaN)."""
    return "—" if not (np.isfinite(low) and np.isfinite(high)) else f"[{low:.3g}, {high:.3g}]"


def seeds_needed_text(needed, effect_size: float, n_a: int, n_b: int) -> str:
    """The "seeds needed" cell: the number, or why there is none ("None" said nothing). With
    fewer than 2 seeds in an arm the spread (and d) is unknown; with no gap between the means
    (d = 0, or 0 / 0 when no seed varies) there is no difference to detect and the power is
    undefined at any n; otherwise the number is above the search's ``MAX_SEEDS_SEARCHED``."""
    if not pd.isna(needed):
        return str(int(needed))
    if min(n_a, n_b) < 2:
        return "— (needs 2 seeds per arm)"
    if not effect_size > 0:  # 0 or NaN
        return "— (no gap to detect)"
    return f"> {MAX_SEEDS_SEARCHED:,}"


class Verdict(NamedTuple):
    """The verdict table of one metric: per arm, per pair, and the final window's extent."""

    arms: pd.DataFrame  # ARM_TABLE_COLUMNS, one row per arm
    pairs: pd.DataFrame  # PAIR_TABLE_COLUMNS, one row per compared pair (empty with one arm)
    window: str  # e.g. "last 10% of each run's logged steps: 10 steps (steps 90-99)"


def _window_text(scores: pd.DataFrame, window_frac: float) -> str:
    k = sorted(set(scores["window_steps"]))
    steps = f"{k[0]} step{'s' * (k[0] != 1)}" if len(k) == 1 else f"{k[0]}-{k[-1]} steps"
    bounds = (f" (steps {scores['first_step'].iloc[0]}-{scores['last_step'].iloc[0]})"
              if scores["first_step"].nunique() == 1 and scores["last_step"].nunique() == 1 else "")
    return f"last {window_frac * 100:.3g}% of each run's logged steps: {steps}{bounds}"


def verdict(frame: pd.DataFrame, metric: str, window_frac: float = DEFAULT_WINDOW_FRAC, *, baseline: str | None = None) -> Verdict:
    """The verdict table of ``metric`` from the long frame ``RunStore.arm_metrics(...)``: each run
    scored by its final-window mean (``final_window_scores``), then ``arm_summary`` per arm and
    ``pairwise`` per pair (every pair, or each arm against ``baseline``), shaped for display:
    numbers stay numbers, intervals become text. ValueError naming the metric when no run logged it."""
    scores = final_window_scores(frame, metric, window_frac)
    if scores.empty:
        raise ValueError(f"metric={metric!r}: no run of this selection logged it yet")
    values = {arm: g["score"].to_numpy(dtype=np.float64) for arm, g in scores.groupby("arm", sort=False)}
    summary = arm_summary(values, CONFIDENCE)
    arms = pd.DataFrame({
        "arm": summary["arm"], "seeds": summary["n"], "mean": summary["mean"],
        "95% CI": [interval_text(lo, hi) for lo, hi in zip(summary["ci_low"], summary["ci_high"])],
        "IQM": summary["iqm"],
        "IQM 95% CI": [interval_text(lo, hi) for lo, hi in zip(summary["iqm_ci_low"], summary["iqm_ci_high"])],
        "note": summary["note"]}, columns=ARM_TABLE_COLUMNS)
    pairs = pairwise(values, CONFIDENCE, baseline=baseline) if len(values) > 1 else pd.DataFrame(columns=PAIR_COLUMNS)
    pairs = pd.DataFrame({
        "A": pairs["a"], "B": pairs["b"], "A − B": pairs["diff"].astype(float),
        "95% CI": [interval_text(lo, hi) for lo, hi in zip(pairs["diff_ci_low"], pairs["diff_ci_high"])],
        "P(A > B)": pairs["p_improvement"].astype(float), "p (Welch)": pairs["p_value"].astype(float),
        "seeds needed": [seeds_needed_text(*row) for row in zip(pairs["seeds_needed"], pairs["effect_size"],
                                                                  pairs["n_a"], pairs["n_b"])],
        "verdict": pairs["verdict"]}, columns=PAIR_TABLE_COLUMNS)
    return Verdict(arms, pairs, _window_text(scores, window_frac))
