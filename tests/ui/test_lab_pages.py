"""Every lab page, walked from the registry (lab_pages()): tables, knob texts and the navigation
that groups them (issue 19, "Labs")."""

import pytest
from streamlit.testing.v1 import AppTest

from workbench.ui.labs import lab_pages


def lab(url: str) -> AppTest:
    script = ("from workbench.ui.labs import lab_pages\n"
              f"{{u: f for f, t, u in lab_pages()}}[{url!r}]()\n")
    return AppTest.from_string(script, default_timeout=120)


def test_padding_cells_of_every_lab_table_render_empty(home):
    """The worked examples' captions say empty cells are padding, but a missing value was drawn
    as "None". Every table on every lab page that has a missing cell draws it empty."""
    seen = 0
    for _, _, url in lab_pages():
        at = lab(url).run()
        assert not at.exception, (url, at.exception)
        for frame in at.dataframe:
            if frame.value.isna().to_numpy().any():
                seen += 1
                assert frame.proto.HasField("placeholder") and frame.proto.placeholder == "", (url, frame.proto.id)
    assert seen >= 10  # every advantage estimator's example pads its shorter completions


def _widget_help(at, key: str) -> str | None:
    for kind in ("number_input", "text_input", "selectbox", "checkbox"):
        for w in at.get(kind):
            if w.key == key:
                return w.help
    return None


def test_every_loss_pages_knob_text_is_its_specs_own(home):
    """GMPO's and DPPO's pages described eps / clip_c as PPO's ratio clip (the text of the shared
    recipe field). Each loss page's knob table and knob widgets say what that loss's spec says."""
    from workbench.algorithms import FAMILIES
    from workbench.ui.labs import page_url
    from workbench.ui.labs.estimators import EXAMPLE_FIXED, knob_text

    specs = FAMILIES["policy_loss"].specs
    for name, spec in specs.items():
        at = lab(page_url("policy_loss", name)).run()
        assert not at.exception, (name, at.exception)
        if not spec.knobs:
            continue
        table = next(d.value for d in at.dataframe if "recipe key" in d.value.columns).set_index("knob")
        for k in spec.knobs:
            assert table.loc[k.name, "what it does"] == knob_text(k) != "", (name, k.name)
            if k.name not in EXAMPLE_FIXED:
                assert _widget_help(at, f"wt_{name}_{k.name}") == knob_text(k), (name, k.name)
    clip = {k.name: knob_text(k) for k in specs["clip"].knobs}
    for name, words in (("gmpo", "log-ratio"), ("dppo_tv", "probability difference"), ("dppo_kl", "binary KL")):
        for k in specs[name].knobs:
            assert knob_text(k) != clip[k.name], (name, k.name)  # not PPO's ratio clip
            if k.name != "clip_c":
                assert words in knob_text(k), (name, k.name)
    assert all("cap C of the detached ratio" in knob_text(k) for n in ("dppo_tv", "dppo_kl")
               for k in specs[n].knobs if k.name == "clip_c")


def test_every_hidden_lab_page_is_linked_from_the_walkthrough_that_stands_for_it(home):
    """The duplicate "Walkthrough: GRPO" / "Estimator walkthrough: GRPO" entries were merged: the
    registry walkthrough left the sidebar and each preset walkthrough of its spec links to it."""
    from workbench.ui.labs import labs

    hidden = {p.url for p in labs() if p.hidden}
    linked = set()
    for p in labs():
        if p.url.startswith("walkthrough-") and not p.hidden and not p.url.startswith(("walkthrough-adv-", "walkthrough-loss-",
                                                                                        "walkthrough-shaping-")):
            at = lab(p.url).run()
            assert not at.exception, (p.url, at.exception)
            linked |= {link.proto.page.strip("/") for link in at.get("page_link")}
    assert hidden and hidden <= linked
