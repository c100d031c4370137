"""The labs' figure builders: exact hand values, traces, and region counts equal to the core's
labels on the same tensors."""

import base64
import json
import math

import numpy as np

import pandas as pd
import pytest
import torch

from workbench.core import REGION_NAMES, PolicyLossConfig, compute_policy_loss
from workbench.engine.events import _jsonable
from workbench.viz import lab_aggregation as agg
from workbench.viz import lab_estimators as est
from workbench.viz import lab_kl as klv
from workbench.viz import lab_lens as lensv
from workbench.viz import lab_regions as reg

torch.set_num_threads(1)
CFG = PolicyLossConfig(eps_low=0.2, eps_high=0.28, clip_c=2.0)


def values(data):
    """A plotly JSON array as a list: plotly >= 6 writes numeric arrays as typed binary
    ({"dtype", "bdata", "shape"}) in figure JSON and in Streamlit's spec."""
    if isinstance(data, dict) and "bdata" in data:
        arr = np.frombuffer(base64.b64decode(data["bdata"]), dtype=np.dtype(data["dtype"]))
        if "shape" in data:
            arr = arr.reshape([int(x) for x in str(data["shape"]).split(",")])
        return arr.tolist()
    return data

RATIOS = torch.tensor([0.5, 1.0, 1.5, 2.5], dtype=torch.float64)


# ---- PPO regions: analytic ----------------------------------------------------------------

def test_clip_objective_and_gradient_by_hand():
    obj, grad = reg.objective_and_gradient("clip", RATIOS, 1.0, CFG)
    # A > 0: R A until 1 + eps_high = 1.28, then flat at 1.28 A with zero gradient (book cases 1-3)
    assert obj.tolist() == pytest.approx([0.5, 1.0, 1.28, 1.28])
    assert grad.tolist() == pytest.approx([0.5, 1.0, 0.0, 0.0])
    obj, grad = reg.objective_and_gradient("clip", RATIOS, -1.0, CFG)
    # A < 0: flat (1 - eps_low) A below 0.8, R A above, dual clip -c A = ... capped at R > c = 2
    assert obj.tolist() == pytest.approx([-0.8, -1.0, -1.5, -2.0])
    assert grad.tolist() == pytest.approx([0.0, -1.0, -1.5, 0.0])


def test_cispo_gradient_never_zero_and_gspo_clips_its_sequence_ratio():
    _, g = reg.objective_and_gradient("cispo", RATIOS, 1.0, PolicyLossConfig(eps_low=1.0, eps_high=0.28))
    assert g.tolist() == pytest.approx([0.5, 1.0, 1.28, 1.28])  # weight clip(R, 0, 1.28) * A
    _, g = reg.objective_and_gradient("cispo", RATIOS, -1.0, PolicyLossConfig(eps_low=1.0, eps_high=0.28))
    assert g.tolist() == pytest.approx([-0.5, -1.0, -1.28, -1.28])
    _, g = reg.objective_and_gradient("gspo", RATIOS, 1.0, PolicyLossConfig(eps_low=0.05, eps_high=0.05))
    assert g.tolist() == pytest.approx([0.5, 1.0, 0.0, 0.0])


THREE = {"PPO clip": ("clip", CFG), "GSPO": ("gspo", PolicyLossConfig(0.05, 0.05)), "CISPO": ("cispo", PolicyLossConfig(1.0, 0.28))}


def test_analytic_figure_traces_and_six_shaded_regions():
    curves = reg.analytic_curves(THREE, ratios=RATIOS)
    assert len(curves) == 3 * 2 * 4
    fig = json.loads(reg.analytic_figure(curves, CFG).to_json())
    assert len(fig["data"]) == 3 * 2 * 2  # losses x signs x (objective, gradient)
    assert [t["name"] for t in fig["data"]][:3] == ["PPO clip", "PPO clip", "GSPO"]
    assert {t["name"] for t in fig["data"]} == {"PPO clip", "GSPO", "CISPO"}
    assert len({t["line"]["color"] for t in fig["data"]}) == 3  # one colour per loss
    # A > 0: cases 1-3; A < 0: cases 4, 5, 6 and the dual-clip part of 6; each on both columns
    assert len(fig["layout"]["shapes"]) == (3 + 4) * 2
    labels = [a.get("text", "") for a in fig["layout"]["annotations"] if ":" in a.get("text", "")]
    assert [l.split(":")[0] for l in labels] == ["1", "2", "3", "4", "5", "6", "6'"]
    table = reg.book_regions_table().set_index("case")
    assert len(table) == 6
    # case 6 beyond c: the objective is c A (= -2 at c = 2, A = -1, as computed above), the loss -c A
    assert table.loc[6, "objective"] == "R A  (c A beyond the dual clip c: loss -c A)"


def test_every_annotation_of_the_analytic_figure_has_text():
    """An annotation without text is drawn by plotly.js as its placeholder "new text" (it was in
    every shaded region of the gradient plots): each annotation carries its own label."""
    curves = reg.analytic_curves(THREE, ratios=RATIOS)
    annotations = json.loads(reg.analytic_figure(curves, CFG).to_json())["layout"]["annotations"]
    assert all(str(a.get("text") or "").strip() for a in annotations), [a for a in annotations if not a.get("text")]
    region_labels = [a["text"] for a in annotations if ":" in a["text"]]
    assert len(region_labels) == 3 + 4  # one per shaded region, on the objective column only


def test_sapo_soft_gate_against_the_ratio_by_hand():
    """SAPO (tau 1.0 / 1.05): J = (4 / tau) sigmoid(tau (R - 1)) A, dJ/dlog pi = 4 s (1 - s) R A:
    the policy gradient A at R = 1, fading on both sides, never exactly 0 (the clip's is 0 above 1.28)."""
    def sig(x):
        return 1 / (1 + math.exp(-x))

    cfg = PolicyLossConfig()
    for a, tau in ((1.0, 1.0), (-1.0, 1.05)):
        obj, grad = reg.objective_and_gradient("sapo", RATIOS, a, cfg)
        s = [sig(tau * (r - 1)) for r in RATIOS.tolist()]
        assert obj.tolist() == pytest.approx([4 / tau * si * a for si in s], rel=1e-12)
        assert grad.tolist() == pytest.approx([4 * si * (1 - si) * r * a for si, r in zip(s, RATIOS.tolist())], rel=1e-12)
    _, grad = reg.objective_and_gradient("sapo", RATIOS, 1.0, cfg)
    assert grad[1] == pytest.approx(1.0) and all(g > 0 for g in grad.tolist())


def test_gmpo_clips_the_log_ratio_of_a_one_token_sequence_by_hand():
    """GMPO, one token: J = A exp(clip(log R, -0.4, 0.4)) where the clip is on A's side; gradient
    A R inside, 0 once the log-ratio passed 0.4 (A > 0) or -0.4 (A < 0)."""
    cfg = PolicyLossConfig(eps_low=0.4, eps_high=0.4)
    top, bottom = math.exp(0.4), math.exp(-0.4)  # 1.4918, 0.6703
    obj, grad = reg.objective_and_gradient("gmpo", RATIOS, 1.0, cfg)  # R = 0.5, 1, 1.5, 2.5
    assert obj.tolist() == pytest.approx([0.5, 1.0, top, top])
    assert grad.tolist() == pytest.approx([0.5, 1.0, 0.0, 0.0])
    obj, grad = reg.objective_and_gradient("gmpo", RATIOS, -1.0, cfg)
    assert obj.tolist() == pytest.approx([-bottom, -1.0, -1.5, -2.5])
    assert grad.tolist() == pytest.approx([0.0, -1.0, -1.5, -2.5])


def test_analytic_figure_without_a_clip_config_is_unshaded():
    curves = reg.analytic_curves({"SAPO": ("sapo", PolicyLossConfig())}, ratios=RATIOS)
    fig = json.loads(reg.analytic_figure(curves).to_json())
    assert not fig["layout"].get("shapes") and [t["name"] for t in fig["data"]] == ["SAPO"] * 4


def test_region_bands_use_the_smaller_of_dual_clip_and_delta():
    bands = reg.region_bands(PolicyLossConfig(eps_low=0.2, eps_high=0.28, clip_c=3.0, delta=2.0), -1, 4.0)
    assert [x for lo, hi, *_ in bands for x in (lo, hi)] == pytest.approx([0.0, 0.8, 0.8, 1.28, 1.28, 2.0, 2.0, 4.0])
    assert bands[-1][2] == "6': dual clip, no update"


# ---- PPO regions: empirical --------------------------------------------------------------

def engine_diagnostics(cfg=CFG):
    """A diagnostics payload built the way the trainer builds it (core loss -> JSON)."""
    gen = torch.Generator().manual_seed(3)
    B, T = 6, 5
    logp = torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.1
    old = logp + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.5
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 2.0], dtype=torch.float64)[:, None].expand(B, T).clone()
    mask = (torch.arange(T)[None] < torch.tensor([5, 3, 4, 5, 2, 1])[:, None]).to(torch.float64)
    _, diag = compute_policy_loss("clip", logp, old, adv * mask, mask, cfg)
    payload = dict(region_names=list(REGION_NAMES), ratio=diag.ratio, advantage=adv * mask, mask=mask, loss_mask=mask,
                   region=diag.region, zero_grad=diag.zero_grad, length=mask.sum(dim=1))
    return json.loads(json.dumps(_jsonable(payload))), diag, mask


def test_token_points_region_counts_equal_core_labels():
    payload, diag, mask = engine_diagnostics()
    points = reg.token_points(payload)
    assert len(points) == int(mask.sum())
    valid = mask.bool()
    expected = {name: int(((diag.region == code) & valid).sum()) for code, name in enumerate(REGION_NAMES)}
    counts = reg.region_counts(points)
    assert {k: counts.get(k, 0) for k in REGION_NAMES} == expected
    assert expected["clipped_high"] + expected["clipped_low"] + expected["dual_clipped"] > 0  # the example clips
    assert reg.zero_grad_fraction(points) == pytest.approx(float(diag.zero_grad[valid].double().mean()))


def test_region_scatter_one_trace_per_run_and_region_same_axes():
    payload, diag, mask = engine_diagnostics()
    points = reg.token_points(payload)
    fig = json.loads(reg.region_scatter({"run-a": points, "run-b": points.iloc[:10]}, CFG).to_json())
    names = [t["name"] for t in fig["data"]]
    assert names == [f"run-a: {r}" for r in sorted(points["region"].unique())] + \
                    [f"run-b: {r}" for r in sorted(points.iloc[:10]["region"].unique())]
    trust = next(t for t in fig["data"] if t["name"] == "run-a: trust")
    assert len(values(trust["x"])) == reg.region_counts(points)["trust"]
    assert {t["marker"]["symbol"] for t in fig["data"] if t["name"].startswith("run-b")} == {"x"}
    assert all(t.get("xaxis", "x") == "x" for t in fig["data"])
    assert len(fig["layout"]["shapes"]) == 3 + 4


def test_region_shares_sum_to_one_per_step():
    payload, _, _ = engine_diagnostics()
    shares = reg.region_shares({0: payload, 5: payload})
    regions = shares[shares["region"] != "zero_grad"]
    assert regions.groupby("step")["share"].sum().tolist() == pytest.approx([1.0, 1.0])
    fig = json.loads(reg.region_share_figure({"r": shares}).to_json())
    assert len(fig["data"]) == len(REGION_NAMES) + 2  # + masked + zero_grad
    assert values(fig["data"][0]["x"]) == [0, 5]


# ---- loss aggregation ---------------------------------------------------------------------

def test_book_example_per_token_gradients():
    table = agg.aggregation_table(agg.BOOK_EXAMPLE, max_len=7)
    first = table.groupby(["mode", "seq"])["grad_wrt_ratio"].first()
    assert first["seq-mean-token-mean"].tolist() == pytest.approx([0.25, 1 / 7])
    assert first["seq-mean-token-sum-norm"].tolist() == pytest.approx([1 / 7, 1 / 7])
    assert first["token-mean"].tolist() == pytest.approx([2 / 11, 2 / 11])
    assert first["seq-mean-token-sum"].tolist() == pytest.approx([1.0, 1.0])
    weight = table.groupby(["mode", "seq"])["weight"].first()
    assert weight["token-mean"].tolist() == pytest.approx([1 / 11, 1 / 11])  # the book's printed 0.0909
    loss = table.groupby("mode")["loss"].first()
    assert loss["seq-mean-token-mean"] == pytest.approx(2.0)
    assert loss["seq-mean-token-sum-norm"] == pytest.approx((8 + 14) / 14)
    # verl < 0.9's convention, no division by B = 2: 2 / 7 on every token, loss (8 + 14) / 7
    assert first["token-sum-norm"].tolist() == pytest.approx([2 / 7, 2 / 7])
    assert loss["token-sum-norm"] == pytest.approx((8 + 14) / 7)


def test_lab_shows_every_registered_aggregation():
    """The lab's modes are core's registry, in its order: a mode added to core appears here."""
    from workbench.core import LOSS_AGGREGATIONS

    assert agg.LAB_MODES == LOSS_AGGREGATIONS.names()
    assert "token-sum-norm" in agg.LAB_MODES
    assert len({agg.MODE_COLORS[m] for m in agg.LAB_MODES}) == len(agg.LAB_MODES)  # one colour each


def test_aggregation_figure_and_parse_errors():
    table = agg.aggregation_table([[1, 1], [1, 1, 1]], max_len=4)
    fig = json.loads(agg.aggregation_figure(table, "weight").to_json())
    assert [t["name"] for t in fig["data"]] == list(agg.LAB_MODES)
    assert fig["data"][0]["x"] == ["s0 t0", "s0 t1", "s1 t0", "s1 t1", "s1 t2"]
    assert values(fig["data"][0]["y"]) == pytest.approx([0.2] * 5)
    assert agg.parse_sequences("1, 2\n3") == [[1.0, 2.0], [3.0]]
    with pytest.raises(ValueError, match="line 2='1, x'"):
        agg.parse_sequences("1\n1, x")


def test_run_batch_weights_by_hand():
    diag = {"mask": [[1, 1, 0, 0], [1, 1, 1, 1]], "loss_mask": [[1, 1, 0, 0], [1, 1, 1, 1]]}
    w = agg.run_batch_weights(diag, max_len=4).set_index(["mode", "seq"])
    assert w.loc[("seq-mean-token-mean", 0), "weight"] == pytest.approx(1 / 4)
    assert w.loc[("seq-mean-token-mean", 1), "weight"] == pytest.approx(1 / 8)
    assert w.loc[("token-mean", 0), "weight"] == pytest.approx(1 / 6)
    assert w.loc[("seq-mean-token-sum-norm", 1), "weight"] == pytest.approx(1 / 8)
    assert w.loc[("seq-mean-token-sum", 1), "total"] == pytest.approx(2.0)
    assert w.loc[("token-sum-norm", 0), "weight"] == pytest.approx(1 / 4)  # 1 / L_max
    fig = json.loads(agg.weight_vs_length_figure(w.reset_index(), "token-mean").to_json())
    assert [t["line"]["width"] for t in fig["data"]] == [4] + [2] * (len(agg.LAB_MODES) - 1)


def test_length_drift_figure():
    m = pd.DataFrame({"run_id": ["a", "a", "b", "b"], "step": [1, 0, 0, 1], "completions/mean_length": [5.0, 4.0, 4.0, 3.0]})
    fig = json.loads(agg.length_drift_figure(m, {"a": "a (token-mean)"}).to_json())
    assert [t["name"] for t in fig["data"]] == ["a (token-mean)", "b"]
    assert values(fig["data"][0]["x"]) == [0, 1] and values(fig["data"][0]["y"]) == [4.0, 5.0]
    with pytest.raises(ValueError, match="no column 'x'"):
        agg.length_drift_figure(m, column="x")


# ---- estimators ---------------------------------------------------------------------------

def test_all_estimators_side_by_side_by_hand():
    t = est.sequence_advantages([1, 0, 0, 0, 1, 1, 1, 0], group_size=4, eps=0.0)
    assert t["Dr. GRPO"].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75])
    assert t["RLOO"].tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3, 1 / 3, 1 / 3, 1 / 3, -1.0])
    assert t["GRPO"].tolist()[:2] == pytest.approx([1.5, -0.5])  # group std 0.5
    assert t["REINFORCE (batch mean)"].tolist()[0] == pytest.approx(0.5)
    # one-token sequences: OPO's length-weighted baseline is the group mean (Dr. GRPO's numbers);
    # pass@k credits only a group's strict best, (1 - 0) / std_g = 1 / 0.5 = 2 in group 1, group 2's
    # best is tied (three 1s) -> 0; GPG at the paper's F_norm = 1, alpha = B / (B - M) = 8 / 8 -> Dr. GRPO
    assert t["OPO (optimal baseline)"].tolist() == t["Dr. GRPO"].tolist()
    assert t["GRPO pass@k"].tolist() == pytest.approx([2.0, 0, 0, 0, 0, 0, 0, 0])
    assert t["GPG"].tolist() == pytest.approx(t["Dr. GRPO"].tolist())
    # every advantage estimator whose example needs only the rewards, from the specs, in registry order
    assert list(t.columns[2:]) == ["GRPO", "Dr. GRPO", "GRPO (batch std)", "RLOO", "REINFORCE (batch mean)", "REINFORCE++",
                                   "REINFORCE++ baseline", "OPO (optimal baseline)", "GRPO pass@k", "GPG"]
    fig = json.loads(est.advantages_figure(t).to_json())
    assert [d["name"] for d in fig["data"]] == [v.label for v in est.sequence_variants()]
    with pytest.raises(ValueError, match="group size=3"):
        est.sequence_advantages([1, 0, 0, 0], group_size=3)


def test_walkthrough_shows_the_engines_advantages_for_the_same_rewards():
    """The walkthrough table = core's compute_advantages on the rewards as the engine scores them
    (float32): bit for bit, so the page and the run's Samples table cannot disagree. An all-equal
    group (0.2 x 8, the issue's example) is exactly 0 under every group baseline, and a batch of
    equal rewards (0.7 x 3, one ulp off even in float64) is exactly 0 in every column."""
    from workbench.core import REWARD_DTYPE, AdvantageConfig, compute_advantages

    rewards = [0.2] * 8 + [1, 0, 0, 0, 0, 0, 0, 0]
    t = est.sequence_advantages(rewards, group_size=8, eps=1e-6)
    engine = compute_advantages("grpo", torch.tensor(rewards, dtype=REWARD_DTYPE), torch.ones(16, 4),
                                AdvantageConfig(group_size=8, eps=1e-6)).advantages[:, 0]
    assert t["GRPO"].tolist() == engine.tolist()
    for col in ("GRPO", "Dr. GRPO", "GRPO (batch std)", "RLOO"):  # the group baselines, unwhitened
        assert t[col].tolist()[:8] == [0.0] * 8, col
    t = est.sequence_advantages([0.7] * 3, group_size=3)
    assert all(t[v.label].tolist() == [0.0] * 3 for v in est.sequence_variants())


def test_gae_table_by_hand():
    t = est.gae_table([0, 0, 1], [0.5, 0.5, 0.5], gamma=1.0, lam=0.5)
    assert t["delta (= A at lambda 0)"].tolist() == pytest.approx([0.0, 0.0, 0.5])
    assert t["A (GAE)"].tolist() == pytest.approx([0.125, 0.25, 0.5])
    assert t["A (lambda 1: G_t - V_t)"].tolist() == pytest.approx([0.5, 0.5, 0.5])
    assert t["return (A + V)"].tolist() == pytest.approx([0.625, 0.75, 1.0])
    with pytest.raises(ValueError, match="values has 2 entries"):
        est.gae_table([0, 1, 1], [0.5, 0.5], 1.0, 1.0)


def test_bias_examples_by_hand():
    s = est.std_bias_example(eps=0.0).set_index("group rewards")
    assert list(s.index) == ["1, 0, 0, 0", "0.1, 0, 0, 0", "1, 1, 0, 0", "1, 1, 1, 0"]
    # unbiased group std: (1,0,0,0) -> 0.5, (0.1,0,0,0) -> 0.05, (1,1,0,0) -> sqrt(1/3), (1,1,1,0) -> 0.5
    assert s["GRPO A(best)"].tolist() == pytest.approx([0.75 / 0.5, 0.075 / 0.05, 0.5 / math.sqrt(1 / 3), 0.25 / 0.5])
    assert s["Dr. GRPO A(best)"].tolist() == pytest.approx([0.75, 0.075, 0.5, 0.25])
    lb = est.length_bias_example().set_index("mode")
    assert lb.iloc[:, 0].tolist() == pytest.approx([1 / 8, 1 / 11, 1 / 14])
    assert lb.iloc[:, 1].tolist() == pytest.approx([-1 / 14, -1 / 11, -1 / 14])


def test_per_token_policy_gradients_by_hand():
    t = est.per_token_policy_gradients([0.0, 0.5], 1.0, {"PPO clip": ("clip", PolicyLossConfig(0.2, 0.2)),
                                                         "GSPO": ("gspo", PolicyLossConfig(0.2, 0.2)),
                                                         "CISPO": ("cispo", PolicyLossConfig(eps_low=1.0, eps_high=0.28))})
    assert t["PPO clip grad"].tolist() == pytest.approx([1.0, 0.0])  # e^0.5 = 1.65 > 1.2: clipped
    assert t["GSPO ratio"].tolist() == pytest.approx([math.exp(0.25)] * 2)
    assert t["GSPO grad"].tolist() == pytest.approx([0.0, 0.0])  # s = 1.284 > 1.2: whole sequence clipped
    assert t["CISPO grad"].tolist() == pytest.approx([1.0, 1.28])  # weight capped, gradient kept
    assert "def clip_policy_loss" in est.source_of(compute_policy_loss.__globals__["clip_policy_loss"])


# ---- KL -----------------------------------------------------------------------------------

def test_kl_moments_by_hand():
    pi, ref = klv.categorical([0.5, 0.5], "pi"), klv.categorical([1, 3], "ref")
    kl = 0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75)
    assert klv.true_kl(pi, ref) == pytest.approx(kl)
    m = klv.estimator_moments(pi, ref).set_index("estimator")
    assert m.loc["k1", "bias"] == pytest.approx(0.0, abs=1e-12)
    assert m.loc["k3", "bias"] == pytest.approx(0.0, abs=1e-12)
    d0, d1 = math.log(0.25 / 0.5), math.log(0.75 / 0.5)
    assert m.loc["k2", "mean"] == pytest.approx(0.25 * (d0 ** 2 + d1 ** 2))
    assert m.loc["k1", "variance"] == pytest.approx(0.25 * (d1 - d0) ** 2)
    bv = klv.bias_variance_vs_samples(pi, ref, [1, 4]).set_index(["estimator", "n"])
    assert bv.loc[("k1", 4), "std"] == pytest.approx(math.sqrt(0.25 * (d1 - d0) ** 2 / 4))
    with pytest.raises(ValueError, match=r"pi=\[1.0, 0.0\]"):
        klv.categorical([1.0, 0.0], "pi")


def test_kl_bias_within_float_rounding_is_exactly_zero():
    """E[k3] - KL came out as 1.1e-16 for the page's default pi and ref and was printed as a bias
    "0.0000000000000001"; a real bias (k2's, k3's under the clamp) is left as it is."""
    pi, ref = klv.categorical([0.5, 0.3, 0.15, 0.05], "pi"), klv.categorical([0.25] * 4, "ref")
    m = klv.estimator_moments(pi, ref).set_index("estimator")
    assert m.loc["k1", "bias"] == 0.0 and m.loc["k3", "bias"] == 0.0
    assert m.loc["k2", "bias"] == pytest.approx(-0.03474692094953993, rel=1e-12)
    assert klv.snap_rounding_noise(1.1102230246251565e-16, 0.244, 0.244) == 0.0
    assert klv.snap_rounding_noise(1e-9, 0.244, 0.244) == 1e-9  # far above 64 ulps (1.4e-14)


def test_kl_normalisation_note_says_what_was_divided():
    assert klv.normalisation_note([0.5, 0.5], "pi") is None
    assert klv.normalisation_note([1, 3], "ref") == "ref sums to 4, not 1: divided by 4, it is used as 0.25, 0.75."
    assert klv.categorical([1, 3], "ref").tolist() == [0.25, 0.75]


def test_k3_has_lower_variance_than_k1_when_pi_is_close_to_ref():
    pi, ref = klv.categorical([0.5, 0.5], "pi"), klv.categorical([0.45, 0.55], "ref")
    m = klv.estimator_moments(pi, ref).set_index("estimator")
    # two equally likely outcomes with d = log 0.9, log 1.1: Var = (k(x0) - k(x1))^2 / 4
    var_k1 = 0.25 * math.log(1.1 / 0.9) ** 2
    var_k3 = 0.25 * ((0.9 - math.log(0.9)) - (1.1 - math.log(1.1))) ** 2
    assert m.loc["k1", "variance"] == pytest.approx(var_k1)  # 1.0067e-2
    assert m.loc["k3", "variance"] == pytest.approx(var_k3)  # 1.1246e-7
    assert var_k3 < var_k1


def test_k3_is_biased_where_cores_clamp_bites():
    pi, ref = klv.categorical([0.98, 0.01, 0.01], "pi"), klv.categorical([0.1, 0.45, 0.45], "ref")
    m = klv.estimator_moments(pi, ref).set_index("estimator")
    kl = 0.98 * math.log(0.98 / 0.1) + 0.02 * math.log(0.01 / 0.45)
    # k3 at the rare outcomes is 45 - log 45 - 1 = 40.2, clamped to 10 (verl's bound, in core)
    k3_mean = 0.98 * (0.1 / 0.98 - math.log(0.1 / 0.98) - 1) + 0.02 * 10.0
    assert m.loc["k3", "mean"] == pytest.approx(k3_mean)
    assert m.loc["k3", "bias"] == pytest.approx(k3_mean - kl) and round(k3_mean - kl, 2) == -0.60
    assert m.loc["k1", "bias"] == pytest.approx(0.0, abs=1e-12)


def test_kl_monte_carlo_is_seeded_and_figure_has_all_estimators():
    pi, ref = klv.categorical([0.5, 0.3, 0.2], "pi"), klv.categorical([0.2, 0.3, 0.5], "ref")
    a = klv.monte_carlo(pi, ref, [4, 256], trials=100, seed=1)
    assert a.equals(klv.monte_carlo(pi, ref, [4, 256], trials=100, seed=1))
    k1 = a[(a["estimator"] == "k1") & (a["n"] == 256)].iloc[0]
    assert abs(k1["mean"] - klv.true_kl(pi, ref)) < 4 * k1["std"] / math.sqrt(100)
    fig = json.loads(klv.kl_figure(klv.bias_variance_vs_samples(pi, ref, [1, 4]), klv.true_kl(pi, ref), a).to_json())
    names = {t["name"] for t in fig["data"]}
    assert {"k1 expectation", "k2 expectation", "k3 expectation", "k1 Monte Carlo"} <= names


def test_placement_table_from_presets():
    t = klv.placement_table().set_index("preset")
    assert t.loc["grpo", "placement"] == "in_loss" and t.loc["grpo", "estimator"] == "k3"
    assert t.loc["rloo", "placement"] == "in_reward" and t.loc["rloo", "estimator"] == "k1"
    assert t.loc["dr_grpo", "estimator"] == "-"


# ---- lens ---------------------------------------------------------------------------------

def lens_payload(step, cos):
    combos = [{"advantage": a, "policy_loss": l, "loss": 0.1, "grad_norm": 1.0, "cos_run": cos if a == "rloo" else 1.0,
               "cos_update": None, "zero_grad": 0.0} for a in ("dr_grpo", "rloo") for l in ("clip", "cispo")]
    return {"step": step, "run": {"advantage": "dr_grpo", "policy_loss": "clip"}, "points": {"before": combos, "after": combos}}


def test_lens_frame_and_figures():
    frame = lensv.lens_frame([lens_payload(2, 0.5), lens_payload(0, 1.0)])
    assert len(frame) == 2 * 2 * 4
    assert frame["step"].tolist()[0] == 0
    assert frame["cos_update"].isna().all()
    fig = json.loads(lensv.lens_over_run_figure(frame, "cos_run", "before").to_json())
    assert [t["name"] for t in fig["data"]] == ["dr_grpo x clip (this run)", "dr_grpo x cispo", "rloo x clip", "rloo x cispo"]
    assert values(fig["data"][2]["y"]) == [1.0, 0.5]
    assert fig["data"][0]["line"]["width"] == 4
    heat = json.loads(lensv.lens_heatmap(frame, 2, "cos_run").to_json())["data"][0]
    assert heat["y"] == ["dr_grpo", "rloo"] and heat["x"] == ["clip", "cispo"]
    assert values(heat["z"]) == [[1.0, 1.0], [0.5, 0.5]]
    with pytest.raises(ValueError, match="lens metric='nope'"):
        lensv.lens_over_run_figure(frame, "nope")


# ---- registry walkthroughs: worked examples are the core function on the same batch ---------

EXAMPLE_REWARDS = [1, 0, 0, 0, 1, 1, 1, 0]
EXAMPLE_LENGTHS = [2, 4, 3, 1, 2, 2, 4, 3]


def example_batch():
    from workbench.core import REWARD_DTYPE

    mask = torch.zeros(8, 4, dtype=REWARD_DTYPE)
    for i, n in enumerate(EXAMPLE_LENGTHS):
        mask[i, :n] = 1
    return torch.tensor(EXAMPLE_REWARDS, dtype=REWARD_DTYPE), mask


def test_advantage_example_is_compute_advantages_for_every_registered_estimator():
    from workbench.core import (ADVANTAGE_ESTIMATORS, BASELINE_ESTIMATORS, CRITIC_ESTIMATORS, POLICY_STAT_ESTIMATORS,
                                AdvantageConfig, compute_advantages)

    r, mask = example_batch()
    cfg = AdvantageConfig(group_size=4)
    for name in ADVANTAGE_ESTIMATORS.names():
        extra = {"values": [0.5] * 8} if name in CRITIC_ESTIMATORS else {}
        extra |= {"baselines": [0, 0, 0, 0, 1, 1, 1, 1]} if name in BASELINE_ESTIMATORS else {}
        probs, spi2 = [0.9, 0.5, 0.2, 0.7, 0.9, 0.6, 0.3, 0.5], [0.82, 0.3, 0.1, 0.5, 0.82, 0.4, 0.15, 0.3]
        stats = name in POLICY_STAT_ESTIMATORS
        extra |= {"token_probs": probs, "sum_pi_squared": spi2} if stats else {}
        table = est.advantage_example(name, EXAMPLE_REWARDS, EXAMPLE_LENGTHS, cfg, **extra)
        column = lambda xs: torch.tensor(xs, dtype=torch.float64)[:, None] * mask  # noqa: E731
        core = compute_advantages(name, r, mask, cfg, values=0.5 * mask if "values" in extra else None,
                                  baselines=torch.tensor([0.0] * 4 + [1.0] * 4) if "baselines" in extra else None,
                                  old_logp=torch.log(torch.tensor(probs, dtype=torch.float64))[:, None] * mask if stats else None,
                                  sum_pi_squared=column(spi2) if stats else None)
        shown = torch.tensor(table[[f"A_t{t}" for t in range(4)]].fillna(0.0).to_numpy())
        assert torch.equal(shown, core.advantages.double()), name
        assert table[[f"A_t{t}" for t in range(4)]].isna().to_numpy().tolist() == (mask == 0).tolist(), name


def test_advantage_example_opo_and_pass_at_k_by_hand():
    # OPO: group 0 rewards 1,0,0,0 lengths 2,4,3,1: b = 2 / 10 = 0.2; group 1 rewards 1,1,1,0
    # lengths 2,2,4,3: b = 8 / 11
    t = est.advantage_example("opo", EXAMPLE_REWARDS, EXAMPLE_LENGTHS, est.AdvantageConfig(group_size=4))
    b1 = 8 / 11
    assert t["A_t0"].tolist() == pytest.approx([0.8, -0.2, -0.2, -0.2, 1 - b1, 1 - b1, 1 - b1, -b1])
    assert t["A_t3"].isna().tolist() == [True, False, True, True, True, True, False, True]
    # pass@k: only the best of each group; group 0 margin 1 - 0 over std 0.5 = 2, group 1: ties for the best -> 0
    t = est.advantage_example("grpo_passk", EXAMPLE_REWARDS, EXAMPLE_LENGTHS, est.AdvantageConfig(group_size=4, eps=0.0))
    assert t["A_t0"].tolist() == [2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="lengths has 2 entries but rewards has 8"):
        est.advantage_example("opo", EXAMPLE_REWARDS, [1, 2], est.AdvantageConfig(group_size=4))


LOSS_SEQS = [[0.0, 0.1, 0.5], [-0.3, -0.05, 0.2, 1.0]]


def test_policy_loss_example_is_compute_policy_loss_for_every_registered_loss():
    from workbench.core import POLICY_LOSSES

    d = torch.tensor([[0.0, 0.1, 0.5, 0.0], [-0.3, -0.05, 0.2, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float64)
    old = math.log(0.1) * mask
    adv = torch.tensor([[1.0], [-1.0]], dtype=torch.float64) * mask
    cfg = PolicyLossConfig(cov_seed=0)
    for name in POLICY_LOSSES.names():
        table, metrics = est.policy_loss_example(name, LOSS_SEQS, [1, -1], cfg)
        logp = (old + d).requires_grad_(True)
        loss, diag = compute_policy_loss(name, logp, old, adv, mask, cfg)
        (grad,) = torch.autograd.grad(-loss.sum(), logp)
        valid = mask.bool()
        assert table["loss"].tolist() == loss.detach()[valid].tolist(), name
        assert table["-d loss / d log pi"].tolist() == grad[valid].tolist(), name
        assert table["zero grad"].tolist() == diag.zero_grad[valid].tolist(), name
        assert metrics == {k: float(v) for k, v in diag.metrics.items()}, name


def test_policy_loss_example_sapo_by_hand():
    table, metrics = est.policy_loss_example("sapo", [[0.0, 0.5]], [1.0], PolicyLossConfig())
    r = math.exp(0.5)
    s = 1 / (1 + math.exp(-(r - 1)))
    assert table["loss"].tolist() == pytest.approx([-2.0, -4 * s])  # -(4 / tau) sigmoid(tau (R - 1)) A, tau = 1
    assert table["-d loss / d log pi"].tolist() == pytest.approx([1.0, 4 * s * (1 - s) * r])
    assert table["region"].tolist() == ["trust", "trust"]
    assert metrics["sapo/gate_mean"] == pytest.approx((1 + 4 * s * (1 - s) * r) / 2)
    with pytest.raises(ValueError, match=r"each must be <= 2.3026"):
        est.policy_loss_example("sapo", [[3.0]], [1.0], PolicyLossConfig())


def test_knobs_read_finds_the_config_fields_a_source_reads():
    from workbench.core import AdvantageConfig

    def scaled(rewards, mask, cfg, *, kl=None, values=None):
        return rewards * cfg.eps + cfg.gamma, cfg.not_a_field

    assert est.knobs_read(scaled, AdvantageConfig) == ("eps", "gamma")  # in field order, real fields only


# ---- aggregation with a policy loss -------------------------------------------------------

def test_every_loss_at_ratio_one_weighs_tokens_as_its_aggregation():
    """On-policy every registered loss hands each token its advantage, so the per-token gradient
    through loss + aggregation equals the aggregation lab's dL/dR (the book's numbers)."""
    from workbench.core import POLICY_LOSSES

    book = agg.aggregation_table(agg.BOOK_EXAMPLE, max_len=7).set_index(["mode", "seq", "token"])["grad_wrt_ratio"]
    for name in POLICY_LOSSES.names():
        t = agg.loss_gradient_table(name, agg.BOOK_EXAMPLE, 7).set_index(["mode", "seq", "token"])["grad_logp"]
        assert t.tolist() == pytest.approx(book.loc[t.index].tolist(), rel=1e-12), name
    first = agg.loss_gradient_table("gmpo", agg.BOOK_EXAMPLE, 7).groupby(["mode", "seq"])["grad_logp"].first()
    assert first["seq-mean-token-mean"].tolist() == pytest.approx([0.25, 1 / 7])


def test_off_policy_the_losses_part_by_hand():
    r = math.exp(0.5)
    s = 1 / (1 + math.exp(-(r - 1)))
    sapo = agg.loss_gradient_table("sapo", agg.BOOK_EXAMPLE, 7, log_ratio=0.5).groupby(["mode", "seq"])["grad_logp"].first()
    # weight 1/8 (4 tokens, seq-mean-token-mean, B = 2) x gate 4 s (1 - s) R x A = 2
    assert sapo["seq-mean-token-mean"].tolist() == pytest.approx([2 / 8 * 4 * s * (1 - s) * r, 2 / 14 * 4 * s * (1 - s) * r])
    clip = agg.loss_gradient_table("clip", agg.BOOK_EXAMPLE, 7, log_ratio=0.5)
    assert clip["grad_logp"].tolist() == [0.0] * len(clip)  # R = 1.65 > 1.2 with A > 0: every token clipped
    cispo = agg.loss_gradient_table("cispo", agg.BOOK_EXAMPLE, 7, log_ratio=0.5).groupby(["mode", "seq"])["grad_logp"].first()
    assert cispo["token-mean"].tolist() == pytest.approx([2 / 11 * 1.2] * 2)  # weight capped at 1 + eps_high
    fig = json.loads(agg.aggregation_figure(clip, "grad_logp").to_json())
    assert fig["layout"]["yaxis"]["title"]["text"] == "dJ / d log pi per token"


def test_worked_examples_refuse_numbers_no_example_can_use():
    from workbench.core import AdvantageConfig

    for text in ("1, nan", "inf, 0", "1, -inf"):  # float() accepts them; the class is refused, not one spelling
        with pytest.raises(ValueError, match="is not a finite number"):
            est.parse_numbers(text, "rewards")
    cfg = AdvantageConfig(group_size=2)
    with pytest.raises(ValueError, match=f"from 1 to {est.MAX_EXAMPLE_LENGTH}"):
        est.advantage_example("grpo", [1, 0], [2, est.MAX_EXAMPLE_LENGTH + 1], cfg)
    with pytest.raises(ValueError, match=f"at most {est.MAX_EXAMPLE_COMPLETIONS}"):
        est.advantage_example("grpo", [0.0] * (est.MAX_EXAMPLE_COMPLETIONS + 2), [1] * (est.MAX_EXAMPLE_COMPLETIONS + 2), cfg)
    stats = dict(token_probs=[0.5, 0.5], sum_pi_squared=[0.5, 0.5])
    for key, bad in (("token_probs", [0.0, 0.5]), ("token_probs", [1.5, 0.5]), ("sum_pi_squared", [0.0, 0.5]),
                     ("sum_pi_squared", [1.2, 0.5])):
        with pytest.raises(ValueError, match=rf"{key}=.*must lie in \(0.0, 1.0\]"):
            est.advantage_example("optimal_token_baseline", [1, 0], [2, 2], cfg, **{**stats, key: bad})
    with pytest.raises(ValueError, match="below token_probs"):  # pi^2 of the sampled token is part of the sum
        est.advantage_example("optimal_token_baseline", [1, 0], [2, 2], cfg, token_probs=[0.9, 0.5], sum_pi_squared=[0.5, 0.5])


def test_the_example_inputs_follow_the_specs_capabilities():
    from workbench.algorithms import spec

    inputs = lambda name: {i.keyword for i in est.example_inputs(spec("advantage", name))}  # noqa: E731
    assert inputs("gae") == {"values"} and inputs("remax") == {"baselines"} and inputs("grpo") == set()
    assert inputs("tir_optimal_token_baseline") == {"token_probs", "sum_pi_squared"}
