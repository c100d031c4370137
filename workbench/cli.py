"""Command line: ``python -m workbench ...``.

    train RECIPE [--set key=value ...] [--run-dir DIR] [--stdout-events]
    recipes list | recipes show NAME
    model build tiny
    launch / runs / collect   (workbench/runs/cli.py)
    export                    (workbench/export/cli.py)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from workbench.home import workbench_home
from workbench.recipe import RecipeError, load_recipe, preset_names, preset_path


def _cmd_train(args) -> int:
    try:
        recipe = load_recipe(args.recipe, args.set)
    except RecipeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir) if args.run_dir else workbench_home() / "runs" / f"{recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    from workbench.engine.trainer import train  # heavy imports only when training

    status = train(recipe, run_dir, stdout_events=args.stdout_events, progress=sys.stderr.isatty())
    print(f"{status}: {run_dir}", file=sys.stderr)
    return {"finished": 0, "cancelled": 130}.get(status, 1)


def _cmd_recipes(args) -> int:
    if args.action == "list":
        from workbench.recipe import Recipe

        for name in preset_names():
            print(f"{name:14s} {Recipe.from_yaml(preset_path(name).read_text()).description}")
        return 0
    try:
        print(preset_path(args.name).read_text(), end="")
    except RecipeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _cmd_model(args) -> int:
    from workbench.engine.tiny import ensure_tiny_model

    print(ensure_tiny_model())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workbench", description="RL Workbench")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="run a recipe (preset name or YAML path) in this process")
    t.add_argument("recipe")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field, e.g. train.steps=10")
    t.add_argument("--run-dir", help="where events and the recipe go (default: WORKBENCH_HOME/runs/NAME-TIME)")
    t.add_argument("--stdout-events", action="store_true", help="mirror events to stdout (remote runs)")
    t.set_defaults(func=_cmd_train)
    r = sub.add_parser("recipes", help="list or show the presets")
    r.add_argument("action", choices=["list", "show"])
    r.add_argument("name", nargs="?")
    r.set_defaults(func=_cmd_recipes)
    m = sub.add_parser("model", help="build the built-in model")
    m.add_argument("action", choices=["build"])
    m.add_argument("name", choices=["tiny"])
    m.set_defaults(func=_cmd_model)
    from workbench.export.cli import add_export_parser
    from workbench.runs.cli import add_run_parsers

    add_run_parsers(sub)
    # export is pure text below the run layer: the run store and the settings are handed in from here
    add_export_parser(sub, resolve_run=_stored_recipe, slurm_defaults=_slurm_defaults)
    return parser


def _stored_recipe(run_id: str) -> str | None:
    """The recipe YAML stored with ``run_id`` in the run store; None for an unknown id."""
    from workbench.runs import RunError, RunStore

    try:
        return RunStore().get_run(run_id)["recipe"]
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "recipes" and args.action == "show" and not args.name:
        build_parser().error("recipes show needs a preset NAME")
    return args.func(args)
