"""The app shell: navigation sections, the default page, and the advantages page's numbers."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def test_app_opens_on_launch_with_every_section(home):
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert at.title[0].value == "Launch"
    from workbench.ui.labs import LAB_PAGES
    from workbench.ui.nav import page_specs

    sections = page_specs()
    assert [p.title for p in sections["Workbench"]] == ["Launch", "Runs", "Live / Compare", "Export", "Settings"]
    assert [p.url_path for p in sections["Workbench"]] == ["launch", "runs", "compare", "export", "settings"]
    assert [p.title for p in sections["Learn"]] == ["Advantages"]
    assert [p.title for p in sections.get("Labs", [])] == [title for _, title, _ in LAB_PAGES]


def _advantages():
    from workbench.ui import advantages_page

    advantages_page.render()


def test_advantages_page_shows_core_values():
    at = AppTest.from_function(_advantages, default_timeout=30).run()
    assert not at.exception
    df = at.dataframe[0].value
    # group [1, 0, 0, 1, 0.5]: mean 0.5, Dr. GRPO = r - 0.5; RLOO = 5/4 (r - 0.5)
    assert df["Dr. GRPO"].tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.0])
    assert df["RLOO"].tolist() == pytest.approx([0.625, -0.625, -0.625, 0.625, 0.0])


def test_bad_rewards_show_error_naming_field():
    at = AppTest.from_function(_advantages, default_timeout=30).run()
    at.text_input[0].input("1, x").run()
    assert "rewards='1, x'" in at.error[0].value
