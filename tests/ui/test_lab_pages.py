"""Every lab page, walked from the registry (LAB_PAGES): tables, knob texts and the navigation
that groups them (issue 19, "Labs")."""

import pytest
from streamlit.testing.v1 import AppTest

from workbench.ui.labs import LAB_PAGES


def lab(url: str) -> AppTest:
    script = ("from workbench.ui.labs import LAB_PAGES\n"
              f"{{u: f for f, t, u in LAB_PAGES}}[{url!r}]()\n")
    return AppTest.from_string(script, default_timeout=120)


def test_padding_cells_of_every_lab_table_render_empty(home):
    """The worked examples' captions say empty cells are padding, but a missing value was drawn
    as "None". Every table on every lab page that has a missing cell draws it empty."""
    seen = 0
    for _, _, url in LAB_PAGES:
        at = lab(url).run()
        assert not at.exception, (url, at.exception)
        for frame in at.dataframe:
            if frame.value.isna().to_numpy().any():
                seen += 1
                assert frame.proto.HasField("placeholder") and frame.proto.placeholder == "", (url, frame.proto.id)
    assert seen >= 10  # every advantage estimator's example pads its shorter completions
