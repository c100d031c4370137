"""Statistics over runs, below the UI: arms x seeds -> scores, intervals, verdicts, bands, sweeps.

Pure functions of pandas frames and numpy arrays (scipy for every statistic; no torch, no
streamlit, no plotting). ``stats``: the verdict table (``final_window_values``, ``arm_summary``,
``pairwise``, ``seeds_needed``) and ``sweep_table``; ``bands``: ``mean_curve_with_band`` for the
arms view.
"""

from workbench.analysis.bands import aggregation_caption, mean_curve_with_band
from workbench.analysis.stats import (arm_summary, default_metric, final_window_scores, final_window_values, pairwise,
                                      probability_of_improvement, seeds_needed, sweep_table)

__all__ = ["aggregation_caption", "arm_summary", "default_metric", "final_window_scores", "final_window_values",
           "mean_curve_with_band", "pairwise", "probability_of_improvement", "seeds_needed", "sweep_table"]
