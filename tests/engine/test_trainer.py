"""The engine for real on the built-in tiny model: every preset learns, metric names, KL and
reference model, clipping with mu > 1, global-batch gradient accumulation, failures."""

import math
import statistics

import pytest
import torch

from workbench.engine.events import read_events
from workbench.engine.trainer import Trainer, train
from workbench.recipe import load_recipe, preset_names

DESIGN_METRICS = {
    "reward", "reward_std", "frac_reward_zero_std", "kl", "entropy", "clip_ratio/low_mean",
    "clip_ratio/high_mean", "clip_ratio/region_mean", "completions/mean_length",
    "completions/clipped_ratio", "loss/policy", "grad_norm", "perf/step_time", "perf/tokens_per_s",
    "sampling/logprob_diff/mean", "sampling/logprob_diff/max",
}
PRESET_STEPS = 30


def metrics_of(run_dir):
    return [e["metrics"] for e in read_events(run_dir) if e["kind"] == "metrics"]


def learns(rewards, head=5, tail=10):
    """Reward rises beyond noise: the mean of the last ``tail`` steps exceeds the mean of the
    first ``head`` steps by more than 0.15 and by more than 3 standard errors of the two means."""
    a, b = rewards[:head], rewards[-tail:]
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    gain = statistics.mean(b) - statistics.mean(a)
    return gain > 0.15 and gain > 3 * se, gain, se


@pytest.fixture(scope="module")
def preset_runs(wb_home, few_problems, tmp_path_factory):
    """Each preset, 30 steps on four arithmetic problems, fixed seed; (trainer, run_dir, status)."""
    out = {}
    for name in preset_names():
        recipe = load_recipe(name, [f"dataset={few_problems}", f"train.steps={PRESET_STEPS}", "train.seed=0"])
        run_dir = tmp_path_factory.mktemp(name)
        trainer = Trainer(recipe, run_dir)
        out[name] = (trainer, run_dir, trainer.run())
    return out


@pytest.mark.parametrize("name", ["cispo", "dapo", "dr_grpo", "grpo", "gspo", "ppo", "reinforce_pp", "rloo"])
def test_preset_learns_and_logs_every_metric(preset_runs, name):
    trainer, run_dir, status = preset_runs[name]
    assert status == "finished"
    ms = metrics_of(run_dir)
    assert len(ms) == PRESET_STEPS
    ok, gain, se = learns([m["reward"] for m in ms])
    assert ok, f"{name}: reward gain {gain:.3f} (standard error {se:.3f})"
    missing = DESIGN_METRICS - set(ms[-1])
    assert not missing, missing
    if trainer.recipe.algorithm.critic:
        assert "loss/value" in ms[-1]


@pytest.mark.parametrize("name", ["cispo", "dapo", "dr_grpo", "gspo"])
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


def test_ppo_value_loss_falls(preset_runs):
    _, run_dir, _ = preset_runs["ppo"]
    v = [m["loss/value"] for m in metrics_of(run_dir)]
    # the critic starts at V = 0 (zero-initialised head): its loss must fall well below that
    assert statistics.mean(v[-10:]) < 0.6 * statistics.mean(v[:3]), v


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


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_gradient_accumulation_equals_full_batch(wb_home, few_problems, tmp_path, aggregation):
    """1 x B and 4 x B/4 micro-batches give the same gradient (TRL #3021 / verl #5625)."""
    grads = []
    for accum in (1, 4):
        recipe = load_recipe("grpo", [f"dataset={few_problems}", f"train.grad_accum={accum}", f"algorithm.aggregation={aggregation}", "train.mu=2"])
        t = Trainer(recipe, tmp_path / f"acc{accum}")
        t.setup()
        rows, out = t.rollout(0)
        # completions of every length 1..T, so per-sequence and per-token normalisers differ
        B, T = out.completion_mask.shape
        out.completion_mask = (torch.arange(T)[None] < 1 + torch.arange(B)[:, None] % T).float()
        rewards = torch.linspace(0.0, 1.0, B)
        batch, _ = t.prepare_batch(out, rewards)
        last = {"ratio": torch.ones_like(batch.completion_mask), "region": torch.zeros_like(batch.completion_mask, dtype=torch.long),
                "zero_grad": torch.zeros_like(batch.completion_mask, dtype=torch.bool)}
        list(t.accumulate_gradients(batch, torch.arange(out.completion_mask.shape[0]), False, last))
        grads.append(torch.cat([p.grad.flatten() for p in t.policy.parameters()]))
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)


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


def test_non_finite_loss_fails_before_the_update(few_problems, tmp_path):
    status = train(_fault_recipe(few_problems, "tests.engine.faulty_rewards:infinite_at_step_2"), tmp_path)
    events = read_events(tmp_path)
    assert status == "failed"
    assert [e["step"] for e in events if e["kind"] == "metrics"] == [0, 1]
    assert "NonFiniteLossError" in [e for e in events if e["kind"] == "error"][0]["error"]
