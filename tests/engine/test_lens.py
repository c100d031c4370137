"""The same-batch lens: hand-worked identities on a small differentiable policy, then for real in
the trainer on the tiny model."""

import pytest
import torch

from workbench.core import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageConfig,
    Advantages,
    PolicyLossConfig,
    aggregate_loss,
    compute_advantages,
    compute_policy_loss,
)
from workbench.engine.events import read_events
from workbench.engine.lens import lens_advantages, lens_estimators, lens_key, lens_report
from workbench.engine.trainer import Trainer
from workbench.recipe import load_recipe

torch.set_num_threads(1)
LOSSES = ("clip", "gspo", "cispo", "reinforce")
G = 4


def small_policy(seed=0):
    """8 completions (2 prompts x G=4) of ragged lengths; logp = log_softmax(X W)[token]."""
    gen = torch.Generator().manual_seed(seed)
    B, T, D, V = 2 * G, 5, 3, 6
    X = torch.randn(B, T, D, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    W = torch.randn(D, V, generator=gen, dtype=torch.float64).requires_grad_(True)
    lengths = torch.tensor([5, 2, 3, 4, 1, 5, 2, 4])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    logp = torch.log_softmax(X @ W, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
    # group 0 has std 0.577, group 1 std 0.5: GRPO's per-group scaling differs, Dr. GRPO's does not
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    return W, logp, mask, rewards


def report(run=("dr_grpo", "clip"), update=None, aggregation="seq-mean-token-mean"):
    W, logp, mask, rewards = small_policy()
    adv = lens_advantages(rewards, mask, AdvantageConfig(group_size=G))
    rows = lens_report(logp, logp.detach(), adv, mask, [W], losses=LOSSES, loss_cfg=PolicyLossConfig(),
                       aggregation=aggregation, norm={"max_len": 5}, run=run, update=update)
    return {(r["advantage"], r["policy_loss"]): r for r in rows}, (W, logp, mask, rewards)


def test_rloo_and_dr_grpo_gradients_are_parallel_with_ratio_g_over_g_minus_1():
    rows, _ = report()
    rloo, dr = rows[("rloo", "clip")], rows[("dr_grpo", "clip")]
    assert dr["cos_run"] == pytest.approx(1.0, abs=1e-12)
    assert rloo["cos_run"] == pytest.approx(1.0, abs=1e-12)  # RLOO = G/(G-1) * Dr. GRPO
    assert rloo["grad_norm"] / dr["grad_norm"] == pytest.approx(G / (G - 1), rel=1e-12)
    # GRPO divides the two groups by different stds (0.5774 vs 0.5): not parallel
    assert rows[("grpo", "clip")]["cos_run"] < 0.9999


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum"])
def test_at_ratio_one_every_policy_loss_gives_the_same_gradient(aggregation):
    """GSPO too: d s_i / d logp_t = 1/n_i over n_i tokens, and aggregation weights are constant
    within a sequence."""
    rows, _ = report(aggregation=aggregation)
    for loss in ("gspo", "cispo", "reinforce"):
        assert rows[("dr_grpo", loss)]["cos_run"] == pytest.approx(1.0, abs=1e-12)
        assert rows[("dr_grpo", loss)]["grad_norm"] == pytest.approx(rows[("dr_grpo", "clip")]["grad_norm"], rel=1e-12)


def test_off_policy_the_losses_differ_and_clipping_zeroes_tokens():
    W, logp, mask, rewards = small_policy()
    adv = lens_advantages(rewards, mask, AdvantageConfig(group_size=G))
    old = logp.detach() + torch.linspace(-0.5, 0.5, logp.numel(), dtype=torch.float64).reshape(logp.shape)
    rows = lens_report(logp, old, adv, mask, [W], losses=LOSSES, loss_cfg=PolicyLossConfig(),
                       aggregation="token-mean", norm={"max_len": 5}, run=("dr_grpo", "clip"))
    rows = {(r["advantage"], r["policy_loss"]): r for r in rows}
    assert rows[("dr_grpo", "clip")]["zero_grad"] > 0  # some tokens left the trust region
    assert rows[("dr_grpo", "cispo")]["zero_grad"] == 0  # CISPO never zeroes a token with A != 0
    assert rows[("dr_grpo", "cispo")]["cos_run"] < 0.9999


def test_every_combination_and_the_update_cosine():
    W, logp, mask, rewards = small_policy()
    adv = compute_advantages("grpo", rewards, mask, AdvantageConfig(group_size=G, scale="none")).advantages
    per_token, _ = compute_policy_loss("clip", logp, logp.detach(), adv, mask, PolicyLossConfig())
    (g,) = torch.autograd.grad(aggregate_loss("seq-mean-token-mean", per_token, mask), W)
    # a plain SGD step theta_after = theta_before - 0.1 g: the update taken is 0.1 g
    rows, _ = report(update=0.1 * g.reshape(-1))
    # no critic values and no greedy baselines here: gae and remax sit out
    assert set(rows) == {(a, l) for a in lens_estimators() if a not in ("gae", "remax") for l in LOSSES}
    assert rows[("dr_grpo", "clip")]["cos_update"] == pytest.approx(1.0, abs=1e-12)
    assert rows[("rloo", "clip")]["cos_update"] == pytest.approx(1.0, abs=1e-12)
    assert rows[("dr_grpo", "clip")]["grad_norm"] == pytest.approx(float(g.norm()), rel=1e-12)
    # loss values at ratio 1: clip gives -mean_i A_i = 0 for group-centred advantages
    assert rows[("dr_grpo", "clip")]["loss"] == pytest.approx(0.0, abs=1e-12)


def test_lens_key_maps_grpo_scales():
    assert lens_key("grpo", "none") == "dr_grpo"
    assert lens_key("grpo", "group") == "grpo"
    assert lens_key("grpo", "batch") == "grpo_batch_std"
    assert lens_key("rloo", "group") == "rloo"


def test_lens_covers_every_registered_estimator_and_grpo_scale():
    assert list(lens_estimators()) == ["grpo", "dr_grpo", "grpo_batch_std", "rloo", "reinforce", "reinforce_pp",
                                       "reinforce_pp_baseline", "gae", "remax", "opo", "grpo_passk", "gpg"]

    @ADVANTAGE_ESTIMATORS.register("lens_test_constant")
    def constant(rewards, mask, cfg, *, kl=None, values=None):
        return Advantages(0.5 * mask, 0.5 * mask)

    try:  # registered after the lens module was imported: it still joins, with no list to edit
        assert lens_estimators()["lens_test_constant"] == ("lens_test_constant", {})
        _, _, mask, rewards = small_policy()
        assert torch.equal(lens_advantages(rewards, mask, AdvantageConfig(group_size=G))["lens_test_constant"], 0.5 * mask)
    finally:
        ADVANTAGE_ESTIMATORS.unregister("lens_test_constant")


@pytest.fixture(scope="module")
def lens_run(wb_home, few_problems, tmp_path_factory):
    recipe = load_recipe("dr_grpo", [f"dataset={few_problems}", "train.steps=3", "logging.lens_every=2",
                                      "logging.diagnostics_every=0"])
    run_dir = tmp_path_factory.mktemp("lens")
    trainer = Trainer(recipe, run_dir)
    assert trainer.run() == "finished"
    return trainer, read_events(run_dir)


def test_trainer_emits_lens_events(lens_run):
    _, events = lens_run
    assert not [e for e in events if e["kind"] == "diagnostics"]  # regular diagnostics are off
    lenses = {e["step"]: e for e in events if e["kind"] == "lens"}
    assert sorted(lenses) == [0, 2]
    lens = lenses[0]
    assert lens["run"] == {"advantage": "dr_grpo", "policy_loss": "clip"}
    for point in ("before", "after"):
        combos = {(c["advantage"], c["policy_loss"]): c for c in lens["points"][point]}
        # every registered loss x every estimator but GAE (no critic) and ReMax (no greedy baseline)
        assert set(combos) == {(a, l) for a in lens_estimators() if a not in ("gae", "remax") for l in POLICY_LOSSES.names()}
        assert combos[("rloo", "clip")]["cos_run"] == pytest.approx(1.0, abs=1e-5)
        assert combos[("rloo", "clip")]["grad_norm"] / combos[("dr_grpo", "clip")]["grad_norm"] == pytest.approx(8 / 7, rel=1e-5)
    before = {(c["advantage"], c["policy_loss"]): c for c in lens["points"]["before"]}
    # the run's update is AdamW's, not the raw gradient: positively aligned, not parallel
    assert 0.0 < before[("dr_grpo", "clip")]["cos_update"] < 1.0
    assert set(lens["advantages"]) == set(c[0] for c in before)


def test_lens_gradient_is_the_gradient_the_trainer_stepped_with(lens_run):
    """dr_grpo: mu = 1, one minibatch, no KL, no entropy: the trainer's grad_norm (before
    clipping) is the norm of exactly the lens's run gradient at theta_before."""
    _, events = lens_run
    metrics = {e["step"]: e["metrics"] for e in events if e["kind"] == "metrics"}
    lenses = {e["step"]: e for e in events if e["kind"] == "lens"}
    for step in (0, 2):
        run = next(c for c in lenses[step]["points"]["before"] if (c["advantage"], c["policy_loss"]) == ("dr_grpo", "clip"))
        assert run["grad_norm"] == pytest.approx(metrics[step]["grad_norm"], rel=1e-4)
        assert metrics[step]["perf/lens_time"] > 0
    assert "perf/lens_time" not in metrics[1]


def test_lens_leaves_training_unchanged(lens_run, wb_home, few_problems, tmp_path):
    """Same seed without the lens: identical rewards and losses at every step."""
    recipe = load_recipe("dr_grpo", [f"dataset={few_problems}", "train.steps=3", "logging.diagnostics_every=0"])
    assert Trainer(recipe, tmp_path).run() == "finished"
    plain = [e["metrics"] for e in read_events(tmp_path) if e["kind"] == "metrics"]
    with_lens = [e["metrics"] for e in lens_run[1] if e["kind"] == "metrics"]
    for a, b in zip(plain, with_lens):
        assert a["reward"] == b["reward"]
        assert a["loss/policy"] == pytest.approx(b["loss/policy"], abs=1e-7)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-6)
