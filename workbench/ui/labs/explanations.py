"""What the walkthrough pages say about each registered advantage estimator and policy loss.

Pure data, no torch (the navigation reads the titles). One ``Explanation`` per registry name:
the equation(s), what the method fixes, which framework calls it what, the knobs (the fields of
``AdvantageConfig`` / ``PolicyLossConfig`` it reads) and its known biases / notes. A name with no
entry here still gets a walkthrough: ``workbench.ui.labs.estimators`` falls back to the
registered function's docstring and to the ``cfg.<field>`` it reads, so an estimator or loss
registered later needs no page module and no entry to be explained.
"""

from __future__ import annotations

from dataclasses import dataclass

# registry families: key -> (singular label, url slug)
FAMILIES: dict[str, tuple[str, str]] = {"advantage": ("Estimator", "adv"), "policy_loss": ("Loss", "loss"),
                                         "shaping": ("Shaping", "shaping")}


@dataclass(frozen=True)
class Explanation:
    title: str
    equations: tuple[str, ...]  # LaTeX, shown with st.latex
    fixes: str  # what problem of the method before it this one addresses
    names: str  # how TRL / verl / OpenRLHF / slime call it
    knobs: tuple[str, ...] = ()  # config fields it reads (AdvantageConfig / PolicyLossConfig)
    notes: tuple[str, ...] = ()  # known biases and caveats
    preset: str | None = None  # the recipes/ preset that trains with it, if any
    ratio_curve: bool = False  # losses: one token's loss is a function of its ratio alone (PPO-region lab)
    launch_note: str | None = None  # why no run can be launched with it yet (None: launchable)


GROUP_MEAN = r"\operatorname{mean}_g(r)"

ADVANTAGE_EXPLANATIONS: dict[str, Explanation] = {
    "grpo": Explanation(
        "GRPO", (r"A_i = \frac{r_i - \operatorname{mean}_g(r)}{\operatorname{std}_g(r) + \varepsilon}",),
        "No critic: the other G - 1 completions of the same prompt are the baseline (DeepSeekMath, Shao et al. 2024).",
        "TRL GRPOTrainer scale_rewards='group' / 'batch' / 'none'; verl adv_estimator=grpo "
        "(norm_adv_by_std_in_grpo=False is Dr. GRPO); OpenRLHF advantage_estimator=group_norm.",
        ("group_size", "scale", "eps", "kl_coef"),
        ("Std bias: dividing by the group's std gives the rare answer |A| = 1.5 in a group of 4, right or wrong, "
         "and cancels the reward scale (0.1, 0, 0, 0 gets the same 1.5 as 1, 0, 0, 0); scale='none' (Dr. GRPO) removes it.",
         "All-equal groups get exactly 0 (no signal)."), preset="grpo"),
    "rloo": Explanation(
        "RLOO", (r"A_i = r_i - \frac{1}{G-1}\sum_{j \ne i} r_j = \frac{G}{G-1}\big(r_i - " + GROUP_MEAN + r"\big)",),
        "The baseline must not contain the completion's own reward: leave-one-out makes it unbiased "
        "(Kool et al. 2019; Ahmadian et al. 2024).",
        "TRL RLOOTrainer; verl adv_estimator=rloo; OpenRLHF advantage_estimator=rloo.",
        ("group_size", "kl_coef"), ("Equals G/(G-1) x Dr. GRPO: the same direction, a larger step.",), preset="rloo"),
    "reinforce": Explanation(
        "REINFORCE (batch mean)", (r"A_i = r_i - \operatorname{mean}_{batch}(r)",),
        "Vanilla policy gradient with the simplest variance-reducing baseline (Williams 1992).",
        "The textbook baseline; no framework default uses it for LMs.",
        ("kl_coef",), ("The baseline mixes prompts of different difficulty: an easy prompt's completions all look good.",)),
    "reinforce_pp": Explanation(
        "REINFORCE++",
        (r"r_t = -\beta\,\mathrm{KL}_t + [t = |o|]\, r", r"G_t = \sum_{l \ge 0} \gamma^l r_{t+l}",
         r"A_t = \frac{G_t - \operatorname{mean}_{batch}(G)}{\operatorname{std}_{batch}(G)}"),
        "No critic and no group: per-token returns with the KL in the reward, whitened over the whole batch (Hu 2025).",
        "OpenRLHF advantage_estimator=reinforce_plus_plus; verl adv_estimator=reinforce_plus_plus.",
        ("gamma", "kl_coef"), ("Batch whitening: the advantages of one batch always have mean 0 and std 1.",),
        preset="reinforce_pp"),
    "reinforce_pp_baseline": Explanation(
        "REINFORCE++ baseline", (r"r_i \leftarrow r_i - " + GROUP_MEAN, r"\text{then as REINFORCE++}"),
        "REINFORCE++ with a group-mean baseline first, for prompts of mixed difficulty.",
        "OpenRLHF advantage_estimator=reinforce_plus_plus_baseline; verl adv_estimator=reinforce_plus_plus_baseline.",
        ("group_size", "gamma", "kl_coef"),
        ("verl whitens sequence scores that include the summed KL; with gamma = 1 and no KL the two agree.",)),
    "gae": Explanation(
        "GAE (PPO)",
        (r"\delta_t = r_t + \gamma V_{t+1} - V_t", r"A_t = \sum_{l \ge 0} (\gamma\lambda)^l \delta_{t+l}",
         r"R_t = A_t + V_t"),
        "A learned critic gives every token its own credit (Schulman et al. 2016).",
        "TRL PPOTrainer; verl adv_estimator=gae; OpenRLHF advantage_estimator=gae.",
        ("gamma", "lam", "kl_coef"),
        ("lambda = 0: one-step TD (low variance, biased by the critic); lambda = 1: Monte Carlo return minus V.",),
        preset="ppo"),
    "remax": Explanation(
        "ReMax", (r"A_i = r_i - r(\hat o^{greedy})",),
        "A baseline without a critic or a group: the reward of one greedy completion of the same prompt "
        "(Li et al. 2023).",
        "verl adv_estimator=remax (reward_baselines).",
        ("kl_coef",), ("Costs one extra (greedy) rollout per prompt, not trained on; its reward is logged as "
             "remax/baseline_reward.",
             "With an in-reward KL verl subtracts the baseline from per-token returns; here from the shaped "
             "sequence reward (equal without an in-reward KL)."),
        preset="remax"),
    "opo": Explanation(
        "OPO (optimal baseline)",
        (r"b_g = \frac{\sum_{j \in g} n_j r_j}{\sum_{j \in g} n_j}", r"A_i = r_i - b_g"),
        "The variance-minimising baseline when every token carries its sequence's reward: longer completions "
        "weigh more (Hao et al. 2025).",
        "verl adv_estimator=opo.",
        ("group_size", "kl_coef"),
        ("A group of one gets A = 0 here (verl: b = 0, A = r).", "All-equal groups get exactly 0."), preset="opo"),
    "gpg": Explanation(
        "GPG",
        (r"A_i = \alpha \, \frac{r_i - " + GROUP_MEAN + r"}{F_{norm}}",
         r"\alpha_{paper} = \frac{B}{B - M} \quad \alpha_{verl} = \frac{B}{\#\{i : r_i \ne 0\}}"),
        "Group Policy Gradient (Chu et al. 2025): the plain policy gradient with a group-mean baseline; the "
        "completions of all-equal groups (M of the B) carry no gradient, so alpha scales the batch back up "
        "instead of letting them dilute it.",
        "verl adv_estimator=gpg (alpha = B / non-zero rewards, f_norm = 1) with policy_loss gpg.",
        ("group_size", "scale", "gpg_alpha", "kl_coef"),
        ("gpg_alpha='paper' (default) counts the completions of informative groups; 'verl' counts non-zero "
         "rewards, which differs when a right answer scores 0 or a wrong one not.",
         "One positive scale per batch: with Adam it mostly changes the step only while M changes.",
         "scale='none' is the paper's F_norm = 1; 'group' divides by std_g + eps."), preset="gpg"),
    "grpo_passk": Explanation(
        "GRPO pass@k",
        (r"A_{best} = \frac{r_{(1)} - r_{(2)}}{\operatorname{std}_g(r) + \varepsilon}", r"A_i = 0 \text{ otherwise}"),
        "Optimises pass@k (one of the G samples right) instead of the mean reward: only the group's best "
        "completion is credited (Tang et al. 2025).",
        "verl adv_estimator=grpo_passk.",
        ("group_size", "scale", "eps", "kl_coef"),
        ("Ties for the best give 0; no completion is ever pushed down.",), preset="grpo_passk"),
}

RATIO = r"\rho_t = \pi_\theta(o_t) / \pi_{old}(o_t)"

POLICY_LOSS_EXPLANATIONS: dict[str, Explanation] = {
    "clip": Explanation(
        "PPO clip", (r"\ell_t = -\min\big(\rho_t A_t,\ \operatorname{clip}(\rho_t, 1-\varepsilon_{low}, 1+\varepsilon_{high}) A_t\big)",),
        "A trust region without a KL constraint: a token whose ratio left [1 - eps_low, 1 + eps_high] in the "
        "direction of its advantage gets no gradient (Schulman et al. 2017).",
        "TRL loss_type grpo / bnpo / dr_grpo / dapo (the same clip, different aggregation); verl policy_loss vanilla "
        "(clip_ratio_c = dual clip); OpenRLHF PolicyLoss.",
        ("eps_low", "eps_high", "clip_c", "delta"),
        ("Zero gradient for clipped tokens: rare 'fork' tokens stop learning once their ratio grows (DAPO's clip-higher "
         "raises eps_high to 0.28).",), preset="grpo", ratio_curve=True),
    "gspo": Explanation(
        "GSPO", (r"s_i = \exp\Big(\frac{1}{|o_i|}\sum_t \log\rho_{i,t}\Big)",
                 r"\ell_i = -\min\big(s_i A_i,\ \operatorname{clip}(s_i, 1-\varepsilon_{low}, 1+\varepsilon_{high}) A_i\big)"),
        "The importance ratio at the level the reward is given (the sequence): one outlier token moves s_i only by "
        "1/|o_i| (Zheng et al. 2025).",
        "TRL importance_sampling_level='sequence'; verl policy_loss gspo (gspo_variant token = GSPO-token).",
        ("eps_low", "eps_high", "gspo_variant"),
        ("Tiny clip ranges (3e-4 / 4e-4): s_i is a per-token geometric mean.",), preset="gspo", ratio_curve=True),
    "cispo": Explanation(
        "CISPO", (r"\ell_t = -\operatorname{sg}\big(\operatorname{clip}(\rho_t, 1-\varepsilon_{low}, 1+\varepsilon_{high})\big) A_t \log\pi_\theta(o_t)",),
        "Clip the importance weight, not the update: every token keeps a gradient (MiniMax-M1, 2025).",
        "TRL loss_type='cispo' (absolute cap epsilon_high); verl-style relative bounds (cispo_bounds).",
        ("eps_low", "eps_high", "cispo_bounds"), ("The weight is biased (truncated IS) but bounded.",),
        preset="cispo", ratio_curve=True),
    "reinforce": Explanation(
        "REINFORCE (no clip)", (r"\ell_t = -A_t \log\pi_\theta(o_t) \quad\text{or}\quad -A_t \rho_t",),
        "The plain policy gradient, no trust region (Williams 1992).",
        "Any framework with clipping off.", ("reinforce_form",),
        ("Off-policy (mu > 1) nothing stops a token's ratio from running away.",), ratio_curve=True),
    "sapo": Explanation(
        "SAPO", (r"\ell_t = -\frac{4}{\tau}\,\sigma\big(\tau(\rho_t - 1)\big) A_t,\quad \tau = \tau_{pos} \text{ if } A_t > 0 \text{ else } \tau_{neg}",
                 r"\frac{\partial J}{\partial \log\pi} = 4\sigma(x)(1-\sigma(x))\,\rho_t A_t,\quad x = \tau(\rho_t - 1)"),
        "A soft trust region: the gradient fades smoothly as the ratio leaves 1 instead of dropping to 0 at a hard "
        "clip, so no token loses its signal abruptly (Gao et al. 2025).",
        "TRL loss_type='sapo' (sapo_temperature_pos / _neg); verl policy_loss sapo (tau_pos / tau_neg).",
        ("sapo_tau_pos", "sapo_tau_neg"),
        ("Equals the policy gradient at rho = 1 (on-policy); tau_neg > tau_pos damps negative updates sooner.",),
        preset="sapo", ratio_curve=True),
    "gmpo": Explanation(
        "GMPO", (r"\tilde l_t = \operatorname{sign}(A)\min\big(\operatorname{sign}(A)\log\rho_t,\ \operatorname{sign}(A)\operatorname{clip}(\log\rho_t, -\varepsilon_{low}, \varepsilon_{high})\big)",
                 r"\ell_i = -A_i \exp\Big(\frac{1}{|o_i|}\sum_t \tilde l_t\Big)"),
        "GRPO averages token ratios arithmetically, so one outlier ratio dominates; the geometric mean of "
        "log-clipped ratios is robust to it and allows a wider clip (Zhao et al. 2025).",
        "verl policy_loss geo_mean.", ("eps_low", "eps_high"),
        ("eps bounds the log-ratio: the paper's 0.4 keeps the ratio in [e^-0.4, e^0.4].",
         "verl averages per sequence: aggregate with seq-mean-token-mean for its number."),
        preset="gmpo", ratio_curve=True),
    "dppo_tv": Explanation(
        "DPPO (TV)", (r"\ell_t = -A_t\,\operatorname{sg}(\min(\rho_t, C))\log\pi_\theta(o_t)\,[\text{valid}_t]",
                      r"\text{valid}_t:\ p_t - p^{old}_t \le \varepsilon_{high}\ (A>0),\quad \ge -\varepsilon_{low}\ (A \le 0)"),
        "A trust region on the change of the token's probability, not its ratio: 1e-5 -> 1e-3 (ratio 100) is a tiny "
        "move, 0.99 -> 0.8 a large one.",
        "verl policy_loss dppo_tv (clip_ratio_low / _high are the TV threshold, clip_ratio_c the ratio cap C).",
        ("eps_low", "eps_high", "clip_c"),
        ("The region depends on p_old, not only on the ratio: no single ratio curve.",
         "The paper's settings (verl example): TV 0.15, C = 10000 (no truncation), Dr. GRPO advantages and "
         "seq-mean-token-sum-norm, several mini-batches per rollout batch: the dppo preset."), preset="dppo"),
    "dppo_kl": Explanation(
        "DPPO (KL)", (r"\mathrm{KL}_b = p^{old}\log\frac{p^{old}}{p} + (1-p^{old})\log\frac{1-p^{old}}{1-p}",
                      r"\text{valid}_t:\ \mathrm{KL}_b \le \varepsilon \text{ or } p \text{ moved against } A"),
        "As DPPO (TV) with the binary KL between the old and new probability of the sampled token.",
        "verl policy_loss dppo_kl.", ("eps_low", "eps_high", "clip_c"),
        ("The region depends on p_old, not only on the ratio: no single ratio curve.",
         "The paper's KL threshold is 0.05 (verl example): the dppo preset with policy_loss=dppo_kl, eps 0.05.")),
    "clip_cov": Explanation(
        "Clip-Cov", (r"\mathrm{Cov}_t = (A_t - \bar A)(\log\pi_t - \overline{\log\pi})",
                     r"\ell_t = \ell^{clip}_t\,(1 - \text{selected}_t)"),
        "Entropy collapses in proportion to the covariance of advantage and log-probability: cutting the gradient "
        "of a few high-covariance tokens keeps entropy up (Cui et al. 2025).",
        "verl policy_loss clip_cov (clip_cov_ratio, clip_cov_lb, clip_cov_ub).",
        ("eps_low", "eps_high", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "cov_seed"),
        ("The selection is random and depends on the whole batch: no single ratio curve.",
         "Statistics are per call (per micro-batch), as in verl."), preset="clip_cov"),
    "kl_cov": Explanation(
        "KL-Cov", (r"\ell_t = -A_t\rho_t + \beta_{cov}\,|\log\rho_t|\,[t \in \text{top-}k\ \mathrm{Cov}]",),
        "Same diagnosis as Clip-Cov, softer cure: a KL penalty on the highest-covariance tokens (Cui et al. 2025).",
        "verl policy_loss kl_cov (kl_cov_ratio, ppo_kl_coef).", ("kl_cov_ratio", "kl_cov_coef"),
        ("The penalised tokens depend on the whole batch: no single ratio curve.",), preset="kl_cov"),
    "gpg": Explanation(
        "GPG", (r"\ell_t = -A_t \log\pi_\theta(o_t)",),
        "Drops the surrogate, the clip, the reference model and the KL: the plain policy gradient with a group "
        "baseline is a strong baseline (Chu et al. 2025).",
        "verl policy_loss gpg.", (),
        ("No trust region: keep mu = 1 (one pass per batch).",), preset="gpg", ratio_curve=True),
}

# Advantage shapings (core.distillation.ADVANTAGE_SHAPINGS): applied to any estimator's advantage.
SHAPING_EXPLANATIONS: dict[str, Explanation] = {
    "opd": Explanation(
        "On-policy distillation (OPD)",
        (r"d_t = \log\pi_\theta(o_t) - \log\pi_T(o_t) \quad (o \sim \pi_\theta)",
         r"D_t = \sum_{k \ge t} \gamma^{k-t} d_k", r"A'_t = [\text{shaped}]\,A_t - \lambda D_t"),
        "RL's reward is one number per completion; a teacher grades every token the student sampled, on the "
        "student's own completions (on-policy, so it learns to recover from its own mistakes): the gradient of "
        "the reverse KL(pi_theta || pi_T), mode-seeking (Agarwal et al. 2024; Thinking Machines, Lu et al. 2025).",
        "slime --use-opd --opd-kl-coef (A - lambda d, any estimator, before its advantage normalisation); "
        "tinker-cookbook distillation kl_penalty_coef / kl_discount_factor (reward 0: pure distillation); "
        "here teacher.model / kl_coef / kl_discount / mode.",
        ("coef", "discount", "mode"),
        ("One-sample estimate: d_t < 0 on tokens the teacher likes more than the student; the KL's mean is >= 0.",
         "The teacher must share the student's tokenizer (checked before training).",
         "Added after the estimator and its whitening: lambda is in nats per token whatever the estimator.",
         "On the tiny model the teacher is near-deterministic (reverse KL ~4 nats per token at first): the opd "
         "preset uses lambda = 0.1; pure distillation (mode only) did not learn there in 30 steps."),
        preset="opd"),
}

EXPLANATIONS: dict[str, dict[str, Explanation]] = {"advantage": ADVANTAGE_EXPLANATIONS,
                                                   "policy_loss": POLICY_LOSS_EXPLANATIONS,
                                                   "shaping": SHAPING_EXPLANATIONS}


def title_of(family: str, name: str) -> str:
    """The page title of a registered name (its explanation's title, else the name itself)."""
    entry = EXPLANATIONS[family].get(name)
    return entry.title if entry else name


def page_url(family: str, name: str) -> str:
    return f"walkthrough-{FAMILIES[family][1]}-{name.replace('_', '-')}"


def page_title(family: str, name: str) -> str:
    return f"{FAMILIES[family][0]} walkthrough: {title_of(family, name)}"
