"""Advantages side by side: one group of rewards through every sequence-level estimator.

Layout and widgets only; every number comes from ``workbench.core``.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st
import torch

from workbench.core import ADVANTAGE_ESTIMATORS, TOKEN_LEVEL_ESTIMATORS, AdvantageConfig, compute_advantages


def parse_rewards(text: str) -> list[float]:
    """'1, 0, 0.5' -> [1.0, 0.0, 0.5]; ValueError naming the field otherwise."""
    try:
        values = [float(x) for x in text.replace(";", ",").split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"rewards={text!r}: expected numbers separated by commas, e.g. 1, 0, 0.5") from None
    if not values:
        raise ValueError("rewards is empty: enter at least one number")
    return values


def advantage_table(rewards: list[float], eps: float) -> pd.DataFrame:
    """Sequence-level advantages of one group under every estimator (columns) per completion (rows)."""
    r = torch.tensor(rewards, dtype=torch.float64)
    mask = torch.ones(len(rewards), 1, dtype=torch.float64)
    columns = {"reward": rewards}
    variants = [("grpo", {"scale": "group"}, "GRPO"), ("grpo", {"scale": "none"}, "Dr. GRPO"),
                ("rloo", {}, "RLOO"), ("reinforce", {}, "REINFORCE"),
                ("reinforce_pp_baseline", {}, "REINFORCE++ baseline")]
    for name, extra, label in variants:
        cfg = AdvantageConfig(group_size=len(rewards), eps=eps, **extra)
        columns[label] = compute_advantages(name, r, mask, cfg).advantages[:, 0].tolist()
    return pd.DataFrame(columns)


def render() -> None:
    st.title("RL Workbench")
    st.caption("Advantages of one group of completions under each estimator (computed by workbench.core).")
    text = st.text_input("Rewards of one group (G completions of the same prompt)", "1, 0, 0, 1, 0.5")
    eps = st.number_input("eps added to the std (TRL 1e-4, verl 1e-6)", value=1e-6, format="%.0e")
    try:
        rewards = parse_rewards(text)
    except ValueError as err:
        st.error(str(err))
        return
    st.dataframe(advantage_table(rewards, eps), hide_index=True)
    token_level = ", ".join(sorted(TOKEN_LEVEL_ESTIMATORS))
    st.caption(f"Registered estimators: {', '.join(ADVANTAGE_ESTIMATORS.names())} (token-level: {token_level}).")
