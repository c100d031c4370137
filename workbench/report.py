"""A comparison report: one self-contained HTML file for a comparison group, to send a teammate
who opens it offline (no server, no network).

What it holds, in order: the provenance (workbench commit, the machine that wrote it, when), the
runs (arm, seed, status, steps, target / host), the arms' mean curves with their 95% bands
(``viz.arms.arm_figures``, the Live / Compare arms view), the verdict table
(``viz.tables.verdict``: ``analysis.stats`` shaped for display; every number also carries its
full-precision value in ``data-value``), the sweep view when the group is a sweep, the recipe
fields in which arms differ and each arm's whole recipe.

Self-contained: plotly.js is inlined once, in the first figure's ``<div>`` (about 4.7 MB); every
later figure calls the same ``Plotly``. No ``<script src>``, ``<link>`` or image refers to
anything outside the file.

Torch-free: ``python -m workbench report GROUP`` and the page's download read the store only.
``report_html`` is a pure function of the store's contents and the ``Provenance`` handed in
(``provenance()`` reads the machine and git).
"""

from __future__ import annotations

import html
import importlib.metadata
import platform
import subprocess
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from workbench.analysis import DEFAULT_WINDOW_FRAC
from workbench.analysis.smoothing import RAW_VERDICT_NOTE, check_smoothing
from workbench.runs import Run, RunError

REPORT_PACKAGES = ("torch", "transformers", "accelerate", "plotly", "scipy")  # versions the provenance lists
SWEEP_CAPTION = ("Final-window mean per swept value with its 95% CI over seeds (Student-t); a line per setting of "
                 "the other swept fields, 'all' pooling them.")
RECIPE_FIELDS_SHOWN = 40  # at most this many differing fields in the table (a sweep over model names differs a lot)


class Provenance(NamedTuple):
    """Where and from what a report was written: shown at its top."""

    commit: str  # the workbench's git commit ('abc1234 (uncommitted changes)'), or 'unknown'
    machine: dict[str, str]  # label -> value: host, OS, Python, CPUs, GPUs, memory, package versions
    written: str  # local time, 'YYYY-MM-DD HH:MM:SS'


def workbench_commit() -> str:
    """The git commit of the workbench code that runs, with '(uncommitted changes)' when its
    tracked files differ from it; 'unknown' outside a git checkout (an installed wheel)."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short=12", "HEAD")
    if not commit:
        return "unknown"
    return commit + (" (uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine_info() -> dict[str, str]:
    """This machine as ``workbench.machine`` sees it (CPUs this process may use, visible GPUs,
    memory), with the host, OS, Python and the versions of ``REPORT_PACKAGES`` (read from their
    metadata: nothing is imported)."""
    from workbench.machine import available_cpus, visible_gpu_count
    from workbench.model_facts import format_bytes, gpu_memory_bytes, host_memory_bytes

    gpus = visible_gpu_count()
    gpu_memory = gpu_memory_bytes() if gpus else None
    info = {"host": platform.node(), "OS": platform.platform(), "Python": platform.python_version(),
            "CPUs": str(available_cpus()),
            "GPUs": str(gpus) + (f" ({format_bytes(gpu_memory)} each)" if gpu_memory else ""),
            "memory": format_bytes(host_memory_bytes())}
    for name in REPORT_PACKAGES:
        try:
            info[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info[name] = "not installed"
    return info


def provenance() -> Provenance:
    """The commit, this machine and the time, read now."""
    return Provenance(workbench_commit(), machine_info(), time.strftime("%Y-%m-%d %H:%M:%S"))


def arm_sweeps(runs: list[Run]) -> dict[str, dict]:
    """arm -> {swept field: value} when the runs are a sweep (every arm has swept values, all of
    the same fields); {} when nothing was swept."""
    by_arm = {r.arm: r.sweep or {} for r in runs}
    return by_arm if all(by_arm.values()) and len({frozenset(v) for v in by_arm.values()}) == 1 else {}


# ---- HTML pieces (every text from the store is escaped) -----------------------------------------

_e = html.escape
NUMBER_FORMATS = {"mean": "{:.4g}", "IQM": "{:.4g}", "A − B": "{:.4g}", "p (Welch)": "{:.4g}", "P(A > B)": "{:.2f}"}

_STYLE = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f5f5f5; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 1em; }
.caption { color: #666; font-size: 0.85em; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
"""


def _cell(value: Any, fmt: str | None = None) -> str:
    """One ``<td>``: numbers right-aligned, shown with ``fmt``, their full value in ``data-value``
    (and as the tooltip); NaN / None / NA as '—'."""
    if value is None or value is pd.NA or (isinstance(value, (float, np.floating)) and not np.isfinite(value)):
        return "<td>—</td>"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return f"<td>{_e(str(value))}</td>"
    full = repr(float(value)) if isinstance(value, (float, np.floating)) else str(int(value))
    return f"<td class='num' data-value='{full}' title='{full}'>{_e((fmt or '{}').format(value))}</td>"


def _table(frame: pd.DataFrame, formats: dict[str, str] | None = None, table_class: str = "") -> str:
    """A frame as an HTML table, numbers of column C shown with ``formats[C]``."""
    formats = formats or {}
    head = "".join(f"<th>{_e(str(c))}</th>" for c in frame.columns)
    rows = "".join("<tr>" + "".join(_cell(v, formats.get(c)) for c, v in zip(frame.columns, row)) + "</tr>"
                   for row in frame.itertuples(index=False))
    return f"<table class='{table_class}'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _figures(figures: list, captions: list[str], *, with_plotlyjs: bool) -> str:
    """Figures as ``<div>``s in a grid; plotly.js inlined in the first when ``with_plotlyjs``
    (the report's first figure), never again."""
    parts = []
    for i, (fig, caption) in enumerate(zip(figures, captions)):
        div = fig.to_html(full_html=False, include_plotlyjs="inline" if with_plotlyjs and i == 0 else False,
                          config={"displaylogo": False, "responsive": True}, default_width="100%")
        parts.append(f"<figure>{div}<figcaption class='caption'>{_e(caption)}</figcaption></figure>")
    return "<div class='charts'>" + "".join(parts) + "</div>"


# ---- sections ------------------------------------------------------------------------------------

def _runs_section(arms: dict[str, list[Run]]) -> str:
    rows = [{"arm": arm, "seed": r.seed, "run": r.id, "status": r.status, "steps": f"{r.last_step + 1}/{r.total_steps}",
             "final reward": r.reward, "target": r.target, "host": r.host} for arm, runs in arms.items() for r in runs]
    seeds = "; ".join(f"{arm}: {', '.join(str(r.seed) for r in runs)}" for arm, runs in arms.items())
    return (f"<h2>Runs</h2><p>{len(arms)} arm{'s' * (len(arms) != 1)}, seeds per arm: {_e(seeds)}.</p>"
            + _table(pd.DataFrame(rows), {"final reward": "{:.4g}"}, "runs"))


def _curves_section(frame: pd.DataFrame, smoothing: float) -> tuple[str, int]:
    """The arms view's charts of every fixed panel with data; (HTML, number of figures)."""
    from workbench.analysis.bands import BANDS
    from workbench.viz.arms import arm_figures
    from workbench.viz.curves import PANELS, has_data

    keys = [k for k in PANELS if has_data(frame, k)]
    charts = arm_figures(frame, keys, smoothing=smoothing, legend=True)  # a report's chart stands alone
    if not charts:
        return "<h2>Curves</h2><p>No metric logged yet.</p>", 0
    how = (f"smoothing: EMA weight {smoothing:g}, each seed smoothed before the mean and band over seeds"
           if smoothing else "smoothing: off, raw logged values")
    return (f"<h2>Curves</h2><p class='caption' data-smoothing='{smoothing!r}'>Mean over seeds per arm ({how}); "
            f"each chart's caption names its band (the default: {_e(BANDS['ci'].caption(0.95))}).</p>"
            + _figures([c.figure for c in charts.values()], [" · ".join(filter(None, (c.styles, c.note, c.caption))) for c in charts.values()], with_plotlyjs=True),
            len(charts))


def _verdict_section(frame: pd.DataFrame, metric: str, window: float) -> str:
    from workbench.viz.tables import verdict

    result = verdict(frame, metric, window)
    pairs = _table(result.pairs, NUMBER_FORMATS, "verdict-pairs") if len(result.pairs) else ""
    return (f"<h2>Verdict</h2><p><b>{_e(metric)}</b>, score of a run = its mean over the {_e(result.window)}; "
            f"intervals at 95%; {_e(RAW_VERDICT_NOTE)}.</p>" + _table(result.arms, NUMBER_FORMATS, "verdict-arms") + pairs)


def _sweep_section(frame: pd.DataFrame, runs: list[Run], metric: str, window: float, offset: int) -> tuple[str, int]:
    """The sweep view (final metric against each swept value) when the group is a sweep; offset:
    figures already in the report (plotly.js is inlined in the first of all)."""
    from workbench.analysis import final_window_values, sweep_table
    from workbench.viz.arms import sweep_figures

    sweeps = arm_sweeps(runs)
    scores = final_window_values(frame, metric, window) if sweeps else {}
    if not scores:
        return "", 0
    figures = list(sweep_figures(sweep_table(scores, {arm: sweeps[arm] for arm in scores}), metric).values())
    body = _figures(figures, [SWEEP_CAPTION] * len(figures), with_plotlyjs=offset == 0)
    return "<h2>Sweep</h2>" + body, len(figures)


def _recipes_section(arms: dict[str, list[Run]]) -> str:
    from workbench.runs.planning import recipe_differences

    recipes = {arm: runs[0].recipe for arm, runs in arms.items()}
    differs = recipe_differences(recipes) if len(recipes) > 1 else {}
    shown = list(differs.items())[:RECIPE_FIELDS_SHOWN]
    if shown:
        table = pd.DataFrame({"field": [k for k, _ in shown], **{arm: [str(v[arm]) for _, v in shown] for arm in recipes}})
        more = f"<p>… and {len(differs) - len(shown)} more fields.</p>" if len(differs) > len(shown) else ""
        diff = "<p>Fields in which the arms' recipes differ (the seed aside):</p>" + _table(table, None, "differences") + more
    else:
        diff = "<p>The arms' recipes are the same but for the seed.</p>" if len(recipes) > 1 else ""
    full = "".join(f"<details><summary>{_e(arm)}</summary><pre>{_e(text)}</pre></details>" for arm, text in recipes.items())
    return "<h2>Recipes</h2>" + diff + "<p>Each arm's recipe (its first seed's; seeds differ only in train.seed):</p>" + full


def _provenance_section(group: str, prov: Provenance) -> str:
    machine = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in prov.machine.items())
    return (f"<h1>Comparison report: {_e(group)}</h1><p>Written {_e(prov.written)} by RL Workbench "
            f"commit <code>{_e(prov.commit)}</code> on this machine:</p><table class='machine'>{machine}</table>")


def report_html(store, group: str, *, metric: str | None = None, window: float = DEFAULT_WINDOW_FRAC,
                smoothing: float = 0.0, prov: Provenance | None = None) -> str:
    """The comparison report of ``group`` in ``store`` (a ``RunRepository``) as one HTML page.

    ``metric``: the verdict's and the sweep's metric (default ``analysis.default_metric``: the
    held-out eval reward once logged, else the training reward); ``window``: the final share of
    each run's logged steps that scores it; ``smoothing``: EMA weight of the curves, each seed
    smoothed before the mean and band (0: raw; recorded in the Curves section; the verdict is
    always of raw values); ``prov``: the provenance shown (default: ``provenance()``, read now).
    RunError naming the group when it has no runs or the metric when no run logged it; ValueError
    naming the window when it is not in (0, 1] or the smoothing when it is not in [0, 0.99]."""
    from workbench.analysis import default_metric
    from workbench.runs.cli import check_logged, group_arms  # compare's wording of a bad group / metric

    smoothing = check_smoothing(smoothing)
    arms = group_arms(store, group)
    runs = [r for rs in arms.values() for r in rs]
    frame = store.arm_metrics([r.id for r in runs])
    metric = metric or default_metric(frame)
    curves, n_curves = _curves_section(frame, smoothing)
    if metric is None:  # nothing logged yet
        verdict, sweep = "<h2>Verdict</h2><p>No metric logged yet.</p>", ""
    else:
        verdict = _verdict_section(frame, check_logged(frame, metric, group), window)
        sweep, _ = _sweep_section(frame, runs, metric, window, n_curves)
    body = (_provenance_section(group, prov or provenance()) + _runs_section(arms) + curves + verdict + sweep
            + _recipes_section(arms))
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(group)} · RL Workbench report</title>"
            f"<style>{_STYLE}</style></head><body>{body}</body></html>")
