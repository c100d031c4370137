"""Export: a run's recipe as YAML, a bash script and an sbatch script, with download buttons.
The text comes from ``workbench.export`` (the same command the launchers run)."""

from __future__ import annotations

import streamlit as st

from workbench import runs as wr
from workbench.export.scripts import BashOptions, ExportError, SlurmOptions, bash_script, recipe_yaml, safe_name, sbatch_script
from workbench.recipe import Recipe, RecipeError, load_recipe, preset_names
from workbench.ui.common import run_option, store


def _recipe() -> Recipe | None:
    runs = store().list_runs()
    sources = (["Run"] if len(runs) else []) + ["Preset"]
    source = st.radio("Export", sources, horizontal=True, key="export_source")
    if source == "Preset":
        return load_recipe(st.selectbox("Preset", preset_names(), key="export_preset"))
    ids = runs["id"].tolist()
    wanted = st.session_state.get("export_run")
    run_id = st.selectbox("Run", ids, index=ids.index(wanted) if wanted in ids else 0, format_func=run_option(runs),
                          key="export_run_select")
    try:
        run = store().get_run(run_id)
        final = wr.model_outputs(run)["final"]
        st.caption(f"Trained model: `{final}` (`AutoModelForCausalLM.from_pretrained(path)`)" if final is not None
                   else "Trained model: none yet (a run saves it in RUN_DIR/final when it finishes)")
        return Recipe.from_yaml(run.recipe)
    except (RecipeError, wr.RunError) as err:
        st.error(str(err))
        return None


def _slurm_defaults() -> wr.SlurmDefaults:
    try:
        return wr.load_settings().slurm
    except wr.SettingsError as err:
        st.warning(f"settings not readable, using SLURM defaults: {err}")
        return wr.SlurmDefaults()


def _download(label: str, text: str, file_name: str, key: str) -> None:
    st.download_button(label, text, file_name=file_name, mime="text/plain", key=key, icon=":material/download:")


def render() -> None:
    st.title("Export")
    st.caption("Reproduce a run outside the app: the recipe, a bash script (one machine, `accelerate launch`) "
               "and a SLURM batch script (multi-node). Both inline the recipe and run the same command as the app.")
    recipe = _recipe()
    if recipe is None:
        return
    name = safe_name(recipe.name)
    yaml_tab, bash_tab, sbatch_tab = st.tabs(["Recipe YAML", "bash", "sbatch"])
    with yaml_tab:
        text = recipe_yaml(recipe)
        _download("Download recipe YAML", text, f"{name}.yaml", "export_dl_yaml")
        st.code(text, language="yaml")
    with bash_tab:
        cols = st.columns(2)
        processes = cols[0].number_input("Processes", min_value=1, value=1, step=1, key="export_bash_processes",
                                         help="accelerate processes on one machine (data parallel)")
        device = cols[1].selectbox("Device", ["cpu", "gpu"], key="export_bash_device")
        try:
            text = bash_script(recipe, BashOptions(processes=int(processes), device=device))
        except ExportError as err:
            st.error(str(err))
        else:
            _download("Download bash script", text, f"{name}.sh", "export_dl_bash")
            st.code(text, language="bash")
    with sbatch_tab:
        d = _slurm_defaults()
        cols = st.columns(5)
        nodes = cols[0].number_input("Nodes", min_value=1, value=d.nodes, step=1, key="export_nodes")
        gpus = cols[1].number_input("GPUs per node", min_value=0, value=d.gpus_per_node, step=1, key="export_gpus")
        time_limit = cols[2].text_input("Time limit", value=d.time, key="export_time", help="HH:MM:SS or D-HH:MM:SS")
        partition = cols[3].text_input("Partition", value=d.partition, key="export_partition")
        account = cols[4].text_input("Account", value=d.account, key="export_account")
        vllm = st.checkbox("Extra vLLM server node (TRL layout)", key="export_vllm")
        try:
            text = sbatch_script(recipe, SlurmOptions(nodes=int(nodes), gpus_per_node=int(gpus), time=time_limit.strip(),
                                                      partition=partition.strip(), account=account.strip(), vllm_node=vllm))
        except ExportError as err:
            st.error(str(err))
        else:
            _download("Download sbatch script", text, f"{name}.sbatch", "export_dl_sbatch")
            st.code(text, language="bash")
