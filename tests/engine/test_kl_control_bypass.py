"""verl's KL controller (algorithm.kl_controller) and DPPO's bypass mode (algorithm.bypass_mode) in
real runs of the built-in tiny model (one CPU thread: runs repeat exactly), their recipe refusals
and their verl import."""

import json
import math
from dataclasses import replace

import pytest
import torch

import workbench.engine.trainer as trainer_module
from tests.engine.test_zoo_controls import resumed_after_step_1
from workbench.core import KL_CONTROLLERS, compute_advantages, sequence_mean_kl
from workbench.engine.events import read_events
from workbench.engine.ranks import global_counts
from workbench.engine.trainer import Trainer, train
from workbench.recipe import RecipeError, load_recipe
from workbench.runs.imports import verl_recipe

BATCH = 32  # the rloo preset: 4 prompts x 8 completions
# beta moves by at most 20% x BATCH / HORIZON = 10% a step, so three steps show it
ADAPTIVE = ["algorithm.kl_controller=adaptive", "algorithm.kl_target=0.001", "algorithm.kl_horizon=64"]


def _recipe(few_problems, *overrides, steps=3):
    """The rloo preset (KL k1 in the reward, beta 0.05) on the four problems, one thread."""
    return load_recipe("rloo", [f"dataset={few_problems}", f"train.steps={steps}", "train.threads=1", *overrides])


def _run(few_problems, path, *overrides, steps=3):
    assert train(_recipe(few_problems, *overrides, steps=steps), path) == "finished"
    return {e["step"]: e["metrics"] for e in read_events(path) if e["kind"] == "metrics"}


def _hand_betas(kls: list[float], beta0: float, target: float, horizon: int) -> list[float]:
    """Ziegler et al. / verl by hand: beta_{s+1} = beta_s (1 + clip(kl_s / target - 1, +-0.2) B / horizon)."""
    betas = [beta0]
    for kl in kls[:-1]:
        betas.append(betas[-1] * (1 + min(max(kl / target - 1, -0.2), 0.2) * BATCH / horizon))
    return betas


# ---- the controller's input, pure -------------------------------------------------------------------

def test_sequence_mean_kl_is_the_batch_mean_of_each_completions_token_mean():
    kl = torch.tensor([[0.2, 0.4, 9.0], [1.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # the last completion is empty
    assert sequence_mean_kl(kl, mask) == pytest.approx(((0.2 + 0.4) / 2 + 1.0 + 0.0) / 3, rel=1e-7)
    assert KL_CONTROLLERS.names() == ("fixed", "adaptive")  # verl's kl_ctrl.type names
    assert KL_CONTROLLERS.get("fixed")(0.05, 3.0, 32, target_kl=0.1, horizon=10) == 0.05


# ---- adaptive KL: real runs ------------------------------------------------------------------------

def test_adaptive_coefficient_follows_the_logged_kls_exactly_and_fixed_stays(few_problems, tmp_path):
    adaptive = _run(few_problems, tmp_path / "adaptive", *ADAPTIVE)
    kls = [adaptive[s]["actor/reward_kl_penalty"] for s in range(3)]
    betas = [adaptive[s]["actor/reward_kl_penalty_coeff"] for s in range(3)]
    assert kls[0] == 0.0  # step 0 samples with the reference's weights: below target, beta falls 10%
    assert betas == pytest.approx(_hand_betas(kls, 0.05, 0.001, 64), rel=1e-12, abs=0)
    assert betas[1] == pytest.approx(0.05 * 0.9, rel=1e-12)
    assert len(set(betas)) == 3
    # the coefficient after step 2 is what a checkpoint carries on
    state = json.loads((tmp_path / "adaptive" / "checkpoints" / "step-00000002" / "trainer_state.json").read_text())
    assert state["kl_control"]["coef"] == pytest.approx(_hand_betas(kls + [0.0], 0.05, 0.001, 64)[3], rel=1e-12)

    fixed = _run(few_problems, tmp_path / "fixed", steps=2)
    assert [fixed[s]["actor/reward_kl_penalty_coeff"] for s in range(2)] == [0.05, 0.05]
    # step 0 is the same batch and the same beta in both runs, so the same numbers throughout
    drop = lambda m: {k: v for k, v in m.items() if not k.startswith("perf/")}  # noqa: E731
    assert drop(fixed[0]) == drop(adaptive[0])


def test_the_advantages_are_shaped_with_the_controllers_beta(wb_home, few_problems, tmp_path):
    """prepare_batch shapes the rewards with TrainState.kl_coef (here set as a resume would), not
    algorithm.kl_coef: with a reference that differs from the policy the two give other advantages."""
    t = Trainer(_recipe(few_problems, *ADAPTIVE), tmp_path)
    t.setup()
    with torch.no_grad():  # a reference other than the policy, so that the KL is not 0
        gen = torch.Generator().manual_seed(0)
        for p in t.reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    _, out = t.rollout(0)
    rewards = torch.linspace(0.0, 1.0, out.completion_mask.shape[0])
    t.state.kl_coef = 0.3
    _, (_, g_mask, g_kl, g_adv, _) = t.prepare_batch(out, rewards)
    assert float(g_kl.abs().sum()) > 0
    cfg = t.recipe.advantage_config()
    shaped = lambda beta: compute_advantages("rloo", rewards, g_mask, replace(cfg, kl_coef=beta), kl=g_kl).advantages  # noqa: E731
    torch.testing.assert_close(g_adv, shaped(0.3), atol=0, rtol=0)
    assert not torch.allclose(g_adv, shaped(0.05))
    assert t.update_kl_controller(g_kl, g_mask) == {"actor/reward_kl_penalty": sequence_mean_kl(g_kl, g_mask),
                                                   "actor/reward_kl_penalty_coeff": 0.3}
    assert t.state.kl_coef == KL_CONTROLLERS.get("adaptive")(0.3, sequence_mean_kl(g_kl, g_mask), BATCH,
                                                             target_kl=0.001, horizon=64)


def test_resume_continues_the_same_kl_coefficient(few_problems, tmp_path):
    overrides = [*ADAPTIVE, "checkpoint.every=2", "checkpoint.keep_last=2"]
    straight = _run(few_problems, tmp_path / "straight", *overrides, steps=4)
    resumed = resumed_after_step_1(tmp_path / "straight", tmp_path / "cut")
    betas = [straight[s]["actor/reward_kl_penalty_coeff"] for s in range(4)]
    assert betas == pytest.approx(_hand_betas([straight[s]["actor/reward_kl_penalty"] for s in range(4)], 0.05, 0.001, 64),
                                  rel=1e-12, abs=0)
    assert betas[2] != 0.05  # a resume that restarted the controller would log kl_coef here
    for step in (2, 3):
        drop = lambda m: {k: v for k, v in m.items() if not k.startswith("perf/")}  # noqa: E731
        assert drop(resumed[step]) == drop(straight[step])


# ---- bypass mode ---------------------------------------------------------------------------------------

@pytest.fixture
def count_policy_forwards(monkeypatch):
    """Counts the engine's log-prob forwards of the policy (the real function still runs)."""
    calls = []
    real = trainer_module.logprobs_and_entropy

    def counted(model, *args, **kwargs):
        calls.append(model)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "logprobs_and_entropy", counted)
    return calls


def test_bypass_loss_is_the_plain_loss_fed_the_rollout_log_probs_and_skips_the_old_forward(
        wb_home, few_problems, tmp_path, count_policy_forwards):
    """mu = 2 (the plain path's ratio uses its old log-probs) and no KL (no reference forward): the
    rollout engine's log-probs are shifted off the trainer's, so the ratio pi / pi_rollout moves."""
    common = ["algorithm.kl_coef=0", "train.mu=2"]
    t = Trainer(_recipe(few_problems, *common, "algorithm.bypass_mode=true"), tmp_path / "bypass")
    t.setup()
    _, out = t.rollout(0)
    shift = torch.linspace(-0.3, 0.3, out.completion_mask.numel()).reshape(out.completion_mask.shape)
    out.rollout_logp = out.rollout_logp + shift * out.completion_mask
    rewards = torch.linspace(0.0, 1.0, out.completion_mask.shape[0])

    count_policy_forwards.clear()
    bypass_batch, _ = t.prepare_batch(out, rewards)
    assert count_policy_forwards == []  # no old log-prob forward
    assert bypass_batch.old_logp is out.rollout_logp
    counts = global_counts(t.ranks, bypass_batch.loss_mask, bypass_batch.completion_mask)
    bypass_loss = t.micro_loss(bypass_batch, *counts)[0]

    t.recipe = _recipe(few_problems, *common)  # the plain path, same weights and rollout
    count_policy_forwards.clear()
    plain_batch, _ = t.prepare_batch(out, rewards)
    assert count_policy_forwards == [t.policy]  # one old log-prob forward
    fed = t.micro_loss(replace(plain_batch, old_logp=out.rollout_logp), *counts)[0]
    recomputed = t.micro_loss(plain_batch, *counts)[0]
    assert float(bypass_loss.detach()) == float(fed.detach())
    assert float(bypass_loss.detach()) != pytest.approx(float(recomputed.detach()), abs=1e-4)


def test_bypass_at_one_update_per_batch_takes_the_ratio_against_the_rollout(wb_home, few_problems, tmp_path):
    """At mu = 1 the plain ratio is exactly 1; bypass mode's is pi / pi_rollout (verl sets old := rollout)."""
    t = Trainer(_recipe(few_problems, "algorithm.kl_coef=0", "algorithm.bypass_mode=true"), tmp_path)
    t.setup()
    _, out = t.rollout(0)
    out.rollout_logp = out.rollout_logp + 0.1 * out.completion_mask
    batch, _ = t.prepare_batch(out, torch.linspace(0.0, 1.0, out.completion_mask.shape[0]))
    *_, diag = t.micro_loss(batch, *global_counts(t.ranks, batch.loss_mask, batch.completion_mask))
    valid = out.completion_mask.bool()
    torch.testing.assert_close(diag.ratio[valid], torch.full_like(diag.ratio[valid], float(torch.exp(torch.tensor(-0.1)))),
                               atol=1e-5, rtol=0)
    out.rollout_logp = None  # a backend without log-probs: refused as rollout_correction is
    with pytest.raises(ValueError, match=r"^algorithm.bypass_mode=True needs the rollout engine's log-probs"):
        t.prepare_batch(out, torch.zeros(out.completion_mask.shape[0]))


def test_a_bypass_run_with_the_adaptive_controller_finishes(few_problems, tmp_path):
    m = _run(few_problems, tmp_path, "algorithm.bypass_mode=true", *ADAPTIVE, steps=2)
    assert m[1]["actor/reward_kl_penalty_coeff"] == pytest.approx(0.05 * (1 + (-0.2) * BATCH / 64), rel=1e-12)
    assert "sampling/importance_sampling_ratio/mean" in m[1]  # the trainer's own log-probs of the single pass


BYPASS_REINFORCE = ["algorithm.kl_coef=0", "train.mu=2", "algorithm.bypass_mode=true", "algorithm.policy_loss=reinforce",
                    "algorithm.reinforce_form=logp", "algorithm.rollout_correction=token_truncate",
                    "algorithm.rollout_correction_max=1.05", "algorithm.rollout_rejection=token_k1",
                    "algorithm.rollout_rejection_max=1.2"]


def test_bypass_with_verls_reinforce_loss_corrects_and_rejects_inside_the_loss(wb_home, few_problems, tmp_path):
    """verl's bypass loss with loss_type=reinforce, IS truncated at 1.05 and token_k1 rejection at
    [1/1.2, 1.2]: nothing is weighed or rejected before the loss (no driver-level weights, the loss
    mask whole), and the micro-batch loss is core.policy_objective's with the correction and the
    rejection of the CURRENT policy against the rollout's log-probs."""
    from workbench.core import policy_objective
    from workbench.engine.forward import logprobs_and_entropy

    t = Trainer(_recipe(few_problems, *BYPASS_REINFORCE), tmp_path)
    t.setup()
    assert t.objective.in_loss_correction == {"level": "token", "mode": "truncate", "clip_min": None, "clip_max": 1.05,
                                              "batch_normalize": False}
    assert t.objective.in_loss_rejection == {"mode": "token_k1", "upper": 1.2, "lower": None}
    _, out = t.rollout(0)
    shift = torch.linspace(-0.4, 0.4, out.completion_mask.numel()).reshape(out.completion_mask.shape)
    out.rollout_logp = out.rollout_logp + shift * out.completion_mask
    batch, g = t.prepare_batch(out, torch.linspace(0.0, 1.0, out.completion_mask.shape[0]))
    assert batch.is_weights is None and g.keep is None and torch.equal(batch.loss_mask, out.completion_mask)
    counts = global_counts(t.ranks, batch.loss_mask, batch.completion_mask)
    loss = t.micro_loss(batch, *counts)[0]
    logp, _ = logprobs_and_entropy(t.policy, batch, t.recipe.sampling.temperature, False)
    obj = policy_objective(logp, out.rollout_logp, batch.advantages, batch.loss_mask, batch.completion_mask, t.objective,
                           num_tokens=counts[0], num_seqs=counts[1], max_len=t.recipe.sampling.max_completion_length)
    assert 0 < obj.loss_mask.sum() < batch.loss_mask.sum()  # the shift of +-0.4 nats pushes some tokens out of [1/1.2, 1.2]
    assert float(loss.detach()) == pytest.approx(float(obj.loss.detach()), rel=1e-6)


def test_a_bypass_reinforce_run_with_correction_and_rejection_finishes(few_problems, tmp_path):
    m = _run(few_problems, tmp_path, *BYPASS_REINFORCE, steps=2)
    assert sorted(m) == [0, 1] and all(math.isfinite(v) for step in m.values() for v in step.values())


# ---- refusals and the verl import --------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (["algorithm.kl_controller=adaptive", "algorithm.kl_placement=in_loss"],
     "algorithm.kl_controller='adaptive' with algorithm.kl_placement='in_loss': allowed only with kl_placement='in_reward'"),
    (["algorithm.kl_controller=adaptive", "algorithm.kl_coef=0"], "algorithm.kl_controller='adaptive' with algorithm.kl_coef=0"),
    (["algorithm.kl_controller=adaptive", "algorithm.kl_horizon=6"], "algorithm.kl_horizon=6: must exceed 0.2 x the batch"),
    (["algorithm.kl_controller=pid"], "algorithm.kl_controller='pid' is not allowed; choose one of: fixed, adaptive"),
    (["algorithm.kl_target=0"], "algorithm.kl_target=0"),
    (["algorithm.kl_horizon=1000000001"], "algorithm.kl_horizon=1000000001"),
    # bypass mode's ratio is pi / pi_rollout already: explicit IS weights only with verl's loss_type=reinforce
    (["algorithm.bypass_mode=true", "algorithm.rollout_correction=token_truncate"],
     "algorithm.rollout_correction='token_truncate' with algorithm.bypass_mode=True and policy_loss='clip': allowed only "
     "with policy_loss='reinforce', reinforce_form='logp'"),
    (["algorithm.bypass_mode=true", "algorithm.rollout_correction=token_truncate", "algorithm.policy_loss=reinforce",
      "algorithm.reinforce_form=ratio"],
     "algorithm.rollout_correction='token_truncate' with algorithm.bypass_mode=True and policy_loss='reinforce', "
     "reinforce_form='ratio': allowed only with policy_loss='reinforce', reinforce_form='logp'"),
    (["algorithm.bypass_mode=true", "algorithm.advantage=optimal_token_baseline"],
     "algorithm.advantage='optimal_token_baseline' with algorithm.bypass_mode=True"),
])
def test_unsupported_settings_are_refused_naming_field_and_value(overrides, message):
    with pytest.raises(RecipeError) as err:
        load_recipe("rloo", overrides)
    lines = str(err.value).splitlines()
    assert len(lines) == 2 and lines[1].strip().startswith(message), str(err.value)


def _verl_config(kl_ctrl=None, rollout_correction=None, use_kl_loss=False):
    return {"algorithm": {"adv_estimator": "rloo", "use_kl_in_reward": not use_kl_loss, "kl_penalty": "kl",
                          "kl_ctrl": kl_ctrl or {}, "rollout_correction": rollout_correction or {}},
            "actor_rollout_ref": {"actor": {"use_kl_loss": use_kl_loss, "kl_loss_coef": 0.01, "kl_loss_type": "low_var_kl"}}}


@pytest.mark.parametrize("config, expected", [
    (_verl_config({"type": "adaptive", "kl_coef": 0.001, "target_kl": 0.1, "horizon": 10000}),
     {"kl_coef": 0.001, "kl_estimator": "k1", "kl_placement": "in_reward", "kl_controller": "adaptive", "kl_target": 0.1,
      "kl_horizon": 10000}),
    (_verl_config({"type": "fixed", "kl_coef": 0.002, "target_kl": 0.1, "horizon": 10000}),
     {"kl_coef": 0.002, "kl_estimator": "k1", "kl_placement": "in_reward", "kl_controller": "fixed"}),
    # verl builds no controller for the KL in the loss: its kl_ctrl says nothing there
    (_verl_config({"type": "adaptive", "kl_coef": 0.001, "target_kl": 0.1, "horizon": 10000}, use_kl_loss=True),
     {"kl_coef": 0.01, "kl_estimator": "k3", "kl_placement": "in_loss"}),
    # bypass with PPO-clip (verl's default loss_type): its IS weights are metrics only; its rejection acts in the loss
    (_verl_config({"type": "fixed", "kl_coef": 0.001}, {"bypass_mode": True, "rollout_is": "sequence", "rollout_is_threshold": 2.0,
                                                        "rollout_rs": "token_k3", "rollout_rs_threshold": 0.01}),
     {"kl_coef": 0.001, "kl_estimator": "k1", "kl_placement": "in_reward", "kl_controller": "fixed", "bypass_mode": True,
      "policy_loss": "clip", "rollout_rejection": "token_k3", "rollout_rejection_max": 0.01}),
    # bypass with REINFORCE: -w A log pi with the IS weights, and the rejection, in the loss
    (_verl_config({"type": "fixed", "kl_coef": 0.001}, {"bypass_mode": True, "loss_type": "reinforce", "rollout_is": "token",
                                                        "rollout_is_threshold": 2.0}),
     {"kl_coef": 0.001, "kl_estimator": "k1", "kl_placement": "in_reward", "kl_controller": "fixed", "bypass_mode": True,
      "policy_loss": "reinforce", "reinforce_form": "logp", "rollout_correction": "token_truncate", "rollout_correction_max": 2.0}),
    (_verl_config({"type": "fixed", "kl_coef": 0.001}, {"bypass_mode": True, "loss_type": "tis"}),
     {"kl_coef": 0.001, "kl_estimator": "k1", "kl_placement": "in_reward", "kl_controller": "fixed"}),
    (_verl_config({"type": "pid", "kl_coef": 0.001}, {"bypass_mode": False, "rollout_is": "token", "rollout_is_threshold": 2.0}),
     {"kl_coef": 0.001, "kl_estimator": "k1", "kl_placement": "in_reward", "rollout_correction": "token_truncate",
      "rollout_correction_max": 2.0}),
])
def test_verl_kl_ctrl_and_bypass_mode_map_to_the_recipe_fields(config, expected):
    recipe, _ = verl_recipe(config)
    algorithm = recipe["algorithm"]
    assert {k: v for k, v in algorithm.items() if k != "advantage"} == expected
    load_recipe("rloo", [f"algorithm.{k}={v}" for k, v in expected.items()])  # a valid recipe
