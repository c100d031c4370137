"""Live / Compare: curves of chosen runs (or a comparison group) side by side, updating in place
while runs are live, with smoothing and x-axis controls, sample completions per step and a
final-metrics table. The arms view draws per arm (a recipe minus its seed) the mean curve over its
seeds with a band (95% CI of the mean, +-1 SE or min-max, clipped to the metric's range), the verdict table (is a gap real?) and, for sweeps, the final metric
against each swept value.

Two fragments: the status line re-runs every ``STATUS_EVERY_S``; the charts every
``CHARTS_EVERY_S``. Streamlit (>= 1.5x) hashes a plotly figure's spec into the chart's element id,
so a chart whose data changed is unmounted and drawn again from scratch in the browser; redrawn
every second, eleven charts on a busy 2-core machine were blank most of the time. A slower chart
cadence leaves each redraw time to finish, and a chart whose data did not change keeps its id
and is not touched at all."""

from __future__ import annotations

import hashlib
import re

from functools import partial

import pandas as pd
import streamlit as st

from workbench import runs as wr
from workbench.analysis import DEFAULT_WINDOW_FRAC, default_metric, final_window_values, sweep_table
from workbench.analysis.stats import DuplicateSeedError
from workbench.ui.common import STATUS_ICONS, run_labels, run_option, store, verdict_table
from workbench.analysis.bands import BANDS
from workbench.analysis.smoothing import MAX_SMOOTHING
from workbench.report import SWEEP_CAPTION, arm_sweeps, report_html
from workbench.runs.metrics_cache import MetricsCache
from workbench.runs.names import slug
from workbench.runs.store import runs_frame
from workbench.viz.arms import arm_colours, arm_figures, sweep_figures
from workbench.viz.export_figure import FORMATS, figure_bytes, file_name, static_export_problem
from workbench.viz.wire import figure_title
from workbench.viz.tables import CONFIDENCE
from workbench.viz.curves import (DEFAULT_SMOOTHING, PANELS, X_AXES, chart_options, compare_figures,
                                  drawn_metrics, final_metrics_table, has_data, legend_html, line_styles, logged_metrics, progress,
                                  resolve_panel, run_colours, step_label)

STATUS_EVERY_S = 1.0
CHARTS_EVERY_S = 5.0
COLUMNS = 2
VIEWS = ("per run", "arms")
MAX_ALL_PAIRS = 4  # arms up to which the verdict compares every pair by default


def _open_requested(runs, groups: list[str]) -> None:
    """A link that names what to open (``?group=G`` or ``?run=ID&run=ID``: Launch's "Open Live /
    Compare") selects it, once per link: the widgets' state is set before they are drawn, so it
    wins over an earlier choice of this session, and later choices on the page stand."""
    wanted = (st.query_params.get("group"), tuple(st.query_params.get_all("run")))
    if wanted == (None, ()) or st.session_state.get("compare_opened") == wanted:
        return
    st.session_state["compare_opened"] = wanted
    group, ids = wanted
    if group in groups:
        st.session_state["compare_mode"] = "Group"
        st.session_state["compare_group_select"] = group
    elif known := [i for i in ids if i in set(runs["id"])]:
        st.session_state["compare_mode"] = "Runs"
        st.session_state["compare_pick"] = known


def _selection(runs) -> list[str]:
    groups = store().groups()
    _open_requested(runs, groups["group"].tolist())
    modes = ["Group", "Runs"] if len(groups) else ["Runs"]
    mode = st.radio("Compare", modes, horizontal=True, key="compare_mode")
    if mode == "Group":
        names = groups["group"].tolist()
        wanted = st.session_state.get("compare_group")
        group = st.selectbox("Comparison group", names, index=names.index(wanted) if wanted in names else 0,
                             key="compare_group_select")
        return runs.loc[runs["group"] == group, "id"].tolist()[::-1]  # launch order
    # a default only while the widget has no state: beside a value set through session state (a
    # link's runs) the default is ignored and Streamlit logs a warning saying so
    default = None if "compare_pick" in st.session_state else (
        [r for r in st.session_state.get("compare_runs", []) if r in set(runs["id"])] or runs["id"].tolist()[:1])
    return st.multiselect("Runs", runs["id"].tolist(), default=default, format_func=run_option(runs), key="compare_pick")


def _chart_title(key: str) -> str:
    return resolve_panel(key).title


def _controls(ids: list[str], runs) -> dict:
    """The view's controls; ``runs``: the selected runs (list_runs rows). The arms view is the
    default once an arm of the selection has more than one seed. Charts offers the fixed panels
    (all chosen by default), then one chart per other metric the runs logged: read from the
    cached frame the view draws from, so naming them costs no query of its own."""
    logged = logged_metrics(_frame(_stamp(ids), tuple(ids)))
    options = chart_options(logged)
    cols = st.columns([1, 2, 3])
    smoothing = cols[0].slider("Smoothing (EMA weight)", 0.0, MAX_SMOOTHING, DEFAULT_SMOOTHING, 0.01,
                               key="compare_smoothing",
                               help="Debiased exponential moving average, as in TensorBoard / W&B (0: off). Per run: "
                               "the raw values stay faint behind the smoothed line. Arms: each seed is smoothed, then "
                               "the mean and band are taken over the smoothed seeds. The verdict always scores the "
                               "raw values.")
    x = cols[1].radio("x-axis", list(X_AXES), horizontal=True, key="compare_x")
    # Streamlit keeps the choice when the options change, dropping what the new selection did not log
    panels = cols[2].multiselect("Charts", options, default=list(PANELS), format_func=_chart_title,
                                 key="compare_panels",
                                 help="The fixed charts, then one per other metric the selected runs logged under "
                                 "its own name: each reward function's rewards/NAME/mean and std, what reward "
                                 "functions log with log_metric, ...")
    replicated = bool((runs["arm"].value_counts() > 1).any())
    cols = st.columns([2, 1, 3])
    view = cols[0].radio("View", VIEWS, index=VIEWS.index("arms" if replicated else "per run"), horizontal=True,
                         key="compare_view", help="per run: one curve per run. arms: per arm (a recipe minus its "
                         "seed) the mean over its seeds with the band chosen beside, and the verdict table.")
    seeds = cols[1].toggle("Show seeds", key="compare_seeds", disabled=view != "arms",
                           help="Each seed of an arm as a faint line behind its mean.")
    band = cols[2].radio("Band", list(BANDS), format_func=lambda b: BANDS[b].label(CONFIDENCE), horizontal=True, key="compare_band",
                         disabled=view != "arms",
                         help="Around each arm's mean over seeds: the 95% Student-t interval of the mean (wide with "
                         "2-3 seeds), +-1 standard error, or the range the seeds covered. Clipped to the metric's "
                         "possible range (a fraction's band stays in [0, 1]).")
    secondary = st.toggle("Secondary series", key="compare_secondary",
                          help="Also draw each chart's secondary lines: the batch min / max beside a mean length or "
                          "importance ratio, the low / high / dual clip regions beside either-side clipping, the "
                          "generation and training parts of the step time.")
    return {"smoothing": smoothing, "x": x, "panels": panels, "view": view, "seeds": seeds, "band": band,
            "secondary": secondary, "logged": set(logged)}


def _chart_help(keys: list[str]) -> None:
    """What each chosen chart draws: its logged metric names (TRL's where TRL logs them) and meaning."""
    with st.expander("What these charts show"):
        st.markdown("\n".join(f"- **{p.title}** ({', '.join(f'`{m}`' for m in p.metrics)}): {p.describe()}"
                               for p in map(resolve_panel, keys)))


def _status_line(runs) -> None:
    parts = [f"{STATUS_ICONS.get(r.status, '')} **{r.name}** {r.status} · step {step_label(r.last_step, r.total_steps)}"
             f" ({progress(r.last_step, r.total_steps):.0%})" for r in runs.itertuples()]
    st.markdown(" &nbsp;|&nbsp; ".join(parts))


def chat_parts(prompt) -> tuple[str, list[dict]] | None:
    """A conversational prompt (a list of {role, content} messages, TRL's format) -> (the last
    user turn, every other message in order): the question first, the long system prompt and
    earlier turns behind it. None for a plain-text prompt."""
    if not (isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt)):
        return None
    last = max((i for i, m in enumerate(prompt) if m.get("role") == "user"), default=len(prompt) - 1)
    return str(prompt[last]["content"]), [m for i, m in enumerate(prompt) if i != last]


def _sample_numbers(row) -> str:
    """'reward **1.000** · advantage +0.500 · 12 tokens (truncated)' (the numbers a table row shows)."""
    parts = [f"reward **{row['reward']:.3f}**", f"advantage {row['advantage']:+.3f}"]
    if pd.notna(row.get("length")):
        parts.append(f"{int(row['length'])} tokens" + (" (truncated)" if row.get("truncated") in (True,) else ""))
    return " · ".join(parts)


def _role_label(message: dict) -> str:
    """A chat message's role as a label: word characters only (the expander's label is markdown)."""
    return re.sub(r"[^\w-]", "", str(message.get("role", "")))[:24] or "?"


def _chat_sample(row, chat: tuple[str, list[dict]]) -> None:
    """One conversational sample as a chat: the last user turn, the earlier messages collapsed,
    and the completion beside it with its reward. Every part of it comes from a dataset, so all
    of it is drawn as plain text (markdown would render a link or an image it carried)."""
    question, others = chat
    with st.container(border=True):
        left, right = st.columns(2)
        with left:
            with st.chat_message("user"):
                st.text(question)
            if others:
                roles = ", ".join(dict.fromkeys(_role_label(m) for m in others))
                with st.expander(f"Earlier messages ({len(others)}: {roles})"):
                    for message in others:
                        st.text(f"{_role_label(message)}:\n{message['content']}")
        with right:
            with st.chat_message("assistant"):
                st.text(str(row["completion"]))
            st.caption(_sample_numbers(row))


def _samples(ids: list[str], labels: dict[str, str]) -> None:
    st.subheader("Sample completions")
    cols = st.columns([2, 1])
    run_id = cols[0].selectbox("Run", ids, format_func=lambda r: labels.get(r, r), key="compare_sample_run")
    steps = store().sample_steps(run_id)  # then only the chosen step's samples are read
    if not steps:
        st.caption("No samples logged yet.")
        return
    step = cols[1].selectbox("Step", steps, index=len(steps) - 1, key=f"compare_sample_step:{run_id}")
    rows = store().samples(run_id, step).drop(columns=["run_id", "step"])
    chats = [chat_parts(p) for p in rows["prompt"]]
    if any(chats):  # conversational prompts: raw JSON would start with the system prompt
        for (_, row), chat in zip(rows.iterrows(), chats):
            _chat_sample(row, chat or (str(row["prompt"]), []))
        return
    st.dataframe(rows, hide_index=True, column_config={
        "reward": st.column_config.NumberColumn(format="%.3f"),
        "advantage": st.column_config.NumberColumn(format="%+.3f", help="sequence-level advantage (token mean)")})


def _selected_runs(ids: list[str]):
    """``list_runs``' rows of ``ids``, in their order, read alone (the store may hold thousands of
    runs)."""
    return runs_frame(store().runs_by_id(ids))


def _live_status(ids: list[str], was_live: bool) -> None:
    """Status line and errors of the selected runs (re-runs alone every STATUS_EVERY_S while live)."""
    runs = _selected_runs(ids)
    _status_line(runs)
    for r in runs.itertuples():
        if r.status in ("failed", "lost") and r.error:
            st.error(f"{r.name}: {r.error}")
    if was_live and not runs["status"].isin(wr.ACTIVE_STATUSES).any():
        st.rerun(scope="app")  # every run ended: one full rerun draws the last steps and turns polling off


def _legend(colours: dict[str, str]) -> None:
    """The page's one legend (charts draw none: an arm or run has one colour on every chart)."""
    st.markdown(legend_html(colours), unsafe_allow_html=True)


def _chart_grid(figures: dict, prefix: str, captions: dict[str, str] | None = None) -> None:
    """Charts in COLUMNS columns, each with its caption when ``captions`` is given. The caption
    element is written even when empty: the page keeps one shape from redraw to redraw, so a
    caption that comes or goes while runs are live (a chart whose seeds differ) does not shift
    the elements after it, which remounted those charts blank for a moment."""
    keys = list(figures)
    for start in range(0, len(keys), COLUMNS):
        for col, key in zip(st.columns(COLUMNS), keys[start:start + COLUMNS]):
            col.plotly_chart(figures[key], key=f"{prefix}:{key}", config={"displaylogo": False})
            if captions is not None:
                col.caption(captions.get(key, ""))
            _figure_downloads(col, figures[key], f"{prefix}:{key}")


def _figure_downloads(col, fig, key: str) -> None:
    """PNG / SVG (print resolution, through Kaleido) and CSV (the plotted data) of one chart. The
    file is made only when its button is clicked (Streamlit's deferred download): a PNG takes
    seconds in a headless Chromium, far too slow for every redraw. Where PNG / SVG cannot be made
    on this server (``static_export_problem``) only CSV is offered; ``_export_notice`` says why."""
    title = figure_title(fig) or key  # a WireFigure is not built to read it
    formats = [f for f in FORMATS if FORMATS[f].static is False or not static_export_problem()]
    for cell, fmt in zip(col.columns(len(formats)), formats):
        cell.download_button(fmt.upper(), data=partial(figure_bytes, fig, fmt), file_name=file_name(title, fmt),
                             mime=FORMATS[fmt].mime, key=f"download:{fmt}:{key}", on_click="ignore",
                             help=f"{title} as {FORMATS[fmt].help}")


def _export_notice() -> None:
    """One message for the page when PNG / SVG export cannot work on this server (no Kaleido, no
    Chromium for it to drive): what is missing and the command that installs it. CSV still works."""
    problem = static_export_problem()
    if problem:
        st.info(f"PNG / SVG downloads are off on this server: {problem}. CSV downloads work.", icon="ℹ️")


def _report_download(group: str) -> None:
    """The comparison report of ``group``: one self-contained HTML file that opens offline (made
    when clicked, from the store as it is then), its curves smoothed as the page's slider says."""
    smoothing = st.session_state.get("compare_smoothing", DEFAULT_SMOOTHING)
    st.download_button("Download report (HTML)", data=partial(report_html, store(), group, smoothing=smoothing),
                       file_name=f"report-{slug(group)}.html", mime="text/html", key="download:report",
                       on_click="ignore", help="The arms' curves with bands, the verdict table, the sweep view, each "
                       "arm's recipe and the fields in which arms differ, seeds, commit and machine; opens offline. "
                       "Same as `python -m workbench report GROUP`.")


def _per_run_view(ids: list[str], controls: dict, labels: dict[str, str], records: list) -> None:
    metrics = _frame(_stamp(ids, records), tuple(ids))
    if metrics.empty:
        st.info("Waiting for the first step of the selected runs…")
    else:
        keys = [k for k in controls["panels"] if has_data(metrics, k)]
        _legend(run_colours(metrics, labels))
        figures = compare_figures(metrics, keys, x=controls["x"], smoothing=controls["smoothing"], labels=labels,
                                  secondary=controls["secondary"], legend=False)
        _chart_grid(figures, "chart", {key: line_styles(drawn_metrics(metrics, resolve_panel(key), controls["secondary"]))
                                       for key in figures})
        st.subheader("Final metrics")
        st.dataframe(final_metrics_table(metrics, labels), hide_index=True)


def _stamp(ids: list[str], records: list | None = None) -> tuple[str, str]:
    """What identifies the selected runs' data: the store's location and a digest of, per run in
    the order of ``ids``, its id, the last step ingested, its reward there, its status and its
    metrics generation (appended steps move the last step; a resume that redoes steps, or a row
    below the last, moves the generation). ``records``: the runs' records when the caller has just
    read them (``runs_by_id(ids)``). A digest, not the rows: Streamlit hashes a cached function's
    arguments on every call, three calls a redraw, and 30 runs' rows took ~0.6 ms each time."""
    records = records if records is not None else store().runs_by_id(ids)
    generations = store().metrics_generations(ids)
    rows = [(r.id, r.last_step, r.reward, r.status, generations.get(r.id)) for r in records]
    return str(store().url), hashlib.blake2b(repr(rows).encode(), digest_size=16).hexdigest()


@st.cache_resource(max_entries=4, show_spinner=False)
def _metrics_cache(location: str) -> MetricsCache:
    """The store's decoded metric rows, kept for every session: a read after new steps decodes only
    those steps (30 runs x 1,000 steps took ~0.6 s to read whole)."""
    return MetricsCache(store())


@st.cache_resource(max_entries=4, show_spinner=False)
def _frame(stamp: tuple[str, str], _ids: tuple[str, ...]):
    """``RunStore.arm_metrics(_ids)`` for the data ``stamp`` names (read-only: shared by sessions),
    drawn by both views and naming the Charts options. Cached because a script run re-runs on
    every widget change (the verdict's window, a panel). ``_ids`` is left out of the cache key
    (Streamlit skips an argument named with a leading underscore): the stamp names the runs."""
    return _metrics_cache(stamp[0]).arm_metrics(list(_ids))


@st.cache_resource(max_entries=8, show_spinner=False)
def _arm_charts(stamp: tuple[str, str], _ids: tuple[str, ...], panels: tuple[str, ...], x: str, smoothing: float,
                seeds: bool, band: str, secondary: bool):
    """The arms view's charts for data ``stamp`` and these controls (~0.3 s for 10 arms x 3 seeds x
    1,000 steps: changing the verdict's controls must not pay it again)."""
    return arm_figures(_frame(stamp, _ids), list(panels), x=x, smoothing=smoothing, show_seeds=seeds, band=band,
                       secondary=secondary)


def _arms_view(ids: list[str], controls: dict, _labels: dict[str, str], records: list) -> None:
    """Per arm: mean curves with bands, the verdict table, the sweep view (arms label themselves)."""
    stamp = _stamp(ids, records)
    frame = _frame(stamp, tuple(ids))
    if frame.empty:
        st.info("Waiting for the first step of the selected runs…")
        return
    keys = tuple(k for k in controls["panels"] if has_data(frame, k))  # metric:NAME keys too: in the cache key
    charts = _arm_charts(stamp, tuple(ids), keys, controls["x"], controls["smoothing"], controls["seeds"],
                         controls["band"], controls["secondary"])
    captions = {key: chart.caption for key, chart in charts.items()}
    # what every chart aggregates, said once; a chart whose seeds differ (a metric some runs do
    # not log) says its own under it, and a chart of several metrics which line style is which
    common = max(captions.values(), key=list(captions.values()).count, default="")
    st.caption(f"Mean over seeds per arm: {common}")
    _legend(arm_colours(frame))
    _chart_grid({key: chart.figure for key, chart in charts.items()}, "arms",
                {key: " · ".join(filter(None, (chart.styles, chart.note, chart.caption if chart.caption != common else "")))
                 for key, chart in charts.items()})
    metric, window = _verdict(frame)
    _sweep_view(records, frame, metric, window)


def _verdict(frame) -> tuple[str | None, float]:
    """The verdict's controls and table; returns the chosen metric (None: nothing logged) and window."""
    st.subheader("Verdict")
    metrics = logged_metrics(frame)
    if not metrics:
        st.info("No numeric metric logged yet.")
        return None, DEFAULT_WINDOW_FRAC
    chosen = default_metric(frame)
    cols = st.columns([2, 2, 2])
    metric = cols[0].selectbox("Metric", metrics, index=metrics.index(chosen) if chosen in metrics else 0,
                               key="verdict_metric", help="Default: the held-out eval reward once runs log it, "
                               "else the training reward.")
    window = cols[1].slider("Final window (share of each run's steps)", 0.01, 1.0, DEFAULT_WINDOW_FRAC, 0.01,
                            key="verdict_window", format="%.2f",
                            help="Each run is scored by its mean over this last share of its logged steps.")
    arms = [str(a) for a in pd.unique(frame["arm"])]
    # up to MAX_ALL_PAIRS arms every pair; beyond, n(n-1)/2 rows (45 for 10 arms) are unreadable:
    # each arm against the first
    baseline = cols[2].selectbox("Pairs", ["every pair", *arms], index=int(len(arms) > MAX_ALL_PAIRS),
                                 key="verdict_pairs",
                                 format_func=lambda a: a if a == "every pair" else f"each arm vs {a}")
    if metric is not None:
        verdict_table(frame, metric, window, baseline=None if baseline == "every pair" else baseline)
    return metric, window


def _sweep_view(records: list, frame, metric: str | None, window: float) -> None:
    sweeps = arm_sweeps(records)  # arm -> {swept field: value}; {} when nothing was swept
    try:
        scores = final_window_values(frame, metric, window) if sweeps and metric else {}
    except DuplicateSeedError as err:  # two runs of an arm with one seed: say so, as verdict_table does
        st.info(str(err))
        return
    if not scores:
        return
    st.subheader("Sweep")
    figures = sweep_figures(sweep_table(scores, {arm: sweeps[arm] for arm in scores}), metric)
    st.caption(SWEEP_CAPTION)
    _chart_grid(figures, "sweep")


def _live_charts(ids: list[str], controls: dict) -> None:
    """Charts, tables and samples of the chosen view (re-run alone every CHARTS_EVERY_S while live)."""
    records = store().runs_by_id(ids)  # read once for the labels, the data stamp and the sweep
    labels = run_labels(runs_frame(records))
    _chart_help([k for k in controls["panels"] if controls["logged"] & set(resolve_panel(k).metrics)])
    _export_notice()
    (_arms_view if controls["view"] == "arms" else _per_run_view)(ids, controls, labels, records)
    _samples(ids, labels)


def render() -> None:
    st.title("Live / Compare")
    runs = store().list_runs()  # kept current by the collector app.py starts
    if runs.empty:
        st.info("No runs yet. Launch one on the Launch page (or press Quick comparison there).")
        return
    ids = _selection(runs)
    if st.session_state.get("compare_mode") == "Group" and st.session_state.get("compare_group_select"):
        _report_download(st.session_state["compare_group_select"])
    if not ids:
        st.info("Choose at least one run.")
        return
    selected = runs[runs["id"].isin(ids)]
    controls = _controls(ids, selected)
    live = bool(selected["status"].isin(wr.ACTIVE_STATUSES).any())
    st.fragment(_live_status, run_every=STATUS_EVERY_S if live else None)(ids, live)
    st.fragment(_live_charts, run_every=CHARTS_EVERY_S if live else None)(ids, controls)
