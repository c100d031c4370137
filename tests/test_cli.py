"""The real command line (``python -m workbench`` in a subprocess) under bad input: one line
``error: ...`` naming the field, the value and what is allowed, exit code 2, nothing left behind;
no traceback for a closed pipe; and no torch imported by commands that do not train."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def cli(home: Path, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``python -m workbench ARGV`` with ``home`` as the workbench home."""
    env = {**os.environ, "WORKBENCH_HOME": str(home), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "workbench", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, input=stdin, timeout=120)


def assert_one_line_error(res: subprocess.CompletedProcess, *patterns: str) -> str:
    """Exit 2, nothing on stdout, stderr exactly one line 'error: ...' holding every pattern."""
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for pattern in patterns:
        assert pattern in lines[0], f"{pattern!r} not in {lines[0]!r}"
    assert res.stdout == ""
    return lines[0]


def leftovers(home: Path) -> list[str]:
    """Run directories and run-store rows under ``home`` (read with sqlite3, not the store's code)."""
    import sqlite3

    dirs = sorted(p.name for p in (home / "runs").iterdir()) if (home / "runs").is_dir() else []
    rows = []
    if (home / "runs.db").exists():
        with sqlite3.connect(home / "runs.db") as db:
            rows = [r[0] for r in db.execute("SELECT id FROM runs")]
    return dirs + rows


# ---- bad values: named before the run starts, nothing left behind --------------------------------

BAD_SETTINGS = [
    # (--set item, what the one line must say)
    ("sampling.max_completion_length=10000000", ["sampling.max_completion_length=10000000", "at most 255", "256 positions"]),
    ("sampling.num_generations=100000", ["sampling.num_generations=100000", "less than or equal to 1024"]),
    ("sampling.prompts_per_step=1000000", ["sampling.prompts_per_step=1000000", "less than or equal to 4096"]),
    ("train.mu=1000000", ["train.mu=1000000", "less than or equal to 64"]),
    ("train.threads=100000", ["train.threads=100000", "less than or equal to 256"]),
    ("train.steps=99999999999999999999999", ["train.steps=99999999999999999999999", "less than or equal to 1000000"]),
    ("optim.lr=.inf", ["optim.lr=inf", "finite number"]),
    ("sampling.temperature=.inf", ["sampling.temperature=inf", "finite number"]),
    ("reward_weights=[.nan,1]", ["reward_weights.0=nan", "finite number"]),
    ("train.steps=true", ["train.steps=True", "a boolean is not a number"]),
    ("train.steps=[1,", ["--set 'train.steps=[1,'", "not valid YAML"]),
    ("name=`x`", ["--set 'name=`x`'", "not valid YAML"]),
]


@pytest.mark.parametrize("item, patterns", BAD_SETTINGS, ids=[item for item, _ in BAD_SETTINGS])
def test_launch_with_a_bad_value_says_which_field_and_leaves_nothing(tmp_path, item, patterns):
    res = cli(tmp_path, "launch", "grpo", "--set", item)
    assert_one_line_error(res, *patterns)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("item, patterns", BAD_SETTINGS, ids=[item for item, _ in BAD_SETTINGS])
def test_export_and_train_reject_the_same_values(tmp_path, item, patterns):
    assert_one_line_error(cli(tmp_path, "export", "grpo", "--to", "yaml", "--set", item), *patterns)
    assert_one_line_error(cli(tmp_path, "train", "grpo", "--set", item, "--run-dir", str(tmp_path / "run")), *patterns)
    assert not (tmp_path / "run").exists()


def test_several_problems_are_still_one_line(tmp_path):
    res = cli(tmp_path, "launch", "grpo", "--set", "optim.lr=.nan", "--set", "train.steps=0")
    assert_one_line_error(res, "optim.lr=nan", "train.steps=0", "greater than or equal to 1")


def test_processes_beyond_the_machine_are_refused(tmp_path):
    res = cli(tmp_path, "launch", "grpo", "--processes", "100000")
    assert_one_line_error(res, "--processes=100000", f"at most {len(os.sched_getaffinity(0))}")
    assert leftovers(tmp_path) == []
    assert_one_line_error(cli(tmp_path, "launch", "grpo", "--processes", "0"), "--processes=0", "at least 1")


def test_threads_beyond_the_machine_are_refused_before_training(tmp_path):
    cpus = len(os.sched_getaffinity(0))
    item = f"train.threads={cpus + 1}"
    assert_one_line_error(cli(tmp_path, "launch", "grpo", "--set", item), item, f"at most {cpus}")
    assert_one_line_error(cli(tmp_path, "train", "grpo", "--set", item, "--run-dir", str(tmp_path / "run")), item)
    assert leftovers(tmp_path) == [] and not (tmp_path / "run").exists()


def test_unknown_run_and_preset_are_one_line(tmp_path):
    assert_one_line_error(cli(tmp_path, "runs", "show", "no-such-run"), "no-such-run")
    assert_one_line_error(cli(tmp_path, "launch", "grpoo"), "'grpoo'", "dapo")
    assert_one_line_error(cli(tmp_path, "recipes", "show", "grpoo"), "'grpoo'", "dapo")


# ---- a closed pipe ------------------------------------------------------------------------------


def _finished_run(home: Path) -> str:
    """One finished run in the store at ``home`` (made with the store's API, nothing trains)."""
    code = ("from workbench.runs import RunStore; from workbench.recipe import load_recipe\n"
            "s = RunStore(); r = load_recipe('grpo')\n"
            "s.create_run(run_id='r1', name='r1', algorithm='grpo', recipe_yaml=r.to_yaml(), total_steps=30,"
            " target='local', launcher='local', host='', created_by='t', run_dir='/nonexistent')\n"
            "s.set_status('r1', 'finished')")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "WORKBENCH_HOME": str(home)}, check=True)
    return "r1"


@pytest.mark.parametrize("argv", [["runs", "show"], ["runs", "list"], ["recipes", "show", "grpo"], ["export", "grpo", "--to", "bash"]])
def test_a_closed_pipe_ends_quietly(tmp_path, argv):
    """`... | head` closes the pipe early: no BrokenPipeError traceback (the reader closes first here)."""
    run_id = _finished_run(tmp_path)
    argv = argv + [run_id] if argv == ["runs", "show"] else argv
    env = {**os.environ, "WORKBENCH_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "workbench", *argv], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # like `head` exiting before the command writes
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) != 0
    assert stderr == "", stderr


def test_runs_show_prints_the_run(tmp_path):
    run_id = _finished_run(tmp_path)
    res = cli(tmp_path, "runs", "show", run_id)
    assert res.returncode == 0, res.stderr
    shown, recipe = res.stdout.split("--- recipe ---\n")
    assert json.loads(shown)["status"] == "finished" and "name: grpo" in recipe


# ---- commands that do not train import no torch --------------------------------------------------

HEAVY = ("torch", "transformers", "accelerate")


@pytest.mark.parametrize("argv", [
    ["runs", "list"], ["recipes", "list"], ["recipes", "show", "grpo"], ["export", "grpo", "--to", "bash"],
    ["export", "ppo", "--to", "sbatch"], ["launch", "--help"], ["runs", "show", "r1"], ["collect", "--once"],
    ["launch", "grpo", "--set", "train.steps=0"], ["launch", "grpo", "--seeds", "2", "--sweep", "algorithm.eps_high=0.2,-1"],
    ["runs", "arms", "nogroup"], ["compare", "nogroup"],
], ids=" ".join)
def test_commands_that_do_not_train_import_no_torch(tmp_path, argv):
    _finished_run(tmp_path)
    code = ("import sys\nfrom workbench.cli import main\n"
            f"try:\n    code = main({argv!r})\nexcept SystemExit as e:\n    code = e.code\n"
            f"print(code, [m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)")
    env = {**os.environ, "WORKBENCH_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    last = res.stderr.splitlines()[-1]
    assert last.endswith(" []"), f"{argv}: {last}\n{res.stderr}"
    assert last.split()[0] in ("0", "2"), res.stderr
