"""``python -m workbench export RUN_OR_RECIPE --to yaml|bash|sbatch [options]``.

RUN_OR_RECIPE is a preset name (``grpo``), a recipe YAML path, or a run id from the run store
(its stored recipe is exported). The text goes to stdout, or to ``--out FILE`` (scripts are made
executable). Exit codes: 0 written, 2 bad input (unknown recipe / run, invalid recipe or options).

The export layer sits below the run layer and knows nothing of it: the caller
(``workbench/cli.py``) hands in how to find a stored run's recipe and the SLURM defaults.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Callable

from workbench.export.scripts import DEVICES, EXPORTERS, BashOptions, SlurmOptions
from workbench.recipe import Recipe, RecipeError, load_recipe, preset_names

# sbatch options the command line can set; those not given come from ``slurm_defaults()``, else SlurmOptions'.
_SLURM_FIELDS = ("nodes", "gpus_per_node", "time", "partition", "account")

RunResolver = Callable[[str], "str | None"]
"""run id -> the recipe YAML stored with that run, or None when there is no such run."""
DefaultsLoader = Callable[[], dict]
"""() -> SlurmOptions fields (of ``_SLURM_FIELDS``) to use where the command line gives none."""


def resolve_recipe(ref: str, overrides: list[str] | None = None, resolve_run: RunResolver | None = None) -> Recipe:
    """A preset name, a YAML path, or (with ``resolve_run``) a run id -> its Recipe, overrides applied.

    Raises RecipeError naming ``ref`` when it is none of them.
    """
    path = Path(ref)
    if ref in preset_names() or (path.suffix in (".yaml", ".yml") and path.is_file()):
        return load_recipe(ref, overrides)
    stored = resolve_run(ref) if resolve_run is not None else None
    if stored is None:
        run_part = ", or a run id in the run store" if resolve_run is not None else ""
        raise RecipeError(f"RUN_OR_RECIPE={ref!r} is not a preset ({', '.join(preset_names())}), "
                          f"an existing .yaml/.yml file{run_part}")
    recipe = Recipe.from_yaml(stored)
    return recipe.with_overrides(overrides) if overrides else recipe


def _options(args, slurm_defaults: DefaultsLoader | None) -> BashOptions | SlurmOptions | None:
    if args.to == "bash":
        return BashOptions(processes=args.processes, device=args.device, python=args.python)
    if args.to == "sbatch":
        defaults = {f: v for f, v in (slurm_defaults() if slurm_defaults else {}).items() if f in _SLURM_FIELDS}
        given = {f: getattr(args, f) for f in _SLURM_FIELDS if getattr(args, f) is not None}
        return SlurmOptions(**{**defaults, **given}, vllm_node=args.vllm_node, python=args.python)
    return None


def _cmd_export(args, *, resolve_run: RunResolver | None, slurm_defaults: DefaultsLoader | None) -> int:
    """Write the export; a RecipeError / ExportError reaches the CLI's handler (one line, exit 2)."""
    recipe = resolve_recipe(args.recipe, args.set, resolve_run)
    text = EXPORTERS.get(args.to)(recipe, _options(args, slurm_defaults))
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


def add_export_parser(subparsers, *, resolve_run: RunResolver | None = None,
                      slurm_defaults: DefaultsLoader | None = None) -> argparse.ArgumentParser:
    """Register ``export`` on the CLI's subparsers (``workbench/cli.py`` calls this).

    ``resolve_run`` makes run ids exportable; ``slurm_defaults`` is called only for ``--to sbatch``
    (it may raise ExportError, e.g. for an unreadable settings file: reported as a bad input).
    """
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
    s = p.add_argument_group("sbatch options (defaults: the slurm section of the workbench settings)")
    s.add_argument("--nodes", type=int, help="training nodes (default from settings, else 1)")
    s.add_argument("--gpus-per-node", dest="gpus_per_node", type=int,
                   help="GPUs = processes per node; 0 = CPU nodes, one process each (default from settings, else 1)")
    s.add_argument("--time", help="wall-clock limit, e.g. 01:00:00 or 2-00:00:00 (default from settings, else 01:00:00)")
    s.add_argument("--partition", help="SLURM partition (default from settings; empty: a placeholder line)")
    s.add_argument("--account", help="SLURM account (default from settings; empty: a placeholder line)")
    s.add_argument("--vllm-node", dest="vllm_node", action="store_true",
                   help="allocate one more node running `trl vllm-serve` as in TRL's multi-node example; "
                        "the workbench engine itself generates colocated and does not use it")
    p.set_defaults(func=partial(_cmd_export, resolve_run=resolve_run, slurm_defaults=slurm_defaults))
    return p
