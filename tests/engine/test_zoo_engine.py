"""Issue 13, the engine side, on the built-in tiny model (a few steps each): TRL's metric names,
rollout importance-sampling correction, top_entropy_quantile, ReMax's greedy baseline,
multi-reward normalisation, train.staleness and DAPO dynamic sampling."""

import math
import statistics

import pytest
import torch

from tests.engine.fixed_rollouts import cycling_lengths, rollout_of_lengths
from workbench.core import combine_rewards, high_entropy_mask, masked_mean
from workbench.engine.events import read_events
from workbench.engine.forward import logprobs_and_entropy
from workbench.engine.ranks import global_counts
from workbench.engine.rollout import hf_generate, valid_token_lists
from workbench.engine.trainer import Trainer, parameter_digest, prompts_for_step
from workbench.recipe import RecipeError, load_recipe


def metrics_of(run_dir):
    return [e["metrics"] for e in read_events(run_dir) if e["kind"] == "metrics"]


def samples_of(run_dir):
    return [e["samples"] for e in read_events(run_dir) if e["kind"] == "samples"]


def recipe_for(few_problems, *overrides, preset="grpo"):
    return load_recipe(preset, [f"dataset={few_problems}", *overrides])


def digest(trainer):
    return parameter_digest(trainer.accelerator.unwrap_model(trainer.policy))


def run(recipe, run_dir):
    trainer = Trainer(recipe, run_dir)
    assert trainer.run() == "finished"
    return trainer, metrics_of(run_dir)


# ---- 1. TRL parity in what a run logs ---------------------------------------------------------


def test_a_run_logs_trls_metrics_with_trls_meaning(wb_home, few_problems, tmp_path):
    """One reward function (exact_match, weight 1) and every completion in the samples, so each
    TRL metric can be recomputed from what the run recorded about its completions."""
    recipe = recipe_for(few_problems, "train.steps=2", "reward_funcs=[exact_match]", "logging.samples_per_step=32",
                        "sampling.max_completion_length=4")
    trainer, ms = run(recipe, tmp_path)
    tok = trainer.tokenizer
    G = recipe.sampling.num_generations
    seen = 0
    for step, (m, samples) in enumerate(zip(ms, samples_of(tmp_path))):
        assert len(samples) == recipe.batch_size
        # num_tokens: cumulative prompt + completion tokens (TRL's num_input_tokens_seen)
        rows = prompts_for_step(trainer.rows, step, recipe.sampling.prompts_per_step, 0, 1, recipe.train.seed)
        prompt_tokens = G * sum(len(tok(row["prompt"])["input_ids"]) for row in rows)
        seen += prompt_tokens + sum(s["length"] for s in samples)
        assert m["num_tokens"] == seen
        # completions/*_terminated_length: over completions that ended with EOS
        ended = [s["length"] for s in samples if not s["truncated"]] or [0]
        assert m["completions/mean_terminated_length"] == pytest.approx(statistics.mean(ended))
        assert (m["completions/min_terminated_length"], m["completions/max_terminated_length"]) == (min(ended), max(ended))
        # rewards/{func}/std: Bessel-corrected std of the function's scores over the batch (TRL nanstd)
        rewards = [s["reward"] for s in samples]
        assert m["rewards/exact_match/std"] == pytest.approx(statistics.stdev(rewards), abs=1e-6)
        assert m["rewards/exact_match/mean"] == pytest.approx(statistics.mean(rewards), abs=1e-6)
        # one pass (mu = 1): the ratio is 1, nothing is clipped (the extremes are tested below)
        assert m["clip_ratio/low_min"] == m["clip_ratio/high_max"] == m["clip_ratio/low_mean"] == 0.0
        # hf generate scores the same weights: the trainer's log-probs agree to float rounding
        assert m["sampling/sampling_logp_difference/max"] < 1e-4
        assert m["sampling/sampling_logp_difference/mean"] <= m["sampling/sampling_logp_difference/max"]
        for name in ("min", "mean", "max"):
            assert m[f"sampling/importance_sampling_ratio/{name}"] == pytest.approx(1.0, abs=1e-4)
        assert not any(k.startswith("sampling/logprob_diff") for k in m)
    # kl/token_std: 0 while the policy is the reference (step 0), a spread once it moved
    assert (ms[0]["kl"], ms[0]["kl/token_std"]) == (0.0, 0.0)
    assert ms[1]["kl/token_std"] > 0


# ---- 2. rollout importance-sampling correction ------------------------------------------------


def _shifted_batch(few_problems, tmp_path, *overrides, shift=0.1):
    """Step 0's batch with the rollout engine's log-probs shifted by +shift per valid token, so
    old - rollout = -shift on every token and the weights are known by hand."""
    recipe = recipe_for(few_problems, "algorithm.kl_coef=0", "algorithm.aggregation=token-mean", *overrides)
    t = Trainer(recipe, tmp_path)
    t.setup()
    _, out = t.rollout(0)
    out.rollout_logp = out.rollout_logp + shift * out.completion_mask
    rewards = torch.linspace(0.0, 1.0, out.completion_mask.shape[0])
    batch, _ = t.prepare_batch(out, rewards)
    return t, batch


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_truncate"])
def test_rollout_correction_weights_are_the_bounded_trainer_to_rollout_ratio(wb_home, few_problems, tmp_path, mode):
    t, batch = _shifted_batch(few_problems, tmp_path, f"algorithm.rollout_correction={mode}")
    mask = batch.completion_mask
    if mode == "token_truncate":  # w_t = exp(old_t - rollout_t) = e^-0.1
        expected = math.exp(-0.1) * mask
    else:  # w_i = exp(sum_t (old_t - rollout_t)) = e^(-0.1 n_i), on each of its tokens
        expected = torch.exp(-0.1 * mask.sum(dim=1, keepdim=True)) * mask
    torch.testing.assert_close(batch.is_weights, expected, atol=2e-5, rtol=0)


def test_rollout_correction_scales_each_tokens_loss(wb_home, few_problems, tmp_path):
    """token_truncate with a uniform ratio e^-0.1 multiplies the token-mean policy loss by e^-0.1.

    The batch's advantages are set to A_i = i + 1 on row i: the group-normalised ones sum to ~0 over
    equally long completions, leaving a loss of float residue (~1e-7) whose ratio is noise. On the
    first of mu = 2 passes pi / pi_old = 1, so the clipped loss is -sum_t A_t m_t / sum_t m_t."""
    losses, by_hand = {}, {}
    for mode in ("none", "token_truncate"):
        t, batch = _shifted_batch(few_problems, tmp_path / mode, f"algorithm.rollout_correction={mode}", "train.mu=2")
        rows = torch.arange(1, batch.loss_mask.shape[0] + 1, dtype=batch.advantages.dtype)[:, None]
        batch.advantages = rows * batch.loss_mask
        n_tokens, n_seqs = global_counts(t.ranks, batch.loss_mask, batch.completion_mask)
        _, metrics, _, _ = t.micro_loss(batch, n_tokens, n_seqs)
        losses[mode] = float(metrics["loss/policy"])
        by_hand[mode] = -float((batch.advantages * batch.loss_mask).sum() / batch.loss_mask.sum())
    assert losses["none"] == pytest.approx(by_hand["none"], rel=1e-5)
    assert losses["token_truncate"] == pytest.approx(math.exp(-0.1) * by_hand["token_truncate"], rel=1e-5)


def test_rollout_correction_mask_outside_its_bounds_trains_nothing(wb_home, few_problems, tmp_path):
    """token_mask keeps weights inside [min, max] only: with [2, 3] and on-policy ratios ~1,
    every token's weight is 0, so the policy never moves; without the correction it does."""
    digests = {}
    for mode in ("none", "token_mask"):
        recipe = recipe_for(few_problems, "train.steps=2", "algorithm.kl_coef=0", f"algorithm.rollout_correction={mode}",
                            "algorithm.rollout_correction_min=2.0", "algorithm.rollout_correction_max=3.0")
        trainer, ms = run(recipe, tmp_path / mode)
        fresh = Trainer(recipe, tmp_path / f"{mode}-fresh")
        fresh.setup()
        digests[mode] = digest(trainer) == digest(fresh)
        if mode == "token_mask":
            assert all(m["sampling/importance_sampling_ratio/max"] == 0.0 for m in ms)
    assert digests == {"none": False, "token_mask": True}


def test_rollout_correction_bounds_are_checked():
    with pytest.raises(RecipeError, match="rollout_correction_min=4.0 must not exceed"):
        load_recipe("grpo", ["algorithm.rollout_correction=token_mask", "algorithm.rollout_correction_min=4.0"])
    with pytest.raises(RecipeError, match="algorithm.rollout_correction"):
        load_recipe("grpo", ["algorithm.rollout_correction=token_clip"])


# ---- 3. top_entropy_quantile ------------------------------------------------------------------


def test_top_entropy_quantile_trains_only_the_high_entropy_tokens(wb_home, few_problems, tmp_path):
    """gpg (-A logp), token-mean: the loss is -sum over kept tokens of A_t logp_t / (all valid
    tokens), TRL's convention (the mask multiplies the per-token loss; the normaliser is unchanged).
    Completions of 1..6 tokens (fixed, not sampled: uniformly short samples would make half the
    tokens first tokens, whose entropies tie within each prompt's group)."""
    recipe = recipe_for(few_problems, "algorithm.kl_coef=0", "algorithm.policy_loss=gpg", "algorithm.aggregation=token-mean",
                        "algorithm.top_entropy_quantile=0.2")
    t = Trainer(recipe, tmp_path)
    t.setup()
    _, sampled = t.rollout(0)
    out = rollout_of_lengths(t, sampled, cycling_lengths(sampled.prompt_ids.shape[0], 6))
    batch, _ = t.prepare_batch(out, torch.linspace(0.0, 1.0, out.completion_mask.shape[0]))
    n_tokens, n_seqs = global_counts(t.ranks, batch.loss_mask, batch.completion_mask)
    _, metrics, _, _ = t.micro_loss(batch, n_tokens, n_seqs)
    with torch.no_grad():
        logp, entropy = logprobs_and_entropy(t.policy, batch, recipe.sampling.temperature)
    kept = high_entropy_mask(entropy, batch.loss_mask, 0.2)
    expected = -(batch.advantages * logp * kept).sum() / batch.loss_mask.sum()
    assert float(metrics["loss/policy"]) == pytest.approx(float(expected), rel=1e-5)
    # at least the top 20 % (more where entropies tie: a prompt's G completions share their first
    # token's distribution), far from all of them
    share = float(kept.sum() / batch.loss_mask.sum())
    assert float(metrics["entropy/top_quantile_kept"]) == pytest.approx(share) and 0.2 <= share < 0.5


# ---- 4. ReMax ---------------------------------------------------------------------------------


def test_remax_baseline_is_the_reward_of_each_prompts_greedy_completion(wb_home, few_problems, tmp_path):
    recipe = recipe_for(few_problems, "algorithm.advantage=remax")
    t = Trainer(recipe, tmp_path)
    t.setup()
    rows, out = t.rollout(0)
    baselines = t.greedy_baselines(rows, 0)
    G = recipe.sampling.num_generations
    prompt_rows = rows[::G]
    greedy = hf_generate(t.policy, t.tokenizer, [r["prompt"] for r in prompt_rows], temperature=0.0, top_p=1.0,
                         max_new_tokens=recipe.sampling.max_completion_length, seed=123)
    expected, _ = t.score(prompt_rows, greedy, 0)
    torch.testing.assert_close(baselines, expected.repeat_interleave(G))
    rewards, _ = t.score(rows, out, 0)
    batch, _ = t.prepare_batch(out, rewards, baselines)
    # A_i = r_i - b_i on every valid token (no KL in the reward)
    torch.testing.assert_close(batch.advantages, (rewards - baselines)[:, None] * batch.completion_mask)


def test_remax_run_logs_its_baseline_and_joins_the_lens(wb_home, few_problems, tmp_path):
    _, ms = run(recipe_for(few_problems, "train.steps=2", "logging.lens_every=1", preset="remax"), tmp_path)
    assert all(0.0 <= m["remax/baseline_reward"] <= 1.2 for m in ms)
    lens = [e for e in read_events(tmp_path) if e["kind"] == "lens"]
    assert len(lens) == 2 and all("remax" in e["advantages"] and e["run"]["advantage"] == "remax" for e in lens)


# ---- 5. several reward functions --------------------------------------------------------------


def test_normalize_then_sum_standardises_each_function_within_its_group(wb_home, few_problems, tmp_path):
    """G = 2, weights (1, 0.2). Group (a, b) = ((1, 0), (0, 0)): a -> (+-0.5 / (0.7071 + 1e-4)),
    b all equal -> 0. Group ((1, 1), (0, 1)): a equal -> 0, b -> (-0.5, +0.5) / (0.7071 + 1e-4) x 0.2."""
    recipe = recipe_for(few_problems, "sampling.num_generations=2", "algorithm.multi_objective_aggregation=normalize_then_sum")
    t = Trainer(recipe, tmp_path)
    t.setup()
    assert t.reward_weights == [1.0, 0.2]
    per_fn = {"exact_match": torch.tensor([1.0, 0.0, 1.0, 1.0]), "format": torch.tensor([0.0, 0.0, 0.0, 1.0])}
    total = torch.tensor([1.0, 0.0, 1.0, 1.2])
    z = 0.5 / (math.sqrt(0.5) + 1e-4)
    torch.testing.assert_close(t.training_rewards(total, per_fn), torch.tensor([z, -z, -0.2 * z, 0.2 * z]))
    same = recipe_for(few_problems, "sampling.num_generations=2")
    t2 = Trainer(same, tmp_path / "sum")
    t2.setup()
    assert t2.training_rewards(total, per_fn) is total  # sum_then_normalize: the weighted sum itself
    per_fn["format"][0] = float("nan")
    with pytest.raises(ValueError, match="reward function 'format' returned None"):
        t.training_rewards(total, per_fn)


def test_normalize_then_sum_run_trains_on_the_combined_reward(wb_home, few_problems, tmp_path):
    recipe = recipe_for(few_problems, "train.steps=2", "algorithm.multi_objective_aggregation=normalize_then_sum")
    _, ms = run(recipe, tmp_path)
    assert 0.0 <= ms[-1]["reward"] <= 1.2  # the logged reward stays the weighted sum


def test_remax_refuses_normalize_then_sum():
    with pytest.raises(RecipeError, match="advantage='remax'.*sum_then_normalize"):
        load_recipe("grpo", ["algorithm.advantage=remax", "algorithm.multi_objective_aggregation=normalize_then_sum"])


# ---- 6. staleness ----------------------------------------------------------------------------


def test_staleness_zero_reproduces_the_on_policy_run_exactly(wb_home, few_problems, tmp_path):
    a, _ = run(recipe_for(few_problems, "train.steps=3"), tmp_path / "default")
    b, _ = run(recipe_for(few_problems, "train.steps=3", "train.staleness=0"), tmp_path / "k0")
    c, _ = run(recipe_for(few_problems, "train.steps=3", "train.staleness=1"), tmp_path / "k1")
    assert digest(a) == digest(b) != digest(c)


@pytest.mark.parametrize("k", [1, 2])
def test_staleness_generates_with_the_policy_of_k_updates_ago(wb_home, few_problems, tmp_path, k):
    recipe = recipe_for(few_problems, f"train.staleness={k}")
    t = Trainer(recipe, tmp_path)
    t.setup()
    after = [digest(t)]  # the policy after 0, 1, 2 updates (one update per step: mu = minibatches = 1)
    ms = []
    for step in range(3):
        assert parameter_digest(t.generation_model()) == after[max(0, step - k)]
        ms.append(t.step(step))
        after.append(digest(t))
    # the trainer's log-probs are the current policy's: they differ from the sampler's once it lags
    assert ms[0]["sampling/sampling_logp_difference/max"] < 1e-4
    assert ms[2]["sampling/sampling_logp_difference/max"] > 1e-3


# ---- 7. DAPO dynamic sampling -------------------------------------------------------------------


def test_dynamic_sampling_fills_the_batch_with_informative_groups(wb_home, few_problems, tmp_path):
    """Groups whose rewards are all equal are dropped and prompts sampled again; only when the
    rounds run out do such groups fill the batch, and then they are exactly the batch's
    zero-std groups (frac_reward_zero_std x prompts)."""
    recipe = recipe_for(few_problems, "train.steps=4", "sampling.dynamic_sampling=true", "sampling.dynamic_sampling_max_rounds=3",
                        "reward_funcs=[exact_match]", "logging.samples_per_step=32")
    trainer, ms = run(recipe, tmp_path)
    P, G = recipe.sampling.prompts_per_step, recipe.sampling.num_generations
    for m, samples in zip(ms, samples_of(tmp_path)):
        assert 1 <= m["dynamic_sampling/rounds"] <= 3
        assert m["frac_reward_zero_std"] * P == m["dynamic_sampling/filled_groups"]
        if m["dynamic_sampling/filled_groups"]:
            assert m["dynamic_sampling/rounds"] == 3  # filled only once the rounds ran out
        assert m["completions/count"] == P * G and len(samples) == P * G
        # informative groups come first; filled ones (all rewards equal) last
        spread = [len({s["reward"] for s in samples[g * G:(g + 1) * G]}) > 1 for g in range(P)]
        assert spread == sorted(spread, reverse=True) and sum(not x for x in spread) == m["dynamic_sampling/filled_groups"]
    assert any(m["dynamic_sampling/rounds"] > 1 for m in ms)  # the untrained model solves few groups


def test_dynamic_sampling_off_is_one_round_of_the_steps_prompts(wb_home, few_problems, tmp_path):
    a, _ = run(recipe_for(few_problems, "train.steps=2"), tmp_path / "off")
    b, ms = run(recipe_for(few_problems, "train.steps=2", "sampling.dynamic_sampling=false"), tmp_path / "off2")
    assert digest(a) == digest(b) and "dynamic_sampling/rounds" not in ms[0]


# ---- every addition on two data-parallel processes ---------------------------------------------


def test_clip_extremes_are_trls_per_sequence_min_and_max(wb_home, few_problems, tmp_path):
    """TRL 1.16: per micro-batch, the min (low) / max (high) over sequences of each sequence's
    fraction of clipped tokens, averaged over the step's micro-batches. mu = 2, one minibatch:
    the first pass's ratio is 1 (nothing clipped: 0), the second pass's regions are in the step's
    diagnostics (every sequence), so the step's value is (0 + extreme of the second pass) / 2."""
    recipe = recipe_for(few_problems, "train.steps=3", "train.mu=2", "optim.lr=3e-3", "algorithm.eps_low=0.02",
                        "algorithm.eps_high=0.02", "logging.diagnostics_sequences=32", "sampling.max_completion_length=4")
    _, ms = run(recipe, tmp_path)
    diagnostics = [e for e in read_events(tmp_path) if e["kind"] == "diagnostics"]
    moved = 0
    for m, d in zip(ms, diagnostics):
        low, high = [], []
        for regions in d["region"]:
            valid = [x for x in regions if x != -1]
            if valid:
                low.append(sum(x == 2 for x in valid) / len(valid))  # clipped_low
                high.append(sum(x == 1 for x in valid) / len(valid))  # clipped_high
        assert len(low) == recipe.batch_size
        assert m["clip_ratio/low_min"] == pytest.approx(min(low) / 2, abs=1e-7)
        assert m["clip_ratio/high_max"] == pytest.approx(max(high) / 2, abs=1e-7)
        assert m["clip_ratio/low_min"] <= m["clip_ratio/low_mean"] and m["clip_ratio/high_max"] >= m["clip_ratio/high_mean"]
        moved += max(high) > 0
    assert moved  # the second pass clipped something: the check above is not 0 == 0


def test_two_processes_agree_with_every_addition_on(wb_home, few_problems, tmp_path):
    """accelerate launch, 2 CPU processes: rollout correction, top_entropy_quantile, staleness and
    dynamic sampling (ranks run the same rounds) keep the ranks' parameters identical, and TRL's
    rank extremes bound the rank mean (low_min <= low_mean, high_max >= high_mean)."""
    from tests.engine.test_process import launch_two_processes

    run_dir = tmp_path / "ddp"
    sets = ["train.steps=3", f"dataset={few_problems}", "train.mu=2", "algorithm.rollout_correction=token_mask",
            "algorithm.rollout_correction_min=0.5", "algorithm.rollout_correction_max=5", "algorithm.top_entropy_quantile=0.5",
            "train.staleness=1", "sampling.dynamic_sampling=true", "sampling.dynamic_sampling_max_rounds=2"]
    res = launch_two_processes(wb_home, 29541, "grpo", *[x for s in sets for x in ("--set", s)], "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stderr[-3000:]
    assert (run_dir / "params.rank0.sha256").read_text() == (run_dir / "params.rank1.sha256").read_text()
    ms = metrics_of(run_dir)
    assert len(ms) == 3
    for m in ms:
        assert m["clip_ratio/low_min"] <= m["clip_ratio/low_mean"] + 1e-7
        assert m["clip_ratio/high_max"] >= m["clip_ratio/high_mean"] - 1e-7
        assert m["sampling/importance_sampling_ratio/min"] <= m["sampling/importance_sampling_ratio/mean"] <= m["sampling/importance_sampling_ratio/max"] <= 5
        assert m["dynamic_sampling/rounds"] in (1.0, 2.0)


# ---- the optimal token baselines (verl 0.9.1): the policy's own statistics -------------------------


def test_optimal_token_baseline_weighs_paths_by_the_policys_own_statistics(wb_home, few_problems, tmp_path):
    from workbench.core import compute_advantages
    from workbench.engine.forward import completion_logits

    recipe = recipe_for(few_problems, "algorithm.advantage=optimal_token_baseline", "sampling.temperature=0.7")
    t = Trainer(recipe, tmp_path)
    t.setup()
    rows, out = t.rollout(0)
    rewards, _ = t.score(rows, out, 0)
    batch, _ = t.prepare_batch(out, rewards)
    # by hand: pi = softmax(logits / T) of the policy that sampled, in float64
    mask = out.completion_mask
    with torch.no_grad():
        logits = completion_logits(t.policy, out.prompt_ids, out.prompt_mask, out.completion_ids, mask).double()
    probs = torch.softmax(logits / 0.7, dim=-1)
    old_logp = torch.log(probs.gather(-1, out.completion_ids[..., None]).squeeze(-1)) * mask
    sum_pi_squared = probs.square().sum(-1) * mask
    expected = compute_advantages("optimal_token_baseline", rewards.double(), mask.double(), recipe.advantage_config(),
                                  old_logp=old_logp, sum_pi_squared=sum_pi_squared).advantages
    torch.testing.assert_close(batch.advantages.double(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_optimal_token_baseline_runs_train(wb_home, few_problems, tmp_path, name):
    _, ms = run(recipe_for(few_problems, "train.steps=3", f"algorithm.advantage={name}"), tmp_path)
    assert len(ms) == 3 and all(math.isfinite(m["loss/policy"]) and math.isfinite(m["grad_norm"]) for m in ms)
