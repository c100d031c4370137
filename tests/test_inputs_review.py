"""Input handling found by review (issue 17): the Launch page's sweep values go through the
limited YAML loader and the form's path confinement, plain YAML types only, the reward allow-list
is the service's default, run ids are slugs of any name a Recipe accepts, task_config numbers are
finite."""

from __future__ import annotations

import math
import time

import pytest

from tests.test_cli import assert_one_line_error, cli, leftovers
from tests.test_inputs_rewards import EVIL, _recipe, modules  # noqa: F401  (fixture)
from tests.test_inputs_yaml import BOMB, DEEP, HUGE_INT
from workbench import runs as wr
from workbench.recipe import Recipe, RecipeError, load_recipe
from workbench.runs.names import check_run_name, new_run_id, slug
from workbench.runs.service import check_launch_inputs
from workbench.yamlsafe import YamlInputError, load_yaml

# (case, the values typed into "Values of task_config", what the one line says)
HOSTILE_SWEEPS = [
    ("alias bomb", BOMB, "anchors and aliases"),
    ("5000 deep", DEEP, "nested more than 64 levels"),
    ("5001-digit integer", HUGE_INT, "<an integer of 5001 digits>"),
    ("5001-digit integer in a mapping", f"{{min_terms: {HUGE_INT}}}", "min_terms=<an integer of 5001 digits>"),
    ("a tag", "!!binary aGVsbG8=", "the tag '!!binary' is not allowed"),
]


@pytest.mark.parametrize("case, raw, expected", HOSTILE_SWEEPS, ids=[c[0] for c in HOSTILE_SWEEPS])
def test_a_hostile_sweep_is_one_quick_run_error(case, raw, expected):
    start = time.monotonic()
    with pytest.raises(wr.RunError) as err:
        wr.parse_sweep([f"task_config={raw}"])
    message = str(err.value)
    assert time.monotonic() - start < 5
    assert "\n" not in message and len(message) < 400 and "task_config" in message and expected in message


def test_a_hostile_sweep_is_one_line_from_the_cli(tmp_path):
    res = cli(tmp_path, "launch", "grpo", "--sweep", f"task_config={BOMB}")
    assert_one_line_error(res, "--sweep 'task_config'", "anchors and aliases")
    assert leftovers(tmp_path) == []


# ---- YAML: plain types only ----------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("1:20", "1:20"), ("0b101", "0b101"), ("0x10", "0x10"), ("0o10", "0o10"), ("2024-01-01", "2024-01-01"),
    ("yes", "yes"), ("off", "off"), ("010", 10), ("1_000", 1000), ("-3", -3), ("0.28", 0.28), ("1.0e-06", 1e-06),
    ("1e-3", "1e-3"), ("true", True), ("False", False), ("~", None), ("null", None), ("'1:20'", "1:20"),
    ("!!str 5", "5"), ("!!int 7", 7), ("!!float 2", 2.0),
])
def test_plain_scalars_resolve_to_str_int_float_bool_null_only(text, expected):
    """YAML 1.1 read 1:20 as 80 (sexagesimal), 0b101 as 5, 010 as 8 and 2024-01-01 as a date."""
    value = load_yaml(text)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("text", ["!!binary aGVsbG8=", "!!set {a, b}", "!!timestamp 2020-01-01", "!!omap [a: 1]",
                                  "!!python/object/apply:os.system [ls]", "!custom x", "{a: [!!binary x]}",
                                  "!!int 0b101", "!!int 1:20", "!!bool yes"])
def test_other_tags_and_spellings_are_refused(text):
    with pytest.raises(YamlInputError) as err:
        load_yaml(text)
    assert "\n" not in str(err.value)


def test_a_sexagesimal_seed_is_refused_not_read_as_80():
    with pytest.raises(RecipeError, match="train.seed"):
        load_recipe("grpo", ["train.seed=1:20"])
    assert load_recipe("grpo", ["train.seed=20"]).train.seed == 20


def test_every_preset_round_trips_through_to_yaml():
    from workbench.recipe import preset_names

    for name in preset_names():
        recipe = load_recipe(name)
        assert Recipe.from_yaml(recipe.to_yaml()) == recipe
    labels = load_recipe("grpo", ["name='1:20'", "description='0b101 yes 2024-01-01'"])
    assert Recipe.from_yaml(labels.to_yaml()).to_dict() == labels.to_dict()


# ---- the reward allow-list is the default --------------------------------------------------------
def test_launch_planned_without_the_argument_refuses_an_unlisted_module(fresh_home, modules):  # noqa: F811
    planned = wr.plan_runs([_recipe(EVIL)])
    with pytest.raises(ValueError, match=f"reward_funcs='{EVIL}' is not allowed"):
        wr.launch_planned(planned, principal=local_principal())
    with pytest.raises(ValueError, match=f"reward_funcs='{EVIL}' is not allowed"):
        wr.launch(planned[0].recipe, principal=local_principal())
    assert not modules["evilmod"].exists() and leftovers(fresh_home) == []


def test_the_cli_launch_still_imports_a_users_module(fresh_home, modules, tmp_path):  # noqa: F811
    """The CLI opts out explicitly (trust_local_imports=True): the module is imported by the
    launch's input check. A queued-behind-nothing run would train; steps=1 keeps it short."""
    import os
    import subprocess
    import sys

    from tests.test_cli import REPO

    folder = modules["evilmod"].parent / "mods"
    env = {**os.environ, "WORKBENCH_HOME": str(fresh_home), "PYTHONPATH": f"{REPO}{os.pathsep}{folder}"}
    res = subprocess.run([sys.executable, "-m", "workbench", "launch", "grpo", "--set", f"reward_funcs=[{EVIL}]",
                          "--set", "train.steps=1", "--set", "reward_weights=null"], cwd=folder, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert modules["evilmod"].exists()
    run_id = res.stdout.split()[0]
    wr.cancel(run_id, principal=local_principal(), store=wr.RunStore(), grace_s=5)


# ---- names ---------------------------------------------------------------------------------------
NAMES = ["my run", "été", "grpo-lr3", "a.b_c", "x" * 64, "  padded  ", "ünïcødé · arm", "🙂"]


@pytest.mark.parametrize("name", NAMES)
def test_every_name_the_recipe_accepts_launches_with_a_slug_id(name):
    assert Recipe(name=name).name == name
    assert check_run_name(name) == name
    run_id = new_run_id(name)
    assert run_id.startswith(slug(name) + "-") and "/" not in run_id and " " not in run_id
    from workbench.runs.names import _NAME

    assert _NAME.match(slug(name))


@pytest.mark.parametrize("name", ["a/b", "..", " . ", "tab\there", "x" * 65, ""])
def test_names_the_recipe_refuses_are_refused_by_the_run_check(name):
    with pytest.raises(ValueError):
        Recipe(name=name)
    with pytest.raises(ValueError, match="^name="):
        check_run_name(name)


def test_a_run_named_my_run_launches_into_a_slug_directory(full_queue):  # noqa: F811
    [run_id] = wr.launch_planned(wr.plan_runs([load_recipe("grpo", ["name='my run été'", "train.steps=1"])]), principal=local_principal(),
                                 store=full_queue)
    run = full_queue.get_run(run_id)
    assert run["name"] == "my run été" and run_id.startswith("my-run-ete-")
    assert run["run_dir"].endswith("/runs/" + run_id)


def test_the_train_commands_default_run_dir_is_a_slug(fresh_home):
    res = cli(fresh_home, "train", "grpo", "--set", "name='my run'", "--set", "train.steps=1")
    assert res.returncode == 0, res.stderr[-2000:]
    [made] = [p.name for p in (fresh_home / "runs").iterdir()]
    assert made.startswith("my-run-")


# ---- task_config numbers are finite --------------------------------------------------------------
@pytest.mark.parametrize("config", ["{min_terms: .nan}", "{max_terms: .inf}", "{x: [1, -.inf]}", "{a: {b: .NaN}}"])
def test_non_finite_task_config_values_are_refused_before_anything_is_written(fresh_home, config):
    recipe = Recipe.model_construct(**{**load_recipe("grpo").__dict__, "task_config": load_yaml(config)})
    assert any(isinstance(v, float) and not math.isfinite(v) for v in _leaves(recipe.task_config))
    for target in ("local", "slurm"):
        with pytest.raises(ValueError, match=r"^task_config\.[\w.]+=-?(nan|inf): not a finite number"):
            check_launch_inputs([recipe], target=target)


def _leaves(value):
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [value]


from tests.runs.test_arms import full_queue  # noqa: E402,F401  (a home whose CPU slot is held: launches queue)
from workbench.runs.authz import local_principal
