"""The arms view in chromium, read back from the DOM: with 2 seeds per arm a fraction's band and
y-axis stay inside [0, 1] (plus the axis margin), the y-axis follows the means, no legend box
covers a plot area or a chart title, and the page's one legend names each arm in its colour."""

from __future__ import annotations

import pytest

from tests.e2e.test_browser import wait_until
from workbench.runs import RunStore

TITLE = "Groups with zero reward std"

# For the chart titled TITLE: its y-axis range as drawn, the y values of its band traces, and
# its curves' colours by name.
FRACTION_CHART = """(title) => {
  const plot = Array.from(document.querySelectorAll('.js-plotly-plot'))
      .find(p => p.layout && p.layout.title && String(p.layout.title.text).includes(title));
  if (!plot || !plot._fullLayout || !plot.querySelector('.scatterlayer .trace')) return null;
  const size = {f8: 8, f4: 4};
  const values = v => v == null ? [] : (Array.isArray(v) ? v :
      (v.bdata ? Array.from(new Float64Array(Uint8Array.from(atob(v.bdata), c => c.charCodeAt(0)).buffer)) : Array.from(v)));
  return {range: plot._fullLayout.yaxis.range, title: plot._fullLayout.yaxis.title.text,
          bands: plot.data.filter(t => t.fill === 'toself').map(t => values(t.y).filter(y => y !== null && !isNaN(y))),
          colours: Object.fromEntries(plot.data.filter(t => t.fill !== 'toself').map(t => [t.name, t.line.color]))};
}"""

# Every legend, plot area (its drag rectangle, .nsewdrag) and chart title on the page as
# rectangles, and the page legend.
BOXES = """() => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  return {legends: Array.from(document.querySelectorAll('.js-plotly-plot .legend')).map(box),
          plots: Array.from(document.querySelectorAll('.js-plotly-plot .nsewdrag')).map(box),
          titles: Array.from(document.querySelectorAll('.js-plotly-plot .gtitle')).map(box),
          charts: Array.from(document.querySelectorAll('.js-plotly-plot')).map(box),
          page: Array.from(document.querySelectorAll('.wb-legend')).map(box),
          swatches: Array.from(document.querySelectorAll('.wb-legend > span'))
              .map(s => [s.textContent, s.firstElementChild.style.background])};
}"""


def overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.fixture
def two_seed_group(e2e_home):
    """Two arms x 2 finished seeds, the newest group of the server's store: the zero-std fraction
    of the seeds of an arm 0.5 apart (a t-band of 0.5 x 12.7 / 2 each side), reward as usual."""
    from tests.ui.seed import add_arm_run, metrics_event

    store = RunStore(e2e_home / "runs.db")
    for arm, offset in (("grpo", 0.0), ("rloo", 0.1)):
        for seed in range(2):
            events = []
            for step in range(30):
                event = metrics_event(step, 2000.0 + step, offset)
                event["metrics"]["frac_reward_zero_std"] = round(0.2 + offset + 0.5 * seed + 0.002 * step, 6)
                events.append(event)
            add_arm_run(store, f"charts-{arm}-{seed}", arm, seed, events, group="charts-e2e", home=e2e_home)
    return store


def test_arms_view_band_in_range_and_no_legend_over_a_plot(browser_page, server, two_seed_group, screenshots):
    page = browser_page
    page.goto(f"{server}/compare")  # opens on the newest group, in the arms view
    chart = wait_until(lambda: page.evaluate(FRACTION_CHART, TITLE), 90, "the zero-std fraction chart", page=page)
    assert chart["title"] == "fraction of prompts"
    low, high = chart["range"]
    # the means run from 0.45 to 0.608; the t-band would span -2.7 to 3.8: the axis follows the
    # means, inside [0, 1] plus its margin
    assert -0.1 <= low < 0.45 and 0.608 < high <= 1.1, chart["range"]
    assert chart["bands"] and all(0.0 <= y <= 1.0 for band in chart["bands"] for y in band), chart["bands"]
    page.wait_for_timeout(1000)  # every chart drawn
    boxes = page.evaluate(BOXES)
    assert len(boxes["plots"]) >= 10
    for legend in boxes["legends"]:  # no chart legend is drawn at all; if one were, it keeps clear
        assert not any(overlap(legend, p) for p in boxes["plots"] + boxes["titles"]), (legend, boxes)
    [page_legend] = boxes["page"]
    assert not any(overlap(page_legend, c) for c in boxes["charts"])
    swatches = dict(boxes["swatches"])
    assert set(swatches) == {"grpo", "rloo"} and len(set(swatches.values())) == 2
    assert page.get_by_test_id("stException").count() == 0
    page.screenshot(path=str(screenshots / "arms-two-seeds.png"), full_page=True)
