"""The comparison report of a real group: runs of the tiny model launched through the CLI (a sweep of
one field, 2 arms x 2 seeds x 3 steps), written by `python -m workbench report`, read back as HTML
and checked against the store and workbench.analysis computed here; and its bad input."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.helpers import home_with_tiny_model
from tests.test_cli import REPO, assert_one_line_error, cli
from tests.ui.figspec import traces
from workbench.analysis.smoothing import ema
from workbench.analysis import DEFAULT_WINDOW_FRAC, arm_summary, final_window_values, pairwise

ARMS = ["grpo · kl_coef=0.0", "grpo · kl_coef=0.04"]


def run_cli(home: Path, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORKBENCH_HOME": str(home), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "workbench", *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def group_home(tmp_path_factory, tiny_model_dir):
    """A home holding group 'g': grpo with kl_coef 0 and 0.04, seeds 0 and 1, 3 steps, all finished."""
    home = home_with_tiny_model(tmp_path_factory.mktemp("reporthome"), tiny_model_dir)
    done = run_cli(home, "launch", "grpo", "--seeds", "2", "--sweep", "algorithm.kl_coef=0.0,0.04",
                   "--set", "train.steps=3", "--group", "g", "--wait")
    assert done.returncode == 0, done.stderr[-3000:]
    return home


class Tables(HTMLParser):
    """Each <table class=...> of a page: its rows of cells, a cell as (text, data-value or None)."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[tuple[str, str | None]]]] = {}
        self._table = self._cell = None
        self._text = ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._table = self.tables.setdefault(attrs.get("class", ""), [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell, self._text = attrs.get("data-value"), ""

    def handle_data(self, data):
        self._text += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._table is not None:
            self._table[-1].append((self._text.strip(), self._cell))
        elif tag == "table":
            self._table = None


def tables(page: str) -> dict:
    parser = Tables()
    parser.feed(page)
    return parser.tables


@pytest.fixture(scope="module")
def report(group_home):
    out = group_home / "g.html"
    done = run_cli(group_home, "report", "g", "--out", str(out), timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == f"wrote {out}"
    return out.read_text(encoding="utf-8")


def test_the_report_holds_every_arm_seed_and_the_differing_field(report, group_home):
    from workbench.runs import RunStore

    store = RunStore(group_home / "runs.db")
    arms = store.arms("g")
    assert list(arms) == ARMS
    runs = tables(report)["runs"]
    assert [row[0][0] for row in runs[1:]] == [arm for arm in ARMS for _ in (0, 1)]
    assert [(row[1][0], row[2][0], row[3][0]) for row in runs[1:]] == [
        (str(r.seed), r.id, "finished") for arm in ARMS for r in arms[arm]]
    # the differing fields, computed here from the stored recipes (seed aside): kl_coef only
    recipes = {arm: yaml.safe_load(runs_[0].recipe) for arm, runs_ in arms.items()}
    differ = [f"{section}.{key}" for section, fields in recipes[ARMS[0]].items() if isinstance(fields, dict)
              for key, value in fields.items() if key != "seed" and recipes[ARMS[1]][section][key] != value]
    assert differ == ["algorithm.kl_coef"]
    rows = tables(report)["differences"]
    assert [[c[0] for c in row] for row in rows] == [["field", *ARMS], ["algorithm.kl_coef", "0.0", "0.04"]]
    for arm in ARMS:  # each arm's whole recipe, escaped
        assert f"<summary>{html.escape(arm)}</summary><pre>{html.escape(arms[arm][0].recipe)}</pre>" in report


def test_the_verdict_numbers_are_the_statistics_of_the_store(report, group_home):
    from workbench.runs import RunStore

    store = RunStore(group_home / "runs.db")
    frame = store.arm_metrics([r.id for runs in store.arms("g").values() for r in runs])
    values = final_window_values(frame, "reward", DEFAULT_WINDOW_FRAC)
    summary = arm_summary(values).set_index("arm")
    arms = tables(report)["verdict-arms"]
    header = [c[0] for c in arms[0]]
    for row in arms[1:]:
        cells = dict(zip(header, row))
        arm = cells["arm"][0]
        assert float(cells["mean"][1]) == summary.loc[arm, "mean"]  # the full value, exactly
        assert int(cells["seeds"][1]) == summary.loc[arm, "n"] == 2
    pair = pairwise(values).iloc[0]
    pairs = tables(report)["verdict-pairs"]
    cells = dict(zip([c[0] for c in pairs[0]], pairs[1]))
    assert (cells["A"][0], cells["B"][0]) == (pair["a"], pair["b"])
    assert float(cells["A − B"][1]) == pair["diff"]
    assert float(cells["P(A > B)"][1]) == pair["p_improvement"]
    assert cells["verdict"][0] == pair["verdict"]


def test_the_report_is_self_contained_with_provenance(report):
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)\s*=", report, re.I)  # nothing fetched
    assert report.count("<script>/**\n* plotly.js v") == 1  # plotly.js inlined once
    figures = report.count('class="plotly-graph-div"')
    assert figures >= 3 and "<h2>Sweep</h2>" in report  # curves, and the sweep view of kl_coef
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    assert f"commit <code>{commit}" in report
    machine = dict((row[0][0], row[1][0]) for row in tables(report)["machine"])
    assert machine["CPUs"] == str(len(os.sched_getaffinity(0))) and machine["Python"] == sys.version.split()[0]


def report_figures(page: str) -> list[dict]:
    """Every figure of a report as plotly draws it: (title, traces with x / y decoded)."""
    decoder, out = json.JSONDecoder(), []
    for found in re.finditer(r'Plotly\.newPlot\(\s*"[^"]+",\s*', page):
        data, end = decoder.raw_decode(page, found.end())
        layout, _ = decoder.raw_decode(page, end + page[end:].index("{"))
        out.append({"title": layout["title"]["text"], "traces": traces({"data": data})})
    return out


def test_smooth_w_smooths_each_seed_before_the_mean_records_the_weight_and_leaves_the_verdict_raw(report, group_home):
    from workbench.runs import RunStore

    out = group_home / "g-smooth.html"
    done = run_cli(group_home, "report", "g", "--out", str(out), "--smooth", "0.5", timeout=300)
    assert done.returncode == 0, done.stderr
    smoothed = out.read_text(encoding="utf-8")
    assert ("<p class='caption' data-smoothing='0.5'>Mean over seeds per arm (smoothing: EMA weight 0.5, each seed "
            "smoothed before the mean and band over seeds)") in smoothed
    assert "<p class='caption' data-smoothing='0.0'>Mean over seeds per arm (smoothing: off, raw logged values)" in report
    assert "(EMA weight 0.5, debiased as in TensorBoard), then averaged: the band spreads the smoothed seeds" in smoothed
    assert "verdicts use the raw logged values (smoothing applies to the curves only)" in smoothed
    for name in ("verdict-arms", "verdict-pairs"):  # the same numbers, to the last digit
        assert tables(smoothed)[name] == tables(report)[name]
    # the reward chart's mean line per arm: the mean over seeds of each seed's EMA, from the store
    store = RunStore(group_home / "runs.db")
    for page, weight in ((smoothed, 0.5), (report, 0.0)):
        reward = next(f for f in report_figures(page) if f["title"] == "Reward (batch mean)")["traces"]
        for arm, runs in store.arms("g").items():
            frame = store.arm_metrics([r.id for r in runs]).sort_values(["run_id", "step"])
            per_seed = [ema(rows["reward"].to_numpy(), weight) for _, rows in frame.groupby("run_id")]
            line = next(t for t in reward if t["name"] == arm)
            assert line["y"] == pytest.approx(np.mean(per_seed, axis=0).tolist(), abs=1e-12), (arm, weight)


def test_report_imports_no_torch(group_home, tmp_path):
    code = ("import sys\nfrom workbench.cli import main\n"
            f"code = main(['report', 'g', '--out', {str(tmp_path / 'r.html')!r}])\n"
            "print(code, 'torch' in sys.modules)")
    env = {**os.environ, "WORKBENCH_HOME": str(group_home), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "False"]


def test_bad_input_is_one_line_and_leaves_no_file(group_home, tmp_path):
    out = tmp_path / "r.html"
    assert_one_line_error(cli(group_home, "report", "nope", "--out", str(out)), "group='nope' has no runs", "groups: g")
    assert_one_line_error(cli(group_home, "report", "g", "--out", str(out), "--metric", "no/such"),
                          "metric='no/such' is not logged by group 'g'", "logged: ", "reward")
    assert_one_line_error(cli(group_home, "report", "g", "--out", str(out), "--window", "2"), "window_frac=2.0")
    # (NaN, negative and other weights: tests/analysis/test_smoothing.py, the same check_smoothing)
    assert_one_line_error(cli(group_home, "report", "g", "--out", str(out), "--smooth", "1"),
                          "--smooth=1.0 is not allowed; an EMA weight from 0 (off) to 0.99")
    assert_one_line_error(cli(group_home, "report", "g", "--out", str(tmp_path / "no" / "r.html")),
                          "--out=", "does not exist")
    assert list(tmp_path.iterdir()) == []
    folder = tmp_path / "a-folder"
    folder.mkdir()
    assert_one_line_error(cli(group_home, "report", "g", "--out", str(folder)), "--out=", "is a folder")
    # a folder nobody may create files in, root included: one line, not a traceback
    assert_one_line_error(cli(group_home, "report", "g", "--out", "/proc/r.html"), "--out='/proc/r.html'", "cannot write it")
    assert [p.name for p in tmp_path.iterdir()] == ["a-folder"] and list(folder.iterdir()) == []
