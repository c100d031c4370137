"""Training curves and run tables: pure functions of the run store's DataFrames (no Streamlit).

Input is ``RunStore.metrics(...)``: one row per (run_id, step) with columns ``run_id``, ``step``,
``time`` (epoch seconds of the event) and one column per metric the engine logs, under TRL's
names (``reward``, ``kl``, ``clip_ratio/low_mean`` ...). Every builder returns a plotly Figure or
a DataFrame; the pages only place them.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.smoothing import check_smoothing, ema
from workbench.viz.wire import WireFigure


@dataclass(frozen=True)
class Metric:
    """What a logged metric is, for drawing it honestly: the y-axis title with its unit, its
    possible range (a band is clipped to it), which direction is better (None: neither), and
    whether it is a secondary series (a min / max / per-region line beside a panel's main one: hidden until the
    page's "Secondary series" toggle shows it)."""

    axis: str  # the y-axis title, unit included: "tokens", "seconds", "fraction of prompts"
    low: float = -math.inf
    high: float = math.inf
    better: str | None = None  # "higher", "lower" or None: said in the chart's help (Panel.describe)
    secondary: bool = False

    @property
    def bounds(self) -> tuple[float, float]:
        return (self.low, self.high)

    def but(self, **changes) -> "Metric":
        """This metric's metadata with some fields changed (``FRACTION.but(better="lower")``)."""
        return replace(self, **changes)


# The kinds of metric the panels draw; a panel's metrics share a y-axis, so they share a kind
# (``Panel.kinds`` overrides one metric's direction, reduction or role).
FRACTION = Metric("fraction", 0.0, 1.0)
TOKENS = Metric("tokens", 0.0)
SECONDS = Metric("seconds", 0.0)
COUNT = Metric("count", 0.0)
NATS = Metric("nats per token", 0.0)  # an entropy, a spread: >= 0
# A KL estimate: the KL itself is >= 0, but k1's per-token values and step means can be < 0 (the
# ppo, rloo and reinforce_pp presets use k1), so a band or axis clipped at 0 would hide data
KL_ESTIMATE = Metric("nats per token (estimate)")
UNKNOWN = Metric("value")  # a logged metric no panel describes: no range, no direction


@dataclass(frozen=True)
class Panel:
    """One chart: a title, the metric columns drawn in it (one line per run and metric), what they
    mean, and what kind of quantity they are (``kind`` for all of them, ``kinds`` per metric where
    one differs)."""

    title: str
    metrics: tuple[str, ...]
    help: str = ""
    kind: Metric = UNKNOWN
    kinds: Mapping[str, Metric] = field(default_factory=dict)

    def meta(self, metric: str) -> Metric:
        """The metadata of one of this panel's metrics."""
        return self.kinds.get(metric, self.kind)

    def describe(self) -> str:
        """The chart's help line: what it draws, and which way is better where that is known."""
        better = sorted({f"{m}: {self.meta(m).better} is better" for m in self.metrics if self.meta(m).better})
        return self.help + (f" ({'; '.join(better)}.)" if better else "")

    def primary(self) -> tuple[str, ...]:
        """The metrics drawn by default (secondary series left out)."""
        return tuple(m for m in self.metrics if not self.meta(m).secondary)


_RATIO = Metric("ratio", 0.0)
_MISMATCH = Metric("nats per token (|log-ratio|)", 0.0, better="lower")


def _extremes(low_name: str, high_name: str, kind: Metric) -> dict[str, Metric]:
    """A panel's per-batch min and max beside its mean: secondary series, reduced by min / max."""
    return {low_name: kind.but(secondary=True), high_name: kind.but(secondary=True)}


# The Compare page's charts, in display order, grouped (rewards, eval, KL and distillation,
# entropy, clipping, lengths, rollout, optimisation, cost). A metric a run never logged is simply
# absent. Help says what each logged name means (TRL's meaning where TRL logs the same name).
PANELS: dict[str, Panel] = {
    "reward": Panel("Reward (batch mean)", ("reward",), "Mean total reward of the step's completions.",
        Metric("reward", better="higher")),
    # held-out evaluation (eval.every): logged at step 0, every N steps and at the end only
    "eval_accuracy": Panel("Held-out accuracy", ("eval/pass@1", "eval/pass@k"),
                           "Held-out prompts never trained on: greedy pass@1 and pass@k at the eval temperature.",
        FRACTION.but(axis="pass rate", better="higher")),
    "eval_reward": Panel("Held-out reward", ("eval/reward",), "Mean reward of greedy completions of the held-out prompts.",
        Metric("reward", better="higher")),
    "reward_std": Panel("Reward std within groups", ("reward_std",),
                        "Mean over prompts of the std of the G rewards: the signal a group baseline can use.",
        Metric("reward std", 0.0)),
    "frac_reward_zero_std": Panel("Groups with zero reward std", ("frac_reward_zero_std",),
                                  "Fraction of prompts whose G rewards are all equal: zero advantage, no gradient (DAPO filters them).",
        FRACTION.but(axis="fraction of prompts", better="lower")),
    "remax_baseline": Panel("ReMax greedy baseline", ("remax/baseline_reward",),
                            "Mean reward of the greedy completion of each prompt: the baseline ReMax subtracts "
                            "(advantage = reward - greedy reward).",
        Metric("reward")),
    "kl": Panel("KL to the reference", ("kl",), "Mean per-token KL estimate (0 when kl_coef = 0: no reference; "
                "k1's can be < 0).",
        KL_ESTIMATE),
    # its own panel: the std of a heavy-tailed per-token estimate is often 10x its mean
    "kl_token_std": Panel("KL spread over tokens", ("kl/token_std",),
                          "Std over the batch's completion tokens of the per-token KL estimate whose mean is kl "
                          "(0 when kl_coef = 0): large with a small mean, a few tokens carry the divergence.",
        NATS.but(axis="nats per token (std)")),
    # verl's names (ray_trainer.apply_kl_penalty), logged whenever the KL is in the reward
    "reward_kl_penalty": Panel("KL in the reward (what the controller sees)", ("actor/reward_kl_penalty",),
                               "verl's actor/reward_kl_penalty: the batch mean of each completion's mean per-token KL "
                               "estimate, the KL algorithm.kl_controller=adaptive steers toward kl_target.",
        KL_ESTIMATE),
    "reward_kl_penalty_coeff": Panel("KL coefficient", ("actor/reward_kl_penalty_coeff",),
                                     "verl's actor/reward_kl_penalty_coeff: the beta this step's rewards were shaped "
                                     "with (kl_placement=in_reward); constant under kl_controller=fixed, moved each step "
                                     "by the adaptive controller.",
        Metric("coefficient", 0.0)),
    "distill_reverse_kl": Panel("Reverse KL to the teacher", ("distill/reverse_kl",),
                                "On-policy distillation: token mean of log pi_student - log pi_teacher on the "
                                "student's samples, an unbiased estimate of KL(student || teacher) (one step can be < 0).",
        Metric("nats per token", better="lower")),
    "distill_teacher_logp": Panel("Teacher log-prob of the student's tokens", ("distill/teacher_logp",),
                                  "On-policy distillation: token mean of log pi_teacher(o_t), how likely the teacher "
                                  "finds what the student writes (rises toward 0 as the student imitates it).",
        Metric("nats (log-prob)", high=0.0, better="higher")),
    "entropy": Panel("Entropy", ("entropy",), "Mean per-token entropy of the policy (collapse = falls to 0).",
        NATS),
    "entropy_coef": Panel("Entropy coefficient", ("entropy_coef",),
                          "TRL's entropy_coef: the entropy bonus's coefficient after each optimiser update (mean over "
                          "the step's updates); with use_adaptive_entropy it moves by entropy_coef_delta to hold the "
                          "entropy at entropy_target (Skywork-OR1).",
        Metric("coefficient")),
    "entropy_kept": Panel("High-entropy tokens trained on", ("entropy/top_quantile_kept",),
                          "Fraction of the loss tokens top_entropy_quantile keeps: only the highest-entropy tokens get "
                          "a gradient (Beyond the 80/20 Rule; TRL top_entropy_quantile).",
        FRACTION.but(axis="fraction of tokens")),
    "clip": Panel("Clip ratios", ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
                                  "clip_ratio/dual_mean"),
                  "Fraction of tokens clipped below 1-eps_low (A<0), above 1+eps_high (A>0), either (TRL's names), "
                  "and capped by dual clip (A<0, ratio > clip_c).",
        FRACTION.but(axis="fraction of tokens"), {m: FRACTION.but(axis="fraction of tokens", secondary=True) for m in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/dual_mean")}),
    # own panel: a per-sequence extreme sits well above / below the token means beside it
    "clip_extremes": Panel("Clip ratio extremes over sequences", ("clip_ratio/low_min", "clip_ratio/high_max"),
                           "TRL 1.16: per micro-batch, over every rank's sequences, the smallest fraction of a "
                           "sequence's tokens clipped low (clip_ratio/low_min) and the largest clipped high "
                           "(clip_ratio/high_max), averaged over the step's micro-batches. high_max near 1 means "
                           "some completion is clipped almost everywhere.",
        FRACTION.but(axis="fraction of a sequence's tokens"), {}),
    "loss_token_fractions": Panel("Tokens the loss treats specially", ("cispo/clip_ratio", "dppo/masked_mean",
                                                                         "dppo/truncated_mean", "clip_cov/selected_mean",
                                                                         "kl_cov/selected_mean", "value/clipfrac"),
                                  "Per loss, the fraction of tokens it handles apart: CISPO weights clipped, DPPO tokens "
                                  "outside the trust region (masked) or with the ratio cut at clip_c (truncated), "
                                  "Clip-Cov tokens detached, KL-Cov tokens penalised, PPO value predictions clipped.",
        FRACTION.but(axis="fraction of tokens")),
    "sapo_gate": Panel("SAPO gradient gate", ("sapo/gate_mean",),
                       "Mean of 4 s (1 - s) rho over tokens, s = sigmoid(tau (rho - 1)): the share of the gradient "
                       "SAPO's soft gate lets through (1 on-policy).",
        Metric("share of the gradient", 0.0)),
    "length": Panel("Completion length", ("completions/mean_length", "completions/min_length", "completions/max_length"),
                    "Tokens per completion (mean, min, max over the batch).",
        TOKENS, _extremes("completions/min_length", "completions/max_length", TOKENS)),
    "terminated_length": Panel("Terminated completion length", ("completions/mean_terminated_length",
                                                                 "completions/min_terminated_length",
                                                                 "completions/max_terminated_length"),
                               "TRL: tokens per completion over the completions that ended with a stop token "
                               "(truncated ones left out; all 0 when none ended).",
        TOKENS, _extremes("completions/min_terminated_length", "completions/max_terminated_length", TOKENS)),
    "truncated": Panel("Truncated completions", ("completions/clipped_ratio",),
                       "Fraction of completions cut at max_completion_length.",
        FRACTION.but(axis="fraction of completions", better="lower")),
    "prompts_truncated": Panel("Truncated prompts", ("prompts/truncated_ratio",),
                               "Fraction of the batch's prompts that lost tokens to max_prompt_length.",
        FRACTION.but(axis="fraction of prompts", better="lower")),
    "sampling_mismatch": Panel("Rollout / trainer mismatch", ("sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max"),
                               "|log pi_trainer - log pi_rollout| per token (TRL names): vLLM, bf16, top_p < 1 or train.staleness make it grow.",
        _MISMATCH, {"sampling/sampling_logp_difference/max": _MISMATCH.but(secondary=True)}),
    "importance_ratio": Panel("Importance-sampling ratio", ("sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
                                                            "sampling/importance_sampling_ratio/max"),
                              "pi_trainer / pi_rollout as algorithm.rollout_correction weights it (raw per-token ratios when off).",
        _RATIO, _extremes("sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/max", _RATIO)),
    "dynamic_sampling": Panel("Dynamic sampling rounds", ("dynamic_sampling/rounds", "dynamic_sampling/filled_groups"),
                              "Rollout rounds to fill the batch with groups that have a reward spread (DAPO), and groups filled after the cap.",
        COUNT.but(axis="rounds / groups"), {"dynamic_sampling/rounds": COUNT.but(axis="rounds / groups", better="lower")}),
    "loss": Panel("Losses", ("loss/policy", "loss/value"), "Aggregated policy loss and value loss (PPO).",
        Metric("loss"), {"loss/value": Metric("loss", 0.0, better="lower")}),
    "grad_norm": Panel("Gradient norm", ("grad_norm",),
                       "Global gradient norm before clipping, averaged over the step's mu x minibatches "
                       "optimiser updates.",
        Metric("L2 norm", 0.0)),
    "num_tokens": Panel("Tokens seen", ("num_tokens",),
                        "TRL's num_tokens: prompt + completion tokens of every step so far, over all ranks "
                        "(the tokens x-axis counts completion tokens only).",
        TOKENS),
    "step_time": Panel("Step time (s)", ("perf/step_time", "perf/generation_time", "perf/train_time", "perf/eval_time"),
                       "Wall time of one step (rollout + rewards + updates), and of its generation (sampling and "
                       "rewards) and training parts; perf/eval_time: a held-out evaluation's wall time, at the steps "
                       "it runs (before the step's rollout, not in perf/step_time).",
        SECONDS.but(better="lower"), {m: SECONDS.but(secondary=True) for m in ("perf/generation_time", "perf/train_time")}),
}

# Columns of the store's frames that are keys, not metrics (``step`` is also in each metrics line).
KEY_COLUMNS = frozenset({"run_id", "arm", "seed", "step", "time"})
# A chart of one logged metric no fixed panel covers (a reward function's rewards/NAME/mean, a
# log_metric name): key ``metric:NAME``.
METRIC_KEY_PREFIX = "metric:"


def metric_key(name: str) -> str:
    """The chart key of one logged metric: 'rewards/acc/mean' -> 'metric:rewards/acc/mean'."""
    return METRIC_KEY_PREFIX + name


def resolve_panel(key: str) -> Panel:
    """A chart key -> its Panel: a ``PANELS`` key, or ``metric:NAME`` -> Panel(NAME, (NAME,)).
    ValueError naming the key otherwise."""
    if key in PANELS:
        return PANELS[key]
    if key.startswith(METRIC_KEY_PREFIX) and len(key) > len(METRIC_KEY_PREFIX):
        name = key[len(METRIC_KEY_PREFIX):]
        return Panel(name, (name,), f"Logged as {name} (no fixed chart draws it).")
    raise ValueError(f"chart={key!r} is not allowed; use one of: {', '.join(PANELS)}, or {METRIC_KEY_PREFIX}NAME "
                     "for a logged metric")


_COVERED = frozenset(m for p in PANELS.values() for m in p.metrics)


def has_values(column: pd.Series) -> bool:
    """``column.notna().any()``: whether it holds a value that is not missing (inf counts). A numpy
    float or integer column is read as its array (the Series operations cost ~60 us a call, and a
    redraw of the arms view asked ~80 columns); any other dtype as pandas says."""
    values = column.to_numpy() if isinstance(column.dtype, np.dtype) else None
    if values is not None and values.dtype.kind == "f":
        return not np.isnan(values).all()
    if values is not None and values.dtype.kind in "iub":
        return len(values) > 0
    return bool(column.notna().any())


def logged_metrics(df: pd.DataFrame) -> list[str]:
    """The numeric metric columns of a store frame (``RunStore.metrics`` / ``arm_metrics``) with at
    least one logged value, in column order; key columns left out."""
    return [c for c in df.columns if c not in KEY_COLUMNS and df[c].dtype.kind in "fi" and has_values(df[c])]


def extra_metrics(names) -> list[str]:
    """The logged metric names (iterable of str, e.g. ``logged_metrics``) that no fixed
    panel draws, key columns left out; sorted, so a reward function's mean and std sit together."""
    return sorted(set(names) - _COVERED - KEY_COLUMNS)


def chart_options(names) -> list[str]:
    """The Charts control's keys: every fixed panel, then ``metric:NAME`` per ``extra_metrics``."""
    return [*PANELS, *map(metric_key, extra_metrics(names))]


def has_data(df: pd.DataFrame, key: str) -> bool:
    """Whether the chart ``key`` has at least one logged value in ``df``."""
    return any(m in df.columns and has_values(df[m]) for m in resolve_panel(key).metrics)


# x-axis choices: label -> function of one run's rows (sorted by step) returning the x values.
X_LABELS = {"step": "step", "tokens": "completion tokens (cumulative)", "wall time": "wall time (s)"}


def _x_step(rows: pd.DataFrame) -> pd.Series:
    return rows["step"].astype(float)


def _x_tokens(rows: pd.DataFrame) -> pd.Series:
    """Cumulative completion tokens: ``perf/tokens`` if logged, else the sum over steps of
    mean_length x count (the batch's valid completion tokens)."""
    if "perf/tokens" in rows and has_values(rows["perf/tokens"]):
        return rows["perf/tokens"].astype(float)
    if {"completions/mean_length", "completions/count"} <= set(rows.columns):
        return (rows["completions/mean_length"] * rows["completions/count"]).fillna(0).cumsum()
    return pd.Series(np.nan, index=rows.index)


def _x_wall(rows: pd.DataFrame) -> pd.Series:
    """Seconds since the run's first logged step (event times)."""
    return rows["time"].astype(float) - float(rows["time"].min())


X_AXES: dict[str, Callable[[pd.DataFrame], pd.Series]] = {"step": _x_step, "tokens": _x_tokens, "wall time": _x_wall}

# The legend sits in one row between the title and the plot area, so it never meets the x-axis
# title below the plot (a legend at y < 0 was drawn over it). Only for charts of a few entries
# (the sweep view): a long one wraps upwards over the title.
TITLE_PLACE = {"x": 0.0, "xanchor": "left", "y": 0.97, "yanchor": "top", "yref": "container"}
LEGEND_PLACE = {"orientation": "h", "x": 0.0, "xanchor": "left", "y": 1.02, "yanchor": "bottom"}
# A chart's own legend where one is asked for: a column right of the plot area (plotly widens the
# right margin for it), so it never covers the title or the curves; it scrolls when long. The
# Compare page draws no chart legend at all but one for the page (``legend_html``).
LEGEND_SIDE = {"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1.0, "yanchor": "top", "font": {"size": 10}}
# The Live / Compare slider's default, TensorBoard's: single steps of a small-batch reward are
# mostly noise. Functions default to 0 (off), and so does the report (``--smooth``).
DEFAULT_SMOOTHING = 0.6

# Distinguishes the metrics of one panel; colours distinguish runs.
_DASHES = ("solid", "dash", "dot", "dashdot")
_COLOURS = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff", "#fecb52")


SIGNIFICANT_DIGITS = 12


def plotted(values) -> np.ndarray:
    """Values as drawn: rounded to ``SIGNIFICANT_DIGITS`` significant digits (NaN kept). An EMA or
    a mean over seeds of a constant metric (reward_std = 0.3 at every step) differs from it by
    ~1e-17, and plotly's autorange zoomed into that noise: a flat line drawn as a saw-tooth.
    (N,) -> (N,) float64."""
    y = np.asarray(values, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        magnitude = np.where(np.isfinite(y) & (y != 0), np.floor(np.log10(np.abs(y))), 0.0)
    scale = 10.0 ** (SIGNIFICANT_DIGITS - 1 - magnitude)
    return np.round(y * scale) / scale


def with_x(df: pd.DataFrame, x: str) -> pd.DataFrame:
    """``df`` (rows of many runs) plus a column named ``x`` holding each run's x-axis values
    (``X_AXES[x]`` applied run by run, rows sorted by run then step). For ``step`` the frame is
    only sorted: the column is already there."""
    if x not in X_AXES:
        raise ValueError(f"x={x!r} is not allowed; choose one of: {', '.join(X_AXES)}")
    ordered = df.sort_values(["run_id", "step"], kind="stable")
    if x == "step" or ordered.empty:
        return ordered
    xs = [X_AXES[x](rows) for _, rows in ordered.groupby("run_id", sort=False)]
    return ordered.assign(**{x: pd.concat(xs).astype(np.float64)})


def colour(i: int) -> str:
    """The i-th run's (or arm's) colour, the same in every panel."""
    return _COLOURS[i % len(_COLOURS)]


def _short_metric(metric: str) -> str:
    return metric.split("/", 1)[1] if "/" in metric else metric


# The y-axis follows the mean curves, not the band, when the band is more than SWAMP times as
# tall as the means' spread: a 2-seed t-band (t_{.975,1} = 12.7) otherwise squashes every mean
# flat. The range is the span drawn plus MARGIN of it each side, kept inside the metric's
# possible range (plus the margin): ``y_range``.
SWAMP = 3.0
MARGIN = 0.1


def y_range(means: np.ndarray, lows: np.ndarray, highs: np.ndarray, bounds: tuple[float, float], *,
            drawn: bool = False) -> list[float] | None:
    """The y-axis range: the span of the means and bands, or of the means alone when the band
    would swamp them (band span > SWAMP x the means' span), with MARGIN of that span each side
    (of the value itself, or 1, for a flat line), kept inside ``bounds`` widened by the margin.
    Set explicitly: plotly's autorange put a flat line of a non-negative metric at 0.3 on an axis
    from -0.5 to 1. None when nothing finite is drawn. Arrays: every drawn point of the chart;
    ``drawn``: they are already ``plotted`` (rounding them again changes no value)."""
    # as drawn (``plotted``): the EMA of a constant differs from it by ~1e-17, a "span" that
    # zoomed the axis onto one line with no tick on it
    if not drawn:
        means, lows, highs = plotted(means), plotted(lows), plotted(highs)
    means = means[np.isfinite(means)]
    if not len(means):
        return None
    edges = np.r_[lows[np.isfinite(lows)], highs[np.isfinite(highs)], means]
    lo, hi = float(means.min()), float(means.max())
    if float(edges.max() - edges.min()) <= SWAMP * (hi - lo):
        lo, hi = float(edges.min()), float(edges.max())
    pad = MARGIN * ((hi - lo) or abs(hi) or 1.0)
    # inside the range widened by the margin, but never cutting off a drawn point outside it
    return [max(lo - pad, min(bounds[0], lo) - pad), min(hi + pad, max(bounds[1], hi) + pad)]


def drawn_metrics(df: pd.DataFrame, panel: Panel, secondary: bool) -> list[str]:
    """The panel's metrics with data in ``df`` that are drawn: its primary ones, and its
    secondary ones (min / max / per-region: ``Metric.secondary``) only with ``secondary`` or when
    no primary one has data."""
    present = [m for m in panel.metrics if m in df.columns and has_values(df[m])]
    primary = [m for m in present if not panel.meta(m).secondary]
    return present if secondary or not primary else primary


def line_styles(metrics: list[str]) -> str:
    """Which line style is which metric in a chart of several ('' for one): the page's legend
    names the runs or arms (colours), a chart's caption names its metrics (dashes)."""
    return " · ".join(f"{_DASHES[m % len(_DASHES)]}: {name}" for m, name in enumerate(metrics)) if len(metrics) > 1 else ""


def legend_html(colours: Mapping[str, str]) -> str:
    """The page's one legend: a coloured line and the name per run or arm (``colours``: name ->
    colour, as the charts draw them), as inline HTML, names escaped."""
    swatch = ('<span style="display:inline-block;margin-right:14px;white-space:nowrap">'
              '<span style="display:inline-block;width:18px;height:3px;background:{c};vertical-align:middle;'
              'margin-right:5px"></span>{a}</span>')
    return ('<div class="wb-legend">' + "".join(swatch.format(c=c, a=html.escape(str(a))) for a, c in colours.items())
            + "</div>")


def run_colours(df: pd.DataFrame, labels: Mapping[str, str] | None = None) -> dict[str, str]:
    """Run label -> its colour in ``metric_figure`` (runs in order of first appearance in ``df``)."""
    labels = labels or {}
    return {labels.get(r, r): colour(i) for i, r in enumerate(dict.fromkeys(df["run_id"]))} if len(df) else {}


def metric_figure(df: pd.DataFrame, panel: Panel | str, *, x: str = "step", smoothing: float = 0.0,
                  labels: Mapping[str, str] | None = None, height: int = 300, secondary: bool = False,
                  legend: bool = True) -> go.Figure:
    """One panel (a Panel or a chart key, see ``resolve_panel``) as a line chart: a trace per
    (run, metric drawn: ``drawn_metrics``, secondary series only with ``secondary``).

    Trace names are ``LABEL`` for one-metric panels and ``LABEL · metric`` otherwise (LABEL =
    ``labels[run_id]`` or the run id). With ``smoothing`` > 0 the EMA is drawn and the raw values
    are kept as a faint line behind it (named ``... (raw)``, not in the legend). Runs keep one
    colour across panels (``run_colours``). The y-axis is titled with the metric's unit; the
    legend (``legend``) sits right of the plot area, or is left to the page (``legend_html``).
    """
    panel = resolve_panel(panel) if isinstance(panel, str) else panel
    if x not in X_AXES:
        raise ValueError(f"x={x!r} is not allowed; choose one of: {', '.join(X_AXES)}")
    smoothing = check_smoothing(smoothing)
    labels = labels or {}
    traces = []
    present = drawn_metrics(df, panel, secondary)
    run_ids = list(dict.fromkeys(df["run_id"])) if len(df) else []
    for r, run_id in enumerate(run_ids):
        rows = df[df["run_id"] == run_id].sort_values("step")
        xs = X_AXES[x](rows).to_numpy()
        line_colour = colour(r)
        label = labels.get(run_id, run_id)
        for m, metric in enumerate(present):
            if rows[metric].isna().all():
                continue
            name = label if len(present) == 1 else f"{label} · {_short_metric(metric)}"
            ys = rows[metric].to_numpy(dtype=np.float64)
            line = {"color": line_colour, "dash": _DASHES[m % len(_DASHES)], "width": 2}
            if smoothing > 0:
                traces.append({"type": "scatter", "x": xs, "y": ys, "name": f"{name} (raw)", "mode": "lines",
                               "showlegend": False, "opacity": 0.25, "line": {**line, "width": 1},
                               "hoverinfo": "skip", "legendgroup": name})
                ys = ema(ys, smoothing)
            # connectgaps: a metric logged every N steps (eval/*) is one line through its points, not
            # isolated points that a lines-only trace would not draw at all
            traces.append({"type": "scatter", "x": xs, "y": plotted(ys), "name": name, "mode": "lines", "line": line,
                           "legendgroup": name, "connectgaps": True, "showlegend": legend})
    kind = panel.meta(present[0]) if present else panel.kind
    drawn = np.concatenate([t["y"] for t in traces]) if traces else np.empty(0)
    fixed = y_range(drawn, drawn, drawn, kind.bounds)
    return WireFigure(_validate=False, data=traces, layout={  # built from fixed keys; a test validates it in full
        "title": {"text": panel.title, "font": {"size": 14}, **TITLE_PLACE}, "height": height,
        "margin": {"l": 50, "r": 10, "t": 40, "b": 40}, "xaxis": {"title": {"text": X_LABELS[x]}},
        "yaxis": {"title": {"text": kind.axis}, **({"range": fixed, "autorange": False} if fixed else {})},
        "showlegend": legend, "legend": LEGEND_SIDE,
        "uirevision": "keep"})  # zoom survives updates


def compare_figures(df: pd.DataFrame, panels: list[str] | None = None, **kwargs) -> dict[str, go.Figure]:
    """Figures of the given chart keys (``PANELS`` keys or ``metric:NAME``; default: every fixed
    panel with data in ``df``)."""
    keys = panels if panels is not None else available_panels(df)
    return {key: metric_figure(df, key, **kwargs) for key in keys}


def available_panels(df: pd.DataFrame) -> list[str]:
    """Fixed panel keys with at least one logged value in ``df`` (``PANELS`` order)."""
    return [key for key in PANELS if has_data(df, key)]


FINAL_METRICS = ("reward", "reward_std", "frac_reward_zero_std", "kl", "entropy", "clip_ratio/region_mean",
                 "completions/mean_length", "loss/policy", "grad_norm")


def final_metrics_table(df: pd.DataFrame, labels: Mapping[str, str] | None = None, last_k: int = 5) -> pd.DataFrame:
    """One row per run: steps logged, best reward, mean step time, and the mean of each of
    ``FINAL_METRICS`` over the run's last ``last_k`` logged steps (smooths step-to-step noise).

    Columns: run, steps, ``reward (best)``, then ``METRIC (last K)`` per metric present, then
    ``step time (s)``. Rows in order of first appearance of each run in ``df``.
    """
    if last_k < 1:
        raise ValueError(f"last_k={last_k!r} is not allowed; use an integer >= 1")
    labels = labels or {}
    rows = []
    for run_id in dict.fromkeys(df["run_id"]):
        run = df[df["run_id"] == run_id].sort_values("step")
        tail = run.tail(last_k)
        row = {"run": labels.get(run_id, run_id), "steps": int(run["step"].max()) + 1}
        if "reward" in run:
            row["reward (best)"] = float(run["reward"].max())
        for metric in FINAL_METRICS:
            if metric in run and has_values(run[metric]):
                row[f"{metric} (last {last_k})"] = float(tail[metric].mean())
        if "perf/step_time" in run:
            row["step time (s)"] = float(run["perf/step_time"].mean())
        rows.append(row)
    return pd.DataFrame(rows)


def progress(last_step: int, total_steps: int | None) -> float:
    """Fraction of steps done: (last_step + 1) / total_steps in [0, 1]; last_step = -1 means none."""
    if not total_steps or total_steps <= 0:
        return 0.0
    return min(max((last_step + 1) / total_steps, 0.0), 1.0)


def step_label(last_step: int, total_steps: int) -> str:
    """'k/N': steps done (last_step + 1; last_step = -1 means none) out of the run's total."""
    return f"{int(last_step) + 1}/{int(total_steps)}"
