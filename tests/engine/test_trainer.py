"""The engine for real on the built-in tiny model: every preset learns, metric names, KL and
reference model, clipping with mu > 1, global-batch gradient accumulation, failures."""

import math
import statistics
from dataclasses import replace

import pytest
import torch

from workbench.core import compute_advantages
from workbench.engine.events import read_events
from workbench.engine.trainer import Trainer, reward_setup, train
from workbench.recipe import Recipe, load_recipe, preset_names

DESIGN_METRICS = {
    "reward", "reward_std", "frac_reward_zero_std", "kl", "entropy", "clip_ratio/low_mean",
    "clip_ratio/high_mean", "clip_ratio/region_mean", "completions/mean_length",
    "completions/clipped_ratio", "loss/policy", "grad_norm", "perf/step_time", "perf/tokens_per_s",
    "sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
    # TRL GRPOTrainer parity (issue 13)
    "num_tokens", "completions/mean_terminated_length", "completions/min_terminated_length",
    "completions/max_terminated_length", "clip_ratio/low_min", "clip_ratio/high_max",
    "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max", "kl/token_std",
}
PRESET_STEPS = 30
# Presets that learn more slowly per step get more steps, so that the criterion is far from its
# threshold on any machine: GPG's advantages are not divided by the group std (smaller steps), and
# pass@k credits one completion per group. At 30 steps both gained ~0.19 (SE 0.03) against the
# 0.15 bar; at 60 steps 0.35-0.64 (bench/learning_bench.py --part presets --seeds 3 4 5).
# Dr. GRPO (no std division either) and ReMax (one greedy baseline per prompt) gained 0.11 and 0.13
# at 30 steps over seeds 0-4 with the installed transformers 5.19 / accelerate 1.15; at 60 steps
# 0.33 / 0.32 on seeds 0-4 and 0.38 / 0.42 on seeds 5-9 (not tuned on), per-seed gains in the
# closing note of issue 17.
# DPPO (Dr. GRPO's advantages, a trust region that masks tokens) gained 0.163 at 30 steps over seeds
# 0-4 before issue 20's forward levers and 0.106 after (a rounding-level change of the gradients
# moves every seed's path): the margin was never there. At 60 steps: 0.355 before, 0.301 after on
# seeds 0-4, 0.395 on seeds 5-9 (not tuned on); SE ~0.03 each.
SLOW_PRESET_STEPS = {"gpg": 60, "grpo_passk": 60, "dr_grpo": 60, "remax": 60, "dppo": 60}


def steps_of(name: str) -> int:
    return SLOW_PRESET_STEPS.get(name, PRESET_STEPS)
#: Runs per preset. One seed decides nothing: float results differ between CPUs, so a fixed seed
#: that learns on one machine can draw a flat run on another. The criterion is on their average.
#: Ten, not five: on one CPU SAPO (two minibatch updates a step at lr 1e-3) collapsed on 2 of seeds
#: 0-4 (entropy ~0.07, reward flat at the format score), a mean gain of 0.142 < 0.15, while seeds
#: 5-9 gained 0.307; a run costs 2-4 s on the tiny model, so 5 more per preset is ~4 minutes.
PRESET_SEEDS = tuple(range(10))


def metrics_of(run_dir):
    return [e["metrics"] for e in read_events(run_dir) if e["kind"] == "metrics"]


def gain_and_se(rewards, head=5, tail=10):
    """(mean of the last ``tail`` steps - mean of the first ``head``, standard error of that difference)."""
    a, b = rewards[:head], rewards[-tail:]
    return statistics.mean(b) - statistics.mean(a), math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))


def learns(rewards, head=5, tail=10):
    """Reward rises beyond noise: the mean of the last ``tail`` steps exceeds the mean of the
    first ``head`` steps by more than 0.15 and by more than 3 standard errors of the two means."""
    gain, se = gain_and_se(rewards, head, tail)
    return gain > 0.15 and gain > 3 * se, gain, se


def learns_over_seeds(curves, head=5, tail=10):
    """The same criterion on the mean gain of n runs (seeds): it must exceed 0.15 and 3 standard
    errors, SE = sqrt(sum of the runs' squared SEs) / n (independent runs)."""
    gains, ses = zip(*(gain_and_se(c, head, tail) for c in curves))
    gain, se = statistics.mean(gains), math.sqrt(sum(x * x for x in ses)) / len(ses)
    return gain > 0.15 and gain > 3 * se, gain, se


def test_learning_criterion_averages_seeds():
    flat, rising = [0.2, 0.3] * 15, [0.2] * 5 + [0.25] * 15 + [0.6] * 10
    # one run gaining 0.4 (no noise) and a flat one (0.24 -> 0.25) average to a gain
    # of 0.205 with half the flat one's SE
    ok, gain, se = learns_over_seeds([rising, flat])
    assert ok and (gain, se) == (pytest.approx(0.205), pytest.approx(math.sqrt(0.003 / 5 + 0.025 / 90) / 2))
    assert not learns_over_seeds([flat, flat])[0]
    assert not learns_over_seeds([[0.2] * 20 + [0.3] * 10] * 3)[0]  # a gain of 0.1 is too small, however steady
    assert not learns_over_seeds([[0.0, 1.0] * 15, rising])[0]  # 0.25, but within 3 SE of the noise


@pytest.fixture(scope="module")
def preset_seed_runs(wb_home, few_problems, tmp_path_factory):
    """Each preset, 30 steps (SLOW_PRESET_STEPS: 60) on four arithmetic problems, once per seed of PRESET_SEEDS;
    name -> [(trainer, run_dir, status) per seed]."""
    out = {}
    for name in preset_names():
        for seed in PRESET_SEEDS:
            recipe = load_recipe(name, [f"dataset={few_problems}", f"train.steps={steps_of(name)}", "optim.lr=1e-3",
                                         f"train.seed={seed}"])
            run_dir = tmp_path_factory.mktemp(f"{name}-seed{seed}")
            trainer = Trainer(recipe, run_dir)
            out.setdefault(name, []).append((trainer, run_dir, trainer.run()))
    return out


@pytest.fixture(scope="module")
def preset_runs(preset_seed_runs):
    """Each preset's seed-0 run: (trainer, run_dir, status)."""
    return {name: runs[0] for name, runs in preset_seed_runs.items()}


@pytest.mark.parametrize("name", preset_names())  # every preset in recipes/, the ones added later too
def test_preset_learns_and_logs_every_metric(preset_seed_runs, name):
    curves = []
    for trainer, run_dir, status in preset_seed_runs[name]:
        assert status == "finished"
        ms = metrics_of(run_dir)
        assert len(ms) == steps_of(name)
        missing = DESIGN_METRICS - set(ms[-1])
        assert not missing, missing
        if trainer.recipe.algorithm.critic:
            assert "loss/value" in ms[-1]
        curves.append([m["reward"] for m in ms])
    ok, gain, se = learns_over_seeds(curves)
    per_seed = ", ".join(f"{gain_and_se(c)[0]:+.3f}" for c in curves)
    assert ok, f"{name}: mean reward gain over seeds {PRESET_SEEDS}: {gain:.3f} (standard error {se:.3f}); per seed {per_seed}"


@pytest.mark.parametrize("name", [n for n in preset_names() if load_recipe(n).algorithm.kl_coef == 0])
def test_no_kl_means_zero_kl_and_no_reference_model(preset_runs, name):
    trainer, run_dir, _ = preset_runs[name]
    assert trainer.recipe.algorithm.kl_coef == 0
    assert trainer.reference is None
    assert all(m["kl"] == 0.0 for m in metrics_of(run_dir))


@pytest.mark.parametrize("name", ["grpo", "rloo", "ppo", "reinforce_pp"])
def test_kl_presets_load_reference_and_report_kl(preset_runs, name):
    trainer, run_dir, _ = preset_runs[name]
    assert trainer.reference is not None
    assert metrics_of(run_dir)[-1]["kl"] != 0.0


def test_ppo_value_loss_falls(preset_seed_runs):
    # the critic starts at V = 0 (zero-initialised head): its loss at step 0 is that of V = 0, and
    # over the last 10 steps it must fall well below it on a typical seed (it falls within a step
    # or two, so the first steps' mean is no baseline). The median over seeds, not the mean: on
    # some seeds the policy's reward drops late and the clipped critic (value_clip 0.2) lags the
    # new returns for several steps, a ratio of 1-3 that one seed alone pushes the mean over any
    # bar (seeds 0-9 at 30 steps: 0.11-0.61 on eight, 1.05 and 2.67 on two; medians of seeds 0-4
    # and 5-9: 0.22 and 0.57). A critic that learned nothing sits at >= 1: V = 0's loss grows with
    # the returns (mean reward 0.2-0.5 in the first steps, 0.6-1.2 in the last).
    curves = [[m["loss/value"] for m in metrics_of(run_dir)] for _, run_dir, _ in preset_seed_runs["ppo"]]
    ratios = [statistics.mean(v[-10:]) / v[0] for v in curves]
    assert statistics.median(ratios) < 0.75, ratios


@pytest.mark.parametrize("name", ["ppo", "gspo", "cispo"])
def test_several_passes_produce_clipping(preset_runs, name):
    trainer, run_dir, _ = preset_runs[name]
    assert trainer.recipe.train.mu > 1
    key = "cispo/clip_ratio" if name == "cispo" else "clip_ratio/region_mean"
    assert max(m[key] for m in metrics_of(run_dir)) > 0


def test_single_pass_never_clips(preset_runs):
    _, run_dir, _ = preset_runs["grpo"]  # mu = 1: ratio is exactly 1 on the only pass
    assert all(m["clip_ratio/region_mean"] == 0.0 for m in metrics_of(run_dir))


def test_events_carry_samples_and_token_diagnostics(preset_runs):
    _, run_dir, _ = preset_runs["ppo"]
    events = read_events(run_dir)
    samples = [e for e in events if e["kind"] == "samples"]
    diags = [e for e in events if e["kind"] == "diagnostics"]
    assert len(samples) == PRESET_STEPS and {"prompt", "completion", "reward", "advantage"} <= set(samples[0]["samples"][0])
    d = diags[-1]
    assert len(d["ratio"]) == len(d["region"]) == len(d["advantage"]) == 8
    assert set(x for row in d["region"] for x in row) <= {-1, 0, 1, 2, 3}
    assert [e["status"] for e in events if e["kind"] == "status"] == ["starting", "running", "finished"]


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum-norm"])
def test_gradient_accumulation_equals_full_batch(wb_home, few_problems, tmp_path, aggregation):
    """1 x B and 4 x B/4 micro-batches give the same gradient (TRL #3021 / verl #5625). The plain
    forward: the shared-prefix one groups a micro-batch's rows by prompt, so 1 x B and 4 x B/4
    round differently (~3e-6 here); its equality with the plain forward is tests/engine/test_forward_prefix.py's."""
    grads = [_accumulated_gradient(load_recipe("grpo", [f"dataset={few_problems}", f"train.grad_accum={accum}",
                                                        f"algorithm.aggregation={aggregation}", "train.mu=2",
                                                        "train.shared_prefix=false"]), tmp_path / f"acc{accum}")
             for accum in (1, 4)]
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)


def _accumulated_gradient(recipe, run_dir) -> torch.Tensor:
    """The policy's gradient of one full pass over a step-0 batch with completions of every length."""
    t = Trainer(recipe, run_dir)
    t.setup()
    rows, out = t.rollout(0)
    B, T = out.completion_mask.shape
    out.completion_mask = (torch.arange(T)[None] < 1 + torch.arange(B)[:, None] % T).float()
    batch, _ = t.prepare_batch(out, torch.linspace(0.0, 1.0, B))
    last = {"ratio": torch.ones_like(batch.completion_mask), "region": torch.zeros_like(batch.completion_mask, dtype=torch.long),
            "zero_grad": torch.zeros_like(batch.completion_mask, dtype=torch.bool)}
    list(t.accumulate_gradients(batch, torch.arange(B), last))
    return torch.cat([p.grad.flatten() for p in t.policy.parameters()])


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-sum-norm"])
def test_the_shared_prefix_forward_accumulates_the_plain_forwards_gradient(wb_home, few_problems, tmp_path, aggregation):
    """Micro-batches (grad_accum = 4) through the shared-prefix forward give the plain forward's
    full-batch gradient up to float rounding: each micro-batch groups its own rows by prompt."""
    base = [f"dataset={few_problems}", f"algorithm.aggregation={aggregation}", "train.mu=2"]
    plain = _accumulated_gradient(load_recipe("grpo", [*base, "train.grad_accum=1", "train.shared_prefix=false"]), tmp_path / "plain")
    shared = _accumulated_gradient(load_recipe("grpo", [*base, "train.grad_accum=4", "train.shared_prefix=true"]), tmp_path / "shared")
    assert float(plain.abs().max()) > 0
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-4)


def test_kl_uses_the_trainers_log_probs_not_the_rollout_engines(wb_home, few_problems, tmp_path):
    """Single pass (mu = 1) with the KL in the reward (rloo). A rollout engine's log-probs are
    not the trainer's (vLLM renormalises them under top_p < 1, or samples in bf16): here they are
    shifted by +0.1 per token. At step 0 the policy is the reference, so the KL the advantages
    are shaped with (k1 = logp - ref_logp) is 0; from the rollout log-probs it would be 0.1."""
    recipe = load_recipe("rloo", [f"dataset={few_problems}"])
    assert recipe.train.single_pass and recipe.algorithm.kl_placement == "in_reward"
    t = Trainer(recipe, tmp_path)
    t.setup()
    _, out = t.rollout(0)
    out.rollout_logp = out.rollout_logp + 0.1 * out.completion_mask
    rewards = torch.linspace(0.0, 1.0, out.completion_mask.shape[0])
    batch, (_, g_mask, g_kl, g_adv, _) = t.prepare_batch(out, rewards)
    torch.testing.assert_close(g_kl, torch.zeros_like(g_kl), atol=1e-6, rtol=0)
    torch.testing.assert_close(batch.old_logp, batch.ref_logp, atol=1e-6, rtol=0)
    unshaped = compute_advantages("rloo", rewards, g_mask, replace(recipe.advantage_config(), kl_coef=0.0)).advantages
    torch.testing.assert_close(g_adv, unshaped, atol=1e-5, rtol=0)


@pytest.mark.parametrize("aggregation,policy_loss,value_loss", [
    # two loss tokens of A = 1 at ratio 1: policy -(1 + 1) / 2; value 0.5 (V - R)^2 = 0.5 per token
    ("token-mean", -1.0, 0.5),
    # Dr. GRPO divides by B * L_max with B = 2 sequences (the truncated one counts): -2 / (2 * 6)
    ("seq-mean-token-sum-norm", -2 / 12, 1 / 12),
])
def test_truncation_masked_completion_counts_as_a_sequence_but_has_no_loss(wb_home, few_problems, tmp_path, aggregation, policy_loss, value_loss):
    """PPO with DAPO's overlong filtering on a hand batch of two completions: row 0 ends after 2
    tokens, row 1 was cut at L_max = 6 (its loss is masked). Returns R = 1 on every token, the
    zero-initialised critic gives V = V_old = 0."""
    recipe = load_recipe("ppo", [f"dataset={few_problems}", "algorithm.mask_truncated=true", f"algorithm.aggregation={aggregation}",
                                 "train.mu=1", "train.minibatches=1"])
    assert recipe.sampling.max_completion_length == 6
    t = Trainer(recipe, tmp_path)
    t.setup()
    _, out = t.rollout(0)
    batch, _ = t.prepare_batch(out, torch.zeros(out.completion_mask.shape[0]))
    completion = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0, 0.0], [1.0] * 6])
    loss_mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0, 0.0], [0.0] * 6])
    two = replace(batch.rows(torch.arange(2)), completion_mask=completion, loss_mask=loss_mask, advantages=completion.clone(),
                  returns=completion.clone(), old_values=torch.zeros(2, 6))
    last = {"ratio": torch.ones(2, 6), "region": torch.zeros(2, 6, dtype=torch.long), "zero_grad": torch.zeros(2, 6, dtype=torch.bool)}
    [(metrics, _)] = list(t.accumulate_gradients(two, torch.arange(2), last))
    assert metrics["loss/policy"].item() == pytest.approx(policy_loss, abs=1e-6)
    assert metrics["loss/value"].item() == pytest.approx(value_loss, abs=1e-6)


def test_reward_weights_must_match_the_resolved_functions():
    # the task's defaults (exact_match, format) when reward_funcs is empty
    assert reward_setup(Recipe())[1] == [1.0, 0.2]
    for text in ("reward_funcs: [exact_match, format]\nreward_weights: [1.0]", "reward_weights: [1.0]"):
        with pytest.raises(ValueError, match=r"reward_weights has 1 values for 2 reward functions \(exact_match, format\)"):
            reward_setup(Recipe.from_yaml(text))
    assert reward_setup(Recipe.from_yaml("reward_funcs: [exact_match, format]\nreward_weights: [1, 0.5]"))[1] == [1.0, 0.5]


def _fault_recipe(few_problems, ref):
    return load_recipe("grpo", [f"dataset={few_problems}", "train.steps=6", f"reward_funcs=['{ref}']"])


def test_reward_function_that_raises_fails_the_run_and_keeps_earlier_steps(few_problems, tmp_path):
    status = train(_fault_recipe(few_problems, "tests.engine.faulty_rewards:raises_at_step_2"), tmp_path)
    events = read_events(tmp_path)
    assert status == "failed"
    assert [e["step"] for e in events if e["kind"] == "metrics"] == [0, 1]
    err = [e for e in events if e["kind"] == "error"][0]
    assert "raises_at_step_2" in err["error"] and "boom in the reward" in err["error"] and err["reward_function"]
    assert events[-1]["kind"] == "status" and events[-1]["status"] == "failed"


def test_infinite_reward_fails_the_run_naming_the_function(few_problems, tmp_path):
    """An infinite reward is refused where it enters (an all-infinite group would otherwise count as
    'all equal' and silently get advantage 0)."""
    status = train(_fault_recipe(few_problems, "tests.engine.faulty_rewards:infinite_at_step_2"), tmp_path)
    events = read_events(tmp_path)
    assert status == "failed"
    assert [e["step"] for e in events if e["kind"] == "metrics"] == [0, 1]
    err = [e for e in events if e["kind"] == "error"][0]["error"]
    assert "infinite_at_step_2" in err and "returned inf at index 0" in err


def test_non_finite_loss_fails_before_the_update(few_problems, tmp_path):
    recipe = load_recipe("grpo", [f"dataset={few_problems}", "train.steps=6", "algorithm.grpo_scale=none",
                                  "reward_funcs=['tests.engine.faulty_rewards:overflowing_at_step_2']"])
    status = train(recipe, tmp_path)
    events = read_events(tmp_path)
    assert status == "failed"
    assert [e["step"] for e in events if e["kind"] == "metrics"] == [0, 1]
    assert "NonFiniteLossError" in [e for e in events if e["kind"] == "error"][0]["error"]


def test_a_non_finite_loss_stops_the_step_before_any_weight_moves(wb_home, few_problems, tmp_path):
    """The finiteness check runs once per optimiser update, before the optimiser steps: the step
    whose loss overflows raises with the weights exactly as the previous step left them."""
    from workbench.engine.trainer import NonFiniteLossError, Trainer, parameter_digest

    recipe = load_recipe("grpo", [f"dataset={few_problems}", "train.steps=6", "algorithm.grpo_scale=none",
                                  "reward_funcs=['tests.engine.faulty_rewards:overflowing_at_step_2']"])
    t = Trainer(recipe, tmp_path)
    t.setup()
    digest = lambda: parameter_digest(t.accelerator.unwrap_model(t.policy))  # noqa: E731
    t.step(0)
    t.step(1)
    before = digest()
    with pytest.raises(NonFiniteLossError):
        t.step(2)
    assert digest() == before


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_a_batch_of_solved_groups_leaves_the_policy_unchanged(wb_home, few_problems, tmp_path, name):
    """Every completion of every group earns 1.2 (exact match + format, in float32): no group has
    a signal, so every advantage is exactly 0 and one optimiser step changes no weight. Before
    core zeroed all-equal groups, float32 rounding gave them A = +0.119 (GRPO: a one-ulp error of
    the mean over a rounding-sized std + 1e-6): each step pushed solved prompts' completions up,
    and in the 200-step comparison with TRL (bench/learning_vs_trl.py, seeds 0-5) GRPO's reward
    gain was -0.035 +- 0.060 against TRL's +0.058 +- 0.056 (after: +0.118 +- 0.128)."""
    recipe = load_recipe(name, [f"dataset={few_problems}", "algorithm.kl_coef=0.0"])
    t = Trainer(recipe, tmp_path)
    t.setup()
    _, out = t.rollout(0)
    batch, _ = t.prepare_batch(out, torch.full((out.completion_mask.shape[0],), 1.2))
    assert torch.equal(batch.advantages, torch.zeros_like(batch.advantages))
    before = [p.detach().clone() for p in t.policy.parameters()]
    t.optimise(batch, 0)
    assert all(torch.equal(b, p) for b, p in zip(before, t.policy.parameters()))
