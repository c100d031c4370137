"""A plotly Figure that is quick to send: ``WireFigure.to_dict`` is what ``st.plotly_chart`` serialises.

plotly's ``BaseFigure.to_dict`` deep-copies every trace and then walks the copy, passing each
array through ``copy_to_readonly_numpy_array`` (a narwhals probe for a dataframe type, ~0.3 ms an
array) before base64-encoding it as a plotly.js typed array (``{"dtype": "f8", "bdata": ...}``).
The arms view of 10 arms sends ~550 arrays on every live redraw: that walk was ~40% of the render.
Our charts' arrays are numpy arrays we built, so ``to_dict`` encodes them directly with plotly's
own typed-array rules (``to_typed_array_spec``: int64 narrowed to the smallest int that holds the
values, the same short dtype names) and copies only the containers. The result equals
``go.Figure.to_dict`` of the same figure (tests/viz/test_wire.py, on every chart of both views).
"""

from __future__ import annotations

import base64
import threading
from copy import deepcopy

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from _plotly_utils.utils import convert_to_base64, is_skipped_key, plotlyjsShortTypes, to_typed_array_spec

# int64 / uint64 arrays are sent as the narrowest type that holds their values (plotly.js has no
# 64-bit ints), as plotly's to_typed_array_spec does
_NARROW = {np.dtype(wide): tuple(map(np.iinfo, narrow))
           for wide, narrow in {"int64": ("int8", "int16", "int32"), "uint64": ("uint8", "uint16", "uint32")}.items()}
# plotly.js's short type names keyed by numpy dtype (str(dtype) per array was a tenth of the encoding)
_SHORT_TYPES = {np.dtype(name): short for name, short in plotlyjsShortTypes.items()}


def narrowed(v: np.ndarray) -> np.ndarray:
    """An int64 / uint64 array as the narrowest integer type of 8, 16 or 32 bits that holds its
    values, as plotly sends it (``v`` itself when none does, or for any other dtype). A caller
    that narrows a whole column once spares the check of each array cut from it."""
    if v.size == 0:
        return v
    for info in _NARROW.get(v.dtype, ()):
        if info.min <= v.min() and v.max() <= info.max:
            return v.astype(info.dtype)
    return v


def typed_array(v: np.ndarray):
    """plotly.js's typed-array spec of a numeric 1-D numpy array ({"dtype", "bdata"}), as
    ``to_typed_array_spec`` makes it; any other array goes through plotly's own function."""
    if v.ndim != 1 or v.size == 0 or v.dtype.kind not in "fiu":
        return to_typed_array_spec(v)
    v = narrowed(v)
    short = _SHORT_TYPES.get(v.dtype)
    if short is None:  # int64 beyond int32: plotly leaves it as it is
        return to_typed_array_spec(v)
    return {"dtype": short, "bdata": base64.b64encode(np.ascontiguousarray(v)).decode("ascii")}


_LEAVES = (str, int, float, bool, type(None))


def _encoded(obj):
    """A copy of a trace's properties with every numpy array that is a dict's value as its
    typed-array spec, as plotly's ``convert_to_base64`` does (containers copied; leaves shared:
    strings and numbers are immutable, and an array inside a list is sent as it is)."""
    if isinstance(obj, dict):  # a string or number is itself whatever its key (plotly's key check is a loop)
        return {k: (v if isinstance(v, _LEAVES) or is_skipped_key(k) else
                    typed_array(v) if isinstance(v, np.ndarray) else _encoded(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):  # an array directly in a list stays an array, as plotly leaves it
        return type(obj)(_encoded(v) for v in obj)
    return obj


def _template(name: str) -> dict:
    """The layout template plotly puts in a new figure's ``to_dict`` (``pio.templates.default``)."""
    if name not in _TEMPLATES:
        _TEMPLATES[name] = go.Figure.to_dict(go.Figure())["layout"].get("template")
    return _TEMPLATES[name]


_TEMPLATES: dict[str, dict | None] = {}
_BUILD_LOCK = threading.RLock()


class WireFigure(go.Figure):
    """``go.Figure(data=[trace dicts], layout={...}, _validate=False)`` that builds plotly's objects
    only when something asks for them, and a quick ``to_dict`` (the module's docstring).

    Building a figure's plotly objects (one trace object per dict, each property set through its
    validator, the traces deep-copied, the layout template copied in) was ~30% of the arms view's
    redraw, and a redraw only needs ``to_dict``: the figure keeps its trace dicts and layout as given
    (``_wire``) and becomes a plain plotly figure on first use of anything else (``fig.data``,
    ``fig.update_layout``, a download's ``write_image``), built as ``go.Figure`` would build it then.
    Any other call of the constructor is ``go.Figure``'s."""

    def __init__(self, data=None, layout=None, frames=None, skip_invalid=False, **kwargs):
        if (kwargs == {"_validate": False} and frames is None and not skip_invalid and isinstance(data, list)
                and all(isinstance(t, dict) for t in data) and isinstance(layout, (dict, type(None)))):
            object.__setattr__(self, "_wire", (data, layout or {}))
            return
        super().__init__(data, layout, frames, skip_invalid, **kwargs)

    def __getattr__(self, name):
        # called only for an attribute not found: before the build, each of plotly's own. Cached
        # figures are shared by the app's sessions (threads): one builds, the others wait for it.
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # copy / pickle probes: no reason to build
        with _BUILD_LOCK:
            wire = self.__dict__.get("_wire")
            if wire is not None:
                self._take_over(go.Figure(data=wire[0], layout=wire[1], _validate=False))
        return object.__getattribute__(self, name)

    def _take_over(self, built: go.Figure) -> None:
        """Become ``built`` in one step. The figure is built apart and its state moved in at once
        (its traces, layout and uid setter pointed at this figure, as ``BaseFigure.__init__``
        points them at the figure it builds): built in place, another session's thread read it
        half-made, e.g. its layout before the template was put in (a flaky test under load).
        ``dict.update`` runs under the GIL without Python code in between: a reader sees none of
        plotly's state or all of it; ``to_dict`` reads ``_wire`` until the state is all there."""
        state = dict(built.__dict__)
        for trace in state["_data_objs"]:
            trace._parent = self
        state["_layout_obj"]._parent = self
        state["_data_validator"].set_uid = self._set_trace_uid
        self.__dict__.update(state)
        del self.__dict__["_wire"]

    @property
    def title_text(self) -> str | None:
        """The layout's title text, read without building the figure."""
        wire = self.__dict__.get("_wire")
        return (wire[1].get("title") or {}).get("text") if wire is not None else self.layout.title.text

    def to_dict(self) -> dict:
        wire = self.__dict__.get("_wire")  # None once built (and then whole: ``_take_over``)
        if wire is not None:  # as go.Figure(data, layout, _validate=False).to_dict() would give
            data, layout = wire
            layout = deepcopy(layout)
            if "template" not in layout and _template(pio.templates.default) is not None:
                layout["template"] = deepcopy(_template(pio.templates.default))
            convert_to_base64(layout)
            return {"data": [_encoded(trace) for trace in data], "layout": layout}
        res = {"data": [_encoded(trace) for trace in self._data], "layout": deepcopy(self._layout)}
        convert_to_base64(res["layout"])  # small: plotly's own walk
        frames = deepcopy([frame._props for frame in self._frame_objs])
        if frames:
            convert_to_base64(frames)
            res["frames"] = frames
        return res


def figure_title(fig: go.Figure) -> str | None:
    """A figure's title text (a ``WireFigure`` is not built to read it)."""
    return fig.title_text if isinstance(fig, WireFigure) else fig.layout.title.text
