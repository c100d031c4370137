"""Widgets the lab pages share: picking runs from the store, reading their recipe, and a launch
button that respects the app's sign-in policy. Layout only; the store is opened only by the
empirical halves, so a lab's analytic half works even where no run store can be opened."""

from __future__ import annotations

from typing import Any

import streamlit as st

from workbench.algorithms import FAMILIES, LabSlider
from workbench.recipe import Recipe
from workbench.runs import RunStore
from workbench.ui import auth
from workbench.ui.common import guarded_button, launch_and_remember, run_option


def open_store():
    """The run store of this workbench home, or None (with the reason shown) if it cannot open."""
    try:
        return RunStore()
    except Exception as err:  # the analytic half of the page must still work
        st.info(f"No run store available here ({type(err).__name__}: {err}); the empirical views need one.")
        return None


def pick_runs(store, *, key: str, label: str = "Runs", multi: bool = True, max_default: int = 2) -> list[str]:
    """Select runs from the store (newest first); [] when there are none."""
    runs = store.list_runs()
    if not len(runs):
        st.info("No runs yet: launch one (Launch page, or the button on this page) to see what happened to its tokens.")
        return []
    runs = runs.sort_values("created_at", ascending=False)
    ids = list(runs["id"])
    if multi:
        return st.multiselect(label, ids, default=ids[:max_default], format_func=run_option(runs), key=key)
    chosen = st.selectbox(label, ids, format_func=run_option(runs), key=key)
    return [chosen] if chosen else []


def run_recipe(store, run_id: str) -> Recipe | None:
    """The recipe a run was launched with (None if the store has none that validates)."""
    try:
        return Recipe.from_yaml(store.get_run(run_id).get("recipe") or "")
    except Exception:
        return None


def diagnostics_by_step(store, run_id: str) -> dict[int, dict[str, Any]]:
    return {step: store.diagnostics(run_id, step) for step in store.diagnostic_steps(run_id)}


def launch_button(recipes: list[Recipe], *, key: str, label: str, group: str | None = None) -> list[str]:
    """A button launching ``recipes`` on this machine (one run, or a comparison ``group``) as the
    signed-in user; disabled, with the reason, when this session may not launch. The new runs
    are preselected on Live / Compare; returns their ids ([] when nothing was launched)."""
    reason = auth.blocked_reason()
    if reason:
        st.caption(f":material/lock: {reason}")
    if guarded_button(label, key=key) and (ids := launch_and_remember(recipes, group)):
        them = "it" if len(ids) == 1 else "them"
        st.success(f"Launched {', '.join(ids)}: follow {them} on the Live / Compare page; "
                   "its tokens appear here as it runs.")
        return ids
    return []


# Widgets per row for the losses' own settings (the specs' RegionLab sliders).
SLIDERS_PER_ROW = 3


def _spec_slider(col, s: LabSlider, key: str) -> float:
    """One widget of a loss's own settings (a spec's LabSlider): a slider, or a number input where
    the spec gives a format (GSPO's paper clip, 3e-4, is finer than a slider's step)."""
    if s.number_format is not None:
        return col.number_input(s.label, s.lo, s.hi, s.default, s.step, format=s.number_format, key=key, help=s.help or None)
    return col.slider(s.label, s.lo, s.hi, s.default, s.step, key=key, help=s.help or None)


def own_settings(names: list[str], prefix: str) -> dict[str, dict[str, float]]:
    """The widgets of every policy loss in ``names`` whose spec has a ``region_lab``, in rows of
    ``SLIDERS_PER_ROW``, keyed ``prefix + slider key`` -> {loss: config attributes it is drawn
    with}; a loss whose spec sets nothing of its own is left out (drawn with the page's PPO-clip
    settings)."""
    specs = FAMILIES["policy_loss"].specs
    labs = {n: specs[n].region_lab for n in names if specs[n].region_lab is not None}
    sliders = [s for lab in labs.values() for s in lab.sliders]
    values: dict[str, float] = {}
    for row in range(0, len(sliders), SLIDERS_PER_ROW):
        for col, s in zip(st.columns(SLIDERS_PER_ROW), sliders[row:row + SLIDERS_PER_ROW]):
            values[s.key] = _spec_slider(col, s, prefix + s.key)
    return {n: settings for n, lab in labs.items() if (settings := lab.settings(values))}


def show_table(data, *, key: str, **kwargs) -> None:
    """``st.dataframe`` as every lab draws it: no index, and missing cells empty. The worked
    examples pad shorter completions with missing values and their captions say "empty cells are
    padding"; Streamlit draws a missing value as "None" unless told otherwise."""
    st.dataframe(data, hide_index=True, placeholder="", key=key, **kwargs)
