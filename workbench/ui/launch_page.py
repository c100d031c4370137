"""Launch: a preset or a previous run as the starting point, every recipe field with its help and
inline validation, other algorithms to launch beside it as one comparison group, seeds per arm and
a sweep over any fields (every run planned and validated before anything starts), the target, and
the one-button quick comparison (GRPO vs RLOO vs PPO x 3 seeds)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import streamlit as st

from workbench import runs as wr
from workbench.runs.planning import InertSweepError, check_joins_group, inert_sweeps
from workbench.recipe import Recipe, RecipeError, load_recipe, preset_names
from workbench.engine.rewards import check_app_reward_funcs
from workbench.ui.common import (LAUNCH_ERRORS, any_active, blocked_notice, carry_out_flight, guarded_button,
                                 in_flight, request_flight, run_option, store)
from workbench.ui.recipe_form import (allowed_reward_refs, app_paths_sweep, check_app_paths, comparison_recipes,
                                      fields_at_fault, load_into_form, preset_notes, render_form, section_title,
                                      sweep_values_help, sweepable_fields)


def _targets() -> tuple[list[str], str | None]:
    """Every target the registered launchers offer with the settings ('local', 'ssh://HOST' per
    host, 'slurm', 'ray' with a cluster address ...); plus a settings error to show."""
    try:
        settings, error = wr.load_settings(), None
    except wr.SettingsError as err:
        settings, error = wr.Settings(), str(err)
    return list(target_labels(settings)), error


def target_labels(settings: wr.Settings) -> dict[str, str]:
    """{target: label} of every registered launcher (``Launcher.offered_targets``), 'local' first."""
    from workbench.runs.launchers import LAUNCHERS

    offered = {}
    for scheme in sorted(LAUNCHERS, key=lambda s: s != "local"):
        offered.update(LAUNCHERS.get(scheme).offered_targets(settings))
    return offered


#: Session keys of the two launch buttons' flights (``common.request_flight``, ``common.FLIGHT_PAGES``).
FORM_FLIGHT, QUICK_FLIGHT = "launch_flight", "quick_flight"



def result_message(group: str | None, ids: list[str]) -> str:
    """What a launch says: the run or group, its ids, and where to watch it (it / them)."""
    what = f"comparison group **{group}**" if group else ("run" if len(ids) == 1 else "runs")
    them = "it" if len(ids) == 1 else "them"
    return f"Launched {what}: " + ", ".join(f"`{i}`" for i in ids) + f". Watch {them} on **Live / Compare**."


def open_link_params(result: dict) -> dict[str, str | list[str]]:
    """The query of the 'Open Live / Compare' link after a launch: the group it made
    (``?group=G``), else the run (``?run=ID``), so Live / Compare opens on what was launched and
    not on the newest group."""
    return {"group": result["group"]} if result.get("group") else {"run": list(result["ids"])}


def _show_result(where: str) -> None:
    """The last launch's message and link, drawn at the button that launched it (``where``: 'form'
    or 'quick'), where the user's eyes and view are."""
    result = st.session_state.get("launch_result")
    if not result or st.session_state.get("launch_result_at") != where:
        return
    st.success(result_message(result["group"], result["ids"]), icon=":material/rocket_launch:")
    from workbench.ui.nav import page

    st.page_link(page("compare"), label="Open Live / Compare", icon=":material/monitoring:",
                 query_params=open_link_params(result))


def _active_quick_group() -> str | None:
    """The quick comparison this session launched, while it is being created or any run of it is
    active (a second click then must not launch another group)."""
    group = st.session_state.get("quick_group")
    if not group:
        return None
    runs = store().list_runs(group=group)
    return group if runs.empty or any_active(runs) else None


def _quick_comparison() -> None:
    with st.container(border=True):
        st.markdown(f"**First time here?** One click launches GRPO, RLOO and PPO on the built-in tiny model, "
                    f"{wr.QUICKSTART_SEEDS} seeds each, side by side on the same prompts (seed k shared by every "
                    "arm): Live / Compare then shows each arm's mean with its 95% band and a verdict table "
                    "saying which gaps are real (timings: bench/learning_bench.py).")
        running = _active_quick_group()
        help_ = f"Your quick comparison {running} is still running: watch it on Live / Compare." if running else None
        guarded_button("Quick comparison: GRPO vs RLOO vs PPO", key="quick_compare", type="primary", action="launch",
                       disabled=bool(running) or in_flight(QUICK_FLIGHT), help=help_,
                       on_click=request_flight, args=(QUICK_FLIGHT,))
        # a click queued before the button was drawn disabled finds its group running: dropped
        ids = carry_out_flight(QUICK_FLIGHT, wr.quickstart_plan, f"quick-{time.strftime('%Y%m%d-%H%M%S')}",
                               ready=not running)
        if ids:
            st.session_state["quick_group"] = st.session_state["launch_result"]["group"]
            st.session_state["launch_result_at"] = "quick"
            st.rerun()  # the result message (with its link) is drawn under this button
        _show_result("quick")


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
        return Recipe.from_yaml(store().get_run(run_id).recipe), f"run:{run_id}"
    except (RecipeError, wr.RunError) as err:
        st.error(f"run {run_id}: its recipe no longer validates: {err}")
        return None, ""


def launch_blocked_message(errors: dict[str, str]) -> str:
    """'Fix these fields before launching: train.minibatches (Training tab), ...'."""
    fields = fields_at_fault(errors)
    named = [f"{f} ({section_title(f)} tab)" if section_title(f) else f for f in fields]
    return f"Fix {'this field' if len(fields) == 1 else 'these fields'} before launching: " + ", ".join(named)


def _sweep_editor() -> tuple[dict[str, list] | None, list[str]]:
    """The sweep editor: fields picked from the recipe schema, comma-separated values for each.
    Returns ({dotted field: [values]} or None while a value list does not parse, the errors)."""
    specs = {s.path: s for s in sweepable_fields()}
    fields = st.multiselect("Sweep these fields (each combination of their values is one arm)", list(specs),
                            key="launch_sweep_fields", help="A grid over recipe fields, crossed with the seeds.")
    sweep, errors = {}, []
    for path in fields:
        text = st.text_input(f"Values of {path}", key=f"launch_sweep:{path}", placeholder="e.g. 0.2, 0.28",
                             help=sweep_values_help(specs[path]))
        if not text.strip():
            errors.append(f"sweep {path}: enter its values, comma separated")
            continue
        try:
            sweep |= wr.parse_sweep([f"{path}={text}"])
        except wr.RunError as err:
            errors.append(str(err).removeprefix("--"))
    return (None if errors else sweep), errors


@dataclass(frozen=True)
class Plan:
    """What the Launch page knows before the click: every run (None while anything is invalid),
    the one error naming the arm and seed at fault, and the swept fields without effect in some
    or every arm ({field: {arm: why}}; ``every_arm`` names the field that acts nowhere)."""

    planned: list[wr.PlannedRun] | None = None
    error: str | None = None
    inert: dict[str, dict[str, str]] = field(default_factory=dict)
    every_arm: InertSweepError | None = None


def _plan(recipe: Recipe | None, others: list[str], seeds: int, sweep: dict | None, target: str) -> Plan:
    """Every run of the launch, validated (``wr.plan_runs``), or the one error naming the arm and
    seed at fault; and where a swept field does nothing (``inert_sweeps``, from the specs).
    Nothing is launched here."""
    if recipe is None or sweep is None:
        return Plan()
    try:  # planning imports and reads nothing; a reward function the app does not offer or a path
        # outside the workbench home (swept too: swept values skip the form) is refused here
        grid = app_paths_sweep(sweep)
        planned = wr.plan_runs(comparison_recipes(recipe, others), seeds=seeds, sweep=grid, target=target)
        allowed = allowed_reward_refs()
        for run in planned:
            check_app_reward_funcs(run.recipe.reward_funcs, allowed)
            check_app_paths(run.recipe)
        return Plan(planned, inert=inert_sweeps(grid, planned))
    except InertSweepError as err:  # said beside the sweep editor, before any click
        return Plan(every_arm=err)
    except LAUNCH_ERRORS as err:
        return Plan(error=str(err).removeprefix("--"))


def inert_sweep_messages(plan: Plan) -> list[tuple[str, str]]:
    """(level, text) per swept field that does nothing somewhere: 'error' when it acts in no arm
    (the launch is refused: its arms would differ only by noise), 'warning' when it is inert in
    some arms (named, with the reason from the algorithm's spec)."""
    if plan.every_arm is not None:
        return [("error", f"Sweep {plan.every_arm.field}: no effect in any arm ({plan.every_arm.reason}), so its arms "
                          "would differ only by noise. Sweep a field that acts, or change the setting named.")]
    arms = len({p.arm for p in plan.planned or []})
    out = []
    for key, inert in plan.inert.items():
        reasons = sorted(set(inert.values()))
        out.append(("warning", f"Sweep {key}: no effect in {len(inert)} of {arms} arms ({', '.join(inert)}): "
                               f"{'; '.join(reasons)}. In those arms its values differ only by noise."))
    return out


def launch_label(planned: list[wr.PlannedRun] | None, seeds: int) -> str:
    """'Launch run', 'Launch 2 runs', 'Launch 3 runs (1 arm x 3 seeds)' or 'Launch 6 runs (2 arms x 3 seeds)'."""
    n = len(planned) if planned else 1
    if n == 1:
        return "Launch run"
    arms = len({p.arm for p in planned})
    return f"Launch {n} runs" + (f" ({arms} arm{'s' * (arms > 1)} x {seeds} seeds)" if seeds > 1 else "")


GROUP_CHARS = 48


def unique_group(base: str, taken: set[str]) -> str:
    """``base`` (cut to GROUP_CHARS) if no group has it, else the first free ``base-2``,
    ``base-3``, ...: re-launching the same sweep makes a new group instead of failing on the old one."""
    base = base[:GROUP_CHARS]
    if base not in taken:
        return base
    n = 2
    while f"{base[:GROUP_CHARS - len(str(n)) - 1]}-{n}" in taken:
        n += 1
    return f"{base[:GROUP_CHARS - len(str(n)) - 1]}-{n}"


def _default_group(recipe: Recipe | None, others: list[str], seeds: int, sweep: dict | None) -> str:
    """'grpo-vs-rloo-sweep-x3', made unique against the store's groups."""
    name = "-vs-".join([recipe.name if recipe else "run", *others])
    base = name + ("-sweep" if sweep else "") + (f"-x{seeds}" if seeds > 1 else "")
    return unique_group(base, set(store().groups()["group"]))


def group_conflict(group: str | None, planned: list[wr.PlannedRun] | None) -> str | None:
    """Why the group typed in the Comparison group field cannot take these runs (an arm there with
    another recipe, or a seed it already has), naming that field; None when it can."""
    if not group or not planned:
        return None
    try:
        check_joins_group(store().arms(group), group, planned)
    except wr.RunError as err:
        reason = str(err).rpartition("; ")[0] or str(err)  # the service's hint names CLI flags
        return f"Comparison group: {reason}. Type a new name in the Comparison group field."
    return None


def _launch_controls(recipe: Recipe | None, errors: dict[str, str], base: Recipe) -> None:
    st.subheader("Launch")
    # the choices leave out the starting point's preset, not whatever the editable run name says
    others = st.multiselect(
        "Compare with these algorithms (same model, task, prompts, sampling, steps and seed; each keeps its "
        "preset's algorithm and optimiser settings)", [p for p in preset_names() if p != base.name],
        key="launch_compare")
    seeds = int(st.number_input("Seeds per arm", 1, wr.MAX_RUNS_PER_LAUNCH, 1, key="launch_seeds",
                                help="Each arm runs with seeds s, s+1, ... (s = train.seed), paired across arms: "
                                "the verdict table needs >= 2 to say whether a gap is real."))
    sweep, sweep_errors = _sweep_editor()
    sweep_notes = st.container()  # filled once the plan says which swept fields act
    targets, settings_error = _targets()
    if settings_error:
        st.error(settings_error)
    cols = st.columns(3)
    labels = target_labels(wr.Settings() if settings_error else wr.load_settings())
    target = cols[0].selectbox("Target", targets, format_func=lambda t: labels.get(t, t), key="launch_target",
                               help="this machine, an SSH host from Settings, a SLURM cluster (sbatch) or a Ray "
                               "cluster (Jobs API).")
    plan = _plan(recipe, others, seeds, sweep, target)
    for level, message in inert_sweep_messages(plan):
        getattr(sweep_notes, level)(message, icon=":material/block:")
    planned = plan.planned
    several = bool(others) or seeds > 1 or bool(sweep)
    default_group = _default_group(recipe, others, seeds, sweep) if several else ""
    launches = st.session_state.get("launch_count", 0)  # a launch resets the field to the next free default
    group = cols[1].text_input("Comparison group", value=default_group, key=f"launch_group:{default_group}:{launches}",
                               help="Runs launched together are compared as one group.") if several else None
    tags_text = cols[2].text_input("Tags (comma separated)", key="launch_tags")
    notes = st.text_area("Notes", key="launch_notes", height=68)
    conflict = group_conflict(group.strip() if group else None, planned)
    if errors:
        st.error(launch_blocked_message(errors), icon=":material/error:")
    for message in [*sweep_errors, *([plan.error] if plan.error else []), *([conflict] if conflict else [])]:
        st.error(message, icon=":material/error:")
    blocked_notice()
    ready = planned is not None and not conflict
    button, feedback = st.columns([1, 3], vertical_alignment="center")
    with button:
        guarded_button(launch_label(planned, seeds), key="launch_go", type="primary", action="launch",
                       disabled=not ready or in_flight(FORM_FLIGHT), on_click=request_flight, args=(FORM_FLIGHT,))
    with feedback:
        tags = [t.strip() for t in tags_text.split(",") if t.strip()]
        group = (group.strip() or f"cmp-{time.strftime('%Y%m%d-%H%M%S')}") if planned and len(planned) > 1 else None
        ids = carry_out_flight(FORM_FLIGHT, lambda: planned, group, ready=ready, target=target,
                               tags=tags, notes=notes)
        if not ids:
            _show_result("form")
            return
        st.session_state["launch_result_at"] = "form"
        st.session_state["launch_count"] = launches + 1
        st.rerun()  # the button enabled again, the result beside it


def render() -> None:
    st.title("Launch")
    _quick_comparison()
    base, base_id = _starting_point()
    if base is None:
        return
    if st.session_state.get("rf:base") != base_id:  # a new starting point resets the fields
        load_into_form(base)
        st.session_state["rf:base"] = base_id
    recipe, errors = render_form(base)
    _launch_controls(recipe, errors, base)
