"""The lab pages' wiring (AppTest): widgets -> figures, figures read back from the plotly spec,
empirical views on a real run launched through workbench.runs (tiny model, real subprocess)."""

import json
import math

import numpy as np
import pytest
import torch
from streamlit import config
from streamlit.testing.v1 import AppTest

from tests.helpers import home_with_tiny_model
from tests.viz.test_labs import values
from workbench.recipe import load_recipe
from workbench.runs.authz import Principal, local_principal

torch.set_num_threads(1)


def lab(url: str) -> AppTest:
    """One lab page rendered on its own, looked up by its url path in lab_pages()."""
    script = ("from workbench.ui.labs import lab_pages\n"
              f"{{u: f for f, t, u in lab_pages()}}[{url!r}]()\n")
    return AppTest.from_string(script, default_timeout=120)


def launched_run(tmp_path_factory, tiny_model_dir, name: str, preset: str, overrides: list[str]):
    """Fixture body: a fresh workbench home (the session's tiny model in it) and one real run of
    ``preset`` launched by workbench.runs on this machine; yields (store, run_id)."""
    home = tmp_path_factory.mktemp(name)
    mp = pytest.MonkeyPatch()
    mp.setenv("WORKBENCH_HOME", str(home))
    mp.delenv("WORKBENCH_PASSWORD", raising=False)
    home_with_tiny_model(home, tiny_model_dir)  # the session's build
    from workbench.runs import RunStore, launch, wait

    store = RunStore()
    run_id = launch(load_recipe(preset, overrides), target="local", principal=Principal("test", "admin", "test"), store=store)
    assert wait(run_id, store=store, timeout_s=600) == "finished", store.get_run(run_id)
    old = config.get_option("server.address")
    config.set_option("server.address", "127.0.0.1")
    yield store, run_id
    config.set_option("server.address", old)
    mp.undo()


@pytest.fixture(scope="module")
def lab_home(tmp_path_factory, tiny_model_dir):
    """A workbench home with one real run: GRPO, mu = 2 (so tokens get clipped), 3 steps,
    diagnostics and the lens every step, launched by workbench.runs on this machine."""
    yield from launched_run(tmp_path_factory, tiny_model_dir, "labs", "grpo",
                            ["train.steps=3", "train.mu=2", "logging.lens_every=1", "logging.diagnostics_every=1",
                             "sampling.prompts_per_step=2", "sampling.num_generations=4"])


def chart(at, key):
    """The plotly spec of the chart whose widget key contains ``key``."""
    for c in at.get("plotly_chart"):
        if key in c.proto.id:
            return json.loads(c.proto.spec)
    raise AssertionError(f"no chart with key {key!r}; charts: {[c.proto.id for c in at.get('plotly_chart')]}")


# ---- PPO regions --------------------------------------------------------------------------

def test_ppo_lab_analytic_follows_the_sliders(lab_home):
    at = lab("lab-ppo-regions").run()
    assert not at.exception
    fig = chart(at, "ppo_analytic")
    assert {t["name"] for t in fig["data"]} == {"PPO clip", "GSPO", "CISPO", "SAPO", "GMPO"}
    x1 = sorted({s["x1"] for s in fig["layout"]["shapes"]})
    assert 1.28 in x1 and 2.0 in x1  # eps_high 0.28 and dual clip c = 2 by default
    at.slider(key="ppo_eps_high").set_value(0.4).run()
    assert 1.4 in {s["x1"] for s in chart(at, "ppo_analytic")["layout"]["shapes"]}
    at.checkbox(key="ppo_use_c").uncheck().run()
    assert 2.0 not in {s["x1"] for s in chart(at, "ppo_analytic")["layout"]["shapes"]}


def test_ppo_lab_bad_dual_clip_names_the_field(lab_home):
    at = lab("lab-ppo-regions").run()
    at.slider(key="ppo_eps_high").set_value(0.9).run()
    at.slider(key="ppo_c").set_value(1.5).run()
    assert at.error[0].value == "clip_c=1.5 must be greater than 1 + eps_high = 1.9"  # PolicyLossConfig's own check


def test_ppo_lab_tokens_of_a_real_run(lab_home):
    store, run_id = lab_home
    at = lab("lab-ppo-regions").run()
    assert not at.exception
    at.multiselect(key="ppo_runs").set_value([run_id]).run()
    steps = store.diagnostic_steps(run_id)
    assert steps == [0, 1, 2]
    diag = store.diagnostics(run_id, steps[-1])
    # the run's own (core) labels, counted straight from the event over completion tokens
    mask = np.asarray(diag["mask"]) == 1
    codes = np.asarray(diag["region"])[mask]
    names = diag["region_names"]
    expected = {name: int((codes == code).sum()) for code, name in enumerate(names) if (codes == code).any()}
    if (codes < 0).any():
        expected["masked"] = int((codes < 0).sum())
    scatter = chart(at, "ppo_scatter")
    shown = {t["name"]: len(values(t["x"])) for t in scatter["data"]}
    assert shown == expected
    metric = at.metric[0]
    assert metric.value == f"{np.asarray(diag['zero_grad'])[mask].mean():.1%}"
    shares = chart(at, "ppo_shares")
    assert values(shares["data"][0]["x"]) == steps


# ---- loss aggregation ---------------------------------------------------------------------

def test_aggregation_lab_book_example_and_errors(lab_home):
    at = lab("lab-aggregation").run()
    assert not at.exception
    df = at.dataframe[0].value.set_index(["mode", "seq"])
    assert df.loc[("seq-mean-token-mean", 0), "grad_wrt_ratio"] == pytest.approx(0.25)
    assert df.loc[("seq-mean-token-mean", 1), "grad_wrt_ratio"] == pytest.approx(1 / 7)
    assert df.loc[("seq-mean-token-sum-norm", 0), "grad_wrt_ratio"] == pytest.approx(1 / 7)
    assert df.loc[("token-mean", 0), "weight"] == pytest.approx(1 / 11)
    fig = chart(at, "agg_fig")
    assert [t["name"] for t in fig["data"]] == ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                                "seq-mean-token-sum-norm", "token-sum-norm", "token-sum"]
    assert df.loc[("token-sum", 0), "grad_wrt_ratio"] == 2.0  # verl token-sum: no normaliser, dL/dR = A
    assert df.loc[("token-sum-norm", 0), "grad_wrt_ratio"] == pytest.approx(2 / 7)  # verl < 0.9: / L_max only
    assert len(values(fig["data"][0]["y"])) == 11
    at.text_area(key="agg_losses").input("1, 1\n1, x").run()
    assert "per-token losses line 2='1, x'" in at.error[0].value


def test_aggregation_lab_empirical_views_of_a_real_run(lab_home):
    store, run_id = lab_home
    at = lab("lab-aggregation").run()
    at.selectbox(key="agg_run").select(run_id).run()
    at.multiselect(key="agg_drift_runs").set_value([run_id]).run()
    weights = chart(at, "agg_weights")
    names = [t["name"] for t in weights["data"]]
    assert "seq-mean-token-mean (this run)" in names  # the GRPO preset's aggregation
    drift = chart(at, "agg_drift")
    assert values(drift["data"][0]["x"]) == [0, 1, 2]
    assert drift["data"][0]["name"] == f"{run_id} (seq-mean-token-mean)"


# ---- walkthroughs -------------------------------------------------------------------------

@pytest.mark.parametrize("url, source", [
    ("walkthrough-grpo", "def grpo_advantages"), ("walkthrough-dr-grpo", "def grpo_advantages"),
    ("walkthrough-rloo", "def rloo_advantages"), ("walkthrough-reinforce-pp", "def reinforce_pp_advantages"),
    ("walkthrough-ppo", "def gae_advantages"), ("walkthrough-gspo", "def gspo_policy_loss"),
    ("walkthrough-cispo", "def cispo_policy_loss"),
])
def test_every_walkthrough_shows_equations_source_and_all_estimators(lab_home, url, source):
    at = lab(url).run()
    assert not at.exception
    assert at.get("latex") and source in at.code[0].value
    # and the aggregation its preset trains with, found by name in core's registry
    preset = load_recipe(url.removeprefix("walkthrough-").replace("-", "_"))
    assert f'@LOSS_AGGREGATIONS.register("{preset.algorithm.aggregation}")' in at.code[0].value
    table = next(d.value for d in at.dataframe if "Dr. GRPO" in d.value.columns)
    assert table["Dr. GRPO"].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75])
    assert table["RLOO"].tolist()[0] == pytest.approx(1.0)
    assert at.button(key=f"{url.removeprefix('walkthrough-').replace('-', '_')}_launch")


def test_walkthrough_inputs_and_errors(lab_home):
    at = lab("walkthrough-grpo").run()
    at.text_input(key="grpo_rewards").input("1, 0, x").run()
    assert "rewards='1, 0, x'" in at.error[0].value
    assert "Fix the inputs above to launch a run with them." in [c.value for c in at.caption]
    at = lab("walkthrough-ppo").run()
    gae = at.dataframe[0].value
    assert gae["A (lambda 1: G_t - V_t)"].tolist() == pytest.approx([0.8, 0.7, 0.6, 0.4, 0.2])
    at.text_input(key="ppo_vt").input("0.1, 0.2").run()
    assert "values has 2 entries but rewards has 5" in at.error[0].value
    at = lab("walkthrough-cispo").run()
    pg = at.dataframe[0].value
    assert pg["CISPO grad"].tolist()[-1] == pytest.approx(1.28)  # log-ratio 2.0: weight capped, gradient kept
    assert pg["PPO clip grad"].tolist()[-1] == 0.0


def test_grpo_walkthrough_shows_the_engines_advantages(tmp_path, monkeypatch):
    """Same rewards, same numbers as a run: the page's table is compute_advantages on float32
    rewards (the engine's), bit for bit, and an all-equal group is exactly 0 (0.2 x 8 showed
    -0.015 in the Samples table; 0.7 x 3 at eps 0 was 1 ulp / 1 ulp in the page's float64)."""
    from workbench.core import REWARD_DTYPE, AdvantageConfig, compute_advantages

    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))
    monkeypatch.delenv("WORKBENCH_PASSWORD", raising=False)
    rewards = [0.2] * 8 + [1.0] + [0.0] * 7
    at = lab("walkthrough-grpo").run()
    at.text_input(key="grpo_rewards").input(", ".join(map(str, rewards)))
    at.number_input(key="grpo_G").set_value(8).run()
    assert not at.exception and not at.error
    table = next(d.value for d in at.dataframe if "GRPO" in d.value.columns)
    engine = compute_advantages("grpo", torch.tensor(rewards, dtype=REWARD_DTYPE), torch.ones(16, 1),
                                AdvantageConfig(group_size=8, eps=1e-6)).advantages[:, 0]
    assert table["GRPO"].tolist() == engine.tolist()
    assert table["GRPO"].tolist()[:8] == [0.0] * 8
    at.text_input(key="grpo_rewards").input("0.7, 0.7, 0.7")
    at.number_input(key="grpo_G").set_value(3)
    at.number_input(key="grpo_eps").set_value(0.0).run()
    table = next(d.value for d in at.dataframe if "GRPO" in d.value.columns)
    assert table["GRPO"].tolist() == [0.0] * 3 and table["RLOO"].tolist() == [0.0] * 3


def test_walkthroughs_show_where_the_clip_formula_is(lab_home):
    for url in ("walkthrough-grpo", "walkthrough-gspo"):
        assert "def clipped_objective" in lab(url).run().code[0].value, url


def test_group_size_is_checked_by_the_recipe_not_the_page(lab_home):
    at = lab("walkthrough-ppo").run()
    at.number_input(key="ppo_G").set_value(1).run()
    assert not at.error and at.button(key="ppo_launch")  # GAE needs no group baseline
    at = lab("walkthrough-grpo").run()
    at.number_input(key="grpo_G").set_value(1).run()
    assert "algorithm.advantage='grpo' needs a group baseline: sampling.num_generations must be >= 2" in at.error[0].value


def test_launch_button_needs_sign_in_and_launches_with_the_pages_settings(lab_home, monkeypatch):
    """GSPO's eps inputs and CISPO's cap reach the launched recipes; the runs are preselected on
    Live / Compare and owned by the signed-in user."""
    store, _ = lab_home
    monkeypatch.setenv("WORKBENCH_PASSWORD", "s3cret")
    from workbench.recipe import Recipe
    from workbench.runs import cancel

    launched = {}
    # each walkthrough launches its own loss with its spec's widgets (GSPO: two number inputs, CISPO: a slider)
    for key, widgets in (("gspo", {"gspo_gspo_low": 0.1, "gspo_gspo_high": 0.12}), ("cispo", {"cispo_cispo_high": 0.5})):
        at = lab(f"walkthrough-{key}").run()
        assert at.button(key=f"{key}_launch").disabled
        assert "sign in" in " ".join(c.value for c in at.caption).lower()
        at.session_state["wb_user"], at.session_state["wb_authed"] = "erin", True
        at.run()
        assert not at.button(key=f"{key}_launch").disabled
        for widget, value in widgets.items():
            next(w for kind in ("slider", "number_input") for w in at.get(kind) if w.key == widget).set_value(value).run()
        at.button(key=f"{key}_launch").click().run()
        assert not at.exception and at.success, [e.value for e in at.error]
        (run_id,) = at.session_state["compare_runs"]
        launched[key] = store.get_run(run_id)
        cancel(run_id, principal=local_principal(), store=store)
    assert {k: r["created_by"] for k, r in launched.items()} == {"gspo": "erin (password)", "cispo": "erin (password)"}
    gspo, cispo = (Recipe.from_yaml(launched[k]["recipe"]).algorithm for k in ("gspo", "cispo"))
    assert (gspo.policy_loss, gspo.eps_low, gspo.eps_high) == ("gspo", 0.1, 0.12)
    assert (cispo.policy_loss, cispo.eps_low, cispo.eps_high) == ("cispo", 1.0, 0.5)


# ---- KL and lens --------------------------------------------------------------------------

def test_kl_lab(lab_home):
    at = lab("lab-kl").run()
    assert not at.exception
    moments = at.dataframe[0].value.set_index("estimator")
    assert moments.loc["k1", "bias"] == pytest.approx(0.0, abs=1e-12)
    assert moments.loc["k3", "bias"] == pytest.approx(0.0, abs=1e-12)
    assert moments.loc["k2", "bias"] != pytest.approx(0.0, abs=1e-6)
    assert {"k1 expectation", "k2 expectation", "k3 expectation"} <= {t["name"] for t in chart(at, "kl_fig")["data"]}
    assert at.dataframe[1].value.set_index("preset").loc["grpo", "placement"] == "in_loss"
    at.text_input(key="kl_ref").input("0.5, 0.5").run()
    assert "pi has 4 outcomes but ref has 2" in at.error[0].value


def test_kl_lab_shows_the_k3_clamp_bias_its_caption_names(lab_home):
    at = lab("lab-kl").run()
    at.text_input(key="kl_pi").input("0.98, 0.01, 0.01")
    at.text_input(key="kl_ref").input("0.1, 0.45, 0.45").run()
    bias = at.dataframe[0].value.set_index("estimator").loc["k3", "bias"]
    assert f"{bias:.2f}" == "-0.60"  # hand values in tests/viz/test_labs.py
    assert any("with pi = 0.98, 0.01, 0.01 and ref = 0.1, 0.45, 0.45 its bias is -0.60" in c.value for c in at.caption)


def test_lens_lab_plots_the_runs_lens(lab_home):
    store, run_id = lab_home
    at = lab("lab-lens").run()
    assert not at.exception
    at.selectbox(key="lens_run").select(run_id).run()
    fig = chart(at, "lens_over_run")
    from workbench.core import BASELINE_ESTIMATORS, CRITIC_ESTIMATORS, POLICY_LOSSES, POLICY_STAT_ESTIMATORS
    from workbench.engine.lens import lens_estimators

    # every registered estimator (GRPO once per std scale) x every registered loss; no critic, no
    # greedy baseline and no sum pi^2 in this run, so GAE, ReMax and the optimal token baselines sit out
    sit_out = CRITIC_ESTIMATORS | BASELINE_ESTIMATORS | POLICY_STAT_ESTIMATORS
    rows = [k for k, (name, _) in lens_estimators().items() if name not in sit_out]
    assert {"opo", "grpo_passk"} <= set(rows)
    # 121 lines were unreadable: the top 8 by |value| (the run's own among them) until "all" is chosen
    assert len(fig["data"]) == 8 and any(t["name"].endswith("(this run)") for t in fig["data"])
    assert any(c.value.startswith(f"8 of {len(rows) * len(POLICY_LOSSES)} estimator x loss lines") for c in at.caption)
    at.segmented_control(key="lens_top").set_value("all").run()
    fig = chart(at, "lens_over_run")
    assert len(fig["data"]) == len(rows) * len(POLICY_LOSSES)
    rloo = next(t for t in fig["data"] if t["name"] == "rloo x clip")
    assert values(rloo["x"]) == [0, 1, 2]
    own = next(t for t in fig["data"] if t["name"].endswith("(this run)"))
    assert own["name"] == "grpo x clip (this run)"
    at.selectbox(key="lens_metric").select("cos_run").run()
    dr = next(t for t in chart(at, "lens_over_run")["data"] if t["name"] == "dr_grpo x clip")
    rl = next(t for t in chart(at, "lens_over_run")["data"] if t["name"] == "rloo x clip")
    # RLOO = G/(G-1) Dr. GRPO: the same angle to the run's gradient where the rows' other terms vanish.
    # Every row carries the run's whole objective, here grpo's in-loss k3 KL (beta 0.04), which does
    # not scale with the advantages; its gradient is 0 at step 0 (policy = reference), so the
    # identity is exact there and only approximate after.
    np.testing.assert_allclose(values(dr["y"])[0], values(rl["y"])[0], atol=1e-6)
    np.testing.assert_allclose(values(dr["y"]), values(rl["y"]), atol=1e-2, equal_nan=True)
    heat = chart(at, "lens_heatmap")["data"][0]
    assert heat["x"] == list(POLICY_LOSSES.names()) and heat["y"] == rows


def test_lens_lab_opens_on_the_newest_run_with_lens_data(lab_home):
    """It opened on the newest run, which usually has the lens off ("This run has no lens events")."""
    store, run_id = lab_home
    from workbench.runs import cancel, launch

    newer = launch(load_recipe("grpo", ["train.steps=3", "logging.lens_every=0"]), target="local",
                   principal=local_principal(), store=store)
    try:
        assert store.list_runs().sort_values("created_at")["id"].iloc[-1] == newer
        at = lab("lab-lens").run()
        assert not at.exception
        assert at.selectbox(key="lens_run").value == run_id and chart(at, "lens_heatmap")
    finally:
        cancel(newer, principal=local_principal(), store=store)


def test_lens_lab_shows_the_run_it_just_launched(lab_home):
    """After "Launch GRPO with the lens" the selector stayed on the older run, under the success box."""
    store, run_id = lab_home
    from workbench.runs import cancel

    at = lab("lab-lens").run()
    at.selectbox(key="lens_run").select(run_id).run()
    at.button(key="lens_launch").click().run()
    assert not at.exception and at.success
    (new_id,) = at.session_state["compare_runs"]
    try:
        assert new_id != run_id and at.selectbox(key="lens_run").value == new_id
        assert new_id in at.success[0].value
        assert "No lens events yet" in at.info[-1].value  # lens_every = 2: they are coming
    finally:
        cancel(new_id, principal=local_principal(), store=store)


def test_kl_lab_says_when_it_renormalises_and_prints_no_rounding_noise(lab_home):
    at = lab("lab-kl").run()
    assert not at.info  # the defaults sum to 1
    assert at.dataframe[0].value.set_index("estimator").loc["k3", "bias"] == 0.0  # was 1.1e-16
    at.text_input(key="kl_ref").input("1, 1, 1, 1").run()
    assert at.info[0].value == "ref sums to 4, not 1: divided by 4, it is used as 0.25, 0.25, 0.25, 0.25."
    assert at.dataframe[0].proto.columns  # formatted columns (significant figures) are configured
    assert '"format": "%.4g"' in at.dataframe[0].proto.columns


@pytest.mark.parametrize("url, std_note", [("walkthrough-grpo", True), ("walkthrough-ppo", False),
                                           ("walkthrough-gspo", True), ("walkthrough-cispo", True),
                                           ("walkthrough-rloo", False)])
def test_known_biases_are_each_presets_own(lab_home, url, std_note):
    """GRPO's std note was repeated on every walkthrough; now a walkthrough shows the biases its
    preset's settings have (GSPO and CISPO presets do use group-std advantages; PPO's GAE does not)."""
    at = lab(url).run()
    text = " ".join(m.value for m in at.markdown)
    assert ("Std normalisation rescales each group" in text) is std_note
    if url == "walkthrough-ppo":
        assert any("Neither known bias applies to the ppo preset" in c.value for c in at.caption)


# ---- registry walkthroughs ------------------------------------------------------------------

def test_every_registered_name_has_a_walkthrough_page():
    """The navigation (torch-free, from the specs) and the live registries list the same pages."""
    from workbench.core import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
    from workbench.ui.labs import lab_pages
    from workbench.ui.labs.estimators import component_pages
    from workbench.ui.labs import page_url

    from workbench.core import ADVANTAGE_SHAPINGS

    nav = [u for _, _, u in lab_pages() if u.startswith(("walkthrough-adv-", "walkthrough-loss-", "walkthrough-shaping-"))]
    expected = ([page_url("advantage", n) for n in ADVANTAGE_ESTIMATORS] + [page_url("policy_loss", n) for n in POLICY_LOSSES]
                + [page_url("shaping", n) for n in ADVANTAGE_SHAPINGS])
    assert nav == expected == [u for _, _, u in component_pages()]
    assert "walkthrough-loss-sapo" in nav and "walkthrough-adv-grpo-passk" in nav


def component(url: str) -> AppTest:
    """A registry walkthrough looked up in the live registries (names registered by a test included)."""
    script = ("from workbench.ui.labs.estimators import component_pages\n"
              f"{{u: f for f, t, u in component_pages()}}[{url!r}]()\n")
    return AppTest.from_string(script, default_timeout=60)


def _example(at):
    """The worked example's table: per-token advantages (A_t0 ...) or per-token loss rows."""
    return next(d.value for d in at.dataframe if {"A_t0"} & set(d.value.columns) or "-d loss / d log pi" in d.value.columns)


def test_walkthrough_values_are_the_core_functions_for_every_registered_name(home):
    from workbench.core import (ADVANTAGE_ESTIMATORS, BASELINE_ESTIMATORS, CRITIC_ESTIMATORS, POLICY_LOSSES,
                                POLICY_STAT_ESTIMATORS, REWARD_DTYPE, AdvantageConfig, compute_advantages,
                                compute_policy_loss)
    from workbench.core.choices import PolicyLossConfig
    from workbench.ui.labs.estimators import explanation, knob_start
    from workbench.ui.labs import page_url
    from workbench.viz import lab_estimators as viz_est

    lengths = [2, 4, 3, 1, 2, 2, 4, 3]
    mask = (torch.arange(4)[None] < torch.tensor(lengths)[:, None]).to(REWARD_DTYPE)
    rewards = torch.tensor([1, 0, 0, 0, 1, 1, 1, 0], dtype=REWARD_DTYPE)
    for name in ADVANTAGE_ESTIMATORS.names():
        at = component(page_url("advantage", name)).run()
        assert not at.exception and not at.error, (name, at.exception, [e.value for e in at.error])
        # the knobs start at the preset's values (PPO: lambda 0.95); G 4, no in-reward KL, no whitening
        start = knob_start("advantage", explanation("advantage", name))
        cfg = AdvantageConfig(group_size=4, **{k: getattr(start, k) for k in explanation("advantage", name).knob_names
                                               if k not in ("group_size", "kl_coef")})
        stats = name in POLICY_STAT_ESTIMATORS  # the page's default pi_old and sum pi^2 per completion
        inputs = {i.keyword: viz_est.parse_numbers(i.default) for i in viz_est.ADVANTAGE_INPUTS["needs_policy_stats"]}
        per_token = lambda xs: torch.tensor(xs, dtype=REWARD_DTYPE)[:, None] * mask  # noqa: E731
        core = compute_advantages(name, rewards, mask, cfg,
                                  values=0.5 * mask if name in CRITIC_ESTIMATORS else None,
                                  baselines=torch.tensor([0.0] * 4 + [1.0] * 4) if name in BASELINE_ESTIMATORS else None,
                                  old_logp=torch.log(torch.tensor(inputs["token_probs"], dtype=REWARD_DTYPE))[:, None] * mask
                                  if stats else None,
                                  sum_pi_squared=per_token(inputs["sum_pi_squared"]) if stats else None)
        shown = _example(at)[[f"A_t{t}" for t in range(4)]].to_numpy()
        np.testing.assert_array_equal(np.nan_to_num(shown.astype(float)), core.advantages.double().numpy(), err_msg=name)
    d = torch.tensor([[0.0, 0.1, 0.5, 0.0], [-0.3, -0.05, 0.2, 1.0]], dtype=torch.float64)
    lmask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float64)
    old = math.log(0.1) * lmask
    adv = torch.tensor([[1.0], [-1.0]], dtype=torch.float64) * lmask
    for name in POLICY_LOSSES.names():
        at = component(page_url("policy_loss", name)).run()
        assert not at.exception and not at.error, (name, at.exception, [e.value for e in at.error])
        logp = (old + d).requires_grad_(True)
        e = explanation("policy_loss", name)
        cfg = PolicyLossConfig(**{k: getattr(knob_start("policy_loss", e), k) for k in e.knob_names})
        loss, _ = compute_policy_loss(name, logp, old, adv, lmask, cfg)
        (grad,) = torch.autograd.grad(-loss.sum(), logp)
        table = _example(at)
        if name != "clip_cov":  # its random draw (cov_seed None) is the global generator's
            assert table["loss"].tolist() == loss.detach()[lmask.bool()].tolist(), name
            assert table["-d loss / d log pi"].tolist() == grad[lmask.bool()].tolist(), name
        assert at.get("latex") and at.code[0].value.count("@POLICY_LOSSES.register") >= 1, name
    # e.g. GMPO starts at its preset's eps 0.4 on the log-ratio, not PolicyLossConfig's 0.2
    at = component("walkthrough-loss-gmpo").run()
    assert at.number_input(key="wt_gmpo_eps_low").value == 0.4


def test_sapo_walkthrough_knobs_drive_the_example_and_its_ratio_curve(home):
    at = component("walkthrough-loss-sapo").run()
    knobs = next(d.value for d in at.dataframe if "recipe key" in d.value.columns).set_index("knob")
    assert knobs.loc["sapo_tau_neg", "recipe key"] == "algorithm.sapo_tau_neg" and knobs.loc["sapo_tau_neg", "value"] == "1.05"
    assert "TRL sapo_temperature_neg" in knobs.loc["sapo_tau_neg", "what it does"]
    # sequence 1 (A = -1), token 3: log-ratio 1.0, tau_neg: loss = -(4 / tau) sigmoid(tau (e - 1)) A
    for tau in (1.05, 3.0):
        at.number_input(key="wt_sapo_sapo_tau_neg").set_value(tau).run()
        s = 1 / (1 + math.exp(-tau * (math.e - 1)))
        assert _example(at)["loss"].tolist()[-1] == pytest.approx(4 / tau * s)
    curve = chart(at, "wt_sapo_curve")
    assert {t["name"] for t in curve["data"]} == {"SAPO"}
    assert not chart(at, "wt_sapo_curve")["layout"].get("shapes")  # no clip bands on a soft gate
    assert at.button(key="wt_sapo_launch")
    at.text_area(key="wt_sapo_lr").input("0.1, x").run()
    assert "log-ratios line 1='0.1, x'" in at.error[0].value


def test_a_newly_registered_estimator_and_loss_get_their_walkthroughs(home):
    """Registering a function is all it takes: its page, from its docstring and the config fields
    its source reads, with the worked example computed by it."""
    from workbench.core import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, Advantages, compute_policy_loss
    from workbench.core.choices import PolicyLossConfig

    def doubled(rewards, mask, cfg, *, kl=None, values=None):
        """Doubled rewards, shifted: A_i = 2 r_i + gamma on every token (a test's estimator)."""
        adv = (2 * rewards + cfg.gamma)[:, None] * mask
        return Advantages(adv, adv)

    def tripled(logp, old_logp, advantages, mask, cfg):
        """Three times REINFORCE, scaled by eps_high (a test's loss)."""
        loss, diag = POLICY_LOSSES.get("reinforce")(logp, old_logp, advantages, mask, cfg)
        return 3 * cfg.eps_high * loss, diag

    ADVANTAGE_ESTIMATORS.register("test_doubled")(doubled)
    POLICY_LOSSES.register("test_tripled")(tripled)
    try:
        at = component("walkthrough-adv-test-doubled").run()
        assert not at.exception
        assert at.title[0].value == "Estimator walkthrough: test_doubled"
        assert any("Doubled rewards, shifted" in m.value for m in at.markdown)
        knobs = next(d.value for d in at.dataframe if "recipe key" in d.value.columns)
        assert knobs["knob"].tolist() == ["gamma"] and knobs["recipe key"].tolist() == ["algorithm.gamma"]
        at.number_input(key="wt_test_doubled_gamma").set_value(0.5).run()
        assert _example(at)["A_t0"].tolist() == [2.5, 0.5, 0.5, 0.5, 2.5, 2.5, 2.5, 0.5]
        assert "algorithm.advantage='test_doubled'" in at.error[0].value  # the recipe knows no such name: no launch
        at = component("walkthrough-loss-test-tripled").run()
        assert not at.exception
        at.number_input(key="wt_test_tripled_eps_high").set_value(0.5).run()
        table = _example(at)
        logp = torch.tensor([[math.log(0.1)] * 3], dtype=torch.float64) + torch.tensor([[0.0, 0.1, 0.5]], dtype=torch.float64)
        expected, _ = compute_policy_loss("test_tripled", logp, torch.full_like(logp, math.log(0.1)), torch.ones_like(logp),
                                          torch.ones_like(logp), PolicyLossConfig(eps_high=0.5))
        assert table["loss"].tolist()[:3] == expected[0].tolist()  # -1.5 A logp
        assert table["-d loss / d log pi"].tolist() == [1.5] * 3 + [-1.5] * 4
    finally:
        ADVANTAGE_ESTIMATORS.unregister("test_doubled")
        POLICY_LOSSES.unregister("test_tripled")


def test_ppo_lab_draws_every_loss_flagged_with_a_ratio_curve(home):
    from workbench.algorithms import FAMILIES

    at = lab("lab-ppo-regions").run()
    specs = FAMILIES["policy_loss"].specs
    flagged = [n for n, s in specs.items() if s.ratio_curve]
    assert list(at.multiselect(key="ppo_losses").options) == [specs[n].title for n in flagged]
    assert set(flagged) == {"clip", "gspo", "cispo", "reinforce", "sapo", "gmpo", "gpg", "dro"}
    at.multiselect(key="ppo_losses").set_value(["sapo"]).run()
    sapo = [t for t in chart(at, "ppo_analytic")["data"] if t["name"] == "SAPO"]
    x, grad = values(sapo[1]["x"]), values(sapo[1]["y"])  # A > 0, gradient column
    s = 1 / (1 + math.exp(-(x[-1] - 1)))
    assert grad[-1] == pytest.approx(4 * s * (1 - s) * x[-1])  # tau_pos 1, |A| 1
    at.slider(key="ppo_sapo_pos").set_value(5.0).run()
    grad = values([t for t in chart(at, "ppo_analytic")["data"] if t["name"] == "SAPO"][1]["y"])
    s = 1 / (1 + math.exp(-5.0 * (x[-1] - 1)))
    assert grad[-1] == pytest.approx(4 * s * (1 - s) * x[-1])


def test_aggregation_lab_through_a_policy_loss(home):
    at = lab("lab-aggregation").run()
    assert not at.exception
    on_policy = chart(at, "agg_loss_fig")
    assert values(on_policy["data"][1]["y"])[:1] == pytest.approx([0.25])  # seq-mean-token-mean: the book's 0.25
    at.selectbox(key="agg_loss").select("sapo")
    at.slider(key="agg_log_ratio").set_value(0.5).run()
    fig = chart(at, "agg_loss_fig")
    r = math.exp(0.5)
    s = 1 / (1 + math.exp(-(r - 1)))
    mean_mean = next(t for t in fig["data"] if t["name"] == "seq-mean-token-mean")
    assert values(mean_mean["y"])[0] == pytest.approx(2 / 8 * 4 * s * (1 - s) * r)


def test_knobs_table_shows_the_values_the_example_starts_from():
    """GRPO's group_size is the grpo preset's num_generations (8), not AdvantageConfig's bare default 1."""
    from workbench.ui.labs.estimators import explanation, knob_start, knobs_table

    e = explanation("advantage", "grpo")
    rows = {r["knob"]: r for r in knobs_table("advantage", e)}
    assert rows["group_size"]["value"] == "8" == str(load_recipe("grpo").sampling.num_generations)
    assert all(r["value"] == str(getattr(knob_start("advantage", e), k)) for k, r in rows.items())


def test_opd_walkthrough_example_is_the_core_shaping(home):
    """The distillation page's worked example: A' = A - lambda (log pi_theta - log pi_T), lambda from the opd preset (0.1)."""
    at = component("walkthrough-shaping-opd").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    table = next(d.value for d in at.dataframe if "A'_t" in d.value.columns)
    # defaults: A = 1; d = [-0.1, -1.8, 2.9, 0] -> A' = 1 - 0.1 d
    assert table["A'_t"].tolist() == pytest.approx([1.01, 1.18, 0.71, 1.0])
    assert table["d_t"].tolist() == pytest.approx([-0.1, -1.8, 2.9, 0.0])  # core's reverse_kl_per_token
