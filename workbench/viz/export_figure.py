"""Any figure as a file to keep: PNG and SVG at print resolution, and the plotted data as CSV.

PNG and SVG go through plotly's static export, Kaleido 1.x, which renders the figure with the
plotly.js bundled in the plotly package inside a headless Chromium. Two choices keep it offline
and download-free on a fresh machine: the browser is the system's Chromium (``browser_path``:
``BROWSER_PATH`` if set, the variable Kaleido's browser driver (choreographer) reads, else the
first Chromium or Chrome on ``PATH``, e.g. Debian's ``/usr/bin/chromium`` that the browser tests
drive; Kaleido never fetches one itself, it raises), and MathJax is off (Kaleido's default loads
it from a CDN; no chart here typesets TeX). Where either Kaleido or a browser is missing,
``static_export_problem`` names it with the command that installs it: the page then offers CSV
only and says so once.

CSV is the figure's own data, one row per plotted point: ``trace`` (its name), ``x``, ``y``,
``band_low``, ``band_high``. A band drawn as a filled outline (``fill="toself"``, the arms view's
confidence band: along x on the upper edge, back on the lower) is folded into the columns of the
trace it belongs to (same ``legendgroup``) at the same x; error bars become the band of their
own points (y - minus, y + plus). Values are written with Python's shortest round-trip repr, so
reading the CSV back gives the plotted floats exactly.

No Streamlit here; a page calls ``figure_bytes`` when the user asks for a file.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pandas as pd
import plotly.graph_objects as go

PRINT_SCALE = 3  # 700 x 300 layout px -> 2100 x 900 px: 7 x 3 in at 300 dpi, a full-width journal figure
DEFAULT_WIDTH = 700  # plotly's default width, for figures that size themselves to their container
DEFAULT_HEIGHT = 500  # plotly's default height
_CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
INSTALL_KALEIDO = "pip install kaleido==1.5.0"  # the pin of requirements.txt
INSTALL_CHROMIUM = "apt-get install chromium"  # Debian's, as tests/e2e/conftest.py installs it
CSV_COLUMNS = ["trace", "x", "y", "band_low", "band_high"]


class ExportError(RuntimeError):
    """A figure that cannot be rendered here (no browser, a browser that failed); says what to install."""


def browser_path() -> str:
    """The Chromium Kaleido drives: ``BROWSER_PATH`` if set (the variable choreographer reads),
    else the first Chromium / Chrome on ``PATH`` (``_CHROMIUM_NAMES``). ExportError naming what to
    install when there is none (Kaleido would only suggest downloading one)."""
    chosen = os.environ.get("BROWSER_PATH")
    if chosen:
        if not Path(chosen).is_file():
            raise ExportError(f"BROWSER_PATH={chosen!r} is not a file: point it at a Chromium or Chrome executable, "
                              f"or unset it and `{INSTALL_CHROMIUM}`")
        return chosen
    found = next((p for p in map(shutil.which, _CHROMIUM_NAMES) if p), None)
    if found is None:
        raise ExportError(f"PNG / SVG export needs Chromium, and none is on PATH: `{INSTALL_CHROMIUM}` (or set "
                          "BROWSER_PATH to a Chromium or Chrome executable)")
    return found


def kaleido_installed() -> bool:
    """Whether ``import kaleido`` would find the package, without importing it (it pulls in its
    browser driver: the page and the report do not pay for that until a PNG is asked for)."""
    try:
        return importlib.util.find_spec("kaleido") is not None
    except (ImportError, ValueError):  # sys.modules["kaleido"] = None: Python's "not importable"
        return False


def static_export_problem() -> str | None:
    """Why PNG / SVG cannot be made on this machine, naming what is missing and the command that
    installs it (None when both Kaleido and a browser are there). CSV needs neither."""
    if not kaleido_installed():
        return f"PNG / SVG export needs the kaleido package, which is not installed: `{INSTALL_KALEIDO}`"
    try:
        browser_path()
    except ExportError as err:
        return str(err)
    return None


def _size(fig: go.Figure) -> tuple[int, int]:
    """(width, height) in layout pixels: the figure's own, else plotly's defaults."""
    return int(fig.layout.width or DEFAULT_WIDTH), int(fig.layout.height or DEFAULT_HEIGHT)


def with_legend(fig: go.Figure) -> go.Figure:
    """A copy of ``fig`` with its own legend: on the page the charts leave the legend to the page
    (one for all charts, ``curves.legend_html``), but an exported image stands alone. The legend
    lists each series' main line: the traces named as their legend group (``metric_figure``'s and
    ``arm_figure``'s convention; bands, raw and per-seed lines are not listed)."""
    out = go.Figure(fig)
    out.update_layout(showlegend=True)
    for trace in out.data:
        if trace.name is not None and trace.name == trace.legendgroup:
            trace.showlegend = True
    return out


def _image(fig: go.Figure, fmt: str, scale: float) -> bytes:
    """``fig`` rendered by Kaleido as ``fmt`` ('png' | 'svg'), ``scale`` x its layout size, with
    its legend (``with_legend``)."""
    problem = static_export_problem()
    if problem:
        raise ExportError(problem)
    import kaleido  # imported on first export: the page and the report never pay for it otherwise
    from kaleido.errors import ChromeNotFoundError

    width, height = _size(fig)
    try:
        data = kaleido.calc_fig_sync(with_legend(fig).to_dict(), opts={"format": fmt, "width": width, "height": height,
                                                          "scale": scale},
                                     kopts={"path": browser_path(), "mathjax": False})
    except ChromeNotFoundError as err:
        raise ExportError(f"Kaleido found no browser: {err}") from None
    return data if isinstance(data, bytes) else data.encode()


def _fold_outline(xs: np.ndarray, ys: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
    """A ``fill="toself"`` band outline (stretches separated by NaN, each along x on the upper edge
    then back on the lower one, as ``viz.arms.band_polygon`` draws it) -> [(x, low, high)] per
    stretch; None when an outline is not of that shape (then its points are written as they are)."""
    gaps = np.flatnonzero(~np.isfinite(ys) & ~np.isfinite(xs.astype(np.float64, copy=False)))
    stretches = []
    for part_x, part_y in zip(np.split(xs, gaps), np.split(ys, gaps)):
        part_x, part_y = part_x[np.isfinite(part_y)], part_y[np.isfinite(part_y)]
        k = len(part_x) // 2
        if len(part_x) != 2 * k or not np.array_equal(part_x[:k], part_x[k:][::-1]):
            return None
        stretches.append((part_x[:k], part_y[k:][::-1], part_y[:k]))
    return stretches


def _error_band(trace, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(low, high) of a trace's asymmetric or symmetric data error bars, None without them."""
    error = trace.error_y if "error_y" in trace else None
    if error is None or error.array is None or error.visible is False:
        return None
    plus = np.asarray(error.array, dtype=np.float64)
    minus = plus if error.symmetric is not False or error.arrayminus is None else np.asarray(error.arrayminus,
                                                                                             dtype=np.float64)
    return ys - minus, ys + plus


def _trace_values(trace) -> tuple[np.ndarray, np.ndarray]:
    xs = np.asarray(trace.x if trace.x is not None else np.arange(len(trace.y)))
    if xs.dtype.kind in "iuf":
        xs = xs.astype(np.float64)
    return xs, np.asarray([np.nan if v is None else v for v in trace.y], dtype=np.float64)


def figure_table(fig: go.Figure) -> pd.DataFrame:
    """The plotted points of ``fig``: one row per (trace, point), columns ``CSV_COLUMNS``, traces
    in drawing order. A band outline fills ``band_low`` / ``band_high`` of the line trace named as
    its ``legendgroup`` (the arms view's mean line) at equal x (a band with no such line keeps rows of its own, ``y`` empty); a
    filled trace of another shape is written point by point like any line."""
    bands: dict[str, tuple[str, list]] = {}
    lines = []
    for trace in fig.data:
        if getattr(trace, "y", None) is None:
            continue
        xs, ys = _trace_values(trace)
        outline = _fold_outline(xs, ys) if getattr(trace, "fill", None) == "toself" and trace.legendgroup else None
        if outline is not None:
            bands[trace.legendgroup] = (trace.name, outline)
        else:
            lines.append((trace, xs, ys))
    frames = []
    for trace, xs, ys in lines:
        low, high = _error_band(trace, ys) or (np.full(len(xs), np.nan), np.full(len(xs), np.nan))
        if trace.name == trace.legendgroup and trace.name in bands:  # the group's line (its seeds are named apart)
            at = {x: (lo, hi) for px, plo, phi in bands.pop(trace.name)[1] for x, lo, hi in zip(px, plo, phi)}
            low, high = (np.array([at.get(x, (np.nan, np.nan))[i] for x in xs], dtype=np.float64) for i in (0, 1))
        frames.append(pd.DataFrame({"trace": trace.name, "x": xs, "y": ys, "band_low": low, "band_high": high}))
    for name, outline in bands.values():  # bands whose line is not drawn: rows of their own
        frames += [pd.DataFrame({"trace": name, "x": px, "y": np.nan, "band_low": lo, "band_high": hi})
                   for px, lo, hi in outline]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=CSV_COLUMNS)


def figure_csv(fig: go.Figure) -> bytes:
    """``figure_table`` as UTF-8 CSV (floats in shortest round-trip form; NaN as an empty cell)."""
    return figure_table(fig).to_csv(index=False).encode()


class Format(NamedTuple):
    """One file format a figure exports to: its MIME type, how the bytes are made, what it is,
    and whether it is a static image (made by Kaleido in a browser: ``static_export_problem``)."""

    mime: str
    render: Callable[[go.Figure, float], bytes]
    help: str
    static: bool = True


FORMATS: dict[str, Format] = {
    "png": Format("image/png", lambda fig, scale: _image(fig, "png", scale),
                  f"PNG at print resolution ({PRINT_SCALE}x: {PRINT_SCALE * DEFAULT_WIDTH} px wide, "
                  f"{PRINT_SCALE * DEFAULT_WIDTH / 300:g} in at 300 dpi)"),
    "svg": Format("image/svg+xml", lambda fig, scale: _image(fig, "svg", scale), "SVG (vector, for papers and slides)"),
    "csv": Format("text/csv", lambda fig, scale: figure_csv(fig),
                  "CSV of the plotted data: per trace x, y and its band (low, high)", static=False),
}


def figure_bytes(fig: go.Figure, fmt: str, *, scale: float = PRINT_SCALE) -> bytes:
    """``fig`` as a file of format ``fmt`` (a ``FORMATS`` key): PNG at ``scale`` x its layout size
    (a figure without a width is exported ``DEFAULT_WIDTH`` wide), SVG (vector, scale-free), CSV
    (``figure_table``). ValueError naming the format otherwise; ExportError without a browser."""
    if fmt not in FORMATS:
        raise ValueError(f"format={fmt!r} is not allowed; one of: {', '.join(FORMATS)}")
    return FORMATS[fmt].render(fig, scale)


def file_name(title: str, fmt: str) -> str:
    """A download's file name from a chart title: 'Reward (batch mean)', 'png' -> 'reward-batch-mean.png'."""
    stem = "-".join("".join(c if c.isalnum() else " " for c in title.lower()).split()) or "figure"
    return f"{stem}.{fmt}"
