"""The export layer's text: recipe YAML round trip, bash / sbatch scripts that `bash -n` accepts,
hostile names that neither break nor inject, option errors, and the `export` command."""

import ast
import shlex
import subprocess
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.export.cli import resolve_recipe
from workbench.export.commands import ShellVar, shell_join, train_command
from workbench.export.scripts import (
    EXPORTERS,
    BashOptions,
    ExportError,
    SlurmOptions,
    bash_script,
    heredoc_delimiter,
    recipe_yaml,
    safe_name,
    sbatch_script,
)
from workbench.recipe import Recipe, RecipeError, load_recipe, preset_names

ROOT = Path(__file__).resolve().parents[2]
# Names are one-line labels of at most 64 characters (the recipe refuses newlines and separators),
# so the name carries the one-line attacks and the description the multi-line ones (a line that
# would end the heredoc, then YAML of its own).
HOSTILE = "ev'\"$(touch PWNED1)`touch PWNED2`;touch PWNED3 #WORKBENCH_RECIPE"
HOSTILE_TEXT = "line1\nEOF\nWORKBENCH_RECIPE\nname: x\\\n'; rm -rf / #"


def hostile_recipe(**changes) -> Recipe:
    data = load_recipe("grpo").to_dict()
    data.update(name=HOSTILE, description=HOSTILE_TEXT, **changes)
    return Recipe.from_dict(data)


def bash_syntax_ok(text: str) -> None:
    res = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("name", preset_names())
def test_yaml_round_trip_of_every_preset(name):
    recipe = load_recipe(name)
    assert Recipe.from_yaml(recipe_yaml(recipe)) == recipe


def test_yaml_round_trip_of_hostile_and_edited_recipes():
    recipe = hostile_recipe(reward_weights=[0.5], reward_funcs=["tests.engine.faulty_rewards:raises_at_step_2"])
    recipe = recipe.with_overrides(["algorithm.adv_eps=1e-4", "optim.lr=3.0e-7", "optim.betas=[0.9, 0.95]",
                                    "algorithm.clip_c=3", "train.seed=12345"])
    text = recipe_yaml(recipe)
    assert Recipe.from_yaml(text) == recipe
    assert text.startswith("# RL Workbench recipe.")
    assert Recipe.from_yaml(text).name == HOSTILE and Recipe.from_yaml(text).description == HOSTILE_TEXT


def test_safe_name_and_heredoc_delimiter():
    assert safe_name("a b/../$(x)") == "a_b_.._x_"
    assert safe_name("../../etc") == "_.._etc"
    assert safe_name("-rf") == "rf"
    assert safe_name("$$$") == "_"
    assert safe_name("...") == "run"
    assert safe_name("x" * 100) == "x" * 64
    assert heredoc_delimiter("a\nb\n") == "WORKBENCH_RECIPE"
    assert heredoc_delimiter("WORKBENCH_RECIPE\nWORKBENCH_RECIPE_1\n") == "WORKBENCH_RECIPE_2"
    # only a whole line can end a heredoc: text that merely contains the word does not
    assert heredoc_delimiter("  WORKBENCH_RECIPE\nx: WORKBENCH_RECIPE\n") == "WORKBENCH_RECIPE"


def test_shell_join_quotes_values_and_expands_shell_vars():
    argv = train_command("/r dir/it's.yaml", ShellVar("RUN_DIR"), python=ShellVar("PYTHON"))
    line = shell_join(argv)
    assert line.startswith('"${PYTHON}" -m accelerate.commands.launch --cpu --num_processes 1 ')
    assert line.endswith("""train '/r dir/it'"'"'s.yaml' --run-dir "${RUN_DIR}\"""")
    assert shlex.split(line)[-3] == "/r dir/it's.yaml"
    with pytest.raises(ValueError, match=r"ShellVar name='A B' is not allowed"):
        ShellVar("A B")


def test_bash_script_layout():
    recipe = load_recipe("grpo", ["train.precision=bf16", "train.threads=2"])
    text = bash_script(recipe, BashOptions(processes=2, device="gpu", python="/opt/venv/bin/python"))
    bash_syntax_ok(text)
    lines = text.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert "set -euo pipefail" in lines
    assert "PYTHON=/opt/venv/bin/python" in lines
    assert 'PYTHON="${WORKBENCH_PYTHON:-$PYTHON}"' in lines
    assert "RECIPE_TEXT=$(cat <<'WORKBENCH_RECIPE'" in lines
    assert 'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"' in lines
    assert lines[-1] == ('exec "${PYTHON}" -m accelerate.commands.launch --multi_gpu --num_processes 2 --num_machines 1 '
                         '--mixed_precision bf16 --dynamo_backend no -m workbench train "${RECIPE}" --run-dir "${RUN_DIR}"')
    # the inlined recipe is the recipe
    start, end = lines.index("RECIPE_TEXT=$(cat <<'WORKBENCH_RECIPE'"), lines.index("WORKBENCH_RECIPE")
    assert Recipe.from_yaml("\n".join(lines[start + 1:end])) == recipe
    cpu = bash_script(load_recipe("grpo"))
    assert cpu.splitlines()[-1].startswith('exec "${PYTHON}" -m accelerate.commands.launch --cpu --num_processes 1 ')


def test_sbatch_script_layout_multi_node():
    recipe = load_recipe("dapo")
    o = SlurmOptions(nodes=4, gpus_per_node=8, time="2-00:00:00", partition="gpu", account="")
    text = sbatch_script(recipe, o)
    bash_syntax_ok(text)
    lines = text.splitlines()
    header = lines[1:lines.index("#")]
    assert header == ["#SBATCH --job-name=dapo", "#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1",
                      "#SBATCH --gpus-per-node=8", "#SBATCH --time=2-00:00:00", "#SBATCH --partition=gpu",
                      "##SBATCH --account=ACCOUNT", "#SBATCH --output=dapo-%j.out", "#SBATCH --error=dapo-%j.err",
                      "#SBATCH --open-mode=append"]  # a requeued job appends to its first start's logs
    assert 'mapfile -t NODELIST < <(scontrol show hostnames "$SLURM_JOB_NODELIST")' in lines
    assert 'MAIN_PROCESS_IP="${NODELIST[0]}"' in lines
    srun = lines.index("srun --nodes=4 --ntasks=4 --ntasks-per-node=1 \\")
    task = shlex.split(lines[srun + 1].strip())
    assert task[:2] == ["bash", "-c"] and task[3:] == ["||", "status=$?"]
    launch = ("\"${PYTHON}\" -m accelerate.commands.launch --multi_gpu --num_processes 32 "
              "--num_machines 4 --mixed_precision no --dynamo_backend no --machine_rank \"${SLURM_PROCID}\" "
              "--main_process_ip \"${MAIN_PROCESS_IP}\" --main_process_port \"${MAIN_PROCESS_PORT}\" -m workbench train")
    # a requeued job (RESUME=1) continues the run; otherwise it starts it
    assert task[2] == (f"trap '' INT TERM; if [ \"$RESUME\" = 1 ]; then exec {launch} --resume \"${{RUN_DIR}}\"; fi; "
                       f"exec {launch} \"${{RECIPE}}\" --run-dir \"${{RUN_DIR}}\"")
    assert "export WORKBENCH_SIGTERM=interrupt" in lines  # SLURM's TERM is not the user's cancel
    assert 'if (( ${SLURM_RESTART_COUNT:-0} > 0 )) && [[ -e "$RUN_DIR/run.json" ]]; then' in lines
    assert "trl.scripts.vllm_serve" not in text


def test_sbatch_script_with_vllm_node_and_run_dir():
    o = SlurmOptions(nodes=2, gpus_per_node=4, vllm_node=True, run_dir="/shared/wb/runs/r1", job_name="r1")
    text = sbatch_script(load_recipe("grpo"), o)
    bash_syntax_ok(text)
    lines = text.splitlines()
    assert "#SBATCH --nodes=3" in lines  # 2 training + 1 generation node
    assert "#SBATCH --output=/shared/wb/runs/r1/stdout.log" in lines
    assert not any(line.startswith("#SBATCH --error") for line in lines)  # stderr joins stdout.log
    assert "RUN_DIR=/shared/wb/runs/r1" in lines
    assert 'VLLM_NODE="${NODELIST[2]}"' in lines
    assert 'TRAIN_NODES="$(IFS=,; echo "${NODELIST[*]:0:2}")"' in lines
    assert 'srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --nodelist="$TRAIN_NODES" \\' in lines
    assert '    "$PYTHON" -m trl.scripts.vllm_serve --model "$MODEL" --tensor-parallel-size 4 \\' in lines
    assert "HONEST NOTE: the workbench engine's vLLM backend is" in text
    hf = sbatch_script(load_recipe("grpo", ["model=Qwen/Qwen2.5-0.5B"]), o)
    assert "MODEL=Qwen/Qwen2.5-0.5B" in hf.splitlines()


def test_cpu_nodes_sbatch_has_no_gpu_line():
    text = sbatch_script(load_recipe("grpo"), SlurmOptions(nodes=1, gpus_per_node=0))
    bash_syntax_ok(text)
    assert "--gpus-per-node" not in text
    assert "accelerate.commands.launch --cpu --num_processes 1 --num_machines 1" in text


def test_hostile_names_are_quoted_in_every_script(tmp_path):
    recipe = hostile_recipe()
    texts = {"bash": bash_script(recipe, BashOptions(python="/x/$(touch PWNED4)/py")),
             "sbatch": sbatch_script(recipe, SlurmOptions(python="py'; touch PWNED5; '")),
             "sbatch-vllm": sbatch_script(recipe, SlurmOptions(vllm_node=True, job_name="j$(touch PWNED6)"))}
    for kind, text in texts.items():
        bash_syntax_ok(text)
        for line in text.splitlines():
            if line.startswith("#") and "PWNED" in line:  # comments and #SBATCH lines carry only reduced names
                assert line.count("PWNED") == line.count("touch_PWNED"), (kind, line)
                assert "$(" not in line and "touch " not in line, (kind, line)
        assert "RUN_NAME=ev_touch_PWNED1_touch_PWNED2_touch_PWNED3_WORKBENCH_RECIPE\n" in text
        lines = text.splitlines()
        start = lines.index("RECIPE_TEXT=$(cat <<'WORKBENCH_RECIPE'")
        inlined = "\n".join(lines[start + 1:lines.index("WORKBENCH_RECIPE", start)])
        assert Recipe.from_yaml(inlined) == recipe  # YAML escapes the newlines: no line ends the heredoc
    assert "#SBATCH --job-name=j_touch_PWNED6_" in texts["sbatch-vllm"]
    assert "PYTHON='/x/$(touch PWNED4)/py'" in texts["bash"]


def test_bad_options_name_field_value_and_rule():
    cases = [
        (lambda: SlurmOptions(nodes=0), "nodes=0 is not allowed; an integer >= 1"),
        (lambda: SlurmOptions(gpus_per_node=-1), "gpus_per_node=-1 is not allowed; an integer >= 0"),
        (lambda: SlurmOptions(time="1 hour"), "time='1 hour' is not allowed; use SLURM's forms"),
        (lambda: SlurmOptions(time="01:00:00\n#SBATCH --x"), "time='01:00:00\\n#SBATCH --x' is not allowed"),
        (lambda: SlurmOptions(partition="gpu\n#SBATCH --account=other"), "partition='gpu\\n#SBATCH --account=other' is not allowed"),
        (lambda: SlurmOptions(account="a b"), "account='a b' is not allowed; one word"),
        (lambda: SlurmOptions(run_dir="/my runs/x"), "run_dir='/my runs/x' is not allowed in an #SBATCH --output line"),
        (lambda: SlurmOptions(python="py\nrm -rf"), "python='py\\nrm -rf' is not allowed; a non-empty single-line string"),
        (lambda: BashOptions(processes=0), "processes=0 is not allowed; an integer >= 1"),
        (lambda: BashOptions(device="tpu"), "device='tpu' is not allowed; choose one of: cpu, gpu"),
    ]
    for make, message in cases:
        with pytest.raises(ExportError) as err:
            make()
        assert message in str(err.value)
    for ok in ("01:00:00", "2-00:00:00", "30", "30:00", "1-12", "1-12:30"):
        assert SlurmOptions(time=ok).time == ok


def test_exporters_registry():
    assert EXPORTERS.names() == ("yaml", "bash", "sbatch")
    recipe = load_recipe("rloo")
    assert EXPORTERS.get("yaml")(recipe) == recipe_yaml(recipe)
    assert EXPORTERS.get("sbatch")(recipe, SlurmOptions(nodes=2)) == sbatch_script(recipe, SlurmOptions(nodes=2))


# ---- the command ----------------------------------------------------------------------------------------


def run_export(argv, capsys):
    """``python -m workbench export ...`` through the real CLI (its wiring hands in the run store and settings)."""
    code = main(["export", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_export_layer_does_not_import_the_run_layer():
    """export sits below runs (DESIGN: imports point downward), not even lazily inside a function."""
    for path in (ROOT / "workbench" / "export").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not [n for n in names if n.startswith("workbench.runs")], (path.name, names)


def test_export_command_preset_file_and_out(tmp_path, capsys, fresh_home):
    code, out, _ = run_export(["grpo", "--to", "yaml", "--set", "train.steps=7"], capsys)
    assert code == 0 and Recipe.from_yaml(out) == load_recipe("grpo", ["train.steps=7"])
    path = tmp_path / "mine.yaml"
    path.write_text(out)
    code, out2, _ = run_export([str(path), "--to", "bash", "--out", str(tmp_path / "run.sh")], capsys)
    assert code == 0 and out2 == ""
    script = tmp_path / "run.sh"
    assert script.stat().st_mode & 0o111
    lines = script.read_text().splitlines()
    assert "RUN_NAME=grpo" in lines and "PYTHON=python" in lines
    assert lines[-1] == ('exec "${PYTHON}" -m accelerate.commands.launch --cpu --num_processes 1 --num_machines 1 '
                         '--mixed_precision no --dynamo_backend no -m workbench train "${RECIPE}" --run-dir "${RUN_DIR}"')
    start = lines.index("RECIPE_TEXT=$(cat <<'WORKBENCH_RECIPE'")
    inlined = Recipe.from_yaml("\n".join(lines[start + 1:lines.index("WORKBENCH_RECIPE", start)]))
    assert inlined.train.steps == 7 and inlined.name == "grpo"


def _srun_task(text: str) -> str:
    """The command each srun task runs (the single-quoted ``bash -c`` argument)."""
    lines = text.splitlines()
    srun = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    return shlex.split(lines[srun + 1].strip())[2]


def test_export_command_sbatch_uses_settings_defaults(capsys, fresh_home):
    from workbench.runs import Settings, SlurmDefaults
    from workbench.runs.settings import save_settings  # unauthorised: tests set up homes with it

    # no settings file: SlurmOptions' defaults, and no live partition / account line
    code, out, _ = run_export(["grpo", "--to", "sbatch"], capsys)
    lines = out.splitlines()
    assert code == 0 and "#SBATCH --nodes=1" in lines and "#SBATCH --time=01:00:00" in lines
    assert not [line for line in lines if line.startswith(("#SBATCH --partition", "#SBATCH --account"))]
    assert "##SBATCH --partition=PARTITION" in lines and "##SBATCH --account=ACCOUNT" in lines

    save_settings(Settings(slurm=SlurmDefaults(partition="a100", account="lab", nodes=2, gpus_per_node=4, time="02:00:00")))
    code, out, _ = run_export(["grpo", "--to", "sbatch", "--nodes", "3"], capsys)  # the command line wins
    lines = out.splitlines()
    assert code == 0
    for line in ("#SBATCH --nodes=3", "#SBATCH --gpus-per-node=4", "#SBATCH --time=02:00:00",
                 "#SBATCH --partition=a100", "#SBATCH --account=lab"):
        assert line in lines
    assert " --num_processes 12 --num_machines 3 " in _srun_task(out)  # 3 nodes x 4 GPUs
    code, out, _ = run_export(["grpo", "--to", "sbatch", "--gpus-per-node", "1"], capsys)
    assert code == 0 and " --num_processes 2 --num_machines 2 " in _srun_task(out)  # 2 nodes x 1 GPU
    code, out, err = run_export(["grpo", "--to", "sbatch", "--vllm-node"], capsys)
    assert code == 0 and "#SBATCH --nodes=3" in out.splitlines()  # 2 training + 1 vLLM node
    assert "does not use that server" in err


def test_export_command_errors(capsys, fresh_home):
    code, out, err = run_export(["no-such-thing", "--to", "yaml"], capsys)
    assert (code, out) == (2, "")
    assert "RUN_OR_RECIPE='no-such-thing' is not a preset (cispo, clip_cov, dapo" in err and "or a run id in the run store" in err
    code, _, err = run_export(["grpo", "--to", "sbatch", "--partition", "gpu;reboot"], capsys)
    assert code == 2 and "partition='gpu;reboot' is not allowed" in err
    code, _, err = run_export(["grpo", "--to", "bash", "--set", "algorithm.advantage=ppo"], capsys)
    assert code == 2 and "algorithm.advantage='ppo'" in err
    with pytest.raises(RecipeError):
        resolve_recipe("../../etc/passwd")
    # without a run resolver (the export layer on its own) run ids are not offered
    with pytest.raises(RecipeError, match=r"an existing \.yaml/\.yml file$"):
        resolve_recipe("grpo-20250101-000000-abcd")
    # an unreadable settings file is a bad input (exit 2), not a traceback
    (fresh_home / "settings.yaml").write_text("slurm:\n  time: soon\n")
    code, _, err = run_export(["grpo", "--to", "sbatch"], capsys)
    assert code == 2 and "time='soon' is not allowed" in err


def test_export_command_run_id(capsys, fresh_home):
    """A run id exports the recipe stored with the run (real SQLite store, no process started)."""
    from workbench.runs import RunStore

    store = RunStore()
    recipe = load_recipe("ppo", ["train.steps=5", "train.seed=9"])
    run_id = "ppo-20250101-000000-abcd"
    store.create_run(run_id=run_id, name="ppo", algorithm="ppo", recipe_yaml=recipe.to_yaml(), total_steps=5,
                     target="local", launcher="local", host="localhost", created_by="t",
                     run_dir=str(fresh_home / "runs" / run_id), group=None, tags=[], notes="", launch={})
    code, out, _ = run_export([run_id, "--to", "yaml"], capsys)
    assert code == 0 and Recipe.from_yaml(out) == recipe
