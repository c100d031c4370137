"""The labs derive their per-algorithm entries from the specs (workbench.algorithms), with no table
keyed by algorithm name left in a lab: every registered spec has its entry in each lab, and a spec
registered by a test (with its function in the core registry) appears in the labs without a lab
file touched."""

import math
from dataclasses import replace

import pytest
import torch
from streamlit.testing.v1 import AppTest

from tests.ui.test_labs import chart, component, lab
from tests.viz.test_labs import values
from workbench import algorithms
from workbench.algorithms import FAMILIES, LabSlider, RegionLab, Spec

torch.set_num_threads(1)


def _widget(at, key: str):
    """The slider or number input with widget key ``key`` (a spec's LabSlider picks which)."""
    found = [w for kind in ("slider", "number_input") for w in at.get(kind) if w.key == key]
    assert found, f"no widget {key!r}"
    return found[0]


def test_every_registered_spec_has_its_entry_in_each_lab(home):
    """PPO-region lab: every ratio-curve loss offered, drawn at first as its spec says, one widget
    per spec slider; aggregation lab: every policy loss; a walkthrough page per registered name;
    each 'ratios' walkthrough maps the lab's sliders to its loss's knobs."""
    from workbench.ui.labs import COMPONENT_FAMILIES, page_url
    from workbench.ui.labs.estimators import component_pages

    specs = FAMILIES["policy_loss"].specs
    at = lab("lab-ppo-regions").run()
    assert not at.exception
    ratio = [s for s in specs.values() if s.ratio_curve]
    losses = at.multiselect(key="ppo_losses")
    assert list(losses.options) == [s.title for s in ratio]
    drawn = [s for s in ratio if s.region_lab and s.region_lab.drawn]
    assert list(losses.value) == [s.name for s in drawn]
    assert {t["name"] for t in chart(at, "ppo_analytic")["data"]} == {s.title for s in drawn}
    for s in ratio:
        for slider in s.region_lab.sliders if s.region_lab else ():
            assert _widget(at, f"ppo_{slider.key}").value == pytest.approx(slider.default)

    at = lab("lab-aggregation").run()
    assert not at.exception
    assert len(at.selectbox(key="agg_loss").options) == len(specs)
    assert {u for _, _, u in component_pages()} >= {page_url(f, n) for f in COMPONENT_FAMILIES for n in FAMILIES[f].specs}
    # a 'ratios' walkthrough launches its loss with its spec's region-lab widgets: each has some
    ratio_owners = [s for s in specs.values() if any(w.inputs == "ratios" for w in s.walkthroughs)]
    assert ratio_owners and all(s.region_lab is not None and s.region_lab.sliders for s in ratio_owners)


def _listed(section: str) -> list[tuple[str, str]]:
    """(url path, sidebar label) of the pages listed under ``section`` of the app's navigation."""
    from workbench.ui.nav import page_specs

    return [(p.url_path, p.title) for p in page_specs()[section] if not p.hidden]


def _gradient_curve(at, title: str) -> tuple[list[float], list[float]]:
    """(ratio, gradient) of ``title``'s A > 0 curve on the PPO-region chart (its traces: A > 0
    objective, A > 0 gradient, A < 0 objective, A < 0 gradient)."""
    traces = [t for t in chart(at, "ppo_analytic")["data"] if t["name"] == title]
    return values(traces[1]["x"]), values(traces[1]["y"])


def test_a_spec_registered_by_a_test_appears_in_the_labs(home):
    """A throwaway clip-like loss: registered in the core registry and given a spec with its own
    PPO-region slider; the PPO-region lab draws it with that slider's eps, the aggregation lab
    offers it, its walkthrough page renders; unregistered, it is gone."""
    from workbench.core import POLICY_LOSSES
    from workbench.core.choices import PolicyLossConfig
    from workbench.viz import lab_regions

    def halved(logp, old_logp, advantages, mask, cfg):
        """Half of the PPO clip (a test's loss)."""
        loss, diag = POLICY_LOSSES.get("clip")(logp, old_logp, advantages, mask, cfg)
        return 0.5 * loss, diag

    slider = LabSlider("test_halved_eps", "Halved eps", ("eps_low", "eps_high"), 0.0, 0.9, 0.1, 0.01)
    spec = Spec("policy_loss", "test_halved", "Halved clip", f"{__name__}:halved", ratio_curve=True, level="token",
                region_lab=RegionLab((slider,)))
    POLICY_LOSSES.register("test_halved")(halved)
    algorithms.register(spec)
    try:
        with pytest.raises(ValueError, match="has a spec already"):
            algorithms.register(spec)
        at = lab("lab-ppo-regions").run()
        assert not at.exception
        assert "test_halved" in at.multiselect(key="ppo_losses").value  # drawn at first: its RegionLab says so
        _widget(at, "ppo_test_halved_eps").set_value(0.3).run()
        assert not at.exception
        x, grad = _gradient_curve(at, "Halved clip")
        expected = lab_regions.analytic_curves({"Halved clip": ("test_halved", PolicyLossConfig(eps_low=0.3, eps_high=0.3))},
                                               advantages=(1.0, -1.0))
        expected = expected[expected["advantage"] == 1.0]
        assert x == pytest.approx(expected["ratio"].tolist())
        assert grad == pytest.approx(expected["gradient"].tolist())
        band = [(r, g) for r, g in zip(x, grad) if 1.1 < r < 1.3]  # clipped at eps 0.1, in the trust region at 0.3
        assert band and all(g == pytest.approx(0.5 * r) for r, g in band)

        at = lab("lab-aggregation").run()
        assert any("test_halved" in o for o in at.selectbox(key="agg_loss").options)
        at = component("walkthrough-loss-test-halved").run()
        assert not at.exception and at.title[0].value == "Loss walkthrough: Halved clip"
        assert ("walkthrough-loss-test-halved", "Halved clip") in _listed("Losses")  # in the navigation too
    finally:
        algorithms.unregister("policy_loss", "test_halved")
        POLICY_LOSSES.unregister("test_halved")
    assert "walkthrough-loss-test-halved" not in {url for url, _ in _listed("Losses")}
    at = lab("lab-ppo-regions").run()
    assert "test_halved" not in FAMILIES["policy_loss"].specs
    assert "Halved clip" not in at.multiselect(key="ppo_losses").options


def test_a_loss_with_a_ratios_walkthrough_joins_every_ratios_walkthrough(home):
    """The ratios walkthroughs compare PPO clip with every loss whose spec carries a 'ratios'
    walkthrough: a test's loss with one gets its column on GSPO's page, drawn with its spec's own
    widget, and its own walkthrough page in the navigation; unregistered, both are gone."""
    from workbench.algorithms import Walkthrough
    from workbench.core import POLICY_LOSSES

    def halved(logp, old_logp, advantages, mask, cfg):
        """Half of the PPO clip (a test's loss)."""
        loss, diag = POLICY_LOSSES.get("clip")(logp, old_logp, advantages, mask, cfg)
        return 0.5 * loss, diag

    def gspo_table(at):
        return next(d.value for d in at.dataframe if "GSPO grad" in d.value.columns)

    globals()["halved_for_ratios"] = halved
    slider = LabSlider("halved_eps", "Halved eps", ("eps_low", "eps_high"), 0.0, 0.9, 0.1, 0.01)
    spec = Spec("policy_loss", "test_halved2", "Halved clip", f"{__name__}:halved_for_ratios", ratio_curve=True,
                level="token", region_lab=RegionLab((slider,)),
                walkthroughs=(Walkthrough("test_halved2", "Halved clip", "grpo", "A test's loss.", inputs="ratios"),))
    POLICY_LOSSES.register("test_halved2")(halved)
    algorithms.register(spec)
    try:
        at = lab("walkthrough-gspo").run()
        assert not at.exception
        # log-ratios 0, 0.1, 0.5, -0.1, 2; A = 1: eps 0.1 clips the ratios above 1.1 (e^0.1 = 1.105 too);
        # below 1 an A > 0 token keeps its gradient R A, halved
        table = gspo_table(at)
        assert table["Halved clip grad"].tolist() == pytest.approx([0.5, 0.0, 0.0, 0.5 * math.exp(-0.1), 0.0])
        assert "Halved clip" in {t["name"] for t in chart(at, "gspo_pg_fig")["data"]}
        _widget(at, "gspo_halved_eps").set_value(0.7).run()  # now only e^2 leaves [0.3, 1.7]
        assert gspo_table(at)["Halved clip grad"].tolist() == pytest.approx(
            [0.5, 0.5 * math.exp(0.1), 0.5 * math.exp(0.5), 0.5 * math.exp(-0.1), 0.0])
        assert ("walkthrough-test-halved2", "Halved clip") in _listed("Losses")
    finally:
        algorithms.unregister("policy_loss", "test_halved2")
        POLICY_LOSSES.unregister("test_halved2")
    at = lab("walkthrough-gspo").run()
    assert "Halved clip grad" not in gspo_table(at).columns
    assert "walkthrough-test-halved2" not in {url for url, _ in _listed("Losses")}


def test_register_refuses_a_second_spec_and_unregister_an_unknown_name():
    with pytest.raises(ValueError, match="policy_loss 'clip' has a spec already"):
        algorithms.register(FAMILIES["policy_loss"].specs["clip"])
    with pytest.raises(KeyError, match="no policy_loss spec 'nope'"):
        algorithms.unregister("policy_loss", "nope")


def test_the_kl_lab_compares_every_estimator_with_a_value_of_its_own(home):
    """The KL lab's bias / variance table and figure list the registered estimators from the specs
    (k1, k2, k3, abs; the straight-through k1+ / k3+ / abs+ share their base's value); a spec
    registered by a test gets its row, computed by its registered function."""
    from workbench.core import KL_ESTIMATORS
    from workbench.viz import lab_kl

    def doubled_k1(logp, ref_logp):
        """2 k1 (a test's estimator)."""
        return 2 * (logp - ref_logp)

    kl_specs = FAMILIES["kl_estimator"].specs
    own = [n for n, s in kl_specs.items() if s.same_value_as is None]
    assert own == ["k1", "k2", "k3", "abs"]
    at = lab("lab-kl").run()
    assert not at.exception
    moments = at.dataframe[0].value.set_index("estimator")
    assert list(moments.index) == own
    assert {f"{n} expectation" for n in own} <= {t["name"] for t in chart(at, "kl_fig")["data"]}
    KL_ESTIMATORS.register("test_2k1")(doubled_k1)
    algorithms.register(Spec("kl_estimator", "test_2k1", "2 k1", f"{__name__}:doubled_k1", level="token"))
    try:
        at = lab("lab-kl").run()
        assert not at.exception
        table = at.dataframe[0].value.set_index("estimator")
        assert list(table.index) == [*own, "test_2k1"]
        assert table.loc["test_2k1", "mean"] == pytest.approx(2 * table.loc["k1", "mean"], rel=1e-12)
        assert table.drop(index="test_2k1").equals(moments)  # the others' numbers unchanged
        assert "test_2k1 expectation" in {t["name"] for t in chart(at, "kl_fig")["data"]}
    finally:
        algorithms.unregister("kl_estimator", "test_2k1")
        KL_ESTIMATORS.unregister("test_2k1")
    assert lab_kl.lab_estimators() == tuple(own)


def test_the_walkthroughs_estimator_table_and_known_biases_come_from_the_specs(home):
    """The walkthroughs' all-estimators table lists the estimators from the specs (a test's
    estimator registered with its spec gets its column, computed by its function; unregistered, it
    is gone), and a preset's known biases are those its chosen specs declare (``Spec.biases``): a
    test's aggregation declaring the length bias makes a preset that uses it show that example."""
    from workbench.core import ADVANTAGE_ESTIMATORS
    from workbench.ui.labs.estimators import preset_biases
    from workbench.viz import lab_estimators

    def doubled_dr_grpo(rewards, mask, cfg, **_):
        """2 x Dr. GRPO (a test's estimator)."""
        out = ADVANTAGE_ESTIMATORS.get("grpo")(rewards, mask, replace(cfg, scale="none"))
        return out._replace(advantages=2 * out.advantages, returns=2 * out.returns)

    globals()["doubled_dr_grpo"] = doubled_dr_grpo  # the spec's implementation path names it
    ADVANTAGE_ESTIMATORS.register("test_2dr")(doubled_dr_grpo)
    algorithms.register(Spec("advantage", "test_2dr", "2 Dr. GRPO", f"{__name__}:doubled_dr_grpo", needs_groups=True))
    try:
        at = lab("walkthrough-grpo").run()
        assert not at.exception
        table = next(d.value for d in at.dataframe if "GRPO" in d.value.columns)
        assert table["2 Dr. GRPO"].tolist() == [2 * a for a in table["Dr. GRPO"].tolist()]
        assert "2 Dr. GRPO" in {t["name"] for t in chart(at, "grpo_adv_fig")["data"]}
    finally:
        algorithms.unregister("advantage", "test_2dr")
        ADVANTAGE_ESTIMATORS.unregister("test_2dr")
    assert "2 Dr. GRPO" not in [v.label for v in lab_estimators.sequence_variants()]

    assert preset_biases("grpo") == ("std", "length")  # group std; seq-mean-token-mean
    assert preset_biases("dr_grpo") == () and preset_biases("cispo") == ("std",)
    agg = FAMILIES["aggregation"].specs["seq-mean-token-sum-norm"]  # dr_grpo's aggregation
    FAMILIES["aggregation"].specs[agg.name] = replace(agg, biases=lambda data: ("length",))
    try:
        assert preset_biases("dr_grpo") == ("length",)
    finally:
        FAMILIES["aggregation"].specs[agg.name] = agg
    assert preset_biases("dr_grpo") == ()
