"""Launch: a preset or a previous run as the starting point, every recipe field with its help and
inline validation, other algorithms to launch beside it as one comparison group, the target, and
the one-button quick comparison."""

from __future__ import annotations

import time

import streamlit as st

from workbench import runs as wr
from workbench.recipe import Recipe, RecipeError, load_recipe, preset_names
from workbench.ui.common import blocked_notice, guarded_button, launch_and_remember, run_option, store
from workbench.ui.recipe_form import comparison_recipes, load_into_form, preset_notes, render_form


def _targets() -> tuple[list[str], str | None]:
    """'local', 'ssh://HOST' per host in settings, 'slurm'; plus a settings error to show."""
    try:
        hosts = list(wr.load_settings().ssh_hosts)
    except wr.SettingsError as err:
        return ["local", "slurm"], str(err)
    return ["local", *[f"ssh://{h}" for h in hosts], "slurm"], None


TARGET_LABELS = {"local": "this machine", "slurm": "SLURM (sbatch)"}


def _show_result() -> None:
    result = st.session_state.get("launch_result")
    if not result:
        return
    what = f"comparison group **{result['group']}**" if result["group"] else "run"
    st.success(f"Launched {what}: " + ", ".join(f"`{i}`" for i in result["ids"])
               + ". Watch them on **Live / Compare**.", icon=":material/rocket_launch:")
    if st.button("Watch live", key="launch_watch"):
        from workbench.ui.nav import page

        st.switch_page(page("compare"))


def _quick_comparison() -> None:
    with st.container(border=True):
        st.markdown("**First time here?** One click launches GRPO, RLOO and PPO on the built-in tiny model, "
                    "side by side on the same prompts and seed; on a 2-core CPU all three finish in about "
                    "90 s with rewards rising (measured by bench/learning_bench.py).")
        if guarded_button("Quick comparison: GRPO vs RLOO vs PPO", key="quick_compare", type="primary"):
            launch_and_remember(wr.quickstart_recipes(), f"quick-{time.strftime('%Y%m%d-%H%M%S')}")


def _starting_point() -> tuple[Recipe | None, str]:
    source = st.radio("Start from", ["Preset", "Previous run"], horizontal=True, key="launch_source")
    if source == "Preset":
        names = preset_names()
        name = st.selectbox("Preset", names, index=names.index("grpo") if "grpo" in names else 0, key="launch_preset")
        with st.expander(f"About the {name} preset (paper, defining settings)"):
            st.markdown(f"```text\n{preset_notes(name)}\n```")
        return load_recipe(name), f"preset:{name}"
    runs = store().list_runs()
    if runs.empty:
        st.info("No runs yet: start from a preset.")
        return None, ""
    run_id = st.selectbox("Run", runs["id"].tolist(), format_func=run_option(runs), key="launch_from_run")
    try:
        return Recipe.from_yaml(store().get_run(run_id)["recipe"]), f"run:{run_id}"
    except (RecipeError, wr.RunError) as err:
        st.error(f"run {run_id}: its recipe no longer validates: {err}")
        return None, ""


def _launch_controls(recipe: Recipe | None, errors: dict[str, str], base: Recipe) -> None:
    st.subheader("Launch")
    # the choices leave out the starting point's preset, not whatever the editable run name says
    others = st.multiselect(
        "Compare with these algorithms (same model, task, prompts, sampling, steps and seed; each keeps its "
        "preset's algorithm and optimiser settings)", [p for p in preset_names() if p != base.name],
        key="launch_compare")
    targets, settings_error = _targets()
    if settings_error:
        st.error(settings_error)
    cols = st.columns(3)
    target = cols[0].selectbox("Target", targets, format_func=lambda t: TARGET_LABELS.get(t, t), key="launch_target",
                               help="this machine, an SSH host from Settings, or a SLURM cluster (sbatch).")
    default_group = "-vs-".join([recipe.name if recipe else "run", *others])[:48] if others else ""
    group = cols[1].text_input("Comparison group", value=default_group, key=f"launch_group:{default_group}",
                               help="Runs launched together are compared as one group.") if others else None
    tags_text = cols[2].text_input("Tags (comma separated)", key="launch_tags")
    notes = st.text_area("Notes", key="launch_notes", height=68)
    if errors:
        st.error(f"Fix {len(errors)} field(s) before launching: " + ", ".join(k or "recipe" for k in errors))
    blocked_notice()
    label = f"Launch {1 + len(others)} runs" if others else "Launch run"
    if not guarded_button(label, key="launch_go", type="primary", disabled=recipe is None):
        return
    tags = [t.strip() for t in tags_text.split(",") if t.strip()]
    recipes, group = (comparison_recipes(recipe, others), group or f"cmp-{time.strftime('%Y%m%d-%H%M%S')}") if others else ([recipe], None)
    if launch_and_remember(recipes, group, target=target, tags=tags, notes=notes):
        st.rerun()


def render() -> None:
    st.title("Launch")
    _show_result()
    _quick_comparison()
    base, base_id = _starting_point()
    if base is None:
        return
    if st.session_state.get("rf:base") != base_id:  # a new starting point resets the fields
        load_into_form(base)
        st.session_state["rf:base"] = base_id
    recipe, errors = render_form(base)
    _launch_controls(recipe, errors, base)
