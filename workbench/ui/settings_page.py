"""Settings: SSH hosts, SLURM defaults, the Ray cluster, roles, CPU / GPU slots, the workbench home.

Stored by ``workbench.runs.update_settings`` (admins only) in settings.yaml under the home. No secrets live there
(SSH uses the user's keys by path). A host's ``python`` and ``setup`` lines run on that host, and
the Ray cluster's ``python`` and ``runtime_env`` on the cluster, so the page shows them but only the
settings file changes them: nothing typed here is executed. The SLURM, Ray and roles sections are
drawn from their models (``workbench.ui.model_form``).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st
from pydantic import ValidationError

from workbench import runs as wr
from workbench.home import workbench_home
from workbench.recipe import format_validation_error
from workbench.ui import auth
from workbench.ui.common import guarded_button
from workbench.ui.model_form import model_section

HOST_COLUMNS = ["name", "hostname", "user", "port", "identity_file", "known_hosts", "workdir", "strict_host_key_checking"]
READ_ONLY = ("python", "setup")  # run on the host: edited in settings.yaml only
RAY_READ_ONLY = ("python", "runtime_env")  # run / installed on the cluster: edited in settings.yaml only
# The stored name of each existing row (not editable; empty on added rows): a row keeps its host's
# python / setup through a rename, and a new row never inherits another host's. Row positions
# cannot serve: after a deletion st.data_editor numbers added rows from the remaining rows.
STORED = "stored_as"


def hosts_frame(settings: wr.Settings) -> pd.DataFrame:
    rows = [{STORED: n, "name": n, **h.model_dump(include=set(HOST_COLUMNS))} for n, h in settings.ssh_hosts.items()]
    return pd.DataFrame(rows, columns=[STORED, *HOST_COLUMNS])


def hosts_from_frame(frame: pd.DataFrame, old: wr.Settings) -> dict[str, dict]:
    """Edited rows -> ssh_hosts data; python / setup kept from the stored host the row came from."""
    hosts = {}
    for row in frame.to_dict("records"):
        stored = row.pop(STORED, None)
        name = str(row.pop("name") or "").strip()
        if not name and not row.get("hostname"):
            continue  # an empty added row
        clean = {k: (None if pd.isna(v) or v == "" else v) for k, v in row.items()}
        clean["port"] = int(clean["port"]) if clean.get("port") is not None else 22
        if clean.get("workdir") is None:
            clean.pop("workdir")
        if clean.get("strict_host_key_checking") is None:
            clean["strict_host_key_checking"] = True
        if isinstance(stored, str) and stored in old.ssh_hosts:
            clean.update(old.ssh_hosts[stored].model_dump(include=set(READ_ONLY)))
        hosts[name] = clean
    return hosts


def render() -> None:
    st.title("Settings")
    home = workbench_home()
    st.markdown(f"**Workbench home:** `{home}`")
    st.caption("Runs, the run store, the cached tiny model and this settings file live there. To use another "
               "directory, start the app with the environment variable WORKBENCH_HOME set.")
    try:
        settings = wr.load_settings()
    except wr.SettingsError as err:
        st.error(str(err))
        return

    st.subheader("Slots")
    cols = st.columns(2)
    cpu_slots = cols[0].number_input("CPU slots", min_value=1, value=settings.cpu_slots, step=1, key="set_cpu",
                                     help=wr.Settings.model_fields["cpu_slots"].description)
    gpu_text = cols[1].text_input("GPU slots (empty: one per visible device)",
                                  value="" if settings.gpu_slots is None else str(settings.gpu_slots), key="set_gpu",
                                  help=wr.Settings.model_fields["gpu_slots"].description)

    st.subheader("SLURM defaults")
    slurm, slurm_errors = model_section(settings.slurm, prefix="slurm", key="set", columns=5)

    st.subheader("SSH hosts")
    st.caption("Authentication uses your own SSH keys and known_hosts files (by path); no passwords are stored. "
               "A host's python and setup lines run on that host: edit them in settings.yaml.")
    edited = st.data_editor(hosts_frame(settings), num_rows="dynamic", hide_index=True, key="set_hosts",
                            column_config={STORED: st.column_config.TextColumn("stored as", disabled=True,
                                                                               help="the name in settings.yaml; python and setup stay with this row"),
                                           "port": st.column_config.NumberColumn(min_value=1, max_value=65535, step=1),
                                           "strict_host_key_checking": st.column_config.CheckboxColumn(default=True)})
    if settings.ssh_hosts:
        st.dataframe(pd.DataFrame([{"name": n, "python": h.python, "setup": h.setup} for n, h in settings.ssh_hosts.items()]),
                     hide_index=True)

    st.subheader("Ray cluster")
    st.caption("Target 'ray' submits each run as one job of this cluster's Jobs API.")
    ray, ray_errors = model_section(settings.ray, prefix="ray", key="set_ray", read_only=RAY_READ_ONLY, columns=2)

    st.subheader("Roles")
    st.caption("Who gets which role when signing in through the identity provider, and the CLI's role on a server "
               "database. viewer: watch, compare, export; member: launch, and cancel, resume, delete their own runs; "
               "admin: anyone's runs, settings, the audit log.")
    roles, roles_errors = model_section(settings.roles, prefix="roles", key="set_roles", columns=2)

    if not guarded_button("Save settings", key="set_save", type="primary", action="settings"):
        return
    for error in slurm_errors + ray_errors + roles_errors:
        st.error(error)
    if slurm_errors or ray_errors or roles_errors:
        return
    try:
        gpu_slots = int(gpu_text) if gpu_text.strip() else None
    except ValueError:
        st.error(f"gpu_slots={gpu_text!r} is not allowed; a whole number >= 0, or empty for one per visible device")
        return
    # Start from what is stored: fields this page does not show (an admin's reward_funcs_allowed,
    # trusted_proxies, whatever is added later) are kept, not reset to their defaults.
    data = {**settings.model_dump(mode="json"),
            "ssh_hosts": hosts_from_frame(edited, settings), "slurm": slurm, "ray": ray, "roles": roles,
            "cpu_slots": int(cpu_slots), "gpu_slots": gpu_slots}
    try:
        new = wr.Settings.model_validate(data)
    except ValidationError as err:
        st.error(format_validation_error(err, wr.Settings).replace("invalid recipe:", "invalid settings:", 1))
        return
    try:  # the service authorises the save itself (admins only), whatever this page drew
        path = wr.update_settings(new, principal=auth.current_principal())
    except wr.PermissionDenied as err:
        st.error(str(err))
        return
    st.success(f"Saved to {path}")
