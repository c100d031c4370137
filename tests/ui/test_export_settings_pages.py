"""Export page (text from workbench.export, download buttons) and Settings page (load / save)."""

import pytest
import yaml

from tests.ui.conftest import page
from tests.ui.seed import add_run
from workbench.export.scripts import BashOptions, SlurmOptions, bash_script, recipe_yaml, sbatch_script
from workbench.recipe import Recipe, load_recipe
from workbench.runs import SSHHost, Settings, load_settings
from workbench.runs.settings import save_settings  # unauthorised: tests set up homes with it


def test_export_a_run_shows_and_offers_the_three_scripts(home, store):
    run_id = add_run(store, preset="dapo", name="mine")
    at = page("export_page").run()
    assert not at.exception
    recipe = Recipe.from_yaml(store.get_run(run_id)["recipe"])
    codes = [c.value for c in at.code]  # st.code drops the final newline
    assert codes == [t.rstrip("\n") for t in (recipe_yaml(recipe), bash_script(recipe), sbatch_script(recipe))]
    labels = [b.label for b in at.get("download_button")]
    assert labels == ["Download recipe YAML", "Download bash script", "Download sbatch script"]


def test_export_options_change_the_scripts(home, store):
    add_run(store, preset="grpo")
    save_settings(Settings(slurm={"partition": "gpu", "time": "02:00:00"}))
    at = page("export_page").run()
    assert at.text_input(key="export_partition").value == "gpu"  # defaults from Settings
    at.number_input(key="export_nodes").set_value(2).run()
    at.number_input(key="export_bash_processes").set_value(2).run()
    recipe = load_recipe("grpo")
    assert at.code[1].value == bash_script(recipe, BashOptions(processes=2)).rstrip("\n")
    assert at.code[2].value == sbatch_script(recipe, SlurmOptions(nodes=2, partition="gpu", time="02:00:00")).rstrip("\n")
    assert "#SBATCH --nodes=2" in at.code[2].value


def test_export_bad_option_names_the_field(home, store):
    add_run(store)
    at = page("export_page").run()
    at.text_input(key="export_time").input("soon").run()
    assert at.error[0].value.startswith("time='soon' is not allowed")


def test_export_a_preset(home):
    at = page("export_page").run()  # no runs: presets only
    at.selectbox(key="export_preset").select("cispo").run()
    assert yaml.safe_load(at.code[0].value)["algorithm"]["policy_loss"] == "cispo"


def test_settings_save_and_show_no_secrets(home):
    save_settings(Settings(ssh_hosts={"gpu1": SSHHost(hostname="gpu1.lab", user="me", setup="source ~/venv/bin/activate",
                                                      identity_file="~/.ssh/id_ed25519")}))
    at = page("settings_page").run()
    assert not at.exception
    assert str(home) in at.markdown[0].value
    assert at.dataframe[-1].value["setup"].tolist() == ["source ~/venv/bin/activate"]  # shown read-only
    at.number_input(key="set_cpu").set_value(2).run()
    at.text_input(key="set_partition").input("a100").run()
    at.text_input(key="set_gpu").input("1").run()
    at.button(key="set_save").click().run()
    assert not at.error, [e.value for e in at.error]
    saved = load_settings()
    assert (saved.cpu_slots, saved.gpu_slots, saved.slurm.partition) == (2, 1, "a100")
    assert saved.ssh_hosts["gpu1"].setup == "source ~/venv/bin/activate"  # untouched by the page
    assert saved.ssh_hosts["gpu1"].identity_file == "~/.ssh/id_ed25519"


def test_settings_invalid_value_names_the_field(home):
    at = page("settings_page").run()
    at.text_input(key="set_time").input("forever").run()
    at.button(key="set_save").click().run()
    assert "slurm.time='forever'" in at.error[0].value
    at.text_input(key="set_time").input("01:00:00").run()
    at.text_input(key="set_gpu").input("two").run()
    at.button(key="set_save").click().run()
    assert at.error[0].value.startswith("gpu_slots='two' is not allowed")
    assert not (home / "settings.yaml").exists()


def test_renamed_host_keeps_its_python_and_setup_and_a_new_row_gets_none(home):
    save_settings(Settings(ssh_hosts={
        "gpu1": SSHHost(hostname="gpu1.lab", python="/opt/py/bin/python", setup="source ~/venv1/bin/activate"),
        "gpu3": SSHHost(hostname="gpu3.lab", setup="source ~/venv3/bin/activate")}))
    at = page("settings_page").run()
    assert at.data_editor(key="set_hosts").value["stored_as"].tolist() == ["gpu1", "gpu3"]
    # what the browser sends: rename row 0, delete row 1, add a row (st.data_editor's edit state)
    at.session_state["set_hosts"] = {"edited_rows": {0: {"name": "gpu2"}}, "deleted_rows": [1],
                                     "added_rows": [{"name": "new", "hostname": "new.lab"}]}
    at.run()
    at.button(key="set_save").click().run()
    assert not at.error, [e.value for e in at.error]
    hosts = load_settings().ssh_hosts
    assert sorted(hosts) == ["gpu2", "new"]
    assert (hosts["gpu2"].hostname, hosts["gpu2"].python, hosts["gpu2"].setup) == \
           ("gpu1.lab", "/opt/py/bin/python", "source ~/venv1/bin/activate")
    assert (hosts["new"].python, hosts["new"].setup) == (SSHHost(hostname="x").python, SSHHost(hostname="x").setup)


# Values the page does not show, one per such field: a field added to Settings later without a
# value here fails the walk below, so the page cannot silently reset it.
HIDDEN_SETTINGS = {"reward_funcs_allowed": ["tests.engine.faulty_rewards:raises_at_step_2"],
                   "trusted_proxies": ["10.0.0.0/8"]}
PAGE_SETTINGS = {"ssh_hosts", "slurm", "cpu_slots", "gpu_slots", "ray", "roles"}
# the sections drawn from their models: settings field -> (widget key prefix, fields shown read-only)
MODEL_SECTIONS = {"slurm": ("set", ()), "ray": ("set_ray", ("python", "runtime_env")), "roles": ("set_roles", ())}


def test_saving_the_page_keeps_every_setting_it_does_not_show(home):
    assert set(Settings.model_fields) == PAGE_SETTINGS | set(HIDDEN_SETTINGS)
    save_settings(Settings(**HIDDEN_SETTINGS))
    at = page("settings_page").run()
    at.number_input(key="set_cpu").set_value(2).run()
    at.button(key="set_save").click().run()
    assert not at.error, [e.value for e in at.error]
    saved = load_settings()
    assert saved.cpu_slots == 2
    for name, value in HIDDEN_SETTINGS.items():
        assert getattr(saved, name) == Settings(**{name: value}).__dict__[name], name


def test_every_field_of_the_model_sections_has_its_widget(home):
    """SLURM, Ray and roles are drawn from their models: each field is a widget (a field added to a
    model later appears with nothing to copy), but those that run code on the cluster."""
    at = page("settings_page").run()
    assert not at.exception
    for section, (key, read_only) in MODEL_SECTIONS.items():
        model = type(getattr(Settings(), section))
        for name in model.model_fields:
            assert (f"{key}_{name}" in at.session_state) is (name not in read_only), (section, name)


def test_ray_and_roles_are_edited_on_the_page_and_what_runs_on_the_cluster_is_kept(home):
    save_settings(Settings(ray={"python": "/opt/ray/bin/python", "runtime_env": {"pip": ["numpy"]}}))
    at = page("settings_page").run()
    assert "/opt/ray/bin/python" in " ".join(c.value for c in at.caption)  # shown, not editable
    at.text_input(key="set_ray_address").input("ray://head.lab:10001").run()
    at.number_input(key="set_ray_num_cpus").set_value(2.0).run()
    at.text_area(key="set_roles_admins").input("ada@lab.org\n\n  bob@lab.org  \n").run()
    at.text_area(key="set_roles_member_domains").input("lab.org").run()
    at.text_area(key="set_roles_cli_roles").input("ada: admin\nops: viewer").run()
    at.text_input(key="set_roles_default_role").input("member").run()
    at.checkbox(key="set_roles_trust_unverified_email").check().run()
    at.button(key="set_save").click().run()
    assert not at.error, [e.value for e in at.error]
    saved = load_settings()
    assert (saved.ray.address, saved.ray.num_cpus) == ("ray://head.lab:10001", 2.0)
    assert (saved.ray.python, saved.ray.runtime_env) == ("/opt/ray/bin/python", {"pip": ["numpy"]})
    assert saved.roles.admins == ["ada@lab.org", "bob@lab.org"] and saved.roles.member_domains == ["lab.org"]
    assert saved.roles.cli_roles == {"ada": "admin", "ops": "viewer"}
    assert (saved.roles.default_role, saved.roles.trust_unverified_email) == ("member", True)


@pytest.mark.parametrize("key, widget, value, expected", [
    ("set_ray_address", "text_input", "file:///etc", "ray.address"),
    ("set_roles_cli_roles", "text_area", "ada admin", "roles.cli_roles: line 'ada admin' is not allowed"),
    ("set_roles_cli_roles", "text_area", "ada: boss", "roles.cli_roles"),
    ("set_roles_default_role", "text_input", "admin", "roles.default_role"),
    ("set_roles_admins", "text_area", "a b@lab.org", "roles.admins"),
])
def test_a_bad_ray_or_roles_value_names_the_field_and_saves_nothing(home, key, widget, value, expected):
    at = page("settings_page").run()
    getattr(at, widget)(key=key).input(value).run()
    at.button(key="set_save").click().run()
    assert at.error and expected in at.error[0].value, [e.value for e in at.error]
    assert not (home / "settings.yaml").exists()
