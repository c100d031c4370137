"""Policy losses. One contract for all of them:

    fn(logp (B, T), old_logp (B, T), advantages (B, T), mask (B, T), cfg: PolicyLossConfig)
        -> (loss_per_token (B, T), PolicyDiagnostics)

``loss_per_token`` is to be *minimised* and is not yet aggregated (see ``aggregation.py``);
padding positions are 0. ``old_logp`` is detached by the caller; with a single gradient step
per batch pass ``logp.detach()``: then rho = 1 but d rho = d logp, so the gradient is the
on-policy policy gradient.

Diagnostics use TRL's metric names (``clip_ratio/low_mean`` ...) and label every token with the
PPO region it fell in and whether its gradient is exactly zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from .choices import CISPO_BOUNDS, DPPO_TIS_CAP, GSPO_VARIANTS, REINFORCE_FORMS, PolicyLossConfig  # noqa: F401 (no torch: the recipe reads them)
from .masked import masked_mean, masked_sum, zero_padding
from .registry import Registry
from .shapes import check_2d, check_like

# Token log-ratios are clamped to [-20, 20] before exp, as verl's PPO losses clamp
# negative_approx_kl, so a single token cannot overflow.
LOG_RATIO_CLAMP = 20.0
# GSPO's sequence log-ratio log s_i is clamped from above only, at 10, as verl's
# compute_policy_loss_gspo does (torch.clamp(log_seq_importance_ratio, max=10.0), verl 0.9.1):
# s_i is a geometric mean, so e^10 is already far outside any trust region and beyond it the
# token gets no gradient; below, exp cannot overflow and needs no bound.
GSPO_LOG_RATIO_MAX = 10.0
# DPPO truncates its detached ratio at clip_c; unset, at DPPO_TIS_CAP = verl 0.9.1's default
# clip_ratio_c, 3.0 (ActorConfig.clip_ratio_c and actor.yaml, shared with dual-clip PPO; why 3.0
# and not verl's 20.0 fallback: algorithms/policy_losses.py).
# DPPO-KL's binary KL adds 1e-8 inside log((1 - p_old) / (1 - p)) (verl), so p -> 1 stays finite.
DPPO_KL_EPS = 1e-8

REGION_NAMES: tuple[str, ...] = ("trust", "clipped_high", "clipped_low", "dual_clipped")
TRUST, CLIPPED_HIGH, CLIPPED_LOW, DUAL_CLIPPED = range(4)
PADDING = -1  # region code of masked positions


@dataclass
class PolicyDiagnostics:
    """What a policy loss reports besides its value.

    metrics: scalar tensors under TRL's names (``clip_ratio/low_mean``, ``approx_kl`` ...).
    ratio: (B, T) the ratio the loss used (sequence ratio broadcast for GSPO), detached.
    region: (B, T) int64 codes into REGION_NAMES, PADDING on masked positions.
    zero_grad: (B, T) bool, True where the token's gradient is exactly zero (and on padding).
    """

    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    ratio: torch.Tensor | None = None
    region: torch.Tensor | None = None
    zero_grad: torch.Tensor | None = None


PolicyLossFn = Callable[..., tuple[torch.Tensor, PolicyDiagnostics]]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


def safe_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def approx_kl(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0.5 * mean over valid tokens of (logp - old_logp)^2 (PPO's usual drift diagnostic)."""
    return masked_mean(0.5 * (logp - old_logp).detach() ** 2, mask)


def dual_clip_cap(cfg: PolicyLossConfig) -> float | None:
    """The ratio above which a negative-advantage token is capped (dual clip or TRL's delta)."""
    caps = [c for c in (cfg.clip_c, cfg.delta) if c is not None]
    return min(caps) if caps else None


def ppo_regions(ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, cfg: PolicyLossConfig):
    """Label each token with its PPO region and whether its gradient is zero.

    The six cases of the clipped objective (RLHF book, policy-gradient chapter):
        A > 0: rho < 1 + eps_high -> trust (gradient flows); rho > 1 + eps_high -> clipped_high (0)
        A < 0: rho > 1 - eps_low  -> trust;                  rho < 1 - eps_low  -> clipped_low (0)
        A < 0 with dual clip/delta: rho > cap -> dual_clipped (0)
        A = 0: trust, gradient 0.
    ratio, advantages, mask: (B, T) -> region (B, T) int64, zero_grad (B, T) bool.
    """
    pos, neg = advantages > 0, advantages < 0
    high = pos & (ratio > 1.0 + cfg.eps_high)
    low = neg & (ratio < 1.0 - cfg.eps_low)
    cap = dual_clip_cap(cfg)
    dual = neg & (ratio > cap) if cap is not None else torch.zeros_like(high)
    # the three clipped cases are mutually exclusive, so the codes can simply be added
    region = _label(high, low, dual, mask)
    zero_grad = high | low | dual | (advantages == 0) | ~mask.bool()
    return region, zero_grad


def _label(high: torch.Tensor, low: torch.Tensor, dual: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
    """Region codes from disjoint boolean masks (B, T); PADDING where mask is 0."""
    region = CLIPPED_HIGH * high.to(torch.int64) + CLIPPED_LOW * low.to(torch.int64)
    if dual is not None:
        region = region + DUAL_CLIPPED * dual.to(torch.int64)
    return region.masked_fill(~mask.bool(), PADDING)


def _region_metrics(region: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """TRL's clip fractions over valid tokens, from the region labels."""
    low = masked_mean((region == CLIPPED_LOW).float(), mask)
    high = masked_mean((region == CLIPPED_HIGH).float(), mask)
    return {
        "clip_ratio/low_mean": low,
        "clip_ratio/high_mean": high,
        "clip_ratio/region_mean": low + high,
        "clip_ratio/dual_mean": masked_mean((region == DUAL_CLIPPED).float(), mask),
    }


def sequence_clip_fractions(region: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per sequence, the fraction of its valid tokens clipped low / high: TRL 1.16's
    ``masked_seq_mean(is_low_clipped)`` / ``masked_seq_mean(is_high_clipped)``, which it gathers
    over ranks and logs as ``clip_ratio/low_min`` = nanmin and ``clip_ratio/high_max`` = nanmax
    over the sequences of each micro-batch.

        f_i = sum_t 1[region_it = c] m_it / sum_t m_it       (NaN for a row without valid tokens)

    region, mask (B, T) -> {"clip_ratio/low_min": (B,), "clip_ratio/high_max": (B,)}, keyed by
    the metric each feeds.
    """
    check_like("region", region, mask=mask)
    valid = mask.to(torch.float32)
    count = valid.sum(dim=1)

    def fraction(code: int) -> torch.Tensor:
        return ((region == code).to(torch.float32) * valid).sum(dim=1) / count  # 0 / 0 = NaN, as TRL

    return {"clip_ratio/low_min": fraction(CLIPPED_LOW), "clip_ratio/high_max": fraction(CLIPPED_HIGH)}


def clipped_objective(ratio: torch.Tensor, advantages: torch.Tensor, cfg: PolicyLossConfig) -> torch.Tensor:
    """Per-token PPO loss  -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A), with the dual clip
    min(., -c A) for A < 0 (verl) and TRL's cap of rho at delta in the unclipped term.
    (B, T) -> (B, T)."""
    clipped = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    unclipped = ratio if cfg.delta is None else ratio.clamp(max=cfg.delta)
    loss = -torch.minimum(unclipped * advantages, clipped * advantages)
    if cfg.clip_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -cfg.clip_c * advantages), loss)
    return loss


def _finish(loss, ratio, advantages, mask, cfg, logp, old_logp, extra=None) -> tuple[torch.Tensor, PolicyDiagnostics]:
    region, zero_grad = ppo_regions(ratio.detach(), advantages, mask, cfg)
    metrics = {**_region_metrics(region, mask), "approx_kl": approx_kl(logp, old_logp, mask), **(extra or {})}
    return zero_padding(loss, mask), PolicyDiagnostics(metrics, ratio.detach(), region, zero_grad)


@POLICY_LOSSES.register("clip")
def clip_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """PPO / GRPO / DAPO token-level clipped surrogate with rho_t = exp(logp_t - old_t)."""
    ratio = safe_exp(logp - old_logp)
    return _finish(clipped_objective(ratio, advantages, cfg), ratio, advantages, mask, cfg, logp, old_logp)


def sequence_log_ratio(logp, old_logp, mask) -> torch.Tensor:
    """GSPO's log s_i = sum_t (logp - old) m / n_i: the log of the length-normalised geometric
    mean of the token ratios. (B, T) -> (B,)."""
    return masked_sum(logp - old_logp, mask, dim=1) / mask.sum(dim=1).clamp(min=1).to(logp.dtype)


@POLICY_LOSSES.register("gspo")
def gspo_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """GSPO (Zheng et al. 2025): the clipped objective on the sequence ratio s_i, the same on
    every token of sequence i, with log s_i clamped at GSPO_LOG_RATIO_MAX (verl's 10). Clip
    fractions are fractions of *sequences*."""
    log_s = sequence_log_ratio(logp, old_logp, mask)[:, None]
    if cfg.gspo_variant == "token":  # verl: sg(log s_i) + logp - sg(logp)
        log_s = log_s.detach() + logp - logp.detach()
    else:
        log_s = log_s.expand_as(logp)
    ratio = torch.exp(log_s.clamp(max=GSPO_LOG_RATIO_MAX))
    loss, diag = _finish(clipped_objective(ratio, advantages, cfg), ratio, advantages, mask, cfg, logp, old_logp)
    # With sequence-level advantages every valid token of a sequence shares its region (a
    # clipped sequence passes no gradient to any token), so report fractions of sequences; with
    # token-level advantages the most-clipped label of the row stands for the sequence.
    seq_mask = (mask.sum(dim=1, keepdim=True) > 0).to(mask.dtype)
    seq_region = diag.region.max(dim=1, keepdim=True).values
    diag.metrics.update(_region_metrics(torch.where(seq_mask.bool(), seq_region, PADDING), seq_mask))
    return loss, diag


@POLICY_LOSSES.register("cispo")
def cispo_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """CISPO (MiniMax-M1, 2025): -sg(clip(rho)) A logp. The importance weight is clipped and
    detached, so every token keeps a gradient -w A d logp; clipping never zeroes it.

    Regions describe the *weight* with the signs of ESTIMATORS.md (and TRL, which counts CISPO
    clipping for A > 0): clipped_high = weight at the upper bound and A > 0, clipped_low = at the
    lower bound and A < 0, so ``clip_ratio/{high,low}_mean`` mean what they mean for ``clip``.
    ``cispo/clip_ratio`` counts every clipped weight whatever the sign of A.
    """
    ratio = safe_exp(logp - old_logp)
    if cfg.cispo_bounds == "relative":
        low, high = 1.0 - cfg.eps_low, 1.0 + cfg.eps_high
    else:  # TRL: absolute cap eps_high, no lower bound
        low, high = 0.0, cfg.eps_high
    weight = ratio.detach().clamp(low, high)
    loss = zero_padding(-weight * advantages * logp, mask)
    above, below = ratio.detach() > high, ratio.detach() < low
    region = _label(above & (advantages > 0), below & (advantages < 0), None, mask)
    zero_grad = (advantages == 0) | ~mask.bool()
    metrics = {
        **_region_metrics(region, mask),
        "cispo/clip_ratio": masked_mean((above | below).float(), mask),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }
    return loss, PolicyDiagnostics(metrics, ratio.detach(), region, zero_grad)


@POLICY_LOSSES.register("reinforce")
def reinforce_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """Vanilla policy gradient (Williams 1992), no clipping: -A logp, or -A rho (``ratio`` form)."""
    ratio = safe_exp(logp - old_logp)
    surrogate = logp if cfg.reinforce_form == "logp" else ratio
    loss = zero_padding(-advantages * surrogate, mask)
    nothing = torch.zeros_like(mask, dtype=torch.bool)
    region = _label(nothing, nothing, None, mask)
    metrics = {**_region_metrics(region, mask), "approx_kl": approx_kl(logp, old_logp, mask)}
    return loss, PolicyDiagnostics(metrics, ratio.detach(), region, (advantages == 0) | ~mask.bool())


@POLICY_LOSSES.register("sapo")
def sapo_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """SAPO, Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv 2511.20347): a smooth gate
    in place of the hard clip,

        loss_t = -f(rho_t) A_t,   f(rho) = sigmoid(tau (rho - 1)) * 4 / tau,
        tau = sapo_tau_pos if A_t > 0 else sapo_tau_neg        (TRL loss_type="sapo", verl "sapo")

    d loss / d logp = -A * 4 sigmoid(x)(1 - sigmoid(x)) rho with x = tau (rho - 1): equal to the
    policy gradient -A at rho = 1, decaying smoothly (never exactly 0) as rho leaves 1, faster
    for larger tau. No token is clipped, so every region is ``trust``; ``sapo/gate_mean`` is
    the mean of 4 s (1 - s) rho over valid tokens (1 on-policy): how much of the gradient passes.
    """
    ratio = safe_exp(logp - old_logp)
    pos, neg = (torch.as_tensor(t, dtype=ratio.dtype, device=ratio.device) for t in (cfg.sapo_tau_pos, cfg.sapo_tau_neg))
    tau = torch.where(advantages > 0, pos, neg)
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = zero_padding(-gate * (4.0 / tau) * advantages, mask)
    passed = (4.0 * gate * (1.0 - gate) * ratio).detach()
    return _unclipped(loss, ratio, advantages, mask, logp, old_logp, {"sapo/gate_mean": masked_mean(passed, mask)})


def _unclipped(loss, ratio, advantages, mask, logp, old_logp, extra=None, zero_grad=None):
    """Diagnostics of a loss with no hard clip: every valid token is ``trust``."""
    nothing = torch.zeros_like(mask, dtype=torch.bool)
    region = _label(nothing, nothing, None, mask)
    if zero_grad is None:
        zero_grad = (advantages == 0) | ~mask.bool()
    metrics = {**_region_metrics(region, mask), "approx_kl": approx_kl(logp, old_logp, mask), **(extra or {})}
    return loss, PolicyDiagnostics(metrics, ratio.detach(), region, zero_grad)


@POLICY_LOSSES.register("gmpo")
def gmpo_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv 2507.20673; verl
    ``geo_mean``): the sequence objective uses the geometric mean of token ratios clipped in
    log space,

        l_t   = logp_t - old_t
        l~_t  = sign(A) min(sign(A) l_t, sign(A) clip(l_t, -eps_low, eps_high))
        R_i   = exp( sum_t l~_t m_t / n_i ),   A_i = sum_t A_t m_t / n_i
        loss_i = -A_i R_i                        (written on every valid token of sequence i)

    eps_low / eps_high bound the *log*-ratio (the paper's 0.4 = ratio in [e^-0.4, e^0.4]).
    A clipped token (A > 0 and l > eps_high, or A < 0 and l < -eps_low) gets no gradient, the
    others of its sequence still do. verl averages loss_i over all B rows (``torch.mean``; a row
    with no valid token counts, with loss 0). ``seq-mean-token-mean`` gives the same number
    (up to verl's n_i + 1e-8) when every row has a valid token, or whenever num_seqs = B is
    passed; with e all-masked rows its default num_seqs (rows with a valid token) gives
    B / (B - e) times verl's. The trainer's num_seqs counts completions, so a completion masked
    out of the loss (truncation masking, OPSM) still counts, as in verl. l_t is clamped to
    +-LOG_RATIO_CLAMP (verl leaves that clamp commented out; the two agree for |l_t| < 20).
    """
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    sign = torch.sign(advantages)
    clamped = log_ratio.clamp(-cfg.eps_low, cfg.eps_high)
    kept = sign * torch.minimum(sign * log_ratio, sign * clamped)
    n = mask.sum(dim=1, keepdim=True).clamp(min=1).to(logp.dtype)
    seq_ratio = torch.exp(masked_sum(kept, mask, dim=1)[:, None] / n)  # (B, 1)
    seq_adv = masked_sum(advantages, mask, dim=1)[:, None] / n
    loss = zero_padding((-seq_adv * seq_ratio).expand_as(logp), mask)
    detached = log_ratio.detach()
    high = (advantages > 0) & (detached > cfg.eps_high)
    low = (advantages < 0) & (detached < -cfg.eps_low)
    region = _label(high, low, None, mask)
    zero_grad = high | low | (seq_adv == 0).expand_as(high) | ~mask.bool()
    metrics = {**_region_metrics(region, mask), "approx_kl": approx_kl(logp, old_logp, mask)}
    return loss, PolicyDiagnostics(metrics, seq_ratio.detach().expand_as(logp), region, zero_grad)


def _dppo_tv_valid(logp, old_logp, advantages, cfg):
    """DPPO-Binary-TV trust region: A > 0 keeps p - p_old <= eps_high, A <= 0 keeps p - p_old >= -eps_low."""
    prob, old_prob = torch.exp(logp), torch.exp(old_logp)
    return torch.where(advantages > 0, prob - old_prob <= cfg.eps_high, prob - old_prob >= -cfg.eps_low)


def _dppo_kl_valid(logp, old_logp, advantages, cfg):
    """DPPO-Binary-KL trust region on the two-outcome KL between Bernoulli(p_old) and Bernoulli(p)
    (did the sampled token come out or not):
        KL_b = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + e) / (1 - p + e)),  e = 1e-8
    A > 0 keeps KL_b <= eps_high or p <= p_old; A <= 0 keeps KL_b <= eps_low or p >= p_old."""
    prob, old_prob = torch.exp(logp), torch.exp(old_logp)
    binary_kl = old_prob * (old_logp - logp) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + DPPO_KL_EPS) / (1.0 - prob + DPPO_KL_EPS))
    return torch.where(advantages > 0, (binary_kl <= cfg.eps_high) | (prob <= old_prob),
                       (binary_kl <= cfg.eps_low) | (prob >= old_prob))


def _dppo_loss(logp, old_logp, advantages, mask, cfg, valid_fn):
    """DPPO (Divergence PPO, arXiv 2602.04879; verl ``dppo_tv`` / ``dppo_kl``): the trust region
    is set on a divergence between the token's old and new *probabilities* rather than on their
    ratio (a ratio of 100 from 1e-5 to 1e-3 is a tiny move; 0.99 -> 0.8 is a large one):

        loss_t = -A_t sg(min(rho_t, C)) logp_t valid_t,    C = clip_c or DPPO_TIS_CAP (3, verl's clip_ratio_c)

    valid_t (detached) comes from ``valid_fn``. The gradient is -A min(rho, C) d logp inside the
    region and exactly 0 outside. eps_low / eps_high are the divergence thresholds. Regions:
    clipped_high = outside with A > 0, clipped_low = outside with A < 0; ``dppo/masked_mean`` is
    every token outside (verl's pg_clipfrac), ``dppo/truncated_mean`` the valid tokens whose
    ratio was truncated at C.
    """
    cap = cfg.clip_c if cfg.clip_c is not None else DPPO_TIS_CAP
    ratio = safe_exp(logp - old_logp)
    truncated = ratio.detach().clamp(max=cap)
    valid = valid_fn(logp.detach(), old_logp, advantages, cfg)
    loss = zero_padding(-advantages * truncated * logp * valid.to(logp.dtype), mask)
    region = _label(~valid & (advantages > 0), ~valid & (advantages < 0), None, mask)
    zero_grad = ~valid | (advantages == 0) | ~mask.bool()
    metrics = {
        **_region_metrics(region, mask),
        "dppo/masked_mean": masked_mean((~valid).to(logp.dtype), mask),
        "dppo/truncated_mean": masked_mean(((ratio.detach() > cap) & valid).to(logp.dtype), mask),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }
    return loss, PolicyDiagnostics(metrics, ratio.detach(), region, zero_grad)


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """DPPO-Binary-TV: valid iff p - p_old <= eps_high (A > 0) / >= -eps_low (A <= 0). See _dppo_loss."""
    return _dppo_loss(logp, old_logp, advantages, mask, cfg, _dppo_tv_valid)


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """DPPO-Binary-KL: valid iff the binary KL is within eps_high / eps_low or p moved the way
    the advantage does not push it. See _dppo_loss and _dppo_kl_valid."""
    return _dppo_loss(logp, old_logp, advantages, mask, cfg, _dppo_kl_valid)


# A batch whose valid values all lie within this many ulps of their largest |value| is constant:
# the mean of n equal values is not always that value in floating point, and padding (or an
# upstream estimator, e.g. ReMax on a row of constant reward) moves them by an ulp, so the
# deviations would be +-1e-16 with signs that depend on where the padding sits. Such a batch is
# centred to exactly 0 (every Cov_t = 0: a tie, broken by ``_top_k_valid``). Any other batch is
# centred exactly as verl does (x - masked mean, in x's dtype), so its numbers are verl's.
COV_NOISE_ULPS = 64


def _centred(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x - masked mean of x over the valid tokens (verl's arithmetic); all 0 when the valid values
    are one value up to rounding (``COV_NOISE_ULPS`` float32 ulps at least, so a bf16 batch is
    constant only when its values are equal)."""
    dev = x - masked_mean(x, mask)
    valid = x[mask > 0]
    if valid.numel() == 0:
        return dev
    eps = torch.finfo(torch.float32 if torch.finfo(x.dtype).bits < 32 else x.dtype).eps
    spread, scale = (valid.max() - valid.min()).float(), valid.abs().max().float()
    return torch.zeros_like(dev) if bool(spread <= COV_NOISE_ULPS * eps * scale) else dev


def token_covariance(logp, advantages, mask) -> torch.Tensor:
    """Cov_t = (A_t - mean A)(logp_t - mean logp), means over the valid tokens of the batch
    (Cui et al. 2025: entropy falls in proportion to this covariance). (B, T) -> (B, T), detached.
    A factor whose valid values are one value up to rounding is centred to exactly 0 (``_centred``)."""
    return _centred(advantages.detach(), mask) * _centred(logp.detach(), mask)


def _top_k_valid(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest of ``values`` (one per valid token, in row-major valid order),
    ties going to the earlier valid token: a stable descending sort, i.e. top-k over the key
    (value, -valid_token_index). verl's ``torch.topk`` leaves ties arbitrary (and 0.0 / -0.0
    tie); here the order of valid tokens, which padding cannot change, decides. Without ties the
    set is exactly topk's."""
    return torch.sort(values, descending=True, stable=True).indices[:k]


def _valid_positions(mask: torch.Tensor) -> torch.Tensor:
    """Flat indices of the valid tokens, row-major. (B, T) -> (N,). Selections index into this, so
    they do not depend on where padding sits."""
    return torch.nonzero(mask.reshape(-1) > 0).squeeze(1)


def _flat_select(mask: torch.Tensor, flat_idx: torch.Tensor) -> torch.Tensor:
    selected = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    selected[flat_idx] = True
    return selected.view_as(mask)


@POLICY_LOSSES.register("clip_cov")
def clip_cov_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"; verl
    ``clip_cov``): the PPO clipped loss (no dual clip), plus: among the valid tokens not already
    clipped whose covariance Cov_t (``token_covariance``) lies strictly inside
    (clip_cov_lb, clip_cov_ub), k = max(1, floor(clip_cov_ratio * n_valid)) are drawn at random
    and their loss is set to 0 (the paper detaches them; verl, followed here, zeroes the value
    too; the gradient is the same: none).

        loss_t = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A) * (1 - selected_t)

    The draw uses ``cfg.cov_seed`` (see PolicyLossConfig) over the valid tokens in row-major
    order, so it does not depend on padding; nor does the band test at an edge of 0, since a
    batch of one value up to rounding has covariance exactly 0 (``_centred``). Statistics are over the tokens of this call (as in
    verl: per micro-batch). ``clip_cov/selected_mean`` = fraction of valid tokens drawn.
    """
    plain = replace(cfg, clip_c=None, delta=None)
    ratio = safe_exp(logp - old_logp)
    per_token = clipped_objective(ratio, advantages, plain)
    region, zero_grad = ppo_regions(ratio.detach(), advantages, mask, plain)
    cov = token_covariance(logp, advantages, mask)
    candidates = (region == TRUST) & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub) & mask.bool()
    valid = _valid_positions(mask)
    pool = torch.nonzero(candidates.reshape(-1)[valid]).squeeze(1)  # positions within the valid tokens
    k = min(max(int(cfg.clip_cov_ratio * valid.numel()), 1), pool.numel())
    generator = None if cfg.cov_seed is None else torch.Generator().manual_seed(cfg.cov_seed)
    drawn = pool[torch.randperm(pool.numel(), generator=generator)[:k].to(pool.device)]
    selected = _flat_select(mask, valid[drawn])
    loss = zero_padding(per_token * (~selected).to(per_token.dtype), mask)
    metrics = {
        **_region_metrics(region, mask),
        "clip_cov/selected_mean": masked_mean(selected.to(logp.dtype), mask),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }
    return loss, PolicyDiagnostics(metrics, ratio.detach(), region, zero_grad | selected)


@POLICY_LOSSES.register("kl_cov")
def kl_cov_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """KL-Cov (same paper; verl ``kl_cov``): no clipping; the k = max(1, floor(kl_cov_ratio *
    n_valid)) valid tokens with the largest Cov_t (``token_covariance``; ties go to the earlier valid
    token, ``_top_k_valid``, so padding cannot change the choice) get a KL penalty on the ratio:

        loss_t = -A_t rho_t + kl_cov_coef |logp_t - old_t| selected_t

    ``kl_cov/selected_mean`` = fraction of valid tokens penalised. Statistics are per call.
    """
    ratio = safe_exp(logp - old_logp)
    log_ratio = logp - old_logp
    valid = _valid_positions(mask)
    k = min(max(int(cfg.kl_cov_ratio * valid.numel()), 1), valid.numel())
    cov = token_covariance(logp, advantages, mask).reshape(-1)[valid]
    selected = _flat_select(mask, valid[_top_k_valid(cov, k)])
    penalty = cfg.kl_cov_coef * log_ratio.abs() * selected.to(logp.dtype)
    loss = zero_padding(-advantages * ratio + penalty, mask)
    zero_grad = ((advantages == 0) & (~selected | (log_ratio.detach() == 0))) | ~mask.bool()
    extra = {"kl_cov/selected_mean": masked_mean(selected.to(logp.dtype), mask)}
    return _unclipped(loss, ratio, advantages, mask, logp, old_logp, extra, zero_grad)


@POLICY_LOSSES.register("gpg")
def gpg_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """GPG, Group Policy Gradient (Chu et al. 2025, arXiv 2504.02546; verl ``gpg``): the plain
    policy gradient -A_t logp_t, no ratio, no clip (= ``reinforce`` with reinforce_form="logp",
    whatever cfg says). d loss / d logp_t = -A_t on every valid token."""
    return reinforce_policy_loss(logp, old_logp, advantages, mask, replace(cfg, reinforce_form="logp"))


# VESPO's log w is clamped to [log 1e-8, 20] as TRL 1.16's get_gamma_weights does (its lower
# bound "for matching truthfully the original implementation"), and lambda from below at 1e-4.
VESPO_LOG_W_MIN = math.log(1e-8)
VESPO_LOG_W_MAX = 20.0
VESPO_LAMBDA_MIN = 1e-4


def vespo_gamma_weights(log_ratio, advantages, mask, cfg: PolicyLossConfig) -> torch.Tensor:
    """VESPO's detached weight phi (B, T): the Gamma-shaped function of the sequence ratio

        log w_i = clamp( sum_t clamp(l_it, +-20) m_it, log 1e-8, 20 )
        phi     = exp( lambda + k log w - lambda w ),   (k, lambda) = (k_pos, lambda_pos) if A >= 0
                                                          else (k_neg, lambda_neg)

    l = logp - old_logp (B, T); w is the *product* of the token ratios (not GSPO's geometric
    mean). phi(1) = 1 and phi peaks at w = k / lambda (its height is bounded by PolicyLossConfig:
    VESPO_MAX_PEAK). TRL also folds token-level rollout IS weights into w; here the rollout
    correction multiplies the loss, as for every loss (the spec says so). Non-finite phi becomes
    0, as in TRL.
    """
    log_ratio = log_ratio.detach()
    seq = masked_sum(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), mask, dim=1)[:, None]
    log_w = seq.clamp(VESPO_LOG_W_MIN, VESPO_LOG_W_MAX)
    nonneg = advantages >= 0

    def by_sign(pos: float, neg: float) -> torch.Tensor:  # in log_ratio's dtype (TRL rounds the knobs to float32 first)
        as_t = lambda v: torch.as_tensor(v, dtype=log_ratio.dtype, device=log_ratio.device)  # noqa: E731
        return torch.where(nonneg, as_t(pos), as_t(neg))

    k = by_sign(cfg.vespo_k_pos, cfg.vespo_k_neg)
    lam = by_sign(cfg.vespo_lambda_pos, cfg.vespo_lambda_neg).clamp(min=VESPO_LAMBDA_MIN)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@POLICY_LOSSES.register("vespo")
def vespo_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """VESPO, Variational Sequence-Level Soft Policy Optimization (arXiv 2602.10693; TRL 1.16
    ``loss_type="vespo"``): a smooth, asymmetric Gamma weight of the sequence ratio in place of
    the hard clip,

        loss_t = -phi(w_i) A_t logp_t,    phi detached (``vespo_gamma_weights``)

    so d loss / d logp_t = -phi A_t: the policy gradient scaled down smoothly as the sequence
    drifts off-policy (never exactly 0 for finite w). It works from *token* log-ratios (TRL warns
    unless importance_sampling_level="token" and refuses sequence-level rollout IS). No token is
    clipped: every region is ``trust``. ``vespo/phi_seq_mean``: mean over sequences with a valid
    token of their phi (TRL's metric for sequence-level advantages). TRL aggregates vespo by
    token sum / tokens in the batch (``token-mean``).
    """
    ratio = safe_exp(logp - old_logp)
    phi = vespo_gamma_weights(logp - old_logp, advantages, mask, cfg)
    loss = zero_padding(-phi * advantages * logp, mask)
    rows = mask.sum(dim=1) > 0
    per_seq = masked_sum(phi, mask, dim=1)[rows] / mask.sum(dim=1)[rows].to(phi.dtype)
    phi_mean = per_seq.mean() if per_seq.numel() else torch.zeros((), dtype=phi.dtype, device=phi.device)
    zero_grad = (advantages == 0) | (phi == 0) | ~mask.bool()
    return _unclipped(loss, ratio, advantages, mask, logp, old_logp, {"vespo/phi_seq_mean": phi_mean}, zero_grad)


@POLICY_LOSSES.register("dro")
def dro_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """DRO, Direct Reward Optimization with a quadratic log-ratio penalty (verl 0.9.1
    ``compute_policy_loss_dro``, docs/algo/dro.md):

        loss_t = -( A_t logp_t - beta / 2 (logp_t - old_t)^2 ),     beta = cfg.dro_beta > 0

    d loss / d logp_t = -A_t + beta (logp_t - old_t): the policy gradient plus a pull back to the
    old policy that grows with the drift (a k2 trust region, soft, no clip). There is no ratio in
    the loss, so the region of every token is ``trust``; its gradient is 0 only where A_t = 0 and
    logp_t = old_t. verl requires dro_beta (null by default); here it defaults to 0.05, the value
    of verl's usage example.
    """
    log_ratio = logp - old_logp
    ratio = safe_exp(log_ratio)
    loss = zero_padding(-(logp * advantages - 0.5 * cfg.dro_beta * log_ratio.square()), mask)
    zero_grad = ((advantages == 0) & (log_ratio.detach() == 0)) | ~mask.bool()
    return _unclipped(loss, ratio, advantages, mask, logp, old_logp, None, zero_grad)


def compute_policy_loss(
    name: str,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: PolicyLossConfig = PolicyLossConfig(),
) -> tuple[torch.Tensor, PolicyDiagnostics]:
    """Validate shapes and run the registered policy loss ``name``."""
    fn = POLICY_LOSSES.get(name)
    check_2d("logp", logp)
    check_like("logp", logp, old_logp=old_logp, advantages=advantages, mask=mask)
    return fn(logp, old_logp.detach(), advantages.detach(), mask, cfg)
