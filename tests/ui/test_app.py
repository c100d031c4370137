"""The app shell: navigation sections and the default page."""

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def test_app_opens_on_launch_with_every_section(home):
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert at.title[0].value == "Launch"
    from workbench.ui.labs import LAB_PAGES
    from workbench.ui.nav import page_specs

    sections = page_specs()
    assert list(sections) == ["Workbench", "Labs"]  # the estimator walkthroughs (Labs) replaced "Learn"
    assert [p.title for p in sections["Workbench"]] == ["Launch", "Runs", "Live / Compare", "Export", "Settings"]
    assert [p.url_path for p in sections["Workbench"]] == ["launch", "runs", "compare", "export", "settings"]
    assert [p.title for p in sections["Labs"]] == [title for _, title, _ in LAB_PAGES]
