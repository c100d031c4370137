"""Live / Compare's downloads: PNG / SVG / CSV under every chart (made when clicked, not on every
redraw) and, for a comparison group, its report."""

from __future__ import annotations

import json
import os
import shutil

from tests.ui.test_arms_view import add_seed
from tests.ui.conftest import page



def test_every_chart_has_png_svg_csv_and_the_group_its_report(home, store):
    for seed in range(2):
        add_seed(store, "grpo", seed, 4, 0.0)
        add_seed(store, "rloo", seed, 4, 0.5)
    at = page("compare_page").run()
    assert not at.exception
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    buttons = [b.proto for b in at.get("download_button")]
    labels = [b.label for b in buttons]
    assert labels[0] == "Download report (HTML)"
    assert labels[1:] == ["PNG", "SVG", "CSV"] * len(titles) and len(titles) >= 3
    # deferred: the page sends a file id to fetch on click, no bytes
    assert all(b.HasField("deferred_file_id") and not b.url for b in buttons)
    helps = [b.help for b in buttons[1::3]]
    assert [h.split(" as ")[0] for h in helps] == titles
    at.radio(key="compare_mode").set_value("Runs").run()
    assert [b.proto.label for b in at.get("download_button")][:1] == ["PNG"]  # no group: no report


def test_without_chromium_the_page_says_what_to_install_once_and_keeps_csv(home, store, monkeypatch, tmp_path):
    """The server's PATH holds no Chromium (an empty folder; BROWSER_PATH unset): one message names
    what is missing and the command that installs it; every chart keeps its CSV download only.
    With the browser back on PATH, PNG and SVG return and the message goes."""
    for seed in range(2):
        add_seed(store, "grpo", seed, 4, 0.0)
        add_seed(store, "rloo", seed, 4, 0.5)
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(tmp_path))
    at = page("compare_page").run()
    assert not at.exception
    notes = [i.value for i in at.info if "PNG / SVG" in i.value]
    assert notes == ["PNG / SVG downloads are off on this server: PNG / SVG export needs Chromium, and none is on "
                     "PATH: `apt-get install chromium` (or set BROWSER_PATH to a Chromium or Chrome executable). "
                     "CSV downloads work."]
    charts = len(at.get("plotly_chart"))
    assert [b.proto.label for b in at.get("download_button")] == ["Download report (HTML)"] + ["CSV"] * charts
    monkeypatch.setenv("PATH", path)
    if shutil.which("chromium") is None:
        return  # this machine has no Chromium at all: nothing more to see
    at.run()
    assert not [i for i in at.info if "PNG / SVG" in i.value]
    assert [b.proto.label for b in at.get("download_button")][1:] == ["PNG", "SVG", "CSV"] * charts
