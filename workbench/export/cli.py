"""``python -m workbench export RUN_OR_RECIPE --to yaml|bash|sbatch [options]``.

RUN_OR_RECIPE is a preset name (``grpo``), a recipe YAML path, or a run id from the run store
(its stored recipe is exported). The text goes to stdout, or to ``--out FILE`` (scripts are made
executable). Exit codes: 0 written, 2 bad input (unknown recipe / run, invalid recipe or options).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workbench.export.scripts import DEVICES, EXPORTERS, BashOptions, ExportError, SlurmOptions
from workbench.recipe import Recipe, RecipeError, load_recipe, preset_names

# SLURM options a user did not give come from Settings.slurm (or these, where the run layer is absent).
_SLURM_FIELDS = ("nodes", "gpus_per_node", "time", "partition", "account")
_SLURM_FALLBACK = {"nodes": 1, "gpus_per_node": 1, "time": "01:00:00", "partition": "", "account": ""}


def resolve_recipe(ref: str, overrides: list[str] | None = None) -> Recipe:
    """A preset name, a YAML path, or a run id -> its Recipe (``--set`` overrides applied).

    Raises RecipeError naming ``ref`` when it is none of the three.
    """
    path = Path(ref)
    if ref in preset_names() or (path.suffix in (".yaml", ".yml") and path.is_file()):
        return load_recipe(ref, overrides)
    run = _stored_run(ref)
    if run is None:
        raise RecipeError(
            f"RUN_OR_RECIPE={ref!r} is not a preset ({', '.join(preset_names())}), "
            "an existing .yaml/.yml file, or a run id in the run store"
        )
    recipe = Recipe.from_yaml(run["recipe"])
    return recipe.with_overrides(overrides) if overrides else recipe


def _stored_run(run_id: str) -> dict | None:
    """The store's row for ``run_id``, or None (unknown id, or no run store in this install)."""
    try:
        from workbench.runs import RunError, RunStore  # lazy: the run layer sits above export
    except ImportError:
        return None
    try:
        return RunStore().get_run(run_id)
    except (RunError, ValueError):
        return None


def slurm_defaults() -> dict:
    """Settings.slurm of the workbench home as a dict (built-in defaults without the run layer)."""
    try:
        from workbench.runs import load_settings
    except ImportError:
        return dict(_SLURM_FALLBACK)
    slurm = load_settings().slurm
    return {field: getattr(slurm, field) for field in _SLURM_FIELDS}


def _options(args) -> BashOptions | SlurmOptions | None:
    if args.to == "bash":
        return BashOptions(processes=args.processes, device=args.device, python=args.python)
    if args.to == "sbatch":
        given = {f: getattr(args, f) for f in _SLURM_FIELDS if getattr(args, f) is not None}
        return SlurmOptions(**{**slurm_defaults(), **given}, vllm_node=args.vllm_node, python=args.python)
    return None


def _cmd_export(args) -> int:
    try:
        recipe = resolve_recipe(args.recipe, args.set)
        text = EXPORTERS.get(args.to)(recipe, _options(args))
    except (RecipeError, ExportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.to == "sbatch" and args.vllm_node:
        print("note: the vLLM node runs `trl vllm-serve`, but the workbench engine generates colocated "
              "(train.rollout=vllm) and does not use that server; see the comment in the script", file=sys.stderr)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    out = Path(args.out)
    out.write_text(text)
    if args.to != "yaml":
        out.chmod(out.stat().st_mode | 0o111)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def add_export_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``export`` on the CLI's subparsers (``workbench/cli.py`` calls this)."""
    p = subparsers.add_parser(
        "export", help="write a run or recipe as recipe YAML, a bash script or a SLURM sbatch script",
        description="Export a preset, a recipe YAML file or a stored run as text that reproduces it outside the workbench.")
    p.add_argument("recipe", metavar="RUN_OR_RECIPE", help="preset name, recipe .yaml path, or run id")
    p.add_argument("--to", required=True, choices=EXPORTERS.names(),
                   help="yaml: the recipe (round-trips exactly); bash: one-machine script with accelerate launch; "
                        "sbatch: SLURM batch script with multi-node accelerate launch")
    p.add_argument("--out", metavar="FILE", help="write here instead of stdout (bash/sbatch files are made executable)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe field first, e.g. train.steps=10")
    p.add_argument("--python", default="python",
                   help="interpreter with the workbench installed, used by the script (default: python; "
                        "WORKBENCH_PYTHON overrides it when the script runs)")
    b = p.add_argument_group("bash options")
    b.add_argument("--processes", type=int, default=1, help="accelerate processes on the machine (default 1)")
    b.add_argument("--device", choices=DEVICES, default="cpu",
                   help="cpu: force CPU; gpu: use the visible CUDA devices (default cpu)")
    s = p.add_argument_group("sbatch options (defaults: Settings.slurm in the workbench home)")
    s.add_argument("--nodes", type=int, help="training nodes (default from settings, else 1)")
    s.add_argument("--gpus-per-node", dest="gpus_per_node", type=int,
                   help="GPUs = processes per node; 0 = CPU nodes, one process each (default from settings, else 1)")
    s.add_argument("--time", help="wall-clock limit, e.g. 01:00:00 or 2-00:00:00 (default from settings, else 01:00:00)")
    s.add_argument("--partition", help="SLURM partition (default from settings; empty: a placeholder line)")
    s.add_argument("--account", help="SLURM account (default from settings; empty: a placeholder line)")
    s.add_argument("--vllm-node", dest="vllm_node", action="store_true",
                   help="allocate one more node running `trl vllm-serve` as in TRL's multi-node example; "
                        "the workbench engine itself generates colocated and does not use it")
    p.set_defaults(func=_cmd_export)
    return p
