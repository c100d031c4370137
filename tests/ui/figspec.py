"""Read plotly figures back as the browser receives them (plotly >= 6 ships numpy arrays as
base64 typed arrays: {"dtype": "f8", "bdata": ...})."""

from __future__ import annotations

import base64
import json

import numpy as np


def decode(value):
    """A trace's x / y as a plain list of floats (typed arrays decoded, lists passed through)."""
    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"])).tolist()
    return list(value)


def traces(spec: str | dict) -> list[dict]:
    """Traces of a figure spec (JSON text or dict) with x and y decoded."""
    fig = json.loads(spec) if isinstance(spec, str) else spec
    return [{**t, "x": decode(t.get("x", [])), "y": decode(t.get("y", []))} for t in fig["data"]]
