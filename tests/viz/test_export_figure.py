"""Figure export: PNG and SVG rendered by Kaleido in the system Chromium (no download, no network),
and CSV holding exactly the plotted data, on the arms view's and the sweep view's real figures."""

from __future__ import annotations

import io
import struct
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers import missing_component
from workbench.viz.arms import arm_figures, sweep_figures
from workbench.viz.export_figure import (CSV_COLUMNS, DEFAULT_WIDTH, FORMATS, ExportError, browser_path, figure_bytes,
                                         file_name, static_export_problem)

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]


def arms_frame() -> pd.DataFrame:
    """Two arms x three seeds x 6 steps of reward and kl (kl logged by seed 0 alone at step 3)."""
    rng = np.random.default_rng(7)
    rows = [{"run_id": f"{arm}{seed}", "arm": arm, "seed": seed, "step": t, "time": 100.0 + t,
             "reward": float(rng.normal(0.3 * (arm == "rloo"), 0.2)), "kl": np.nan if seed and t == 3 else 0.01 * t * (1 + seed)}
            for arm in ("grpo", "rloo") for seed in range(3) for t in range(6)]
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def reward_figure():
    return arm_figures(arms_frame(), ["reward"], show_seeds=True)["reward"].figure


@pytest.fixture(scope="module")
def chromium():
    """Debian's chromium, apt-installed where missing as the browser tests do (never downloaded)."""
    from tests.e2e.conftest import CHROMIUM as E2E_CHROMIUM, _install_chromium

    assert Path(E2E_CHROMIUM) == CHROMIUM
    problem = _install_chromium()
    if problem:
        missing_component(problem)
    return CHROMIUM


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, read independently of any image library."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_png_is_a_png_at_the_requested_scale(reward_figure, chromium, monkeypatch):
    monkeypatch.delenv("BROWSER_PATH", raising=False)  # found without being told: chromium on PATH
    assert Path(browser_path()).resolve() == CHROMIUM.resolve()  # /bin/chromium where /bin comes first (merged /usr)
    data = figure_bytes(reward_figure, "png", scale=2)
    assert png_size(data) == (2 * DEFAULT_WIDTH, 2 * 300)  # arms figures are 300 px high and as wide as their column
    wide = reward_figure.update_layout(width=500)
    assert png_size(figure_bytes(wide, "png", scale=3)) == (1500, 900)


def test_svg_parses_and_draws_every_trace(reward_figure, chromium):
    svg = figure_bytes(reward_figure, "svg")
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    groups = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if "trace" in g.get("class", "").split()]
    assert len(groups) == len(reward_figure.data) == 2 * (3 + 2)  # per arm 3 seeds, the band, the mean
    texts = {t.text for t in root.iter("{http://www.w3.org/2000/svg}text")}
    assert "Reward (batch mean)" in texts and {"grpo", "rloo"} <= texts  # title and legend
    # the page's chart leaves its legend to the page; the exported image has its own, listing the
    # mean lines only (not bands or seeds), and the page's figure is left as it was
    assert not reward_figure.layout.showlegend
    legend = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if "traces" in g.get("class", "").split()]
    assert len(legend) == 2


def read_csv(data: bytes) -> pd.DataFrame:
    return pd.read_csv(io.BytesIO(data))


def test_csv_holds_exactly_the_plotted_points_and_bands(reward_figure):
    table = read_csv(figure_bytes(reward_figure, "csv"))
    assert list(table.columns) == CSV_COLUMNS
    drawn = {t.name: t for t in reward_figure.data}
    lines = [t for t in reward_figure.data if t.fill != "toself"]
    assert list(dict.fromkeys(table["trace"])) == [t.name for t in lines]  # drawing order; bands folded in
    for trace in lines:
        rows = table[table["trace"] == trace.name]
        assert rows["x"].tolist() == list(trace.x)
        assert np.array_equal(rows["y"].to_numpy(), np.asarray(trace.y, dtype=float), equal_nan=True)
        band = drawn.get(f"{trace.name} (95% CI)")
        if band is None:  # a seed's line: no band
            assert rows[["band_low", "band_high"]].isna().all().all()
            continue
        n = len(trace.x)  # the outline: along x on the upper edge, back on the lower one
        assert list(band.x[:n]) == list(trace.x)
        assert rows["band_high"].tolist() == list(band.y[:n])
        assert rows["band_low"].tolist() == list(band.y[n:][::-1])


def test_csv_of_a_band_with_a_gap_of_an_arm_without_band_and_of_error_bars():
    kl = arm_figures(arms_frame().query("not (arm == 'rloo' and seed > 0)"), ["kl"])["kl"].figure
    table = read_csv(figure_bytes(kl, "csv"))
    rloo = table[table["trace"] == "rloo"]  # one seed: a mean, no band
    assert len(rloo) == 6 and rloo[["band_low", "band_high"]].isna().all().all()
    grpo = table[table["trace"] == "grpo"]
    assert grpo["band_low"].notna().tolist() == [True, True, True, False, True, True]  # step 3: one seed, no band
    band = next(t for t in kl.data if t.name == "grpo (95% CI)")
    assert np.isnan(band.y).sum() == 1  # drawn as two outlines: both are in the CSV
    assert grpo["band_high"].dropna().tolist() == [y for y in band.y[:3]] + [y for y in band.y[7:9]]
    sweep = pd.DataFrame({"field": "train.mu", "value": [1, 2], "others": "all", "mean": [0.25, 0.5],
                          "ci_low": [0.125, 0.25], "ci_high": [0.5, 0.75], "n": [3, 3]})
    fig = sweep_figures(sweep, "reward")["train.mu"]
    rows = read_csv(figure_bytes(fig, "csv"))
    assert rows[["x", "y", "band_low", "band_high"]].values.tolist() == [[1, 0.25, 0.125, 0.5], [2, 0.5, 0.25, 0.75]]


def test_bad_format_and_missing_browser_are_named(reward_figure, monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="format='pdf' is not allowed; one of: png, svg, csv"):
        figure_bytes(reward_figure, "pdf")
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "nothing"))
    with pytest.raises(ExportError, match="BROWSER_PATH=.*nothing' is not a file: .* `apt-get install chromium`"):
        figure_bytes(reward_figure, "png")
    assert figure_bytes(reward_figure, "csv")  # CSV needs no browser
    assert list(FORMATS) == ["png", "svg", "csv"]
    assert file_name("Reward (batch mean)", "png") == "reward-batch-mean.png"
    assert file_name("KL · in loss", "svg") == "kl-in-loss.svg"


def test_without_a_chromium_on_path_png_and_svg_say_what_to_install_and_csv_works(reward_figure, monkeypatch,
                                                                                  tmp_path):
    """Kaleido's browser is looked up as choreographer does: BROWSER_PATH, else PATH. A server whose
    PATH holds no Chromium (here: an empty folder) gets the install command, not a traceback."""
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    problem = static_export_problem()
    assert problem == ("PNG / SVG export needs Chromium, and none is on PATH: `apt-get install chromium` (or set "
                       "BROWSER_PATH to a Chromium or Chrome executable)")
    for fmt in ("png", "svg"):
        with pytest.raises(ExportError) as err:
            figure_bytes(reward_figure, fmt)
        assert str(err.value) == problem
    assert read_csv(figure_bytes(reward_figure, "csv"))["trace"].iloc[0] == "grpo · seed 0"


def test_without_kaleido_png_and_svg_say_what_to_install(reward_figure, monkeypatch):
    """sys.modules[name] = None is Python's own 'this module cannot be imported' (an uninstalled
    package reads the same to ``import``): the export is told, nothing of it is replaced."""
    monkeypatch.setitem(sys.modules, "kaleido", None)
    with pytest.raises(ImportError):
        import kaleido  # noqa: F401
    assert static_export_problem() == ("PNG / SVG export needs the kaleido package, which is not installed: "
                                       "`pip install kaleido==1.5.0`")
    with pytest.raises(ExportError, match=r"`pip install kaleido==1\.5\.0`"):
        figure_bytes(reward_figure, "svg")
    assert figure_bytes(reward_figure, "csv")
    pinned = [line for line in (REPO / "requirements.txt").read_text().splitlines() if line.startswith("kaleido==")]
    assert pinned == ["kaleido==1.5.0"]  # the command names the version requirements.txt pins


def test_with_chromium_and_kaleido_there_is_no_problem(chromium, monkeypatch):
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    assert static_export_problem() is None
