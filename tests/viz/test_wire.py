"""WireFigure.to_dict (what st.plotly_chart sends) equals plotly's own Figure.to_dict, exactly:
on every chart of the arms view and the per-run view (seeds, secondary series, NaN gaps, thinned
1,000-step curves) and on arrays of every dtype plotly narrows or leaves alone."""

import json

import numpy as np
import plotly.graph_objects as go
from plotly.io import to_json
import pytest

from tests.viz.test_arm_charts import every_metric_frame
from workbench.viz.arms import arm_figures
from workbench.viz.curves import PANELS, compare_figures
from workbench.viz.wire import WireFigure, figure_title, typed_array


def plotly_dict(fig) -> dict:
    return go.Figure.to_dict(fig)  # plotly's own conversion of the same figure


def same(ours: dict, plotlys: dict) -> bool:
    """Equal as sent: the same JSON, read back (an array left inside a list compares by value)."""
    return json.loads(to_json(ours, validate=False)) == json.loads(to_json(plotlys, validate=False))


def a_long_frame_with_gaps():
    """Every metric, 3 arms x 3 seeds x 1,000 steps (thinned when drawn), one seed missing a
    stretch of one metric (NaN gaps in its band and curve)."""
    df = every_metric_frame(seeds=3, steps=1000)
    df.loc[(df["seed"] == 2) & df["step"].between(100, 300), "reward"] = np.nan
    return df


@pytest.mark.parametrize("options", [{}, {"show_seeds": True, "secondary": True, "smoothing": 0.6},
                                     {"x": "wall time", "band": "minmax"}])
def test_arms_view_charts_send_what_plotly_would(options):
    charts = arm_figures(a_long_frame_with_gaps(), list(PANELS), **options)
    assert all(isinstance(chart.figure, WireFigure) for chart in charts.values())
    for key, chart in charts.items():
        unbuilt = chart.figure.to_dict()
        assert figure_title(chart.figure) == PANELS[key].title and "_wire" in chart.figure.__dict__  # still unbuilt
        assert unbuilt == plotly_dict(chart.figure), key  # no array left: dicts compare
        assert "_wire" not in chart.figure.__dict__ and chart.figure.to_dict() == unbuilt  # built: the same again


def test_per_run_view_charts_send_what_plotly_would():
    df = a_long_frame_with_gaps()
    for key, fig in compare_figures(df, list(PANELS), smoothing=0.3, secondary=True).items():
        assert isinstance(fig, WireFigure)
        unbuilt = fig.to_dict()
        assert unbuilt == plotly_dict(fig) == fig.to_dict(), key


def test_a_built_figure_is_plotlys_own():
    """Once built (first use of anything but to_dict), a WireFigure is the go.Figure the same
    arguments give: its traces, layout, updates, copies and JSON."""
    import copy

    chart = arm_figures(a_long_frame_with_gaps(), ["reward"], show_seeds=True)["reward"].figure
    data, layout = chart.__dict__["_wire"]
    plain = go.Figure(_validate=False, data=data, layout=layout)
    assert len(chart.data) == len(plain.data) and chart.layout == plain.layout and chart == plain
    chart.update_layout(height=500)
    assert chart.to_dict()["layout"]["height"] == 500 and copy.deepcopy(chart).layout.height == 500
    assert go.Figure(chart).to_dict() == chart.to_dict()
    # the traces and layout objects belong to this figure: edits through them reach its JSON
    chart.data[0].line.color = "#123456"
    chart.layout.xaxis.title.text = "steps"
    chart.update_traces(opacity=0.5, selector={"name": chart.data[-1].name})
    chart.add_trace(go.Scatter(x=[0, 1], y=[1, 2], name="added"))
    sent = chart.to_dict()
    assert sent["data"][0]["line"]["color"] == "#123456" and sent["layout"]["xaxis"]["title"]["text"] == "steps"
    assert sent["data"][-2]["opacity"] == 0.5 and sent["data"][-1]["name"] == "added"
    assert all(trace.figure is chart for trace in chart.data) and chart.layout.figure is chart


ARRAYS = {
    "float64": np.array([0.5, np.nan, -np.inf, 1e300]),
    "float32": np.array([0.5, 2.0], dtype=np.float32),
    "int64 small": np.array([1, 2, 3]),              # narrowed to int8
    "int64 medium": np.array([-40_000, 40_000]),      # int32
    "int64 large": np.array([0, 2**40]),             # left as it is (plotly.js has no int64)
    "uint64": np.array([1, 300], dtype=np.uint64),    # uint16
    "bool": np.array([True, False]),
    "strings": np.array(["a", "b"], dtype=object),
    "2-D": np.arange(6.0).reshape(2, 3),
    "empty": np.array([], dtype=np.float64),
    "strided": np.arange(10.0)[::2],
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_every_array_kind_is_encoded_as_plotly_encodes_it(name):
    values = ARRAYS[name]
    fig = WireFigure(_validate=False, data=[{"type": "scatter", "x": values, "y": values,
                                             "customdata": (values, [values]), "marker": {"color": values}}],
                     layout={"xaxis": {"range": [0, 1]}, "title": {"text": name}})
    sent = fig.to_dict()
    assert same(sent, plotly_dict(fig))
    assert all(isinstance(v, np.ndarray) for v in (fig._data[0]["x"], fig._data[0]["marker"]["color"]))  # left as it was
    if name in ("float64", "float32", "int64 small", "int64 medium", "uint64", "strided"):  # the quick path's
        assert sent["data"][0]["x"] == typed_array(values) and "bdata" in sent["data"][0]["x"]


def test_sessions_sharing_a_figure_build_it_once_and_all_read_the_same():
    """Cached charts are shared by the app's sessions (threads): a download building a figure while
    another session sends it, or two building it at once, all get plotly's figure."""
    from concurrent.futures import ThreadPoolExecutor

    for _ in range(5):
        fig = arm_figures(a_long_frame_with_gaps(), ["reward"])["reward"].figure
        expected = go.Figure(_validate=False, data=fig.__dict__["_wire"][0], layout=fig.__dict__["_wire"][1]).to_dict()
        reads = [lambda: fig.to_dict(), lambda: go.Figure.to_dict(fig), lambda: len(fig.data), lambda: fig.layout.height]
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda k: reads[k % 4](), range(32)))
        assert all(r == expected for r in results[0::4] + results[1::4])
        assert set(results[2::4]) == {len(expected["data"])} and set(results[3::4]) == {expected["layout"]["height"]}
