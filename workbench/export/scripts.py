"""Recipe -> text: the recipe YAML, a bash script and a SLURM sbatch script that reproduce a run.

Pure functions (no I/O). Every piece of user text that reaches a script is made harmless:
- the recipe YAML is inlined through a *quoted* heredoc (``<<'DELIM'``: no expansion at all), with
  a delimiter that no line of the YAML equals;
- values on command lines go through ``shlex.quote`` (or are expanded as ``"${VAR}"``);
- names that end up in paths, ``#SBATCH`` lines and comments are reduced to ``[A-Za-z0-9._-]``;
- SLURM settings (partition, account, time) are checked against SLURM's own syntax, because an
  ``#SBATCH`` line is parsed by sbatch, not by the shell, and cannot be quoted.

The training command itself comes from :mod:`workbench.export.commands`, the same one the local
launcher runs, so an exported script and a launched run execute the same thing.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Callable, Literal

from workbench.core.registry import Registry
from workbench.export.commands import MIXED_PRECISION, ShellVar, shell_join, train_command
from workbench.recipe import Recipe


class ExportError(ValueError):
    """Export options that cannot make a valid script (the message names field, value, rule)."""


_SAFE_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
# SLURM partition / account names: one word (no spaces, quotes, '#', newlines: #SBATCH lines are not shell).
_SLURM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# SLURM --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (sbatch(1) "-t, --time").
_SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}|\d+-\d{1,2}:\d{1,2}|\d+-\d{1,2}:\d{1,2}:\d{1,2})$")
# What may stand in an #SBATCH --output path (sbatch splits the line on blanks, '%' is its pattern char).
_SBATCH_PATH = re.compile(r"^[A-Za-z0-9._/~+,@=-]+$")
DEVICES = ("cpu", "gpu")


def safe_name(text: str, default: str = "run") -> str:
    """``text`` reduced to ``[A-Za-z0-9._-]`` (64 chars, no leading '.' / '-'): fit for paths,
    job names and comments. ``'a b/../$(x)'`` -> ``'a_b_.._x_'``; nothing left -> ``default``."""
    name = _SAFE_CHARS.sub("_", text).lstrip(".-")[:64]
    return name or default


def heredoc_delimiter(text: str, base: str = "WORKBENCH_RECIPE") -> str:
    """A heredoc end marker that no line of ``text`` equals (so the text cannot end it early)."""
    lines = set(text.splitlines())
    delim, n = base, 0
    while delim in lines:
        n += 1
        delim = f"{base}_{n}"
    return delim


# ---- option sets ---------------------------------------------------------------------------


def _positive(field: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ExportError(f"{field}={value!r} is not allowed; an integer >= {minimum}")
    return value


def _single_line(field: str, value: str) -> str:
    if not isinstance(value, str) or not value or any(c in value for c in "\n\r\0"):
        raise ExportError(f"{field}={value!r} is not allowed; a non-empty single-line string")
    return value


@dataclass(frozen=True)
class BashOptions:
    """How the bash script launches the run on one machine."""

    processes: int = 1
    """accelerate processes (data-parallel ranks) on this machine; > 1 uses --multi_gpu (gloo on CPU)."""
    device: Literal["cpu", "gpu"] = "cpu"
    """cpu: force CPU (accelerate --cpu with 1 process); gpu: use the visible CUDA devices."""
    python: str = "python"
    """Interpreter with the workbench installed (WORKBENCH_PYTHON overrides it when the script runs)."""
    run_dir: str | None = None
    """Fixed run directory; None: $WORKBENCH_RUN_DIR or $WORKBENCH_HOME/runs/NAME-YYYYmmdd-HHMMSS at run time."""

    def __post_init__(self) -> None:
        _positive("processes", self.processes, 1)
        if self.device not in DEVICES:
            raise ExportError(f"device={self.device!r} is not allowed; choose one of: {', '.join(DEVICES)}")
        _single_line("python", self.python)
        if self.run_dir is not None:
            _single_line("run_dir", self.run_dir)


@dataclass(frozen=True)
class SlurmOptions:
    """The sbatch allocation and layout (the caller fills in its own defaults, e.g. the app's settings)."""

    nodes: int = 1
    """Training nodes; accelerate runs one launcher per node (machine rank = SLURM_PROCID)."""
    gpus_per_node: int = 1
    """GPUs per training node = processes per node; 0: CPU nodes with one process each."""
    time: str = "01:00:00"
    """Wall-clock limit in SLURM's syntax (HH:MM:SS, D-HH:MM:SS, minutes ...)."""
    partition: str = ""
    """Partition; empty: a commented ##SBATCH placeholder (the cluster's default partition)."""
    account: str = ""
    """Account to charge; empty: a commented ##SBATCH placeholder."""
    vllm_node: bool = False
    """One extra node running ``trl vllm-serve`` as in TRL's multi-node GRPO example (see sbatch_script)."""
    python: str = "python"
    """Interpreter with the workbench installed, on every node (WORKBENCH_PYTHON overrides it)."""
    run_dir: str | None = None
    """Fixed run directory on the shared filesystem (logs go there as stdout.log); None: chosen at run time."""
    job_name: str | None = None
    """SLURM job name (default: the recipe name), reduced to [A-Za-z0-9._-]."""
    resume: bool = False
    """Continue the run in ``run_dir`` from its newest checkpoint (``train --resume``); its log is appended to."""

    def __post_init__(self) -> None:
        _positive("nodes", self.nodes, 1)
        _positive("gpus_per_node", self.gpus_per_node, 0)
        if not isinstance(self.time, str) or not _SLURM_TIME.match(self.time):
            raise ExportError(f"time={self.time!r} is not allowed; use SLURM's forms: HH:MM:SS, D-HH:MM:SS, D-HH, MM, MM:SS")
        for field in ("partition", "account"):
            value = getattr(self, field)
            if value and not _SLURM_NAME.match(value):
                raise ExportError(f"{field}={value!r} is not allowed; one word of letters, digits, '.', '-', '_' (or empty)")
        _single_line("python", self.python)
        if self.resume and self.run_dir is None:
            raise ExportError("resume=True needs the run_dir of the run to continue")
        if self.run_dir is not None and not _SBATCH_PATH.match(self.run_dir):
            raise ExportError(
                f"run_dir={self.run_dir!r} is not allowed in an #SBATCH --output line; "
                "use a path of letters, digits and . _ / ~ + , @ = - (no blanks or '%')"
            )

    @property
    def processes(self) -> int:
        """Total accelerate processes: nodes x GPUs per node (one per node on CPU nodes)."""
        return self.nodes * max(self.gpus_per_node, 1)


# ---- recipe YAML ------------------------------------------------------------------------------


def recipe_yaml(recipe: Recipe) -> str:
    """The recipe as YAML; ``Recipe.from_yaml(recipe_yaml(r)) == r`` for every valid recipe."""
    header = "# RL Workbench recipe. Run it: python -m workbench train THIS_FILE [--set section.field=value]\n"
    return header + recipe.to_yaml()


def _inline_recipe(recipe: Recipe, target: str) -> str:
    """Shell lines writing the recipe YAML to ``target`` (a shell word, ``$RUN_DIR/recipe.yaml``)
    through a quoted heredoc, never over another run: a new run goes only into a new or empty
    ``$RUN_DIR`` (a launcher's own files aside), or one whose recipe.yaml is this very recipe (the
    workbench prepared it); anything else is one line ``error: ...`` and exit 2, nothing written.
    The trainer checks the directory again (workbench/engine/rundir.py)."""
    from workbench.engine.rundir import LAUNCHER_FILES, RECIPE_FILE

    text = recipe.to_yaml()
    text = text if text.endswith("\n") else text + "\n"
    delim = heredoc_delimiter(text)
    others = " ".join(f"-e {shlex.quote(name)}" for name in sorted(LAUNCHER_FILES - {RECIPE_FILE}))
    refuse = 'echo "error: run directory $RUN_DIR {}; a new run needs a new or empty directory" >&2; exit 2'
    # <<'DELIM' (quoted): bash expands nothing inside, so $(...), `...`, \ and quotes stay text.
    return (f"RECIPE_TEXT=$(cat <<'{delim}'\n{text}{delim}\n)\n"
            f"if [ -e {target} ]; then\n"
            f"    [ \"$(cat -- {target})\" = \"$RECIPE_TEXT\" ] || {{ {refuse.format('holds another recipe.yaml')}; }}\n"
            f"elif [ -n \"$(ls -A -- \"$RUN_DIR\" 2>/dev/null | grep -vxF {others})\" ]; then\n"
            f"    {refuse.format('is not empty')}\n"
            f"else\n"
            f"    mkdir -p -- \"$RUN_DIR\"\n"
            f"    printf '%s\\n' \"$RECIPE_TEXT\" > {target}\n"
            f"fi\n")


def _summary(recipe: Recipe) -> str:
    """One comment-safe line describing the algorithm (names are registry names: safe chars)."""
    a = recipe.algorithm
    return (f"advantage={safe_name(a.advantage)} policy_loss={safe_name(a.policy_loss)} "
            f"aggregation={safe_name(a.aggregation)} kl_coef={a.kl_coef:g} seed={recipe.train.seed} "
            f"steps={recipe.train.steps} precision={recipe.train.precision}")


def _run_dir_lines(recipe: Recipe, fixed: str | None, suffix: str) -> str:
    """RUN_NAME / RUN_DIR assignments: a fixed (quoted) directory, or one chosen when the script runs."""
    name = shlex.quote(safe_name(recipe.name))
    if fixed is not None:
        return f"RUN_NAME={name}\nRUN_DIR={shlex.quote(fixed)}\n"
    return (f"RUN_NAME={name}\n"
            f'RUN_DIR="${{WORKBENCH_RUN_DIR:-${{WORKBENCH_HOME:-$HOME/.workbench}}/runs/${{RUN_NAME}}-{suffix}}}"\n')


def _run_dir_doc(fixed: str | None, default_leaf: str) -> str:
    if fixed is not None:
        return "RUN_DIR            fixed below (the run directory this script was written for)"
    return f"WORKBENCH_RUN_DIR  run directory (default: $WORKBENCH_HOME/runs/{default_leaf})"


# ---- bash -------------------------------------------------------------------------------------


def bash_script(recipe: Recipe, options: BashOptions = BashOptions()) -> str:
    """A bash script that runs ``recipe`` on one machine exactly as the local launcher does.

    Layout: environment set-up comment, ``set -euo pipefail``, the run directory, the recipe
    inlined into ``RUN_DIR/recipe.yaml`` (quoted heredoc), then ``exec`` of the ``accelerate launch
    ... -m workbench train`` command with the processes and the recipe's mixed precision.
    """
    argv = train_command(ShellVar("RECIPE"), ShellVar("RUN_DIR"), python=ShellVar("PYTHON"),
                         num_processes=options.processes, cpu=options.device == "cpu",
                         mixed_precision=MIXED_PRECISION[recipe.train.precision])
    name = safe_name(recipe.name)
    return f"""#!/usr/bin/env bash
# RL Workbench run script for recipe {name}: {_summary(recipe)}
# Generated by `python -m workbench export ... --to bash`; it runs the same command as the app's
# local launcher, so the same seed gives the same per-step rewards.
#
# Environment set-up (before running it):
#   - a Python environment with the workbench installed (`pip install -e /path/to/rl-workbench`),
#     e.g. `source /path/to/rl-workbench/.venv/bin/activate`, or set WORKBENCH_PYTHON below;
#   - WORKBENCH_HOME: where runs and the cached built-in `tiny` model live (default ~/.workbench).
# Variables read when it runs:
#   WORKBENCH_PYTHON   interpreter (default: the PYTHON= line below)
#   {_run_dir_doc(options.run_dir, name + '-YYYYmmdd-HHMMSS')}
#   OMP_NUM_THREADS    CPU threads per process (default: the recipe's train.threads = {recipe.train.threads})
# Launch: {options.processes} process(es) on {options.device}, mixed precision {MIXED_PRECISION[recipe.train.precision]}.
# Outputs: RUN_DIR/recipe.yaml and RUN_DIR/events.jsonl (status, metrics per step, samples, diagnostics).
set -euo pipefail

PYTHON={shlex.quote(options.python)}
PYTHON="${{WORKBENCH_PYTHON:-$PYTHON}}"
{_run_dir_lines(recipe, options.run_dir, "$(date +%Y%m%d-%H%M%S)")}RECIPE="$RUN_DIR/recipe.yaml"

# The recipe, verbatim (validated again by the trainer).
{_inline_recipe(recipe, '"$RECIPE"')}
export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{recipe.train.threads}}}"
echo "run directory: $RUN_DIR" >&2
exec {shell_join(argv)}
"""


# ---- sbatch -----------------------------------------------------------------------------------


def _sbatch_header(recipe: Recipe, o: SlurmOptions) -> str:
    job = safe_name(o.job_name or recipe.name)
    lines = [f"#SBATCH --job-name={job}",
             f"#SBATCH --nodes={o.nodes + int(o.vllm_node)}",
             "#SBATCH --ntasks-per-node=1"]
    if o.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={o.gpus_per_node}")
    lines.append(f"#SBATCH --time={o.time}")
    # Placeholders stay commented (##SBATCH is ignored by sbatch): fill in and remove one '#'.
    lines.append(f"#SBATCH --partition={o.partition}" if o.partition else "##SBATCH --partition=PARTITION")
    lines.append(f"#SBATCH --account={o.account}" if o.account else "##SBATCH --account=ACCOUNT")
    if o.run_dir is not None:
        # The run directory must exist before submission (SLURM does not create log directories).
        # No --error: stderr joins stdout in one stdout.log, as with the local launcher.
        lines.append(f"#SBATCH --output={o.run_dir}/stdout.log")
    else:
        lines.append(f"#SBATCH --output={job}-%j.out")
        lines.append(f"#SBATCH --error={job}-%j.err")
    # keep the log of the attempts before: a resume's, and a requeued job's first start (SLURM
    # truncates --output by default, also when it runs a requeued job again)
    lines.append("#SBATCH --open-mode=append")
    return "\n".join(lines) + "\n"


def _vllm_block(recipe: Recipe, o: SlurmOptions) -> str:
    model = ('"$("$PYTHON" -m workbench model build tiny)"  # the built-in model, built into WORKBENCH_HOME'
             if recipe.model == "tiny" else shlex.quote(recipe.model))
    tp = max(o.gpus_per_node, 1)
    return f"""
# Dedicated generation node, laid out as in TRL's multi-node GRPO example (`trl vllm-serve` on the
# last node, training on the others). HONEST NOTE: the workbench engine's vLLM backend is
# *colocated* (train.rollout=vllm generates inside each training process); the engine does not
# call this server. The node is allocated and the server started (log: RUN_DIR/vllm_serve.log,
# address exported as VLLM_SERVER_HOST / VLLM_SERVER_PORT) for trainers that use server mode, e.g.
# TRL's GRPOTrainer(vllm_mode="server", vllm_server_host=...). Needs `pip install trl[vllm]` on
# that node. A server that fails to start does not stop the training. VLLM_PORT: its port (8000).
VLLM_NODE="${{NODELIST[{o.nodes}]}}"
VLLM_PORT="${{VLLM_PORT:-8000}}"
MODEL={model}
echo "vLLM server node: $VLLM_NODE:$VLLM_PORT (model $MODEL)" >&2
srun --nodes=1 --ntasks=1 --nodelist="$VLLM_NODE" \\
    "$PYTHON" -m trl.scripts.vllm_serve --model "$MODEL" --tensor-parallel-size {tp} \\
    --host 0.0.0.0 --port "$VLLM_PORT" > "$RUN_DIR/vllm_serve.log" 2>&1 &
VLLM_PID=$!
export VLLM_SERVER_HOST="$VLLM_NODE" VLLM_SERVER_PORT="$VLLM_PORT"
"""


def sbatch_script(recipe: Recipe, options: SlurmOptions = SlurmOptions()) -> str:
    """A SLURM batch script running ``recipe`` with multi-node ``accelerate launch``.

    The batch step (on the first node) writes the recipe into the run directory (shared
    filesystem), takes the main process address from the first allocated host (``scontrol show
    hostnames $SLURM_JOB_NODELIST``, first line) and starts one task per training node with
    ``srun``; each task runs ``accelerate launch --num_machines NODES --num_processes NODES x GPUS
    --machine_rank $SLURM_PROCID`` (expanded inside the task, so every node gets its own rank:
    with one task per node the task rank is the node rank). With ``vllm_node`` one more node is
    allocated and runs ``trl vllm-serve`` (see the note written into the script).
    """
    o = options
    gpus = o.gpus_per_node

    def command(resume: bool) -> str:
        return shell_join(train_command(
            ShellVar("RECIPE"), ShellVar("RUN_DIR"), python=ShellVar("PYTHON"),
            num_processes=o.processes, cpu=gpus == 0, mixed_precision=MIXED_PRECISION[recipe.train.precision],
            num_machines=o.nodes, machine_rank=ShellVar("SLURM_PROCID"),
            main_process_ip=ShellVar("MAIN_PROCESS_IP"), main_process_port=ShellVar("MAIN_PROCESS_PORT"),
            resume=resume))

    # Run by each task's own shell (single-quoted below, so its variables expand there). `trap ''
    # INT TERM`: a signal sent to the step (`scancel --signal=INT`: the workbench's cancel; SLURM's
    # own TERM) reaches every process of it, and accelerate's launcher would die at once, ending
    # the step (SLURM then kills what is left) before the trainer has written its last events. The
    # launcher ignores both instead; the trainer installs its own handlers and ends cleanly (INT:
    # `cancelled`; TERM: no final status, see WORKBENCH_SIGTERM below); KILL still ends everything.
    # A requeued job (RESUME=1, see below) continues the run instead of starting it again.
    per_node = ("trap '' INT TERM; " + (f"exec {command(True)}" if o.resume else
                                        f'if [ "$RESUME" = 1 ]; then exec {command(True)}; fi; exec {command(False)}'))
    total_nodes = o.nodes + int(o.vllm_node)
    train_nodelist = ' --nodelist="$TRAIN_NODES"' if o.vllm_node else ""
    name = safe_name(recipe.name)
    vllm = _vllm_block(recipe, o) if o.vllm_node else ""
    vllm_stop = ('kill "$VLLM_PID" 2>/dev/null || true  # the server never exits by itself\n'
                 'wait "$VLLM_PID" 2>/dev/null || true\n') if o.vllm_node else ""
    layout = (f"{o.nodes} training node(s) x {gpus} GPU(s) = {o.processes} process(es)" if gpus
              else f"{o.nodes} CPU node(s), one process each")
    return f"""#!/bin/bash
{_sbatch_header(recipe, o)}#
# RL Workbench sbatch script for recipe {name}: {_summary(recipe)}
# Generated by `python -m workbench export ... --to sbatch`. Submit: sbatch THIS_FILE
# Layout: {layout}{"; plus 1 vLLM server node" if o.vllm_node else ""}; time limit {o.time}.
# Environment set-up: every node needs a Python environment with the workbench installed
# (`pip install -e /path/to/rl-workbench`); load modules / activate it here or set WORKBENCH_PYTHON.
# The run directory must be on a filesystem shared by the nodes (events.jsonl is written there).
# Variables read when it runs:
#   WORKBENCH_PYTHON   interpreter (default: the PYTHON= line below)
#   {_run_dir_doc(o.run_dir, name + '-slurm-$SLURM_JOB_ID')}
#   MAIN_PROCESS_PORT  rendezvous port on the first node (default: 20000 + SLURM_JOB_ID mod 20000)
#   OMP_NUM_THREADS    CPU threads per process (default: the recipe's train.threads = {recipe.train.threads})
set -euo pipefail
: "${{SLURM_JOB_NODELIST:?submit this script with sbatch (SLURM_JOB_NODELIST is not set)}}"
: "${{SLURM_JOB_ID:?submit this script with sbatch (SLURM_JOB_ID is not set)}}"

PYTHON={shlex.quote(o.python)}
PYTHON="${{WORKBENCH_PYTHON:-$PYTHON}}"
{_run_dir_lines(recipe, o.run_dir, "slurm-${SLURM_JOB_ID}")}RECIPE="$RUN_DIR/recipe.yaml"

# The recipe, verbatim (validated again by the trainer).
{_inline_recipe(recipe, '"$RECIPE"')}
# Allocated hosts, one per line; the first one hosts the main process (same as
# `scontrol show hostnames $SLURM_JOB_NODELIST | head -n1`, without a pipe that pipefail could trip).
mapfile -t NODELIST < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
if (( ${{#NODELIST[@]}} < {total_nodes} )); then
    echo "error: this script needs {total_nodes} nodes, SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST has ${{#NODELIST[@]}}" >&2
    exit 1
fi
MAIN_PROCESS_IP="${{NODELIST[0]}}"
MAIN_PROCESS_PORT="${{MAIN_PROCESS_PORT:-$((20000 + SLURM_JOB_ID % 20000))}}"
TRAIN_NODES="$(IFS=,; echo "${{NODELIST[*]:0:{o.nodes}}}")"
# SLURM requeues a job after a node failure or a preemption (JobRequeue=1, sbatch --requeue) and
# runs this script again under the same job id with SLURM_RESTART_COUNT > 0: a run that the job's
# first start began (RUN_DIR/run.json) then continues from its newest checkpoint (`train --resume`).
RESUME=0
if (( ${{SLURM_RESTART_COUNT:-0}} > 0 )) && [[ -e "$RUN_DIR/run.json" ]]; then
    RESUME=1
    echo "requeued (restart $SLURM_RESTART_COUNT): continuing the run in $RUN_DIR from its newest checkpoint" >&2
fi
# SLURM's SIGTERM (scancel, time limit, node failure, preemption) is not the user's cancel: the
# trainer stops without a final status and the job's final state says what happened.
export WORKBENCH_SIGTERM=interrupt
export PYTHON RUN_DIR RECIPE MAIN_PROCESS_IP MAIN_PROCESS_PORT RESUME
export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{recipe.train.threads}}}"
echo "run directory: $RUN_DIR; training nodes: $TRAIN_NODES; main process: $MAIN_PROCESS_IP:$MAIN_PROCESS_PORT" >&2
{vllm}
# One accelerate launcher per training node. The command is single-quoted so that $SLURM_PROCID
# is expanded by each task (its node's rank), not once here in the batch step (where it is 0).
status=0
srun --nodes={o.nodes} --ntasks={o.nodes} --ntasks-per-node=1{train_nodelist} \\
    bash -c {shlex.quote(per_node)} || status=$?
{vllm_stop}exit "$status"
"""


# ---- registry -------------------------------------------------------------------------------

EXPORTERS: Registry[Callable[..., str]] = Registry("export format")
"""``--to`` formats: name -> function(recipe, options) -> text."""

EXPORTERS.register("yaml")(lambda recipe, options=None: recipe_yaml(recipe))
EXPORTERS.register("bash")(lambda recipe, options=None: bash_script(recipe, options or BashOptions()))
EXPORTERS.register("sbatch")(lambda recipe, options=None: sbatch_script(recipe, options or SlurmOptions()))
