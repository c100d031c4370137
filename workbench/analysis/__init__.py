"""Statistics over runs, below the UI: arms x seeds -> scores, intervals, verdicts, bands, sweeps.

Pure functions of pandas frames and numpy arrays (scipy for every statistic; no torch, no
streamlit, no plotting). ``stats``: the verdict table (``final_window_values``, ``arm_summary``,
``pairwise``, ``seeds_needed``) and ``sweep_table``; ``bands``: ``mean_curve_with_band`` for the
arms view; ``smoothing``: ``ema``, TensorBoard's debiased EMA of every smoothed curve. ``window``: ``DEFAULT_WINDOW_FRAC``, the final window's default, which imports nothing.

The statistics are imported on first use (PEP 562 ``__getattr__``): importing this package, or
its ``window`` module, loads neither pandas nor scipy, so the CLI's parser and the experiments'
listing can read the default window cheaply.
"""

from importlib import import_module

from workbench.analysis.window import DEFAULT_WINDOW_FRAC

_HOME = {"aggregation_caption": "bands", "mean_curve_with_band": "bands", "arm_summary": "stats",
         "default_metric": "stats", "ema": "smoothing", "final_window_scores": "stats", "final_window_values": "stats",
         "pairwise": "stats", "probability_of_improvement": "stats", "seeds_needed": "stats", "sweep_table": "stats"}

__all__ = ["DEFAULT_WINDOW_FRAC", *_HOME]


def __getattr__(name: str):
    """``workbench.analysis.NAME``: the function from its submodule, imported on first use."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value
