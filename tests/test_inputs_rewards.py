"""Reward-function references typed into the app: the app offers the built-ins and the import
references an admin listed in settings (``reward_funcs_allowed``) and refuses anything else
before importing it (importing runs a module's top-level code, and who types in the app does not
own the server). The CLI keeps Python's usual import rules. Every launch, from the app or the CLI,
reads its datasets and resolves its reward functions before anything is written.

The hostile module below writes a marker file when it is imported, from a folder on sys.path and
the current directory: the marker must never appear on any app path."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli import assert_one_line_error, cli, leftovers
from workbench import runs as wr
from workbench.recipe import load_recipe
from workbench.runs.authz import local_principal
from workbench.ui.recipe_form import field_specs, parse_field, validate_form

EVIL = "evilmod:reward"
GOOD = "goodmod:reward"
MODULE = '''
from pathlib import Path
Path({marker!r}).write_text("imported")

def reward(completions, **kwargs):
    return [0.0 for _ in completions]
'''


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """evilmod and goodmod in a folder on sys.path that is also the current directory; returns
    the marker paths {module: marker}."""
    folder = tmp_path / "mods"
    folder.mkdir()
    markers = {}
    for name in ("evilmod", "goodmod"):
        markers[name] = tmp_path / f"{name}.imported"
        (folder / f"{name}.py").write_text(MODULE.format(marker=str(markers[name])))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(folder)
    yield markers
    import sys

    for name in markers:
        sys.modules.pop(name, None)


def _allow(home: Path, *refs: str) -> None:
    (home / "settings.yaml").write_text(f"reward_funcs_allowed: [{', '.join(refs)}]\n")


def _recipe(ref: str):
    return load_recipe("grpo", [f"reward_funcs=[{ref}]", "train.steps=1"])


def test_the_app_launch_refuses_an_unlisted_reference_before_importing_it(fresh_home, modules):
    """The service path every app page launches through (launch_planned with the app's list)."""
    from workbench.ui.recipe_form import allowed_reward_refs

    _allow(fresh_home, GOOD)
    planned = wr.plan_runs([_recipe(EVIL)])  # planning imports nothing
    with pytest.raises(ValueError, match=f"reward_funcs='{EVIL}' is not allowed in the app; allowed: .*{GOOD}"):
        wr.launch_planned(planned, principal=local_principal(), reward_funcs_allowed=allowed_reward_refs())
    assert not modules["evilmod"].exists()
    assert leftovers(fresh_home) == []


def test_a_reference_listed_in_settings_passes_and_the_cli_keeps_python_imports(fresh_home, modules):
    from workbench.runs.service import check_launch_inputs
    from workbench.ui.recipe_form import allowed_reward_refs

    _allow(fresh_home, GOOD)
    assert GOOD in next(s for s in field_specs() if s.path == "reward_funcs").choices
    recipe, errors = validate_form({"reward_funcs": [GOOD]}, load_recipe("grpo"))
    assert errors == {} and recipe.reward_funcs == [GOOD]
    check_launch_inputs([recipe], reward_funcs_allowed=allowed_reward_refs())  # resolved: imported
    assert modules["goodmod"].exists()
    check_launch_inputs([_recipe(EVIL)], trust_local_imports=True)  # the CLI's opt-out: Python's import rules
    assert modules["evilmod"].exists()


def test_the_form_and_the_plan_refuse_an_unlisted_reference(fresh_home, modules):
    """Typed into the form (a crafted client sends any list) or swept on the Launch page."""
    from workbench.ui.launch_page import _plan

    recipe, errors = validate_form({"reward_funcs": [EVIL]}, load_recipe("grpo"))
    assert recipe is None and errors["reward_funcs"].startswith(f"reward_funcs='{EVIL}' is not allowed here")
    plan = _plan(load_recipe("grpo"), [], 1, {"reward_funcs": [["format"], [EVIL]]}, "local")
    assert plan.planned is None and f"reward_funcs='{EVIL}' is not allowed in the app" in plan.error
    assert not modules["evilmod"].exists()


def test_every_multi_choice_field_refuses_a_value_it_does_not_offer():
    """The class: each multiselect of the form (reward functions, trackers, ...)."""
    multis = [s for s in field_specs() if s.kind == "multi"]
    assert {"reward_funcs", "logging.log_with"} <= {s.path for s in multis}
    for spec in multis:
        assert parse_field(spec, list(spec.choices[:1])) == list(spec.choices[:1])
        with pytest.raises(ValueError, match=rf"^{spec.path}='os:system' is not allowed here; allowed: "):
            parse_field(spec, [*spec.choices[:1], "os:system"])


def test_a_previous_runs_unlisted_reference_shows_under_the_field_and_blocks_launch(fresh_home, modules, monkeypatch):
    """A run launched from the CLI with the user's own module, taken as the Launch page's
    starting point: the page draws it, says it is not allowed here, and launches nothing."""
    from streamlit import config

    from tests.ui.conftest import page

    monkeypatch.delenv("WORKBENCH_PASSWORD", raising=False)
    old = config.get_option("server.address")
    config.set_option("server.address", "127.0.0.1")  # as `make app` serves it: launching is allowed
    try:
        store = wr.RunStore()
        store.create_run(run_id="mine-1", name="mine", algorithm="grpo", recipe_yaml=_recipe(EVIL).to_yaml(), total_steps=1,
                         target="local", launcher="local", host="localhost", created_by="alice",
                         run_dir=str(fresh_home / "runs" / "mine-1"))
        at = page("launch_page").run()
        at.radio(key="launch_source").set_value("Previous run").run()
        assert not at.exception
        assert any(e.value.startswith(f"reward_funcs='{EVIL}' is not allowed here") for e in at.error)
        assert at.button(key="launch_go").disabled
        at.text_input(key="rf:train.steps").input("2").run()  # any other edit keeps it refused
        assert at.button(key="launch_go").disabled and not at.exception
        assert list(store.list_runs()["id"]) == ["mine-1"] and not modules["evilmod"].exists()
    finally:
        config.set_option("server.address", old)


@pytest.mark.parametrize("value", ["os.system", "../evil:x", "a b:c", "evilmod:reward; rm -rf /"])
def test_settings_list_only_import_references(fresh_home, value):
    (fresh_home / "settings.yaml").write_text(f"reward_funcs_allowed: [{value!r}]\n")
    res = cli(fresh_home, "launch", "grpo", "--set", "train.steps=1")
    assert_one_line_error(res, "reward_funcs_allowed", "is not an import reference")
    assert leftovers(fresh_home) == []


def test_launch_reads_the_dataset_before_anything_is_written(fresh_home):
    """The CLI's launch (and the app's, through the same service) checks the dataset first."""
    empty = fresh_home / "empty.jsonl"
    empty.write_text("")
    res = cli(fresh_home, "launch", "grpo", "--set", f"dataset={empty}", "--set", "train.steps=1")
    assert_one_line_error(res, f"dataset='{empty}'", "has no rows")
    res = cli(fresh_home, "launch", "grpo", "--seeds", "2", "--set", "reward_funcs=[nosuchmod:f]")
    assert_one_line_error(res, "reward_funcs", "nosuchmod")
    assert leftovers(fresh_home) == []


@pytest.mark.parametrize("field", ["dataset", "eval.dataset", "model"])
def test_the_app_launch_refuses_a_path_outside_the_home_in_the_service(fresh_home, tmp_path, field):
    """The Launch page confines its path fields (``app_path_value``); the run service checks every
    recipe launched for the app again, so a caller that skipped the form (a crafted client, a
    future page) cannot make a run read a file outside the workbench home. The CLI opts out."""
    from workbench.runs.confinement import PATH_FIELDS
    from workbench.runs.service import check_launch_inputs

    assert set(PATH_FIELDS) == {"dataset", "eval.dataset", "model"}  # the class: every path field
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data.jsonl").write_text('{"prompt": "1 + 1 =", "answer": "2"}\n')
    value = str(outside) if field == "model" else str(outside / "data.jsonl")
    recipe = load_recipe("grpo", [f"{field}={value}", "train.steps=1"])
    with pytest.raises(ValueError, match=f"^{field}="):
        wr.launch_planned(wr.plan_runs([recipe]), principal=local_principal(), reward_funcs_allowed=())
    assert leftovers(fresh_home) == []
    with pytest.raises(ValueError, match=f"^{field}="):
        check_launch_inputs([recipe], reward_funcs_allowed=())
    inside = fresh_home / "data.jsonl"
    inside.write_text('{"prompt": "1 + 1 =", "answer": "2"}\n')
    if field != "model":  # inside the home: passes the confinement (and the dataset reads)
        check_launch_inputs([load_recipe("grpo", [f"{field}={inside}", "train.steps=1"])], reward_funcs_allowed=())
