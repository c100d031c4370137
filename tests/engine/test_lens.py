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
from workbench.engine.forward import logprobs_and_entropy
from workbench.core.distillation import ADVANTAGE_SHAPINGS, DistillationConfig, shape_advantages
from workbench.core.masked import masked_mean
from workbench.engine.lens import lens_advantages, lens_estimators, lens_key, lens_report, lens_shaped
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
    # no critic values, no greedy baselines and no sum pi^2 here: gae, remax and the optimal token baselines sit out
    sit_out = ("gae", "remax", "optimal_token_baseline", "tir_optimal_token_baseline")
    assert set(rows) == {(a, l) for a in lens_estimators() if a not in sit_out for l in LOSSES}
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
                                       "reinforce_pp_baseline", "gae", "remax", "opo", "grpo_passk", "gpg",
                                       "optimal_token_baseline", "tir_optimal_token_baseline"]

    @ADVANTAGE_ESTIMATORS.register("lens_test_constant")
    def constant(rewards, mask, cfg, *, kl=None, values=None):
        return Advantages(0.5 * mask, 0.5 * mask)

    try:  # registered after the lens module was imported: it still joins, with no list to edit
        assert lens_estimators()["lens_test_constant"] == ("lens_test_constant", {})
        _, _, mask, rewards = small_policy()
        assert torch.equal(lens_advantages(rewards, mask, AdvantageConfig(group_size=G))["lens_test_constant"], 0.5 * mask)
    finally:
        ADVANTAGE_ESTIMATORS.unregister("lens_test_constant")


def test_shaped_row_is_the_estimator_minus_lambda_times_the_reverse_kl():
    """OPD on the run's estimator only: A' = A - coef (student - teacher) per token, 0 on padding;
    the other estimators untouched, the shaped key right after its estimator."""
    W, logp, mask, rewards = small_policy()
    adv = lens_advantages(rewards, mask, AdvantageConfig(group_size=G))
    student = logp.detach()
    teacher = student - 0.25 * mask  # the teacher finds every sampled token e^-0.25 as likely: d = 0.25
    shaped = lens_shaped(adv, ["dr_grpo"], student, teacher, mask, DistillationConfig(coef=0.5))
    keys = list(shaped)
    assert keys[keys.index("dr_grpo") + 1] == "dr_grpo + opd"
    assert set(keys) - set(adv) == {"dr_grpo + opd"}
    assert all(shaped[k] is adv[k] for k in adv)
    # hand value: dr_grpo's group 0 rewards 1,0,1,0 have mean 0.5, so sequence 0 has A = 0.5; 0.5 - 0.5 x 0.25
    assert shaped["dr_grpo + opd"][0, 0].item() == pytest.approx(0.375, abs=1e-12)
    torch.testing.assert_close(shaped["dr_grpo + opd"], (adv["dr_grpo"] - 0.125) * mask, rtol=0, atol=1e-12)
    # a shaped row is a row like any other: the run's reference when the run stepped with it
    rows = lens_report(logp, student, shaped, mask, [W], losses=LOSSES, loss_cfg=PolicyLossConfig(),
                       aggregation="token-mean", norm={"max_len": 5}, run=("dr_grpo + opd", "clip"))
    rows = {(r["advantage"], r["policy_loss"]): r for r in rows}
    assert rows[("dr_grpo + opd", "clip")]["cos_run"] == pytest.approx(1.0, abs=1e-12)
    assert rows[("dr_grpo", "clip")]["cos_run"] < 0.9999  # the teacher's term turns the gradient


def test_a_shaping_registered_later_joins_the_lens():
    _, logp, mask, rewards = small_policy()
    adv = lens_advantages(rewards, mask, AdvantageConfig(group_size=G))

    @ADVANTAGE_SHAPINGS.register("lens_test_halve")
    def halve(advantages, student_logp, teacher_logp, mask, cfg):
        return 0.5 * advantages

    try:
        shaped = lens_shaped(adv, ["grpo"], logp.detach(), logp.detach(), mask, DistillationConfig())
        assert [k for k in shaped if k.startswith("grpo +")] == ["grpo + opd", "grpo + lens_test_halve"]
        assert torch.equal(shaped["grpo + lens_test_halve"], 0.5 * adv["grpo"])
    finally:
        ADVANTAGE_SHAPINGS.unregister("lens_test_halve")


def dr_grpo_lens_run(few_problems, run_dir, *overrides):
    """Dr. GRPO, 3 steps, lens at steps 0 and 2, regular diagnostics off: (trainer, events)."""
    recipe = load_recipe("dr_grpo", [f"dataset={few_problems}", "train.steps=3", "logging.lens_every=2",
                                      "logging.diagnostics_every=0", *overrides])
    trainer = Trainer(recipe, run_dir)
    assert trainer.run() == "finished"
    return trainer, read_events(run_dir)


@pytest.fixture(scope="module")
def lens_run(wb_home, few_problems, tmp_path_factory):
    return dr_grpo_lens_run(few_problems, tmp_path_factory.mktemp("lens"))


def test_trainer_emits_lens_events(lens_run):
    _, events = lens_run
    assert not [e for e in events if e["kind"] == "diagnostics"]  # regular diagnostics are off
    lenses = {e["step"]: e for e in events if e["kind"] == "lens"}
    assert sorted(lenses) == [0, 2]
    lens = lenses[0]
    assert lens["run"] == {"advantage": "dr_grpo", "policy_loss": "clip"}
    for point in ("before", "after"):
        combos = {(c["advantage"], c["policy_loss"]): c for c in lens["points"][point]}
        # every registered loss x every estimator but GAE (no critic), ReMax (no greedy baseline) and the
        # optimal token baselines (no sum pi^2)
        sit_out = ("gae", "remax", "optimal_token_baseline", "tir_optimal_token_baseline")
        assert set(combos) == {(a, l) for a in lens_estimators() if a not in sit_out for l in POLICY_LOSSES.names()}
        assert combos[("rloo", "clip")]["cos_run"] == pytest.approx(1.0, abs=1e-5)
        assert combos[("rloo", "clip")]["grad_norm"] / combos[("dr_grpo", "clip")]["grad_norm"] == pytest.approx(8 / 7, rel=1e-5)
    before = {(c["advantage"], c["policy_loss"]): c for c in lens["points"]["before"]}
    # the run's update is AdamW's, not the raw gradient: positively aligned, not parallel
    assert 0.0 < before[("dr_grpo", "clip")]["cos_update"] < 1.0
    assert set(lens["advantages"]) == set(c[0] for c in before)
    # no teacher: no shaped rows and the payload's fields are the ones it always had
    assert not [k for k in lens["advantages"] if " + " in k]
    assert set(lens) == {"kind", "step", "time", "run", "aggregation", "update_norm", "points", "advantages"}


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


@pytest.fixture(scope="module")
def opd_lens_run(wb_home, few_problems, tmp_path_factory):
    """Dr. GRPO + OPD (lambda 0.1) against the built-in teacher (built once per home, ~40 s), lens
    at steps 0 and 2; the trainer is returned so its last step's teacher log-probs can be read."""
    from workbench.engine.distill import ensure_tiny_teacher

    ensure_tiny_teacher()
    return dr_grpo_lens_run(few_problems, tmp_path_factory.mktemp("opd-lens"), "teacher=tiny-teacher", "teacher.kl_coef=0.1")


def test_teacher_run_lens_adds_the_shaped_row_from_the_steps_own_teacher_logp(opd_lens_run):
    trainer, events = opd_lens_run
    lens = [e for e in events if e["kind"] == "lens"][-1]
    assert lens["step"] == 2 and lens["run"] == {"advantage": "dr_grpo + opd", "policy_loss": "clip"}
    assert lens["teacher"] == {"shaping": "opd", "coef": 0.1, "discount": 0.0, "mode": "shaped"}
    assert [k for k in lens["advantages"] if " + " in k] == ["dr_grpo + opd"]  # the run's estimator only
    for point in ("before", "after"):
        combos = {(c["advantage"], c["policy_loss"]) for c in lens["points"][point]}
        assert {("dr_grpo + opd", loss) for loss in POLICY_LOSSES.names()} <= combos
        assert {("dr_grpo", loss) for loss in POLICY_LOSSES.names()} <= combos  # the unshaped row stays
    # exact values: shape_advantages on step 2's own inputs (the teacher log-probs the step scored)
    d = trainer.distill_inputs
    assert d["shaping"] == "opd"
    n = len(lens["advantages"]["dr_grpo"])
    mask = d["mask"][:n].double()
    # Dr. GRPO's advantage is one number per sequence, so the logged per-sequence mean is the token value
    plain = torch.tensor(lens["advantages"]["dr_grpo"], dtype=torch.float64)[:, None] * mask
    shaped = shape_advantages("opd", plain, d["student_logp"][:n].double(), d["teacher_logp"][:n].double(), mask,
                              DistillationConfig(coef=0.1))
    expected = masked_mean(shaped, mask, dim=1)
    # = A_i - 0.1 x (sequence mean of log pi_theta - log pi_T): the teacher moved every row it scored
    kl = masked_mean(d["student_logp"][:n].double() - d["teacher_logp"][:n].double(), mask, dim=1)
    torch.testing.assert_close(expected, plain[:, 0] - 0.1 * kl, rtol=0, atol=1e-12)
    assert (kl.abs() > 1e-3).all()
    torch.testing.assert_close(torch.tensor(lens["advantages"]["dr_grpo + opd"], dtype=torch.float64), expected,
                               rtol=1e-6, atol=1e-6)
    # and they are the advantages the run trained on (its samples log the first sequences' means)
    samples = [e for e in events if e["kind"] == "samples" and e["step"] == 2][0]["samples"]
    for s, value in zip(samples, lens["advantages"]["dr_grpo + opd"]):
        assert s["advantage"] == pytest.approx(value, abs=1e-6)


def test_teacher_run_lens_reference_is_the_shaped_gradient_the_trainer_stepped_with(opd_lens_run):
    """The run stepped with A - lambda d: its grad_norm is the shaped row's at theta_before, not the
    unshaped estimator's."""
    _, events = opd_lens_run
    metrics = {e["step"]: e["metrics"] for e in events if e["kind"] == "metrics"}
    for lens in (e for e in events if e["kind"] == "lens"):
        before = {(c["advantage"], c["policy_loss"]): c for c in lens["points"]["before"]}
        assert before[("dr_grpo + opd", "clip")]["grad_norm"] == pytest.approx(metrics[lens["step"]]["grad_norm"], rel=1e-4)
        assert before[("dr_grpo + opd", "clip")]["cos_run"] == pytest.approx(1.0, abs=1e-6)
        assert before[("dr_grpo", "clip")]["grad_norm"] != pytest.approx(metrics[lens["step"]]["grad_norm"], rel=1e-3)


def test_lens_reference_is_the_trainers_accumulated_gradient_with_every_mask_and_weight(wb_home, few_problems, tmp_path):
    """mu = 1, one minibatch: at theta_before the lens's g_run (core.policy_objective through
    Trainer.run_objective) and the gradient the trainer accumulated before its optimiser step
    have cosine 1 and equal norm, on a stale batch (staleness 1) that uses IS weights
    (batch-normalised), rollout rejection sampling, top-entropy tokens and the off-policy mask
    together (plus OPSM, the in-loss KL and an entropy bonus)."""
    recipe = load_recipe("grpo", [f"dataset={few_problems}", "train.steps=2", "train.staleness=1",
                                  "algorithm.rollout_correction=token_truncate", "algorithm.rollout_correction_batch_normalize=true",
                                  "algorithm.rollout_rejection=token_k3", "algorithm.rollout_rejection_max=1.0",
                                  "algorithm.top_entropy_quantile=0.5",
                                  "algorithm.off_policy_mask_threshold=0.001", "algorithm.opsm_delta=0.001",
                                  "algorithm.entropy_coef=0.01", "logging.diagnostics_every=0"])
    t = Trainer(recipe, tmp_path)
    t.setup()
    t.step(0)  # one update: step 1 samples with the weights before it
    _, out, rewards, *_ = t.sample(1)
    batch, (g_rewards, g_mask, g_kl, _, g_keep) = t.prepare_batch(out, rewards)
    B = batch.completion_mask.shape[0]
    # every mask and weight acts on this batch
    assert not torch.allclose(batch.is_weights[batch.completion_mask.bool()], torch.ones(()))
    assert 0 < batch.loss_mask.sum() < batch.completion_mask.sum()  # rejection sampling dropped some tokens
    logp, entropy = logprobs_and_entropy(t.policy, batch, recipe.sampling.temperature, entropy_grad=True)
    obj = t.run_objective(batch, logp, entropy, logp.detach(), entropy_coef=0.01,
                          num_tokens=batch.loss_mask.sum(), num_seqs=float(B))
    assert 0 < obj.kept.sum() < batch.loss_mask.sum()
    assert obj.loss_mask.sum() < batch.loss_mask.sum()  # the off-policy mask / OPSM dropped sequences
    del logp, entropy, obj
    t.lens.keep_reference = True
    t.lens.snapshot()
    last = {"ratio": torch.ones_like(batch.completion_mask), "region": torch.zeros_like(batch.completion_mask, dtype=torch.long),
            "zero_grad": torch.zeros_like(batch.completion_mask, dtype=torch.bool)}
    for _ in t.accumulate_gradients(batch, torch.arange(B), last):
        pass
    params = t.lens._params()
    trainer_grad = torch.cat([p.grad.reshape(-1).double() for p in params])
    t.lens.evaluate(batch, g_rewards, g_mask, g_kl, 4, g_keep=g_keep)
    g_run = t.lens.reference["before"]
    cos = float(torch.dot(g_run, trainer_grad) / (g_run.norm() * trainer_grad.norm()))
    print(f"cos={cos!r} |g_run|={float(g_run.norm())!r} |g_trainer|={float(trainer_grad.norm())!r}")
    assert cos == pytest.approx(1.0, abs=1e-6)
    assert float(g_run.norm()) == pytest.approx(float(trainer_grad.norm()), rel=1e-5)


def test_lens_on_two_processes_reduces_the_same_gradients_on_every_rank(wb_home, few_problems, tmp_path):
    """accelerate launch, 2 CPU processes: the ranks' batches give different sets of equal
    v = dL/dlogp, so rows are grouped by their v on every rank before the gradients are summed
    (grouping per rank ran a different number of all-reduces on each and gloo aborted); the
    run's row is the global gradient the run stepped with."""
    from tests.engine.test_process import launch_two_processes

    run_dir = tmp_path / "ddp"
    res = launch_two_processes(wb_home, 29547, "dr_grpo", "--set", "train.steps=2", "--set", f"dataset={few_problems}",
                               "--set", "logging.lens_every=1", "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stderr[-3000:]
    assert (run_dir / "params.rank0.sha256").read_text() == (run_dir / "params.rank1.sha256").read_text()
    events = read_events(run_dir)
    metrics = {e["step"]: e["metrics"] for e in events if e["kind"] == "metrics"}
    lenses = [e for e in events if e["kind"] == "lens"]
    assert [e["step"] for e in lenses] == [0, 1]
    for lens in lenses:
        before = {(c["advantage"], c["policy_loss"]): c for c in lens["points"]["before"]}
        assert before[("dr_grpo", "clip")]["grad_norm"] == pytest.approx(metrics[lens["step"]]["grad_norm"], rel=1e-4)
        assert before[("rloo", "clip")]["cos_run"] == pytest.approx(1.0, abs=1e-5)
