"""User YAML is parsed by one limited loader (workbench.yamlsafe) everywhere a person types it: a
recipe file, ``--set`` (train, launch, export), the Launch form's fields and the settings file.
The class of hostile input: an alias bomb (billion laughs), nesting 5000 deep, a document far
over the size limit, a 5001-digit integer. Each ends in one line naming where, quoting at most a
short prefix, and nothing written. Every case runs in a subprocess with a timeout: before the
limits some of them ran for minutes (and GBs), and a hang must fail the test, not stall the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.test_cli import assert_one_line_error, cli, leftovers

REPO = Path(__file__).resolve().parents[1]

# The 337-character bomb of the issue's shape: 9 levels of 9 aliases = 9**9 'lol's once expanded.
LEVELS = "abcdefghi"
BOMB = "{" + ", ".join(
    [f"{LEVELS[0]}: &{LEVELS[0]} [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{b}: &{b} [{', '.join(['*' + a] * 9)}]" for a, b in zip(LEVELS, LEVELS[1:])]) + "}"
DEEP = "[" * 5000 + "]" * 5000
HUGE_INT = "1" * 5001

# (case, task_config value, what the one line must say)
HOSTILE_VALUES = [
    ("alias bomb", BOMB, "anchors and aliases"),
    ("5000 deep", DEEP, "nested more than 64 levels"),
    ("5001-digit integer", f"{{min_terms: {HUGE_INT}}}", "task_config.min_terms=<an integer of 5001 digits>"),
    ("over the size limit", "[" + "1, " * 40_000 + "1]", "at most 65536"),
]
MAX_LINE = 600  # the error quotes a short prefix, never the (expanded) value


def _check_line(line: str) -> None:
    assert len(line) < MAX_LINE, f"{len(line)} characters: {line[:200]}..."


@pytest.mark.parametrize("command", ["train", "launch", "export"])
@pytest.mark.parametrize("case, value, expected", HOSTILE_VALUES, ids=[c[0] for c in HOSTILE_VALUES])
def test_hostile_set_value_is_one_line(tmp_path, command, case, value, expected):
    extra = {"train": ["--run-dir", str(tmp_path / "run")], "launch": [], "export": ["--to", "yaml"]}[command]
    res = cli(tmp_path, command, "grpo", "--set", f"task_config={value}", *extra)
    _check_line(assert_one_line_error(res, "--set 'task_config=", expected))
    assert not (tmp_path / "run").exists() and leftovers(tmp_path) == []


FILE_CASES = [
    ("alias bomb", f"name: bomb\ntask_config: {BOMB}\n", "task_config.a: anchors and aliases"),
    ("5000 deep", f"name: deep\ntask_config: {{x: {DEEP}}}\n", "nested more than 64 levels"),
    ("5001-digit integer", f"algorithm:\n  kl_coef: {HUGE_INT}\n", "algorithm.kl_coef=<an integer of 5001 digits>"),
    ("over the size limit", "description: '" + "x" * (2 << 20) + "'\n", "bytes: at most 1048576"),
    ("not UTF-8", "name: caf\xe9\n", "not UTF-8"),
]


@pytest.mark.parametrize("case, text, expected", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_hostile_recipe_file_is_one_line(tmp_path, case, text, expected):
    path = tmp_path / "hostile.yaml"
    path.write_bytes(text.encode("latin-1"))
    res = cli(tmp_path, "train", str(path), "--run-dir", str(tmp_path / "run"))
    _check_line(assert_one_line_error(res, "hostile.yaml", expected))
    assert not (tmp_path / "run").exists() and leftovers(tmp_path) == []


def _isolated(code: str, home: Path, stdin: str = "") -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with a timeout (a hang fails the test instead of the suite)."""
    env = {**os.environ, "WORKBENCH_HOME": str(home), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env, capture_output=True,
                          text=True, input=stdin, timeout=120)


@pytest.mark.parametrize("case, value, expected", HOSTILE_VALUES, ids=[c[0] for c in HOSTILE_VALUES])
def test_hostile_launch_form_field_is_refused_by_the_form(tmp_path, case, value, expected):
    """The Launch page's task_config box: the page validates every field through validate_form
    (recipe_form.render_form), which must refuse the value under that field, briefly."""
    res = _isolated("""
        import sys
        from workbench.recipe import Recipe
        from workbench.ui.recipe_form import validate_form
        recipe, errors = validate_form({"task_config": sys.stdin.read()}, Recipe())
        assert recipe is None
        print(errors["task_config"].replace(chr(10), " "))
        print(max(len(m) for m in errors.values()))
    """, tmp_path, stdin=value)
    assert res.returncode == 0, res.stderr[-2000:]
    message, longest = res.stdout.splitlines()
    assert expected in message and message.startswith("task_config=")
    assert int(longest) < MAX_LINE


def test_hostile_settings_file_is_one_line(tmp_path):
    """The settings file (an admin's, read by every command that launches) uses the same loader."""
    (tmp_path / "settings.yaml").write_text(f"cpu_slots: 2\nslurm: {BOMB}\n")
    res = cli(tmp_path, "launch", "grpo", "--set", "train.steps=1")
    _check_line(assert_one_line_error(res, "settings.yaml", "anchors and aliases"))
    assert leftovers(tmp_path) == []


def test_a_recipe_without_aliases_still_loads_every_preset_and_yaml_form():
    """The limits refuse nothing a recipe needs: presets, flow and block style, comments, quoted text."""
    from workbench.recipe import Recipe, load_recipe, preset_names

    for name in preset_names():
        assert load_recipe(name).name
    recipe = Recipe.from_yaml("name: 'a b'  # comment\nsampling: {num_generations: 4}\noptim:\n  betas: [0.9, 0.99]\n")
    assert (recipe.name, recipe.sampling.num_generations, recipe.optim.betas) == ("a b", 4, (0.9, 0.99))
