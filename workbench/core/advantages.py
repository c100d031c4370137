"""Advantage estimators. One contract for all of them:

    fn(rewards (B,), mask (B, T), cfg: AdvantageConfig, *, kl (B, T) | None, values (B, T) | None)
        -> Advantages(advantages (B, T), returns (B, T))

Estimators in BASELINE_ESTIMATORS (ReMax) also take ``baselines`` (B,): the reward of the
prompt's greedy completion, repeated for each of its G sampled completions. Estimators in
POLICY_STAT_ESTIMATORS (the optimal token baselines) also take ``old_logp`` (B, T), the old
policy's log-probs of the sampled tokens, ``sum_pi_squared`` (B, T), sum_v pi_old(v)^2 at each
position (``sum_pi_squared_from_logits``), and optionally ``is_weights`` (B, T), the rollout IS
weights. ``compute_advantages`` passes these to those only, so the contract of the others is
unchanged.

B = number of completions, grouped contiguously by prompt in groups of ``cfg.group_size`` (G).
Sequence-level estimators broadcast one scalar per completion over its valid tokens; token-level
ones (REINFORCE++, GAE) give each token its own value. Padding is always 0.

``kl`` is the per-token KL estimate, used only when ``cfg.kl_coef`` (the *in-reward* KL
coefficient) is non-zero: sequence estimators shape r_i <- r_i - kl_coef * sum_t kl_it, token
estimators put -kl_coef * kl_t on every token (see ``kl.py``).
"""

from __future__ import annotations

import inspect

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from .choices import (  # noqa: F401 (no torch)
    GPG_ALPHAS,
    BASELINE_ESTIMATORS,
    CRITIC_ESTIMATORS,
    GROUP_ESTIMATORS,
    GRPO_SCALES,
    MULTI_REWARD_MODES,
    POLICY_STAT_ESTIMATORS,
    TOKEN_LEVEL_ESTIMATORS,
)
from .masked import last_valid_index, masked_sum, masked_whiten, zero_padding
from .registry import Registry, check_choice
from .scan import next_valid_value, pack_left, reverse_discounted_cumsum, reverse_discounted_cumsum_reset
from .shapes import ShapeError, check_2d, check_like, check_sequence_vector


@dataclass(frozen=True)
class AdvantageConfig:
    """Settings shared by the advantage estimators (each reads the ones it needs).

    group_size: G, completions per prompt (contiguous). Group baselines need G >= 2; a group of
        one gets advantage 0 (no baseline can be formed without using its own reward).
    scale: ``grpo`` only. ``group`` divides by the group's std (DeepSeekMath GRPO); ``batch``
        by the std of all rewards in the batch (TRL ``scale_rewards="batch"``, more robust when
        many groups have near-zero std); ``none`` keeps r - mean (Dr. GRPO, Liu et al. 2025,
        which removes the bias towards groups that are nearly all-right or all-wrong).
    eps: added to the std. TRL uses 1e-4, verl 1e-6; the difference matters only for groups
        whose std is near zero.
    gamma, lam: discount and GAE lambda (token-level estimators). LM RL uses gamma = 1.
    kl_coef: in-reward KL coefficient (0 when the KL goes in the loss, or is off).
    whiten: normalise the final advantages over all valid tokens of the batch (masked
        mean/var). PPO implementations do this for GAE; it changes the effective step size.
    gpg_alpha: ``gpg`` only: its batch rescaling (``paper``, ``verl`` or ``none``; see gpg_advantages).
    """

    group_size: int = 1
    scale: str = "group"
    eps: float = 1e-6
    gamma: float = 1.0
    lam: float = 1.0
    kl_coef: float = 0.0
    whiten: bool = False
    gpg_alpha: str = "paper"


class Advantages(NamedTuple):
    advantages: torch.Tensor  # (B, T)
    returns: torch.Tensor  # (B, T): value targets for GAE, = advantages otherwise


# The dtype the engine scores rewards in, and the least compute_advantages works in. The
# walkthrough pages compute in it too, so they show the engine's numbers bit for bit.
REWARD_DTYPE = torch.float32

AdvantageFn = Callable[..., Advantages]
ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")


# ---------------------------------------------------------------------------------------------
# reward shaping helpers


def kl_shaped_sequence_rewards(rewards, mask, kl, kl_coef: float) -> torch.Tensor:
    """r_i - kl_coef * sum_t kl_it m_it. rewards (B,), mask/kl (B, T) -> (B,)."""
    if kl_coef == 0.0 or kl is None:
        return rewards
    return rewards - kl_coef * masked_sum(kl, mask, dim=1)


def token_level_rewards(rewards, mask, kl=None, kl_coef: float = 0.0) -> torch.Tensor:
    """Per-token rewards: -kl_coef * kl_t on valid tokens, plus r_i on the last valid token.

    rewards (B,), mask (B, T), kl (B, T) | None -> (B, T). Rows without valid tokens get nothing.
    """
    B, T = mask.shape
    out = torch.zeros(B, T, dtype=rewards.dtype, device=rewards.device)
    if kl is not None and kl_coef != 0.0:
        out = zero_padding(-kl_coef * kl.to(rewards.dtype), mask)
    last = last_valid_index(mask)
    rows = torch.nonzero(last >= 0).squeeze(1)
    out[rows, last[rows]] += rewards[rows]
    return out


def _broadcast(scores: torch.Tensor, mask: torch.Tensor) -> Advantages:
    """(B,) sequence scores -> (B, T) on valid tokens."""
    adv = scores[:, None] * mask.to(scores.dtype)
    return Advantages(adv, adv)


def _groups(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) -> (B/G, G)."""
    return x.view(-1, group_size)


def equal_groups(grouped: torch.Tensor) -> torch.Tensor:
    """(N, G) -> (N, 1) bool: True where every reward of the group is the same number (an exact
    comparison: such groups get advantage exactly 0, and count as zero-std in the metrics)."""
    return grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)


def _zero_equal_groups(scores: torch.Tensor, grouped: torch.Tensor) -> torch.Tensor:
    """Set the (N, G) scores of groups whose rewards are all equal to exactly 0.

    Why: such a group carries no signal, and its centred rewards r_i - mean_g are 0 in exact
    arithmetic but not in floating point: float32 sums 0.2 eight times to 1.6000001, so mean_g is
    one ulp above 0.2 and r_i - mean_g = -1.5e-8; GRPO then divides by std_g + eps, where std_g
    is itself ~1.6e-8 of rounding and eps = 1e-6, turning it into A = -0.015 on every completion
    (-0.12 for 1.9485582 x 8). Rounding the mean more carefully only moves the problem (float64
    inputs, other sizes), whereas max == min is an exact comparison for any values and dtype, so
    equal groups get exact zeros, before any batch whitening (GRPO sets them after its division,
    so that eps = 0 cannot make 0 / 0). Groups with any spread, however small, are left to the
    formula: their rounding error is small next to a real spread.
    """
    return scores.masked_fill(equal_groups(grouped), 0.0)


def _centred(grouped: torch.Tensor) -> torch.Tensor:
    """r_i - mean_g per group, exactly 0 in all-equal groups. (N, G) -> (N, G)."""
    return _zero_equal_groups(grouped - grouped.mean(dim=1, keepdim=True), grouped)


# ---------------------------------------------------------------------------------------------
# GRPO's std choices: each maps grouped rewards (N, G) and all rewards (B,) to a std (N, 1) or None.


def _group_std(grouped: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    if grouped.shape[1] < 2:
        return torch.zeros(grouped.shape[0], 1, dtype=grouped.dtype, device=grouped.device)
    return grouped.std(dim=1, keepdim=True)  # unbiased (Bessel), as TRL and verl


def _batch_std(grouped: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    std = flat.std() if flat.numel() > 1 else torch.zeros((), dtype=flat.dtype, device=flat.device)
    return std.expand(grouped.shape[0], 1)


_GRPO_STD: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None]] = {
    "group": _group_std,
    "batch": _batch_std,
    "none": lambda grouped, flat: None,
}


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None) -> Advantages:
    """GRPO (Shao et al. 2024): A_i = (r_i - mean_g) / (std_g + eps); ``scale`` picks the std.

    scale="none" is Dr. GRPO's A_i = r_i - mean_g.
    """
    r = kl_shaped_sequence_rewards(rewards, mask, kl, cfg.kl_coef)
    grouped = _groups(r, cfg.group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    std = _GRPO_STD[check_choice("scale", cfg.scale, GRPO_SCALES)](grouped, r)
    scores = centered if std is None else centered / (std + cfg.eps)
    # all-equal groups exactly 0, set after the division: with eps = 0 their 0 / 0 would be NaN
    return _broadcast(_zero_equal_groups(scores, grouped).reshape(-1), mask)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None) -> Advantages:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): A_i = r_i - (sum_g r - r_i) / (G - 1).

    Equals G / (G - 1) * (r_i - mean_g). A group of one has no leave-one-out baseline: A = 0.
    """
    r = kl_shaped_sequence_rewards(rewards, mask, kl, cfg.kl_coef)
    G = cfg.group_size
    grouped = _groups(r, G)
    if G < 2:
        return _broadcast(torch.zeros_like(r), mask)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (G - 1)
    return _broadcast(_zero_equal_groups(grouped - baseline, grouped).reshape(-1), mask)


@ADVANTAGE_ESTIMATORS.register("reinforce")
def reinforce_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None) -> Advantages:
    """REINFORCE with a batch-mean baseline (Williams 1992): A_i = r_i - mean over the batch
    (exactly 0 when every reward of the batch is equal)."""
    r = kl_shaped_sequence_rewards(rewards, mask, kl, cfg.kl_coef)
    return _broadcast(_centred(r.view(1, -1)).reshape(-1), mask)


def _reinforce_pp_from_sequence_rewards(r, mask, cfg: AdvantageConfig, kl) -> Advantages:
    token_rewards = token_level_rewards(r, mask, kl, cfg.kl_coef)
    returns = reverse_discounted_cumsum(token_rewards, cfg.gamma, mask)  # G_t = r_t + gamma G_{t+1}
    return Advantages(masked_whiten(returns, mask, shift_mean=True), returns)


def _whitened_over_kept(returns: torch.Tensor, kept: torch.Tensor) -> Advantages:
    """Returns whitened over the kept tokens only, 0 elsewhere (verl: masked_whiten(.,
    response_mask) * response_mask with the rejection-holed response_mask)."""
    return Advantages(zero_padding(masked_whiten(returns, kept, shift_mean=True), kept), zero_padding(returns, kept))


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
def reinforce_pp_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None, keep=None) -> Advantages:
    """REINFORCE++ (Hu 2025), token level: returns-to-go of the token rewards
    (-kl_coef kl_t, plus r_i on the last token), whitened over all valid tokens of the batch.

    keep (B, T) (rollout rejection's keep-mask) reproduces verl's driver exactly: the token
    rewards sit where the full mask puts them (the reward at the original last token, the KL on
    every valid token: verl's reward manager and apply_kl_penalty run before rejection); the return
    loop is verl's, ``running_return = running_return * response_mask[:, t]`` on the holed mask, so
    a rejected token RESETS the return (the tokens before it never see the reward after it: verl's
    behaviour, kept as is); whitening is over the kept tokens, rejected ones get 0.
    """
    if keep is None:
        return _reinforce_pp_from_sequence_rewards(rewards, mask, cfg, kl)
    kept = mask * keep
    returns = reverse_discounted_cumsum_reset(token_level_rewards(rewards, mask, kl, cfg.kl_coef), cfg.gamma, kept)
    return _whitened_over_kept(returns, kept)


@ADVANTAGE_ESTIMATORS.register("reinforce_pp_baseline")
def reinforce_pp_baseline_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None,
                                     keep=None) -> Advantages:
    """REINFORCE++-baseline: subtract the group-mean reward, then as ``reinforce_pp``.

    (verl's version whitens sequence scores that include the summed KL; with gamma = 1 and no
    KL the two agree.) keep (B, T) (rollout rejection): as verl, the score is the whole row's
    (returns over the full mask, no reset at holes: verl sums token_level_rewards over every
    token), broadcast and whitened over the kept tokens only; rejected tokens get 0.
    """
    centered = _centred(_groups(rewards, cfg.group_size)).reshape(-1)
    out = _reinforce_pp_from_sequence_rewards(centered, mask, cfg, kl)
    return out if keep is None else _whitened_over_kept(out.returns, mask * keep)


@ADVANTAGE_ESTIMATORS.register("gae")
def gae_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None, keep=None) -> Advantages:
    """GAE (Schulman et al. 2016) for PPO, per token:

        delta_t = r_t + gamma V_{t+1} - V_t        (V after the last valid token = 0)
        A_t     = sum_l (gamma lambda)^l delta_{t+l}
        returns = A + V                             (the critic's targets)

    r_t = -kl_coef kl_t, plus the scalar reward on the last valid token.

    keep (B, T) (rollout rejection) reproduces verl's ``compute_gae_advantage_return`` on the
    holed response_mask: the token rewards sit where the full mask puts them, then a rejected
    token is SKIPPED (``nextvalues`` and ``lastgaelam`` carried over it), so its own delta -
    the outcome reward too if it was the last token - is dropped and V_{t+1} is the value at the
    next kept token. Rejected tokens get advantage and return 0 here (verl leaves the carried
    value there; they are out of every loss either way).
    """
    if values is None:
        raise ValueError("advantage estimator 'gae' needs values (B, T) from a critic")
    token_rewards = token_level_rewards(rewards, mask, kl, cfg.kl_coef)
    kept = mask if keep is None else mask * keep
    v = zero_padding(values.to(token_rewards.dtype), kept)
    delta = token_rewards + cfg.gamma * next_valid_value(v, kept) - v
    adv = reverse_discounted_cumsum(delta, cfg.gamma * cfg.lam, kept)
    returns = zero_padding(adv + v, kept)
    return Advantages(adv, returns)


@ADVANTAGE_ESTIMATORS.register("remax")
def remax_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None, baselines=None) -> Advantages:
    """ReMax (Li et al. 2023, arXiv 2310.10505; verl ``remax``): A_i = r_i - b_i, where b_i is the
    reward of a greedy completion of the same prompt (one extra rollout per prompt, not trained on).

    baselines: (B,), one per completion (the greedy reward of its prompt, repeated G times), as
    verl's ``reward_baselines``. With the KL in the reward, r_i is shaped as in the other sequence
    estimators (r_i - kl_coef sum_t kl_it) and A_i is the same on every token; verl instead
    subtracts b_i from the per-token returns-to-go of the KL-shaped token rewards. Without an
    in-reward KL the two agree.
    """
    if baselines is None:
        raise ValueError("advantage estimator 'remax' needs baselines (B,): the reward of each prompt's greedy completion")
    r = kl_shaped_sequence_rewards(rewards, mask, kl, cfg.kl_coef)
    return _broadcast(r - baselines.to(r.dtype), mask)


@ADVANTAGE_ESTIMATORS.register("opo")
def opo_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None, keep=None) -> Advantages:
    """OPO, the length-weighted optimal baseline (Hao et al. 2025, arXiv 2505.23585; verl ``opo``):

        b_g = sum_{j in g} n_j r_j / sum_{j in g} n_j,     A_i = r_i - b_g        (n_j = valid tokens)

    the variance-minimising baseline when every token of a completion carries its reward. A
    group of one gets b = r, i.e. A = 0, as every group estimator here (verl special-cases it to
    b = 0, A = r). All-equal groups get exactly 0.

    keep (B, T) (rollout rejection), as verl's driver: r_j is the whole row's score (full mask), n_j
    counts the kept tokens only (a rejected row weighs 0), and A sits on the kept tokens. A group
    with no kept token gets 0 (verl: 0 / 0 = NaN there).
    """
    kept = mask if keep is None else mask * keep
    r = kl_shaped_sequence_rewards(rewards, mask, kl, cfg.kl_coef)
    grouped = _groups(r, cfg.group_size)
    lengths = _groups(kept.sum(dim=1).to(r.dtype), cfg.group_size)
    baseline = (lengths * grouped).sum(dim=1, keepdim=True) / lengths.sum(dim=1, keepdim=True).clamp(min=1)
    return _broadcast(_zero_equal_groups(grouped - baseline, grouped).reshape(-1), kept)


@ADVANTAGE_ESTIMATORS.register("grpo_passk")
def grpo_passk_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None) -> Advantages:
    """Pass@k advantages in GRPO form (verl ``compute_grpo_passk_outcome_advantage``, after
    arXiv 2503.19595): only the group's best completion is credited,

        A_best = (r_max - r_second) / (std_g + eps),   every other A_i = 0

    so the update raises the chance that *one* of the G samples is right (pass@k), not the mean.
    ``scale`` picks the std as for ``grpo`` (verl has group / none). Ties for the best give 0.
    A group of one gets 0 (verl raises).
    """
    r = kl_shaped_sequence_rewards(rewards, mask, kl, cfg.kl_coef)
    grouped = _groups(r, cfg.group_size)
    if cfg.group_size < 2:
        return _broadcast(torch.zeros_like(r), mask)
    top = grouped.topk(2, dim=1)
    margin = top.values[:, :1] - top.values[:, 1:]
    std = _GRPO_STD[check_choice("scale", cfg.scale, GRPO_SCALES)](grouped, r)
    margin = margin if std is None else margin / (std + cfg.eps)
    scores = torch.zeros_like(grouped).scatter(1, top.indices[:, :1], margin)
    return _broadcast(_zero_equal_groups(scores, grouped).reshape(-1), mask)


def _gpg_alpha_paper(r: torch.Tensor, grouped: torch.Tensor) -> torch.Tensor:
    """B / (B - M), M = completions in groups whose rewards are all equal (no gradient there);
    1 when every group is equal (all advantages are 0 anyway)."""
    informative = (~equal_groups(grouped)).expand_as(grouped).sum()
    return r.numel() / informative.clamp(min=1).to(r.dtype)


def _gpg_alpha_verl(r: torch.Tensor, grouped: torch.Tensor) -> torch.Tensor:
    """B / max(#(r_i != 0), 1), as verl's compute_gpg_outcome_advantage counts valid samples."""
    return r.numel() / torch.count_nonzero(r).clamp(min=1).to(r.dtype)


_GPG_ALPHA: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "paper": _gpg_alpha_paper,
    "verl": _gpg_alpha_verl,
    "none": lambda r, grouped: torch.ones((), dtype=r.dtype, device=r.device),
}


@ADVANTAGE_ESTIMATORS.register("gpg")
def gpg_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None) -> Advantages:
    """GPG, Group Policy Gradient (Chu et al. 2025, arXiv 2504.02546, Eq. 8-9; verl ``gpg``):

        A_i = alpha * (r_i - mean_g) / F_norm

    over the global batch of B completions. F_norm is picked by ``scale`` as for ``grpo``
    (``none``: 1, the paper's and verl's default; ``group``: std_g + eps). alpha rescales the
    batch so that completions without a gradient do not dilute it:

        paper   alpha = B / (B - M), M = completions in groups whose rewards are all equal
        verl    alpha = B / max(#(r_i != 0), 1)   (verl's compute_gpg_outcome_advantage counts
                non-zero rewards: with 0/1 rewards it leaves out the wrong answers of every
                group and counts all-right groups, so it differs from B - M in general)
        none    alpha = 1

    All-equal groups get exactly 0 (verl leaves their float rounding).
    """
    r = kl_shaped_sequence_rewards(rewards, mask, kl, cfg.kl_coef)
    grouped = _groups(r, cfg.group_size)
    if cfg.group_size < 2:
        return _broadcast(torch.zeros_like(r), mask)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    std = _GRPO_STD[check_choice("scale", cfg.scale, GRPO_SCALES)](grouped, r)
    scores = centered if std is None else centered / (std + cfg.eps)
    alpha = _GPG_ALPHA[check_choice("gpg_alpha", cfg.gpg_alpha, GPG_ALPHAS)](r, grouped)
    return _broadcast(_zero_equal_groups(alpha * scores, grouped).reshape(-1), mask)


# ---------------------------------------------------------------------------------------------
# optimal token baselines (verl 0.9.1 optimal_token_baseline / tir_optimal_token_baseline)

# verl's epsilon in the baseline's denominator (a fixed default there, not a config field).
OTB_EPS = 1e-8


def sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """sum_v pi(v)^2 at each position, pi = softmax(logits). (B, T, V) -> (B, T), in float32 at least
    (verl's ``calculate_sum_pi_squared`` output, which it stores as float)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.softmax(logits, dim=-1).square().sum(dim=-1)


def path_variance(old_logp, sum_pi_squared, mask, is_weights=None) -> torch.Tensor:
    """W_t = sum_{j <= t} ||s_j||^2 m_j with ||s_j||^2 = 1 - 2 pi_j + sum_v pi_v^2 (times rho_j^2
    with rollout IS weights): the squared norm of the score d log pi(a_j) / d logits, e_a - pi,
    accumulated along the completion. (B, T) -> (B, T)."""
    w = 1 - 2 * torch.exp(old_logp) + sum_pi_squared
    if is_weights is not None:
        w = w * is_weights**2
    return (w * mask).cumsum(dim=-1)


def _otb_group_baselines(returns, w_cum, mask, group_size: int, zero_tail: bool = True) -> torch.Tensor:
    """b_t = sum_g G_t W_t m_t / (sum_g W_t m_t + OTB_EPS) per group and position, (B, T) -> (B, T).

    zero_tail (verl's handle_zero_tail, on by default): where one completion is strictly the
    longest of its group, its baseline is 0 from the second-longest length on (no other
    completion of the group reaches there, so the "baseline" would be its own return)."""
    B, T = returns.shape
    shape = (B // group_size, group_size, T)
    R, W, m = returns.view(shape), w_cum.view(shape), mask.to(returns.dtype).view(shape)
    b = ((R * W * m).sum(dim=1) / ((W * m).sum(dim=1) + OTB_EPS))[:, None, :].expand(shape).clone()
    if zero_tail:
        lengths = m.sum(dim=2)  # (N, G)
        top = lengths.sort(dim=1).values
        longest, second = top[:, -1], top[:, -2]
        alone = ((lengths == longest[:, None]).sum(dim=1) == 1) & (longest > second)
        row = (lengths == longest[:, None]) & alone[:, None]  # (N, G)
        tail = torch.arange(T, device=returns.device)[None, :] >= second[:, None]  # (N, T)
        b = b.masked_fill(row[:, :, None] & tail[:, None, :], 0.0)
    return b.reshape(B, T)


def _otb_returns(rewards, mask, cfg: AdvantageConfig, kl, kept) -> torch.Tensor:
    """G_t = sum_{t' >= t} r_t' kept_t' over the row (verl's flip-cumsum-flip of the masked token
    rewards). The token rewards sit on the full ``mask``; ``kept`` is mask (or, under rollout
    rejection, mask * keep: a rejected last token's reward then reaches no token, as in verl)."""
    token_rewards = token_level_rewards(rewards, mask, kl, cfg.kl_coef) * kept.to(rewards.dtype)
    return token_rewards.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])


def _optimal_token_baseline(rewards, mask, cfg: AdvantageConfig, kl, old_logp, sum_pi_squared, is_weights,
                            by_valid_index: bool, keep=None) -> Advantages:
    """A_t = G_t - B_t (see optimal_token_baseline_advantages); ``by_valid_index`` indexes B by the
    k-th valid token of each completion (rows packed left) instead of the absolute position t.
    keep (B, T) (rollout rejection): as verl's driver, every step below reads mask * keep, only the
    token rewards sit on the full mask."""
    G = _otb_returns(rewards, mask, cfg, kl, mask if keep is None else mask * keep)
    if keep is not None:
        mask = mask * keep
    if cfg.group_size < 2:
        return Advantages(torch.zeros_like(G), zero_padding(G, mask))
    w_cum = path_variance(old_logp.to(G.dtype), sum_pi_squared.to(G.dtype), mask,
                          None if is_weights is None else is_weights.to(G.dtype))
    if not by_valid_index:
        return Advantages(zero_padding(G - _otb_group_baselines(G, w_cum, mask, cfg.group_size), mask), zero_padding(G, mask))
    order = pack_left(mask)
    packed_mask = torch.arange(mask.shape[1], device=mask.device)[None, :] < mask.sum(dim=1, keepdim=True)
    packed = packed_mask.to(G.dtype)
    R, W = G.gather(1, order) * packed, w_cum.gather(1, order) * packed
    adv_packed = (R - _otb_group_baselines(R, W, packed_mask, cfg.group_size)) * packed
    return Advantages(zero_padding(torch.zeros_like(G).scatter(1, order, adv_packed), mask), zero_padding(G, mask))


@ADVANTAGE_ESTIMATORS.register("optimal_token_baseline")
def optimal_token_baseline_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None, old_logp=None,
                                      sum_pi_squared=None, is_weights=None, keep=None) -> Advantages:
    """Optimal Token Baseline (verl 0.9.1 ``optimal_token_baseline``): a baseline per position t
    from the group's returns weighted by each completion's accumulated score variance,

        A_t = G_t - B_t,   B_t = sum_{i in g} G_it W_it / (sum_{i in g} W_it + 1e-8)

    (``path_variance``: W_t = sum_{j<=t} (1 - 2 pi_j + sum_v pi_v^2) [* rho_j^2]), the baseline that
    minimises the variance of the gradient estimate when the score norms are the variance proxy;
    paths that moved more (higher W) weigh more. G_t is the return-to-go of the token rewards
    (the reward on the last valid token, minus kl_coef kl_t per token with an in-reward KL). B_t
    is taken at the absolute position t; with a mask with holes (tool outputs) see
    ``tir_optimal_token_baseline``. A group of one gets 0 as every group estimator here (verl:
    A = G_t, no baseline). Returns = G_t.
    """
    return _optimal_token_baseline(rewards, mask, cfg, kl, old_logp, sum_pi_squared, is_weights, by_valid_index=False, keep=keep)


@ADVANTAGE_ESTIMATORS.register("tir_optimal_token_baseline")
def tir_optimal_token_baseline_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None, old_logp=None,
                                          sum_pi_squared=None, is_weights=None, keep=None) -> Advantages:
    """Optimal Token Baseline for tool-integrated reasoning (verl 0.9.1
    ``tir_optimal_token_baseline``, ``compute_multi_turn_optimal_token_baseline_advantage``): as
    ``optimal_token_baseline``, but B is indexed by the k-th *valid* token of each completion
    instead of the absolute position, so that tool outputs masked out between turns do not shift
    one completion's tokens against another's. With right padding only, the two are equal.
    """
    return _optimal_token_baseline(rewards, mask, cfg, kl, old_logp, sum_pi_squared, is_weights, by_valid_index=True, keep=keep)


# ---------------------------------------------------------------------------------------------
# several reward functions


def combine_rewards(per_func: torch.Tensor, weights: torch.Tensor | None = None, mode: str = "sum_then_normalize",
                    group_size: int = 1, eps: float = 1e-4) -> torch.Tensor:
    """One reward per completion from F reward functions' scores. per_func (B, F) -> (B,).

        sum_then_normalize   r_i = sum_k w_k r_ik        (TRL's default; the estimator normalises)
        normalize_then_sum   r_i = sum_k w_k (r_ik - mean_g r_k) / (std_g r_k + eps)
                             (GDPO, arXiv 2601.05242: each reward is normalised within its group
                             first, so one with a large scale or spread cannot drown the others)

    weights: (F,), default 1 each. group_size G as in AdvantageConfig; std unbiased; a reward
    whose group values are all equal contributes exactly 0 there. eps: TRL 1e-4, verl 1e-6.

    GDPO then normalises the sum over the batch, and TRL and verl differ there:
    - TRL (``multi_objective_aggregation="normalize_then_sum"``): (s - mean_batch) / (std_batch + 1e-4)
      over completions = ``compute_advantages("grpo", s, cfg(scale="batch", eps=1e-4))``, exactly,
      since every group of s has mean 0 so mean_g = mean_batch = 0.
    - verl (``gdpo``): masked whitening over *tokens* (each completion weighted by its length) =
      ``compute_advantages("grpo", s, cfg(scale="none", whiten=True))``.
    """
    B, F = check_2d("per_func", per_func)
    per_func = per_func.to(torch.promote_types(per_func.dtype, REWARD_DTYPE))
    w = torch.ones(F, dtype=per_func.dtype, device=per_func.device) if weights is None else weights.to(per_func)
    if w.shape != (F,):
        raise ShapeError(f"weights must have shape (F,) = ({F},), one per reward function, got {tuple(w.shape)}")
    if group_size < 1 or B % group_size != 0:
        raise ShapeError(f"group_size={group_size} must be >= 1 and divide the batch size B={B}")
    check_choice("mode", mode, MULTI_REWARD_MODES)
    if mode == "normalize_then_sum":
        grouped = per_func.T.reshape(F, -1, group_size)  # (F, N, G)
        centred = grouped - grouped.mean(dim=2, keepdim=True)
        std = grouped.std(dim=2, keepdim=True) if group_size > 1 else torch.zeros_like(centred[..., :1])
        same = grouped.amax(dim=2, keepdim=True) == grouped.amin(dim=2, keepdim=True)
        per_func = (centred / (std + eps)).masked_fill(same, 0.0).reshape(F, B).T
    return per_func @ w


# ---------------------------------------------------------------------------------------------


def reads_keep(fn) -> bool:
    """Whether a registered estimator takes rollout rejection's ``keep`` mask itself (its
    token-level returns / whitening change when rejection holes the mask: reinforce_pp,
    reinforce_pp_baseline, gae; see each one's docstring for verl's behaviour): read from its
    signature, so a later estimator opts in by taking ``keep``."""
    return "keep" in inspect.signature(fn).parameters


def compute_advantages(
    estimator: str,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    cfg: AdvantageConfig = AdvantageConfig(),
    *,
    kl: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    baselines: torch.Tensor | None = None,
    old_logp: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
) -> Advantages:
    """Validate inputs, run the registered estimator, optionally whiten. See module docstring.

    baselines (B,) go to BASELINE_ESTIMATORS only; old_logp, sum_pi_squared and is_weights (B, T)
    to POLICY_STAT_ESTIMATORS only (others ignore them).

    keep (B, T) 0/1: rollout rejection's keep-mask, applied as verl's driver does (rejection
    multiplies response_mask AFTER the reward and the in-reward KL are placed on the full mask,
    BEFORE compute_advantage). Estimators that take ``keep`` (``reads_keep``: token-level returns / whitening) get it;
    every other estimator runs on the full mask and its rejected tokens get advantage 0 (verl
    broadcasts their sequence scores with ``* response_mask``); ``cfg.whiten`` whitens over the
    kept tokens. keep=None is today's path, bit for bit."""
    fn = ADVANTAGE_ESTIMATORS.get(estimator)
    B, _ = check_2d("mask", mask)
    check_sequence_vector("rewards", rewards, B)
    extra = {}
    if estimator in BASELINE_ESTIMATORS:
        if baselines is None:
            raise ValueError(f"advantage estimator {estimator!r} needs baselines (B,): the reward of each prompt's greedy completion")
        check_sequence_vector("baselines", baselines, B)
        extra["baselines"] = baselines
    if estimator in POLICY_STAT_ESTIMATORS:
        if old_logp is None or sum_pi_squared is None:
            raise ValueError(f"advantage estimator {estimator!r} needs old_logp and sum_pi_squared (B, T): the old "
                             "policy's log-probs of the sampled tokens and sum_v pi_v^2 at each position")
        check_like("mask", mask, old_logp=old_logp, sum_pi_squared=sum_pi_squared, is_weights=is_weights)
        extra.update(old_logp=old_logp.detach(), sum_pi_squared=sum_pi_squared.detach(),
                     is_weights=None if is_weights is None else is_weights.detach())
    check_like("mask", mask, kl=kl, values=values)
    if cfg.group_size < 1 or B % cfg.group_size != 0:
        raise ShapeError(f"group_size={cfg.group_size} must be >= 1 and divide the batch size B={B}")
    if cfg.kl_coef != 0.0 and kl is None:
        raise ValueError(f"kl_coef={cfg.kl_coef} puts the KL in the reward, so kl (B, T) is required")
    rewards = rewards.to(torch.promote_types(rewards.dtype, REWARD_DTYPE))
    check_like("mask", mask, keep=keep)
    kept = mask if keep is None else mask * keep.to(mask.dtype)
    if keep is not None and reads_keep(fn):
        extra["keep"] = keep.to(mask.dtype)
    out = fn(rewards, mask, cfg, kl=kl, values=values, **extra)
    if keep is not None and not reads_keep(fn):
        out = Advantages(zero_padding(out.advantages, kept), out.returns)
    if cfg.whiten:
        out = Advantages(masked_whiten(out.advantages, kept, shift_mean=True), out.returns)
    return out
