"""Runs: every run with status, progress, algorithm, target, owner, reward so far, tags and notes;
filter and sort; cancel, resume, delete, rename, tag and annotate one run; where its trained model is."""

from __future__ import annotations

import streamlit as st

from workbench import runs as wr
from workbench.ui import auth
from workbench.ui.common import any_active, guarded_button, run_option, store
from workbench.viz.curves import step_label
from workbench.viz.tables import SORT_KEYS, all_tags, filter_runs, runs_table

TABLE_CONFIG = {
    "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent"),
    "reward": st.column_config.NumberColumn("reward (last step)", format="%.3f"),
    "created": st.column_config.DatetimeColumn("created", format="YYYY-MM-DD HH:mm:ss"),
    "owner": st.column_config.TextColumn("owner", help="who launched it (the name given at sign-in)"),
}


def _filters(table):
    cols = st.columns([2, 1, 1, 2, 1, 1])
    statuses = cols[0].multiselect("Status", list(wr.STATUSES), key="runs_status")
    groups = [""] + sorted({g for g in table["group"] if g})
    group = cols[1].selectbox("Group", groups, format_func=lambda g: g or "all", key="runs_group")
    tag = cols[2].selectbox("Tag", [""] + all_tags(table), format_func=lambda t: t or "all", key="runs_tag")
    search = cols[3].text_input("Search (name, id, algorithm, owner, notes)", key="runs_search")
    sort = cols[4].selectbox("Sort by", list(SORT_KEYS), key="runs_sort")
    descending = cols[5].toggle("Descending", value=True, key="runs_desc")
    return filter_runs(table, statuses=statuses, group=group or None, tag=tag or None, search=search, sort=sort,
                       descending=descending)


def _table() -> None:
    runs = store().list_runs()
    if runs.empty:
        st.info("No runs yet. Launch one on the Launch page (or press Quick comparison there).")
        return
    view = _filters(runs_table(runs))
    st.caption(f"{len(view)} of {len(runs)} runs")
    st.dataframe(view, hide_index=True, column_config=TABLE_CONFIG, key="runs_table")


def _run_status(run_id: str, drawn_status: str) -> None:
    """The selected run's status line (and its error), refreshed while it is active. When the
    status moves on (starting -> running, running -> cancelled) the whole page is drawn again, so
    the run's label in the selector and the enabled buttons follow it."""
    try:
        run = store().get_run(run_id)
    except wr.RunError:
        return
    if run.status != drawn_status:
        st.rerun(scope="app")
    st.markdown(f"Status: **{run.status}** · step {step_label(run.last_step, run.total_steps)} · "
                f"target `{run.target}` · owner {run.created_by}")
    if run.error:  # a cancel is the user's own doing: a notice, not an alarm
        (st.info if run.status == "cancelled" else st.error)(f"{run.status}: {run.error}")


def _model_location(run: wr.Run) -> None:
    """Where the run's trained policy is: the final HF directory, else its newest checkpoint."""
    outputs = wr.model_outputs(run)
    if outputs["final"] is not None:
        st.markdown(f"Trained model: `{outputs['final']}` (a Hugging Face directory: "
                    "`AutoModelForCausalLM.from_pretrained(path)`)")
    elif outputs["checkpoint"] is not None:
        step, path = outputs["checkpoint"]
        st.markdown(f"Newest checkpoint: step {step} · `{path}`")


def _resume_help(run: wr.Run) -> str:
    remote_dir = (run.handle or run.launch.get("previous_handle") or {}).get("remote_dir")
    if run.launcher == "ssh" and remote_dir:  # its checkpoints are on the host (asking costs an ssh call)
        return (f"Continue this run on ssh host {run.host!r} from its newest checkpoint in "
                f"{remote_dir}/checkpoints (none there: from step 0)")
    checkpoint = wr.model_outputs(run)["checkpoint"]
    if checkpoint is None:
        return "Start this run again in the same run (no checkpoint yet: from step 0)"
    return f"Continue this run at step {checkpoint[0] + 1}, from its checkpoint {checkpoint[1]}"


def _actions() -> None:
    runs = store().list_runs()
    if runs.empty:
        return
    st.subheader("Manage a run")
    run_id = st.selectbox("Run", runs["id"].tolist(), format_func=run_option(runs, status=False), key="runs_selected")
    run = store().get_run(run_id)
    st.fragment(_run_status, run_every=1.0 if run.active else None)(run_id, run.status)
    _model_location(run)
    principal = auth.current_principal()  # the service authorises each action as this principal
    # Every action's key names its run: Streamlit folds a click that is still queued into the next
    # rerun (its trigger kept beside the newer widget values), so a button shared by all runs
    # acted on whichever run the box had changed to meanwhile (a second click on Cancel, then
    # another run chosen, cancelled that run). A click on run A's button is not read when A is
    # not drawn.
    cols = st.columns(2)
    with cols[0]:
        new_name = st.text_input("Name", value=run.name, key=f"runs_name:{run_id}")
        tags = st.text_input("Tags (comma separated)", value=", ".join(run.tags), key=f"runs_tags:{run_id}")
        notes = st.text_area("Notes", value=run.notes, key=f"runs_notes:{run_id}", height=68)
        if guarded_button("Save name, tags and notes", key=f"runs_save:{run_id}", action="edit", run=run):
            try:
                wr.edit_run(run_id, principal=principal, name=new_name.strip(), notes=notes, store=store(),
                            tags=[t.strip() for t in tags.split(",") if t.strip()])
            except (ValueError, wr.RunError) as err:
                st.error(str(err))
            else:
                st.rerun()
    with cols[1]:
        if guarded_button("Cancel run", key=f"runs_cancel:{run_id}", disabled=not run.active, action="cancel", run=run,
                          help="SIGTERM to the run's processes (SIGKILL after a grace period)"):
            try:
                wr.cancel(run_id, principal=principal, store=store(), wait=False)
            except (wr.RunError, wr.LaunchError) as err:
                st.error(str(err))
            else:
                st.toast(f"Cancelling {run_id}")
                st.rerun()
        if guarded_button("Resume run", key=f"runs_resume:{run_id}", disabled=run.status not in wr.RESUMABLE_STATUSES,
                          action="resume", run=run, help=_resume_help(run)):
            try:
                wr.resume(run_id, principal=principal, store=store())
            except (wr.RunError, wr.LaunchError) as err:
                st.error(str(err))
            else:
                st.toast(f"Resuming {run_id}")
                st.rerun()
        if st.button("Export this run (YAML, bash, sbatch)", key=f"runs_export:{run_id}"):
            from workbench.ui.nav import page

            st.session_state["export_run"] = run_id
            st.switch_page(page("export"))
        confirm = st.checkbox("I want to delete this run and its files", key=f"runs_confirm:{run_id}")
        if guarded_button("Delete run", key=f"runs_delete:{run_id}", disabled=not confirm, action="delete", run=run):
            try:
                wr.delete(run_id, principal=principal, store=store())
            except (wr.RunError, wr.LaunchError, OSError) as err:
                st.error(str(err))
            else:
                st.rerun()


def render() -> None:
    st.title("Runs")
    live = any_active(store().list_runs())
    st.fragment(_table, run_every=2.0 if live else None)()  # progress moves without full reruns
    _actions()
