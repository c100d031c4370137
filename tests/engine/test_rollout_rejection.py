"""verl's rollout rejection sampling (``algorithm.rollout_rejection``, verl ``rollout_rs``) and IS
batch normalisation (``algorithm.rollout_correction_batch_normalize``, verl
``rollout_is_batch_normalize``) as recipe settings: exact values on a hand-built batch, the
trainer's batch on the built-in tiny model, two short runs, and bad values through the CLI.

The core functions themselves are compared with verl 0.9.1 in tests/core/test_missing_correction.py;
here: how the run combines them (verl ``compute_rollout_correction_and_rejection_mask``: the IS
weights from the whole response mask, rejection as a new response mask, so a rejected token
counts in no denominator)."""

import math

import pytest
import torch

from tests.engine.fixed_rollouts import cycling_lengths, rollout_of_lengths
from tests.test_cli import assert_one_line_error, cli, leftovers
from workbench.core import ObjectiveConfig, policy_objective
from workbench.engine.events import read_events
from workbench.engine.trainer import Trainer, parameter_digest, rollout_corr_metrics, rollout_mismatch_masks
from workbench.recipe import RecipeError, load_recipe

LN2 = math.log(2.0)


def metrics_of(run_dir):
    return [e["metrics"] for e in read_events(run_dir) if e["kind"] == "metrics"]


# ---- a hand-built batch ---------------------------------------------------------------------------


def test_hand_batch_rejected_token_leaves_loss_and_denominator_weights_normalised_over_all():
    """B = 2, T = 3, mask [[1,1,1],[1,1,0]], l = old - rollout = [[0, ln2, 0], [-ln4, 0, .]].

    Rejection token_k1, max 3 (lower 1/3): k1 = -l = [[0, -ln2, 0], [ln4, 0]] is kept within
    [-ln3, ln3]; ln4 > ln3 rejects token (1, 0) only:
        keep = [[1,1,1],[0,1,0]]; masked_fraction = 1/5; seq_masked_fraction = 1/2;
        mean statistic = (0 - ln2 + 0 + ln4 + 0) / 5 = ln2 / 5.
    IS token_truncate, max 2, batch-normalised: w = min(e^l, 2) = [[1, 2, 1], [1/4, 1, 0]]; the
    mean is over the five valid tokens, the rejected one included (verl: both from the same
    response_mask): (1 + 2 + 1 + 1/4 + 1) / 5 = 1.05, so w = [[1, 2, 1], [1/4, 1, 0]] / 1.05.
    Objective: clip loss at ratio 1 (logp = old), A = [[1,1,1],[2,2,2]], token-mean: l_t = -A_t w_t
    over the kept tokens, divided by the kept count 4 (not 5):
        L = -(1 + 2 + 1 + 2 * 1) / 1.05 / 4 = -6 / 4.2 = -10/7,
    and dL/dlogp_t = -A_t w_t / 4: [[-1, -2, -1], [0, -2, 0]] / 4.2 (0 on the rejected token)."""
    a = load_recipe("grpo", ["algorithm.rollout_correction=token_truncate", "algorithm.rollout_correction_max=2",
                             "algorithm.rollout_correction_batch_normalize=true",
                             "algorithm.rollout_rejection=token_k1", "algorithm.rollout_rejection_max=3"]).algorithm
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    rollout = torch.tensor([[-1.0, -1.5, -0.5], [-2.0, -0.7, 0.0]], dtype=torch.float64)
    old = rollout + torch.tensor([[0.0, LN2, 0.0], [-2 * LN2, 0.0, 0.0]], dtype=torch.float64)

    w, keep = rollout_mismatch_masks(old, rollout, mask, a)
    torch.testing.assert_close(keep, torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, 1.0], [0.25, 1.0, 0.0]], dtype=torch.float64) / 1.05)
    assert rollout_corr_metrics(old, rollout, mask, a) == pytest.approx({
        "rollout_corr/rollout_is_batch_norm_factor": 1.05,
        "rollout_corr/rollout_rs_token_k1_mean": LN2 / 5,
        "rollout_corr/rollout_rs_token_k1_masked_fraction": 0.2,
        "rollout_corr/rollout_rs_token_k1_seq_masked_fraction": 0.5,
    }, rel=1e-12)

    logp = old.clone().requires_grad_(True)
    advantages = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]], dtype=torch.float64)
    obj = policy_objective(logp, old, advantages, mask * keep, mask, ObjectiveConfig(policy_loss="clip", aggregation="token-mean"),
                           is_weights=w)
    assert float(obj.loss.detach()) == pytest.approx(-10 / 7, rel=1e-12)
    obj.loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, -2.0, -1.0], [0.0, -2.0, 0.0]], dtype=torch.float64) / 4.2)


def test_off_settings_give_no_weights_no_mask_and_no_metrics():
    a = load_recipe("grpo").algorithm
    x = torch.zeros(2, 3)
    assert rollout_mismatch_masks(x, x, torch.ones(2, 3), a) == (None, None)
    assert rollout_corr_metrics(x, x, torch.ones(2, 3), a) == {}


# ---- the trainer's batch --------------------------------------------------------------------------


def test_prepare_batch_takes_rejected_tokens_out_of_the_loss_mask_only(wb_home, few_problems, tmp_path):
    """Step 0's prompts with completions of 1..5 tokens (``rollout_of_lengths``: fixed, not sampled)
    and the rollout engine's log-probs the trainer's own raised by 0.1 (t + 1) on token t, so
    k1_t = -(old - rollout) = 0.1 (t + 1): token_k1 with max e^0.25 keeps tokens 0 and 1 (0.1, 0.2)
    and rejects t >= 2. The IS weights stay e^(-0.1 (t + 1)) on every valid token, rejected ones
    included (verl)."""
    recipe = load_recipe("grpo", [f"dataset={few_problems}", "algorithm.rollout_correction=token_truncate",
                                  "algorithm.rollout_rejection=token_k1", f"algorithm.rollout_rejection_max={math.exp(0.25)}"])
    t = Trainer(recipe, tmp_path)
    t.setup()
    _, sampled = t.rollout(0)
    out = rollout_of_lengths(t, sampled, cycling_lengths(sampled.prompt_ids.shape[0], 5))
    mask = out.completion_mask
    position = torch.arange(mask.shape[1], dtype=out.rollout_logp.dtype)[None, :]
    out.rollout_logp = out.rollout_logp + 0.1 * (position + 1) * mask
    rewards = torch.linspace(0.0, 1.0, mask.shape[0])
    batch, _ = t.prepare_batch(out, rewards)
    expected = mask * (position < 2)
    assert 0 < expected.sum() < mask.sum()
    torch.testing.assert_close(batch.loss_mask, expected.to(batch.loss_mask.dtype))
    torch.testing.assert_close(batch.completion_mask, mask)  # advantages, entropy and lengths still see every token
    torch.testing.assert_close(batch.is_weights, torch.exp(-0.1 * (position + 1)) * mask, atol=1e-6, rtol=0)
    # the same refusal as rollout_correction's when the rollout engine reports no log-probs
    out.rollout_logp = None
    t.recipe = load_recipe("grpo", [f"dataset={few_problems}", "algorithm.rollout_rejection=token_k3",
                                    "algorithm.rollout_rejection_max=0.1"])
    with pytest.raises(ValueError, match="algorithm.rollout_rejection='token_k3' needs the rollout engine's log-probs"):
        t.prepare_batch(out, rewards)


# ---- runs ----------------------------------------------------------------------------------------


def test_stale_run_logs_rejected_fraction_and_batch_norm_factor(wb_home, few_problems, tmp_path):
    """train.staleness = 1: from step 1 the rollout's policy is an update behind the trainer's, so
    the two log-probs differ; step 0 samples with the trainer's own weights (k3 ~ 1e-12 <= 1)."""
    recipe = load_recipe("grpo", [f"dataset={few_problems}", "train.steps=3", "train.staleness=1",
                                  "algorithm.rollout_correction=token_truncate",
                                  "algorithm.rollout_correction_batch_normalize=true",
                                  "algorithm.rollout_rejection=token_k3", "algorithm.rollout_rejection_max=1.0"])
    assert Trainer(recipe, tmp_path).run() == "finished"
    ms = metrics_of(tmp_path)
    prefix = "rollout_corr/rollout_rs_token_k3"
    for m in ms:
        for name in ("masked_fraction", "seq_masked_fraction"):
            assert 0.0 <= m[f"{prefix}_{name}"] <= 1.0, (name, m[f"{prefix}_{name}"])
        assert m[f"{prefix}_mean"] >= 0.0  # k3 >= 0
        assert 0.0 < m["rollout_corr/rollout_is_batch_norm_factor"] <= 3.0  # the mean of weights truncated at 3
    assert ms[0][f"{prefix}_masked_fraction"] == 0.0
    assert ms[0]["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.0, abs=1e-4)
    assert max(m[f"{prefix}_masked_fraction"] for m in ms[1:]) > 0.0


def test_a_threshold_that_rejects_everything_gives_zero_policy_gradient(wb_home, few_problems, tmp_path):
    """token_k1 kept within [ln 2, ln 2]: no token has pi_rollout / pi_old exactly 2, so every
    token is rejected, the policy loss and its gradient are 0 and the weights never move."""
    recipe = load_recipe("grpo", [f"dataset={few_problems}", "train.steps=2", "algorithm.kl_coef=0",
                                  "algorithm.rollout_rejection=token_k1", "algorithm.rollout_rejection_min=2",
                                  "algorithm.rollout_rejection_max=2"])
    trainer = Trainer(recipe, tmp_path / "run")
    assert trainer.run() == "finished"
    fresh = Trainer(recipe, tmp_path / "fresh")
    fresh.setup()
    unwrap = lambda t: parameter_digest(t.accelerator.unwrap_model(t.policy))  # noqa: E731
    assert unwrap(trainer) == unwrap(fresh)
    for m in metrics_of(tmp_path / "run"):
        assert m["rollout_corr/rollout_rs_token_k1_masked_fraction"] == 1.0
        assert m["rollout_corr/rollout_rs_token_k1_seq_masked_fraction"] == 1.0
        assert (m["loss/policy"], m["grad_norm"]) == (0.0, 0.0)


# ---- bad values through the CLI --------------------------------------------------------------------

BAD_REJECTION = [
    (["algorithm.rollout_rejection=token_k4"], ["algorithm.rollout_rejection='token_k4'", "seq_max_k3"]),
    (["algorithm.rollout_rejection=token_k3"], ["algorithm.rollout_rejection='token_k3'", "needs algorithm.rollout_rejection_max"]),
    (["algorithm.rollout_rejection_max=5000.0"], ["algorithm.rollout_rejection_max=5000.0", "less than or equal to 1000"]),
]
# the other checks, in-process (the CLI prints the same message on one line)
BAD_REJECTION_IN_PROCESS = [
    (["algorithm.rollout_rejection=seq_mean_k2", "algorithm.rollout_rejection_max=0.1", "algorithm.rollout_rejection_min=0.05"],
     ["algorithm.rollout_rejection_min=0.05", "only with a k1 mode"]),
    (["algorithm.rollout_rejection=token_k1", "algorithm.rollout_rejection_max=0.5"],
     ["algorithm.rollout_rejection_max=0.5", "ratio >= 1"]),
    (["algorithm.rollout_rejection=seq_sum_k1", "algorithm.rollout_rejection_max=2", "algorithm.rollout_rejection_min=3"],
     ["algorithm.rollout_rejection_min=3.0 must not exceed algorithm.rollout_rejection_max=2.0"]),
    (["algorithm.rollout_rejection_min=0"], ["algorithm.rollout_rejection_min", "greater than 0"]),
    (["algorithm.rollout_correction_batch_normalize=true"],
     ["algorithm.rollout_correction_batch_normalize=True", "token_truncate"]),
]


@pytest.mark.parametrize("items, patterns", BAD_REJECTION, ids=[" ".join(i) for i, _ in BAD_REJECTION])
def test_bad_rejection_settings_are_one_line_exit_2_and_leave_nothing(tmp_path, items, patterns):
    res = cli(tmp_path, "launch", "grpo", *[arg for item in items for arg in ("--set", item)])
    assert_one_line_error(res, *patterns)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("items, patterns", BAD_REJECTION_IN_PROCESS, ids=[" ".join(i) for i, _ in BAD_REJECTION_IN_PROCESS])
def test_bad_rejection_bounds_name_the_field_and_what_is_allowed(items, patterns):
    with pytest.raises(RecipeError) as err:
        load_recipe("grpo", items)
    message = str(err.value)
    assert all(p in message for p in patterns), message


# ---- verl's settings in an imported run's recipe ----------------------------------------------------


@pytest.mark.parametrize("settings, expected", [
    ({"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": True,
      "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01},
     {"algorithm.rollout_correction": "token_truncate", "algorithm.rollout_correction_max": 2.0,
      "algorithm.rollout_correction_batch_normalize": True, "algorithm.rollout_rejection": "seq_mean_k3",
      "algorithm.rollout_rejection_max": 0.01}),
    ({"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_1.5"},
     {"algorithm.rollout_rejection": "token_k1", "algorithm.rollout_rejection_min": 0.5, "algorithm.rollout_rejection_max": 1.5}),
    ({"rollout_rs": "seq_sum_k1", "rollout_rs_threshold": 2}, {"algorithm.rollout_rejection": "seq_sum_k1",
                                                              "algorithm.rollout_rejection_max": 2.0}),
    # no single recipe value: several modes, k1 upper < 1 without a lower (verl then rejects all), "_" for k3
    ({"rollout_rs": "token_k1,seq_max_k3", "rollout_rs_threshold": "2,0.1"}, {}),
    ({"rollout_rs": "token_k1", "rollout_rs_threshold": 0.5}, {}),
    ({"rollout_rs": "token_k3", "rollout_rs_threshold": "0.5_2"}, {}),
    ({"rollout_rs": "token_k3", "rollout_rs_threshold": None}, {}),
    ({"rollout_is": None, "rollout_is_batch_normalize": True}, {}),
])
def test_verl_rollout_correction_config_maps_to_the_recipe_fields(settings, expected):
    from workbench.runs.imports import verl_rollout_mismatch

    assert verl_rollout_mismatch({"algorithm": {"rollout_correction": settings}}) == expected
    if expected:  # what it gives is a valid recipe
        load_recipe("grpo", [f"{path}={value}" for path, value in expected.items()])
