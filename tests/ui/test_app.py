"""The app shell: navigation sections and the default page."""

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def test_app_opens_on_launch_with_every_section(home):
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert at.title[0].value == "Launch"
    from workbench.ui.labs import lab_pages
    from workbench.ui.nav import page_specs

    sections = page_specs()
    # the labs grouped in the order a learner takes them (one "Labs" list showed 5 of 34, "View 29 more")
    assert list(sections) == ["Workbench", "Concepts", "Estimators", "Losses", "Experiments"]
    assert [p.title for p in sections["Workbench"]] == ["Launch", "Runs", "Live / Compare", "Export", "Settings", "Audit",
                                                        "API tokens"]
    assert [p.url_path for p in sections["Workbench"]] == ["launch", "runs", "compare", "export", "settings", "audit", "tokens"]
    labs = [p for name, pages in sections.items() if name != "Workbench" for p in pages]
    assert sorted(p.url_path for p in labs) == sorted(url for _, _, url in lab_pages())  # every lab page, once
    assert [p.url_path for p in sections["Experiments"]] == ["lab-lens", "lab-experiments"]
    listed = [p.title for p in sections["Estimators"] if not p.hidden]
    assert listed.count("GRPO") == 1 and listed[:2] == ["GRPO", "Dr. GRPO"]  # no second "Estimator walkthrough: GRPO"
    hidden = {p.url_path for p in labs if p.hidden}
    assert hidden == {"walkthrough-adv-grpo", "walkthrough-adv-rloo", "walkthrough-adv-reinforce-pp", "walkthrough-adv-gae",
                      "walkthrough-loss-gspo", "walkthrough-loss-cispo"}


def test_the_app_opens_without_importing_torch(home):
    """The first visit to Launch showed skeletons for ~8 s: building the navigation imported every
    lab and through it torch. A fresh interpreter renders the app and has not imported torch."""
    import subprocess
    import sys

    script = ("import sys\nfrom streamlit.testing.v1 import AppTest\n"
              f"at = AppTest.from_file({APP!r}, default_timeout=120).run()\n"
              "assert not at.exception, at.exception\n"
              "print(at.title[0].value, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["Launch", "False"]


def test_lab_walkthrough_titles_come_from_the_specs():
    """The navigation lists every spec's preset walkthrough, under the spec's title, in spec order."""
    from workbench.algorithms import walkthroughs
    from workbench.ui.labs import lab_pages

    pages = {url: title for _, title, url in lab_pages()}
    expected = {f"walkthrough-{key.replace('_', '-')}": f"Walkthrough: {w.title}" for key, (_, w) in walkthroughs().items()}
    assert {u: t for u, t in pages.items() if u in expected} == expected
    assert list(expected) == ["walkthrough-grpo", "walkthrough-dr-grpo", "walkthrough-rloo", "walkthrough-reinforce-pp",
                              "walkthrough-ppo", "walkthrough-gspo", "walkthrough-cispo"]


def test_opening_a_page_by_its_address_opens_it(home):
    """'/' is a hidden page that switches to Launch, so that Launch has its own address (/launch):
    the default page is served only at '/', and /launch said "Page not found"."""
    from workbench.ui.nav import navigation

    pages = [p for section in navigation().values() for p in section]
    default = [p for p in pages if p._default]
    assert len(default) == 1 and default[0].visibility == "hidden"
