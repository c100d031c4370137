"""The one command line that runs a recipe, shared by the launchers and the exported scripts.

A run is always ``accelerate launch ... -m workbench train RECIPE --run-dir DIR`` so that the
same command works on this machine, over SSH and in an sbatch script.
"""

from __future__ import annotations

import re
import shlex

# Recipe precision -> accelerate's --mixed_precision (the trainer passes the same to Accelerator).
MIXED_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}


class ShellVar(str):
    """An argv item that a generated script expands at run time: ``ShellVar("RUN_DIR")`` is
    rendered by :func:`shell_join` as ``"${RUN_DIR}"`` (double-quoted: one word, no globbing)."""

    def __new__(cls, name: str) -> "ShellVar":
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"ShellVar name={name!r} is not allowed; a shell variable name ([A-Za-z_][A-Za-z0-9_]*)")
        return super().__new__(cls, name)


def _arg(value) -> str:
    # keep ShellVar items as they are (str() of a str subclass would drop the type)
    return value if isinstance(value, str) else str(value)


def accelerate_launch_args(*, num_processes: int = 1, cpu: bool = True, mixed_precision: str = "no",
                           num_machines: int = 1, machine_rank: str | None = None,
                           main_process_ip: str | None = None, main_process_port: str | None = None) -> list[str]:
    """``accelerate launch`` options.

    On CPU, several processes need ``--multi_gpu`` with ``Accelerator(cpu=True)`` inside (gloo);
    ``--cpu --num_processes 2`` starts only one process (DESIGN, measured facts).
    """
    args = ["--num_processes", str(num_processes), "--num_machines", str(num_machines),
            "--mixed_precision", mixed_precision, "--dynamo_backend", "no"]
    if num_processes > 1 or num_machines > 1:
        args.insert(0, "--multi_gpu")
    elif cpu:
        args.insert(0, "--cpu")
    if num_machines > 1:
        args += ["--machine_rank", _arg(machine_rank), "--main_process_ip", _arg(main_process_ip)]
    if num_machines > 1 or main_process_port is not None:  # one machine: a port per run, or runs clash on 29500
        args += ["--main_process_port", _arg(main_process_port)]
    return args


def train_command(recipe_path: str, run_dir: str, *, python: str = "python", stdout_events: bool = False,
                  resume: bool = False, **launch) -> list[str]:
    """argv of one training run (``launch`` as in :func:`accelerate_launch_args`); ``resume``:
    continue the run in ``run_dir`` from its newest checkpoint, with the recipe.yaml there."""
    run = ["--resume", run_dir] if resume else [recipe_path, "--run-dir", run_dir]
    cmd = [python, "-m", "accelerate.commands.launch", *accelerate_launch_args(**launch),
           "-m", "workbench", "train", *run]
    return cmd + (["--stdout-events"] if stdout_events else [])


def shell_join(argv: list[str]) -> str:
    """One shell-safe command line: every item quoted, except :class:`ShellVar` items, which
    become ``"$NAME"`` so the script expands them (still one word)."""
    return " ".join(f'"${{{a}}}"' if isinstance(a, ShellVar) else shlex.quote(a) for a in argv)
