"""Defaults the docs attribute to verl equal verl 0.9.1's own, and the GMPO aggregation claim holds
exactly where its docstring says it does.

verl 0.9.1 (PyPI wheel verl-0.9.1-py3-none-any.whl; the same lines in verl's release/v0.9.0 branch):
- verl/workers/config/actor.py: ``ActorConfig.clip_ratio_c: float = 3.0``; ``PolicyLossConfig``:
  ``kl_cov_ratio = 0.0002``, ``ppo_kl_coef = 0.1``, ``clip_cov_ratio = 0.0002``, ``clip_cov_lb = 1.0``,
  ``clip_cov_ub = 5.0``; verl/trainer/config/actor/actor.yaml states the same values.
- verl/trainer/ppo/core_algos.py: ``compute_policy_loss_dppo_tv / _kl`` read
  ``config.get("clip_ratio_c", 20.0)`` and ``compute_policy_loss_kl_cov`` falls back to
  ``ppo_kl_coef = 1.0`` when the field is None, but both receive an ActorConfig, which always holds
  the fields above: a verl run that sets neither gets 3.0 and 0.1.
"""

from __future__ import annotations

import math

import torch

from workbench.core import PolicyLossConfig, aggregate_loss, compute_policy_loss
from workbench.core.policy_losses import DPPO_TIS_CAP
from workbench.recipe import Algorithm, load_recipe

VERL_0_9_1 = {"clip_ratio_c": 3.0, "kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1,
              "clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0}
# workbench name -> verl name, for the fields whose docs name verl's default
OURS_TO_VERL = {"kl_cov_ratio": "kl_cov_ratio", "kl_cov_coef": "ppo_kl_coef",
                "clip_cov_ratio": "clip_cov_ratio", "clip_cov_lb": "clip_cov_lb", "clip_cov_ub": "clip_cov_ub"}


def test_core_and_recipe_defaults_equal_verl_0_9_1():
    core, recipe = PolicyLossConfig(), Algorithm()
    for ours, theirs in OURS_TO_VERL.items():
        assert getattr(core, ours) == VERL_0_9_1[theirs], ours
        assert getattr(recipe, ours) == VERL_0_9_1[theirs], ours
    assert DPPO_TIS_CAP == VERL_0_9_1["clip_ratio_c"]
    from workbench.algorithms.policy_losses import DPPO_CAP

    assert f"none = {DPPO_TIS_CAP:g}, verl's default" in DPPO_CAP.help  # the knob's text says the core's cap


def test_kl_cov_preset_uses_verl_0_9_1_defaults():
    a = load_recipe("kl_cov").algorithm
    assert (a.kl_cov_ratio, a.kl_cov_coef) == (VERL_0_9_1["kl_cov_ratio"], VERL_0_9_1["ppo_kl_coef"])


def test_dppo_without_clip_c_truncates_at_verl_clip_ratio_c():
    # p_old = 0.01, logp - old = 3: rho = e^3 ~ 20.1, p ~ 0.2 (TV 0.19 <= 0.5: kept); A = 1.
    # d loss / d logp = -A sg(min(rho, C)) = -3 exactly.
    for name in ("dppo_tv", "dppo_kl"):
        old = torch.tensor([[math.log(0.01)]], dtype=torch.float64)
        logp = (old + 3.0).requires_grad_(True)
        loss, _ = compute_policy_loss(name, logp, old, torch.ones_like(old), torch.ones_like(old),
                                      PolicyLossConfig(eps_low=0.5, eps_high=0.5))
        loss.sum().backward()
        assert logp.grad.item() == -VERL_0_9_1["clip_ratio_c"], name


def _gmpo_rows(rows):
    """rows: [(advantages, mask)] with logp = old (ratio 1, so R_i = 1 and loss_i = -A_i exactly)."""
    adv = torch.tensor([r[0] for r in rows], dtype=torch.float64)
    mask = torch.tensor([r[1] for r in rows], dtype=torch.float64)
    logp = torch.zeros_like(adv)
    loss, _ = compute_policy_loss("gmpo", logp, logp, adv, mask, PolicyLossConfig(eps_low=0.4, eps_high=0.4))
    return loss, mask


# loss_i = -A_i: -1, +0.5, -1 (A_i = mean of A over the valid tokens): sum -1.5
FULL_ROWS = [([1.0, 1.0], [1, 1]), ([-0.5, 7.0], [1, 0]), ([1.0, 1.0], [1, 1])]
EMPTY_ROW = ([3.0, 3.0], [0, 0])


def test_gmpo_seq_mean_token_mean_equals_verl_mean_over_rows_without_empty_rows():
    loss, mask = _gmpo_rows(FULL_ROWS)
    assert aggregate_loss("seq-mean-token-mean", loss, mask).item() == -1.5 / 3  # verl: torch.mean over B = 3


def test_gmpo_seq_mean_token_mean_differs_from_verl_with_an_empty_row():
    loss, mask = _gmpo_rows(FULL_ROWS + [EMPTY_ROW])
    verl = -1.5 / 4  # torch.mean over B = 4 rows, the empty row's loss is -0 * exp(0) = 0
    assert aggregate_loss("seq-mean-token-mean", loss, mask).item() == -1.5 / 3  # default num_seqs: 3 rows
    assert aggregate_loss("seq-mean-token-mean", loss, mask).item() == verl * 4 / 3  # B / (B - e)
    assert aggregate_loss("seq-mean-token-mean", loss, mask, num_seqs=4).item() == verl
