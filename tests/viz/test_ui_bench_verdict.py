"""bench/ui_bench.py judges the arms view's 1.5x target beyond the noise of its render pairs: the
distribution-free interval of the median ratio (order statistics, binomial coverage) must lie at
or below the target. Checked against hand-derived coverages and on the three verdicts."""
import importlib.util
import shutil
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "ui_bench.py"


@pytest.fixture(scope="module")
def ui_bench():
    spec = importlib.util.spec_from_file_location("ui_bench_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines functions only: nothing is timed at import
    yield module
    shutil.rmtree(module.SCRATCH, ignore_errors=True)  # the pages' homes it makes at import (none used here)


@pytest.mark.parametrize("n, k", [(6, 1), (9, 2), (10, 2), (25, 8), (41, 14)])
def test_the_median_interval_is_the_widest_order_statistics_pair_of_95_percent_coverage(ui_bench, n, k):
    """(x_(k), x_(n+1-k)) with coverage 1 - 2 P(B <= k - 1) >= 0.95 and 1 - 2 P(B <= k) < 0.95,
    B ~ Binomial(n, 1/2): by hand, n = 9: 1 - 2 (1 + 9) / 512 = 0.961 at k = 2, 1 - 2 * 46 / 512 =
    0.820 at k = 3; n = 6: 1 - 2 / 64 = 0.969 at k = 1. Values given shuffled."""
    from math import comb

    below = lambda j: sum(comb(n, i) for i in range(j + 1)) / 2**n  # P(B <= j)
    assert 1 - 2 * below(k - 1) >= 0.95 > 1 - 2 * below(k)
    values = [float(v) for v in range(1, n + 1)][::-1]
    assert ui_bench.median_interval(values) == (float(k), float(n + 1 - k))


def test_too_few_pairs_give_no_interval(ui_bench):
    assert ui_bench.median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None  # 1 - 2 / 32 = 0.9375 < 0.95


def test_the_target_is_met_only_when_the_interval_is_at_or_below_it(ui_bench):
    verdict = ui_bench.ratio_verdict
    assert verdict([1.3] * 8 + [1.6], 1.5) == "met"  # x_(8) = 1.3
    assert verdict([1.3] * 7 + [1.6] * 2, 1.5) == "met by the median only, within the noise"  # x_(8) = 1.6
    assert verdict([1.3] * 4 + [1.6] * 5, 1.5) == "MISSED"
    assert verdict([1.5] * 9, 1.5) == "met"
    assert verdict([1.3] * 5, 1.5) == "met by the median only, within the noise"  # no interval from 5 pairs



def test_the_default_number_of_pairs_can_judge_the_target(ui_bench):
    """``make bench`` runs the script with its defaults: they must give the median an interval,
    or the arms view's target could never be called met (5 pairs, the old default, give none)."""
    repeats = ui_bench.parser().parse_args([]).repeats
    assert ui_bench.median_interval([float(i) for i in range(repeats)]) is not None, repeats
