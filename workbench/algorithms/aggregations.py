"""Specs of the loss aggregations (``workbench.core.aggregation.LOSS_AGGREGATIONS``), one per
registered name, in registry order."""

from __future__ import annotations

from .spec import Spec, by_name

CORE = "workbench.core.aggregation"
SUM = r"\sum_i \sum_t \ell_{i,t}"

SPECS: dict[str, Spec] = by_name(
    Spec("aggregation", "token-mean", "token-mean", f"{CORE}:token_mean",
         (r"L = \frac{1}{\sum_i |o_i|} " + SUM,),
         "Every token of the batch weighs the same, whatever the length of its completion (DAPO, Yu et al. 2025).",
         "TRL loss_type dapo / bnpo; verl loss_agg_mode token-mean; OpenRLHF's default."),
    Spec("aggregation", "seq-mean-token-mean", "seq-mean-token-mean", f"{CORE}:seq_mean_token_mean",
         (r"L = \frac{1}{B}\sum_i \frac{1}{|o_i|}\sum_t \ell_{i,t}",),
         "GRPO's original average: each completion weighs the same.",
         "TRL loss_type grpo; verl loss_agg_mode seq-mean-token-mean.",
         notes=("Length bias: a token of a short completion weighs 1/|o_i|, more than one of a long completion, so long "
                "wrong answers are penalised less (Dr. GRPO, Liu et al. 2025).",), preset="grpo",
         biases=lambda data: ("length",)),
    Spec("aggregation", "seq-mean-token-sum", "seq-mean-token-sum", f"{CORE}:seq_mean_token_sum",
         (r"L = \frac{1}{B} " + SUM,),
         "Sums each completion's tokens, averages over completions: no per-length normalisation. With GSPO's "
         "sequence ratio it is LUSPO (Length-Unbiased Sequence Policy Optimization, arXiv 2602.05261): a long "
         "completion's tokens no longer count for less than a short one's.",
         "verl loss_agg_mode seq-mean-token-sum; TRL loss_type='luspo' (with importance_sampling_level='sequence')."),
    Spec("aggregation", "seq-mean-token-sum-norm", "seq-mean-token-sum-norm (Dr. GRPO)", f"{CORE}:seq_mean_token_sum_norm",
         (r"L = \frac{1}{B\, L_{max}} " + SUM,),
         "Removes GRPO's length bias with a constant normaliser (Dr. GRPO, Liu et al. 2025).",
         "TRL loss_type dr_grpo; verl >= 0.9 loss_agg_mode seq-mean-token-sum-norm.", preset="dr_grpo"),
    Spec("aggregation", "token-sum-norm", "token-sum-norm", f"{CORE}:token_sum_norm",
         (r"L = \frac{1}{L_{max}} " + SUM,),
         "Dr. GRPO's normaliser as verl < 0.9 wrote it: L_max only, a step B times larger.",
         "verl < 0.9 loss_agg_mode seq-mean-token-sum-norm."),
    Spec("aggregation", "token-sum", "token-sum", f"{CORE}:token_sum",
         (r"L = " + SUM,),
         "No normaliser at all: every token's gradient counts in full.",
         "verl 0.9.1 loss_agg_mode token-sum.",
         notes=("The step grows with the batch's token count: scale the learning rate with the batch.",)),
)
