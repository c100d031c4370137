"""Same-batch lens views: the ``lens`` events a run wrote (``workbench.engine.lens``; from
``RunStore.lens(run_id)`` or the run's events.jsonl, each a dict with ``step``) as tables and
figures over the run."""

from __future__ import annotations

from typing import Iterable, Mapping

import pandas as pd
import plotly.graph_objects as go


LENS_METRICS = {
    "cos_update": "cosine with the update actually taken",
    "cos_run": "cosine with the run's own gradient",
    "grad_norm": "gradient norm",
    "loss": "loss",
    "zero_grad": "share of zero-gradient tokens",
}
LENS_COLUMNS = ["step", "point", "advantage", "policy_loss", "combo", "is_run", *LENS_METRICS]


def lens_frame(lenses: Iterable[Mapping]) -> pd.DataFrame:
    """Long table of every lens row: step, point (before / after), advantage, policy_loss, combo
    ("advantage x loss"), is_run, and the metrics of ``LENS_METRICS`` (None -> NaN)."""
    rows = []
    for lens in sorted(lenses, key=lambda x: x["step"]):
        step = int(lens["step"])
        run = (lens["run"]["advantage"], lens["run"]["policy_loss"])
        for point, combos in lens["points"].items():
            for c in combos:
                rows.append({"step": step, "point": point, "advantage": c["advantage"], "policy_loss": c["policy_loss"],
                             "combo": f"{c['advantage']} x {c['policy_loss']}", "is_run": (c["advantage"], c["policy_loss"]) == run,
                             **{m: c.get(m) for m in LENS_METRICS}})
    return pd.DataFrame(rows, columns=LENS_COLUMNS).astype({m: float for m in LENS_METRICS})


DEFAULT_TOP = 8  # lines the chart draws at first: 121 (11 estimators x 11 losses) were unreadable


def _check_metric(metric: str) -> None:
    if metric not in LENS_METRICS:
        raise ValueError(f"lens metric={metric!r} is not allowed; choose one of: {', '.join(LENS_METRICS)}")


def top_combos(part: pd.DataFrame, metric: str, top: int | None) -> list[str]:
    """The ``top`` combos of ``part`` (one point's rows) with the largest |metric| at their last
    logged step, the run's own combination always among them (it is the reference); every combo
    when ``top`` is None. Ties and missing values (NaN, ranked last) keep the lens's order."""
    combos = list(dict.fromkeys(part["combo"]))
    if top is None or top >= len(combos):
        return combos
    last = part.sort_values("step", kind="stable").groupby("combo", sort=False).tail(1).set_index("combo")
    size = last[metric].abs().reindex(combos).fillna(-1.0)
    ranked = sorted(combos, key=lambda c: -size[c])  # sorted is stable
    own = [c for c in combos if bool(last.loc[c, "is_run"])]
    chosen = set(own[:1] + [c for c in ranked if c not in own][:max(top - len(own[:1]), 0)])
    return [c for c in ranked if c in chosen]


def lens_over_run_figure(frame: pd.DataFrame, metric: str = "cos_update", point: str = "before",
                         policy_loss: str | None = None, top: int | None = None) -> go.Figure:
    """``metric`` over steps, one line per (estimator x loss) at ``point``; the run's own
    combination drawn thick. ``policy_loss`` keeps one loss (the estimator axis alone); ``top``
    keeps the ``top_combos`` (None: every combination)."""
    _check_metric(metric)
    part = frame[frame["point"] == point]
    if policy_loss is not None:
        part = part[part["policy_loss"] == policy_loss]
    part = part[part["combo"].isin(top_combos(part, metric, top))]
    fig = go.Figure()
    for combo, rows in part.groupby("combo", sort=False):
        rows = rows.sort_values("step")
        own = bool(rows["is_run"].iloc[0])
        fig.add_trace(go.Scatter(x=rows["step"], y=rows[metric], mode="lines+markers", name=combo + (" (this run)" if own else ""),
                                 line={"width": 4 if own else 1.5}))
    fig.update_layout(xaxis_title="step", yaxis_title=LENS_METRICS[metric], height=420, margin={"t": 30})
    return fig


def lens_heatmap(frame: pd.DataFrame, step: int, metric: str = "cos_run", point: str = "before") -> go.Figure:
    """Estimator (rows) x policy loss (columns) grid of ``metric`` at one lens step."""
    part = frame[(frame["step"] == step) & (frame["point"] == point)]
    grid = part.pivot(index="advantage", columns="policy_loss", values=metric)
    grid = grid.reindex(index=list(dict.fromkeys(part["advantage"])), columns=list(dict.fromkeys(part["policy_loss"])))
    fig = go.Figure(go.Heatmap(z=grid.to_numpy(), x=list(grid.columns), y=list(grid.index), colorscale="RdBu",
                               zmid=0 if metric.startswith("cos") else None, texttemplate="%{z:.3f}",
                               colorbar={"title": metric}))
    fig.update_layout(xaxis_title="policy loss", yaxis_title="advantage estimator", height=380, margin={"t": 30})
    return fig


def _zero_gradient(rows: pd.DataFrame, metric: str) -> str | None:
    if metric == "grad_norm" or not (rows["grad_norm"] == 0).all():
        return None
    # the estimator's own notes are not quoted: its first note need not be why its advantages are 0
    return ("its gradient is 0 on this batch: every advantage it gave is 0, and no other term of the run's "
            "objective moves the weights here, so there is no direction to take a cosine of")


# Why a heatmap row can be empty, the first that applies: (rows of one estimator, metric) -> reason or None.
EMPTY_ROW_REASONS = (
    _zero_gradient,
    lambda rows, metric: ("the step made no update (the weights did not move), so there is nothing to compare with"
                          if metric == "cos_update" else None),
    lambda rows, metric: ("the run's own gradient was 0 at this step, so there is nothing to compare with"
                          if metric == "cos_run" else None),
    lambda rows, metric: "the lens logged no value for it at this step",
)


def empty_rows(frame: pd.DataFrame, step: int, metric: str = "cos_run", point: str = "before") -> dict[str, str]:
    """Estimator -> why its heatmap row at (``step``, ``point``) is empty (every cell missing), in
    row order. A cosine is undefined where a gradient is 0: an estimator that gave every token a 0
    advantage (grpo_passk when each group's best reward is tied) leaves a blank row."""
    _check_metric(metric)
    part = frame[(frame["step"] == step) & (frame["point"] == point)]
    out = {}
    for advantage, rows in part.groupby("advantage", sort=False):
        if rows[metric].isna().all():
            out[str(advantage)] = next(r for why in EMPTY_ROW_REASONS if (r := why(rows, metric)))
    return out


def teacher_caption(run_advantage: str, teacher: Mapping) -> str:
    """What the shaped row of a run with a teacher is. teacher: the lens payload's ``teacher``
    (shaping, coef, discount, mode); run_advantage: the run's lens key, e.g. 'grpo + opd'."""
    base = run_advantage.rsplit(" + ", 1)[0]
    kind = ("A - lambda D" if teacher["mode"] == "shaped" else "-lambda D (mode only: the reward advantage dropped)")
    future = "= d" if teacher["discount"] == 0 else f"the future sum (discount {teacher['discount']:g})"
    return (f"This run distils from a teacher: '{run_advantage}' is {base}'s advantage shaped by "
            f"{teacher['shaping']}, {kind}, with lambda = {teacher['coef']:g} and D {future} of the per-token "
            f"reverse KL d = log pi_theta - log pi_T, from the teacher log-probs the step scored. It is what the run stepped with, so it is the cosine reference; "
            f"the '{base}' row beside it shows what the teacher adds.")


def lens_events(events: Iterable[Mapping]) -> list[Mapping]:
    """The ``lens`` events among a run's events (as ``read_events`` returns them)."""
    return [e for e in events if e.get("kind") == "lens"]
