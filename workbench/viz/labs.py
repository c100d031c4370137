"""The labs' figure builders in one namespace (pure: DataFrames / tensors -> plotly Figures).

Each lab has its own module: ``lab_regions`` (PPO clip regions), ``lab_aggregation`` (loss
aggregation), ``lab_estimators`` (estimator walkthroughs), ``lab_kl`` (KL estimators) and
``lab_lens`` (the same-batch lens). Every number comes from ``workbench.core``.
"""

from workbench.viz import lab_aggregation, lab_estimators, lab_kl, lab_lens, lab_regions
from workbench.viz.lab_aggregation import (
    LAB_MODES, aggregation_figure, aggregation_table, length_drift_figure, parse_sequences, run_batch_weights,
    token_weights, weight_vs_length_figure,
)
from workbench.viz.lab_estimators import (
    SEQUENCE_VARIANTS, advantages_figure, gae_figure, gae_table, length_bias_example, parse_numbers,
    per_token_policy_gradients, policy_gradient_figure, sequence_advantages, source_of, std_bias_example,
)
from workbench.viz.lab_kl import bias_variance_vs_samples, categorical, estimator_moments, kl_figure, monte_carlo, placement_table, true_kl
from workbench.viz.lab_lens import LENS_METRICS, lens_events, lens_frame, lens_heatmap, lens_over_run_figure
from workbench.viz.lab_regions import (
    BOOK_REGIONS, REGION_COLORS, analytic_curves, analytic_figure, book_regions_table, objective_and_gradient,
    region_bands, region_scatter, region_share_figure, region_shares, token_points, zero_grad_fraction,
)

__all__ = [name for name in dir() if not name.startswith("_")]
