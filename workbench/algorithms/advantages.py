"""Specs of the advantage estimators (``workbench.core.advantages.ADVANTAGE_ESTIMATORS``), one per
registered name, in registry order. Their knobs are ``AdvantageConfig`` attributes (``config``)
set by recipe fields the recipe declares."""

from __future__ import annotations

from .rules import off_unless
from .spec import Knob, RecipeData, Spec, Walkthrough, by_name, setting

CORE = "workbench.core.advantages"

#: GRPO's std: per group (GRPO), over the batch (TRL scale_rewards='batch'), none (Dr. GRPO).
GRPO_SCALES: tuple[str, ...] = ("group", "batch", "none")
#: GPG's batch rescaling alpha (gpg_advantages): the paper's B / (B - M), verl's B / (rewards != 0), or none.
GPG_ALPHAS: tuple[str, ...] = ("paper", "verl", "none")

GROUP_SIZE = Knob("sampling.num_generations", config="group_size", shared=True)
SCALE = Knob("algorithm.grpo_scale", config="scale", choices=GRPO_SCALES)
EPS = Knob("algorithm.adv_eps", config="eps",
           inert_when=lambda d: ("algorithm.grpo_scale='none': no std to add it to"
                                 if setting(d, "algorithm.grpo_scale") == "none" else None))
GAMMA = Knob("algorithm.gamma")
LAM = Knob("algorithm.lam")
KL_IN_REWARD = Knob("algorithm.kl_coef", config="kl_coef", shared=True)
GPG_ALPHA = Knob("algorithm.gpg_alpha", choices=GPG_ALPHAS)

#: The optimal token baselines' path weight: the score's variance accumulated along the completion.
OTB_EQUATIONS = (r"W_{i,t} = \sum_{j \le t} \big(1 - 2\pi_{i,j} + \textstyle\sum_v \pi_{i,j,v}^2\big)\,[\rho_{i,j}^2]",
                 r"B_t = \frac{\sum_{i \in g} G_{i,t} W_{i,t}}{\sum_{i \in g} W_{i,t}},\qquad A_{i,t} = G_{i,t} - B_t")

GROUP_MEAN = r"\operatorname{mean}_g(r)"


def no_critic(data: RecipeData) -> dict[str, str]:
    """Every estimator but the critic's: the value-loss settings are never read."""
    why = f"algorithm.advantage={setting(data, 'algorithm.advantage')!r} trains no critic"
    return {"algorithm.value_clip": why, "algorithm.vf_coef": why, "optim.critic_lr": why}


SPECS: dict[str, Spec] = by_name(
    Spec("advantage", "grpo", "GRPO", f"{CORE}:grpo_advantages",
         (r"A_i = \frac{r_i - \operatorname{mean}_g(r)}{\operatorname{std}_g(r) + \varepsilon}",
          r"\text{scale = none (Dr. GRPO):}\quad A_i = r_i - \operatorname{mean}_g(r)"),
         "No critic: the other G - 1 completions of the same prompt are the baseline (DeepSeekMath, Shao et al. 2024).",
         "TRL GRPOTrainer scale_rewards='group' / 'batch' / 'none'; verl adv_estimator=grpo "
         "(norm_adv_by_std_in_grpo=False is Dr. GRPO); OpenRLHF advantage_estimator=group_norm.",
         (GROUP_SIZE, SCALE, EPS, KL_IN_REWARD),
         ("Std bias: dividing by the group's std gives the rare answer |A| = 1.5 in a group of 4, right or wrong, "
          "and cancels the reward scale (0.1, 0, 0, 0 gets the same 1.5 as 1, 0, 0, 0); scale='none' (Dr. GRPO) removes it.",
          "All-equal groups get exactly 0 (no signal)."), preset="grpo", needs_groups=True, inert_when=no_critic,
         example_variants=(("GRPO", {"scale": "group"}), ("Dr. GRPO", {"scale": "none"}),
                           ("GRPO (batch std)", {"scale": "batch"})),
         biases=lambda data: () if setting(data, "algorithm.grpo_scale") == "none" else ("std",),
         walkthroughs=(Walkthrough("grpo", "GRPO", "grpo", "Group-standardised rewards (DeepSeekMath, Shao et al. 2024), PPO clip, "
                                 "per-sequence mean, k3 KL in the loss.", biases=("std", "length"),
                                 helpers=("workbench.core.policy_losses:clip_policy_loss",
                                          "workbench.core.policy_losses:clipped_objective")),
                      Walkthrough("dr_grpo", "Dr. GRPO", "dr_grpo", "GRPO without the std and the 1/|o_i| "
                                  "normalisations (Liu et al. 2025).", biases=("std", "length")))),
    Spec("advantage", "rloo", "RLOO", f"{CORE}:rloo_advantages",
         (r"A_i = r_i - \frac{1}{G-1}\sum_{j \ne i} r_j = \frac{G}{G-1}\big(r_i - " + GROUP_MEAN + r"\big)",),
         "The baseline must not contain the completion's own reward: leave-one-out makes it unbiased "
         "(Kool et al. 2019; Ahmadian et al. 2024).",
         "TRL RLOOTrainer; verl adv_estimator=rloo; OpenRLHF advantage_estimator=rloo.",
         (GROUP_SIZE, KL_IN_REWARD), ("Equals G/(G-1) x Dr. GRPO: the same direction, a larger step.",), preset="rloo",
         needs_groups=True, inert_when=no_critic,
         walkthroughs=(Walkthrough("rloo", "RLOO", "rloo", "Leave-one-out baseline (Kool et al. 2019; Ahmadian et al. 2024); "
                                 "KL folded into the reward."),)),
    Spec("advantage", "reinforce", "REINFORCE (batch mean)", f"{CORE}:reinforce_advantages",
         (r"A_i = r_i - \operatorname{mean}_{batch}(r)",),
         "Vanilla policy gradient with the simplest variance-reducing baseline (Williams 1992).",
         "The textbook baseline; no framework default uses it for LMs.",
         (KL_IN_REWARD,), ("The baseline mixes prompts of different difficulty: an easy prompt's completions all look good.",),
         inert_when=no_critic),
    Spec("advantage", "reinforce_pp", "REINFORCE++", f"{CORE}:reinforce_pp_advantages",
         (r"r_t = -\beta\,\mathrm{KL}_t + [t = |o|]\, r", r"G_t = \sum_{l \ge 0} \gamma^l r_{t+l}",
          r"A_t = \frac{G_t - \operatorname{mean}_{batch}(G)}{\operatorname{std}_{batch}(G)}"),
         "No critic and no group: per-token returns with the KL in the reward, whitened over the whole batch (Hu 2025).",
         "OpenRLHF advantage_estimator=reinforce_plus_plus; verl adv_estimator=reinforce_plus_plus.",
         (GAMMA, KL_IN_REWARD), ("Batch whitening: the advantages of one batch always have mean 0 and std 1.",),
         preset="reinforce_pp", level="token", inert_when=no_critic,
         walkthroughs=(Walkthrough("reinforce_pp", "REINFORCE++", "reinforce_pp", "Token rewards with the KL, returns-to-go, whitened over "
                                 "the whole batch (Hu 2025): no group baseline.",
                                 helpers=(f"{CORE}:_reinforce_pp_from_sequence_rewards",)),)),
    Spec("advantage", "reinforce_pp_baseline", "REINFORCE++ baseline", f"{CORE}:reinforce_pp_baseline_advantages",
         (r"r_i \leftarrow r_i - " + GROUP_MEAN, r"\text{then as REINFORCE++}"),
         "REINFORCE++ with a group-mean baseline first, for prompts of mixed difficulty.",
         "OpenRLHF advantage_estimator=reinforce_plus_plus_baseline; verl adv_estimator=reinforce_plus_plus_baseline.",
         (GROUP_SIZE, GAMMA, KL_IN_REWARD),
         ("verl whitens sequence scores that include the summed KL; with gamma = 1 and no KL the two agree.",),
         level="token", needs_groups=True, inert_when=no_critic),
    Spec("advantage", "gae", "GAE (PPO)", f"{CORE}:gae_advantages",
         (r"\delta_t = r_t + \gamma V_{t+1} - V_t", r"A_t = \sum_{l \ge 0} (\gamma\lambda)^l \delta_{t+l}",
          r"R_t = A_t + V_t \quad\text{(critic targets)}"),
         "A learned critic gives every token its own credit (Schulman et al. 2016).",
         "TRL PPOTrainer; verl adv_estimator=gae; OpenRLHF advantage_estimator=gae.",
         (GAMMA, LAM, KL_IN_REWARD),
         ("lambda = 0: one-step TD (low variance, biased by the critic); lambda = 1: Monte Carlo return minus V.",),
         preset="ppo", level="token", needs_critic=True,
         walkthroughs=(Walkthrough("ppo", "PPO with GAE", "ppo", "A learned critic V and GAE (Schulman et al. 2016): per-token "
                                 "credit assignment.", inputs="gae"),)),
    Spec("advantage", "remax", "ReMax", f"{CORE}:remax_advantages",
         (r"A_i = r_i - r(\hat o^{greedy})",),
         "A baseline without a critic or a group: the reward of one greedy completion of the same prompt "
         "(Li et al. 2023).",
         "verl adv_estimator=remax (reward_baselines).",
         (KL_IN_REWARD,), ("Costs one extra (greedy) rollout per prompt, not trained on; its reward is logged as "
                           "remax/baseline_reward.",
                           "With an in-reward KL verl subtracts the baseline from per-token returns; here from the shaped "
                           "sequence reward (equal without an in-reward KL)."),
         preset="remax", needs_baseline_rollout=True, inert_when=no_critic),
    Spec("advantage", "opo", "OPO (optimal baseline)", f"{CORE}:opo_advantages",
         (r"b_g = \frac{\sum_{j \in g} n_j r_j}{\sum_{j \in g} n_j}", r"A_i = r_i - b_g"),
         "The variance-minimising baseline when every token carries its sequence's reward: longer completions "
         "weigh more (Hao et al. 2025).",
         "verl adv_estimator=opo.",
         (GROUP_SIZE, KL_IN_REWARD),
         ("A group of one gets A = 0 here (verl: b = 0, A = r).", "All-equal groups get exactly 0."), preset="opo",
         needs_groups=True, inert_when=no_critic),
    Spec("advantage", "grpo_passk", "GRPO pass@k", f"{CORE}:grpo_passk_advantages",
         (r"A_{best} = \frac{r_{(1)} - r_{(2)}}{\operatorname{std}_g(r) + \varepsilon}", r"A_i = 0 \text{ otherwise}"),
         "Optimises pass@k (one of the G samples right) instead of the mean reward: only the group's best "
         "completion is credited (Tang et al. 2025).",
         "verl adv_estimator=grpo_passk.",
         (GROUP_SIZE, SCALE, EPS, KL_IN_REWARD),
         ("Ties for the best give 0; no completion is ever pushed down.",), preset="grpo_passk", needs_groups=True,
         inert_when=no_critic),
    Spec("advantage", "gpg", "GPG", f"{CORE}:gpg_advantages",
         (r"A_i = \alpha \, \frac{r_i - " + GROUP_MEAN + r"}{F_{norm}}",
          r"\alpha_{paper} = \frac{B}{B - M} \quad \alpha_{verl} = \frac{B}{\#\{i : r_i \ne 0\}}"),
         "Group Policy Gradient (Chu et al. 2025): the plain policy gradient with a group-mean baseline; the "
         "completions of all-equal groups (M of the B) carry no gradient, so alpha scales the batch back up "
         "instead of letting them dilute it.",
         "verl adv_estimator=gpg (alpha = B / non-zero rewards, f_norm = 1) with policy_loss gpg.",
         (GROUP_SIZE, SCALE, EPS, GPG_ALPHA, KL_IN_REWARD),
         ("gpg_alpha='paper' (default) counts the completions of informative groups; 'verl' counts non-zero "
          "rewards, which differs when a right answer scores 0 or a wrong one not.",
          "One positive scale per batch: with Adam it mostly changes the step only while M changes.",
          "scale='none' is the paper's F_norm = 1; 'group' divides by std_g + eps."), preset="gpg", needs_groups=True,
         inert_when=no_critic, example_variants=(("GPG", {"scale": "none"}),)),  # the paper's F_norm = 1
    Spec("advantage", "optimal_token_baseline", "Optimal token baseline", f"{CORE}:optimal_token_baseline_advantages",
         OTB_EQUATIONS,
         "One baseline per sequence ignores that the gradient's variance accumulates along the completion: a "
         "baseline per position, weighting each completion's return by its accumulated score variance W, is the "
         "variance-optimal one (verl optimal_token_baseline).",
         "verl adv_estimator=optimal_token_baseline.",
         (GROUP_SIZE, KL_IN_REWARD),
         ("B_t is taken at the absolute position t: padding inside a row (tool outputs) shifts it; "
          "tir_optimal_token_baseline indexes by valid token instead.",
          "With rollout IS weights rho, W accumulates rho^2 too."),
         level="token", needs_groups=True, needs_policy_stats=True, inert_when=no_critic),
    Spec("advantage", "tir_optimal_token_baseline", "Optimal token baseline (multi-turn)",
         f"{CORE}:tir_optimal_token_baseline_advantages",
         OTB_EQUATIONS,
         "As the optimal token baseline, with B indexed by the k-th valid token of each completion, so tool outputs "
         "masked out between turns do not shift one completion's tokens against another's.",
         "verl adv_estimator=tir_optimal_token_baseline.",
         (GROUP_SIZE, KL_IN_REWARD),
         ("With right padding only it equals optimal_token_baseline.",
          "The trainer computes sum_v pi_v^2 in the old-log-prob forward (one more softmax over the vocabulary)."),
         level="token", needs_groups=True, needs_policy_stats=True, inert_when=no_critic),
)
