"""The verdict table's "seeds needed" cell says why there is no number instead of "None"."""

import pandas as pd

from workbench.analysis.stats import MAX_SEEDS_SEARCHED
from workbench.viz.tables import verdict


def frame(offsets: dict[str, float], seeds: int = 3, spread: float = 0.1) -> pd.DataFrame:
    """One run per (arm, seed), 2 steps; reward = the arm's offset + spread x seed."""
    return pd.DataFrame([{"run_id": f"{arm}{seed}", "arm": arm, "seed": seed, "step": step,
                          "reward": off + spread * seed} for arm, off in offsets.items()
                         for seed in range(seeds) for step in range(2)])


def cell(df: pd.DataFrame) -> str:
    [value] = verdict(df, "reward").pairs["seeds needed"].tolist()
    return value


def test_seeds_needed_says_why_there_is_no_number():
    assert cell(frame({"a": 0.0, "b": 0.0})) == "— (no gap to detect)"  # d = 0: power undefined at any n
    assert cell(frame({"a": 0.0, "b": 0.0}, spread=0.0)) == "— (no gap to detect)"  # d = 0 / 0
    assert cell(frame({"a": 0.0, "b": 0.0}, seeds=1)) == "— (needs 2 seeds per arm)"
    assert cell(frame({"a": 0.0, "b": 1e-9})) == f"> {MAX_SEEDS_SEARCHED:,}"
    assert cell(frame({"a": 0.0, "b": 1.0})) == "2"  # d = 10: the smallest n the search allows
    assert cell(frame({"a": 0.0, "b": 0.1})) == "17"  # d = 1: the textbook 17 per arm
    for df in (frame({"a": 0.0, "b": 0.0}), frame({"a": 0.0, "b": 0.0}, seeds=1)):
        assert "None" not in verdict(df, "reward").pairs.astype(str).to_string()
