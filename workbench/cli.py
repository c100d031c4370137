"""Command line: ``python -m workbench ...``.

    train RECIPE [--set key=value ...] [--run-dir DIR] [--stdout-events]
    train --resume RUN_DIR [--stdout-events]   (continue a run from its newest intact checkpoint)
    recipes list | recipes show NAME
    model build tiny | tiny-teacher
    launch / runs / collect   (workbench/runs/cli.py)
    export                    (workbench/export/cli.py)
    report GROUP [--out FILE] [--metric M] [--window F] [--smooth W]   (one self-contained HTML file: workbench/report.py)

Exit codes: 0 done, 2 bad input (one line ``error: ...`` naming the field, the value and what is
allowed; nothing is left behind), 1 a run that did not finish, 130 interrupted, 141 closed pipe.
Only ``train`` and ``model build`` import torch; every other command stays light.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from workbench.analysis.window import DEFAULT_WINDOW_FRAC  # imports nothing: the parser stays light
from workbench.console import report
from workbench.home import workbench_home
from workbench.machine import check_fits_machine
from workbench.recipe import load_recipe, preset_names, preset_path
from workbench.runs.names import slug

EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE


def _resumed_run(args):
    """(recipe, run_dir) of ``train --resume RUN_DIR``: the run's own recipe, unchanged (a changed
    recipe would not continue the same run)."""
    from workbench.recipe import RecipeError

    if args.recipe or args.set or args.run_dir:
        raise RecipeError("--resume RUN_DIR takes the run's own recipe.yaml: give no RECIPE, --set or --run-dir with it")
    run_dir = Path(args.resume)
    if not (run_dir / "recipe.yaml").is_file():
        raise RecipeError(f"--resume {str(run_dir)!r} is not a run directory (it has no recipe.yaml)")
    return load_recipe(str(run_dir / "recipe.yaml")), run_dir


def _cmd_train(args) -> int:
    if args.resume is not None:
        recipe, run_dir = _resumed_run(args)
    elif not args.recipe:
        raise ValueError("train needs a RECIPE (preset name or YAML path), or --resume RUN_DIR")
    else:
        recipe = load_recipe(args.recipe, args.set)
        run_dir = Path(args.run_dir) if args.run_dir else workbench_home() / "runs" / f"{slug(recipe.name)}-{time.strftime('%Y%m%d-%H%M%S')}"
    # threads vs this machine's CPUs, prompts_per_step vs the launch's processes: before any output is written
    check_fits_machine(recipe, world=_launch_world())
    from workbench.engine.distill import check_teacher  # tokenizers only: a teacher must share the student's

    check_teacher(recipe)
    from workbench.engine.precheck import check_run_inputs  # datasets and reward functions, before the run dir

    check_run_inputs(recipe)
    claim = _claim_run_dir(recipe, run_dir, resume=args.resume is not None)
    try:
        from workbench.engine.trainer import Trainer  # heavy imports only when training

        trainer = Trainer(recipe, run_dir, stdout_events=args.stdout_events, progress=sys.stderr.isatty(), claim=claim)
    except BaseException:
        claim.abandon()  # no event written: the directory is left as it was found, a fixed rerun may take it
        raise
    try:
        status = trainer.run()
    finally:
        claim.release()
    print(f"{status}: {run_dir}", file=sys.stderr)
    return {"finished": 0, "cancelled": 130, "interrupted": 143}.get(status, 1)


def _claim_run_dir(recipe, run_dir: Path, *, resume: bool):
    """The run directory claimed before torch is imported (workbench/engine/rundir.py): a new run
    only into a new, empty or launcher-prepared directory; a resume only with its recorded recipe
    and an intact checkpoint; one live trainer per directory. RunDirError: one line, exit 2."""
    from workbench.engine import rundir

    return rundir.claim(run_dir, recipe.to_yaml(), recipe.train.steps, resume=resume)


def _launch_world() -> int:
    """Processes of this launch: ``WORLD_SIZE`` under ``accelerate launch`` / torchrun, else 1."""
    value = os.environ.get("WORLD_SIZE", "1")
    return int(value) if value.isdecimal() and int(value) > 0 else 1


def _cmd_recipes(args) -> int:
    if args.action == "list":
        from workbench.recipe import Recipe

        for name in preset_names():
            print(f"{name:14s} {Recipe.from_yaml(preset_path(name).read_text()).description}")
        return 0
    print(preset_path(args.name).read_text(), end="")
    return 0


def _cmd_model(args) -> int:
    from workbench.engine.distill import ensure_tiny_teacher
    from workbench.engine.tiny import ensure_tiny_model

    print({"tiny": ensure_tiny_model, "tiny-teacher": ensure_tiny_teacher}[args.name]())
    return 0


def _cmd_report(args) -> int:
    """Write the comparison report of a group. Everything is checked and the page built before
    the file is opened; it is written beside its target and renamed into place, so a failure
    leaves no file (nor half of one)."""
    from workbench.analysis.smoothing import check_smoothing
    from workbench.report import report_html
    from workbench.runs.cli import _open_store, _sync_before_reading

    smoothing = check_smoothing(args.smooth, "--smooth")
    out = Path(args.out) if args.out else Path(f"report-{slug(args.group)}.html")
    if args.out != "-" and not out.resolve().parent.is_dir():
        raise ValueError(f"--out={args.out!r}: the folder {str(out.resolve().parent)!r} does not exist")
    if args.out != "-" and out.is_dir():
        raise ValueError(f"--out={args.out!r} is a folder: name the HTML file to write")
    store = _open_store()
    _sync_before_reading(store)
    text = report_html(store, args.group, metric=args.metric, window=args.window, smoothing=smoothing)
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    partial = out.with_name(f".{out.name}.partial")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, out)
    except OSError as err:  # a read-only folder, a full disk: one line, not a traceback
        raise ValueError(f"--out={args.out!r}: cannot write it ({err.strerror or err})") from None
    finally:
        partial.unlink(missing_ok=True)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workbench", description="RL Workbench")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="run a recipe (preset name or YAML path) in this process")
    t.add_argument("recipe", nargs="?", help="preset name or YAML path (not with --resume)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field, e.g. train.steps=10")
    t.add_argument("--run-dir", help="where events and the recipe go (default: WORKBENCH_HOME/runs/NAME-TIME)")
    t.add_argument("--stdout-events", action="store_true", help="mirror events to stdout (remote runs)")
    t.add_argument("--resume", metavar="RUN_DIR",
                   help="continue the run in RUN_DIR from its newest intact checkpoint (same run, same events.jsonl)")
    t.set_defaults(func=_cmd_train)
    r = sub.add_parser("recipes", help="list or show the presets")
    r.add_argument("action", choices=["list", "show"])
    r.add_argument("name", nargs="?")
    r.set_defaults(func=_cmd_recipes)
    m = sub.add_parser("model", help="build a built-in model (tiny-teacher: tiny trained by the grpo preset, the opd preset's teacher)")
    m.add_argument("action", choices=["build"])
    m.add_argument("name", choices=["tiny", "tiny-teacher"])
    m.set_defaults(func=_cmd_model)
    from workbench.export.cli import add_export_parser
    from workbench.runs.cli import add_run_parsers

    add_run_parsers(sub)
    rep = sub.add_parser("report", help="write a comparison group as one self-contained HTML file (opens offline)",
                         description="The arms' curves with bands, the verdict table, the sweep view, each arm's recipe "
                         "and the fields in which arms differ, seeds, the workbench commit and this machine.")
    rep.add_argument("group", help="comparison group (`python -m workbench runs list` shows them)")
    rep.add_argument("--out", metavar="FILE", help="where to write it (default: report-GROUP.html here; - for stdout)")
    rep.add_argument("--metric", help="the verdict's metric (default: eval/reward if logged, else reward)")
    rep.add_argument("--window", type=float, default=DEFAULT_WINDOW_FRAC,
                     help="final fraction of each run's steps that scores it")
    rep.add_argument("--smooth", type=float, default=0.0, metavar="W",
                     help="EMA weight of the curves, 0 (off, the default) to 0.99, as TensorBoard's slider: each seed "
                     "is smoothed before the mean and band; the verdict always uses the raw values")
    rep.set_defaults(func=_cmd_report)
    # export is pure text below the run layer: the run store and the settings are handed in from here
    add_export_parser(sub, resolve_run=_stored_recipe, slurm_defaults=_slurm_defaults)
    return parser


def _stored_recipe(run_id: str) -> str | None:
    """The recipe YAML stored with ``run_id`` in the run store; None for an unknown id."""
    from workbench.runs import RunError, RunStore

    try:
        return RunStore().get_run(run_id).recipe
    except RunError:
        return None


def _slurm_defaults() -> dict:
    """The settings' slurm section (partition, account, nodes, gpus_per_node, time) as SlurmOptions fields."""
    from workbench.export.scripts import ExportError
    from workbench.runs import SettingsError, load_settings

    try:
        return load_settings().slurm.model_dump()
    except SettingsError as err:
        raise ExportError(str(err)) from None


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors that are the user's to fix (a bad recipe, id, setting, target or path), imported
    only once one is raised, so a light command stays light."""
    from workbench.export.scripts import ExportError
    from workbench.recipe import RecipeError
    from workbench.runs import ConfigError, LaunchError, RunError, SettingsError

    # ValueError: the confinement of paths to the home and the name checks of runs, tags and groups
    return RecipeError, RunError, LaunchError, ConfigError, SettingsError, ExportError, ValueError


def _quiet_closed_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush raises nothing
    (https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


STORE_COMMANDS = frozenset({"launch", "runs", "compare", "collect", "import", "db", "tokens", "report", "export"})


def _check_token(command: str) -> None:
    """With WORKBENCH_TOKEN set, a command that reads or writes the run store first resolves it
    (workbench.runs.apitokens): an unknown, revoked or expired token stops it before anything is done."""
    if command in STORE_COMMANDS and os.environ.get("WORKBENCH_TOKEN", "").strip():
        from workbench.runs.roles import cli_principal
        cli_principal()


def main(argv: list[str] | None = None) -> int:
    """Run one command. Bad input is one line ``error: ...`` and exit 2, never a traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "recipes" and args.action == "show" and not args.name:
        parser.error("recipes show needs a preset NAME")
    try:
        _check_token(args.command)
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return code
    except BrokenPipeError:  # `... | head` stopped reading: not an error of ours to print
        _quiet_closed_stdout()
        return EXIT_CLOSED_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as err:
        if isinstance(err, _user_errors()):
            return report(str(err))
        raise
