"""CLI verbs of the run layer.

    launch RECIPE [RECIPE ...] [--set k=v] [--target local|ssh://HOST|slurm] [--group NAME] [--name N]
           [--tag T] [--notes TEXT] [--processes N] [--wait]
    runs list [--status S] [--group G] | runs show ID | runs logs ID [--follow] | runs cancel ID | runs delete ID
    collect [--interval S] [--once]
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

EXIT_USAGE = 2


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors that are the user's to fix (bad id, settings, target, recipe)."""
    from workbench.recipe import RecipeError
    from workbench.runs import LaunchError, RunError, SettingsError

    return RecipeError, RunError, LaunchError, SettingsError, ValueError


def _user_facing(command):
    """A CLI verb that reports the user's errors as one line and exit 2, never as a traceback."""

    @functools.wraps(command)
    def run(args) -> int:
        try:
            return command(args)
        except _user_errors() as err:
            return _fail(str(err))

    return run


@_user_facing
def _cmd_launch(args) -> int:
    from workbench.recipe import load_recipe
    from workbench.runs import RunStore, launch, launch_group, wait

    recipes = [load_recipe(name, args.set) for name in args.recipe]
    store = RunStore()
    common = dict(target=args.target, tags=args.tag, notes=args.notes, num_processes=args.processes, store=store)
    if len(recipes) > 1 or args.group:
        if args.name:
            return _fail("--name names one run; with several recipes use --group")
        ids = launch_group(recipes, group=args.group or f"group-{time.strftime('%Y%m%d-%H%M%S')}", **common)
    else:
        ids = [launch(recipes[0], name=args.name, **common)]
    for run_id in ids:
        print(run_id)
    if not args.wait:
        return 0
    statuses = [wait(run_id, store=store, on_step=_progress_printer()) for run_id in ids]
    return 0 if all(s == "finished" for s in statuses) else 1


def _progress_printer():
    shown: dict[str, tuple] = {}

    def show(run: dict) -> None:
        state = (run["status"], run["last_step"])
        if shown.get(run["id"]) != state:
            shown[run["id"]] = state
            reward = "" if run["reward"] is None else f" reward={run['reward']:.3f}"
            print(f"{run['id']}: {run['status']} step {run['last_step'] + 1}/{run['total_steps']}{reward}", file=sys.stderr)

    return show


@_user_facing
def _cmd_runs(args) -> int:
    from workbench.runs import RunStore, sync

    store = RunStore()
    sync(store)
    if args.action == "list":
        return _list_runs(store, args)
    if not args.id:
        return _fail(f"runs {args.action} needs a run ID")
    return _RUN_ACTIONS[args.action](store, store.get_run(args.id), args)


def _list_runs(store, args) -> int:
    frame = store.list_runs(status=args.status, group=args.group)
    if frame.empty:
        print("no runs")
        return 0
    frame = frame.assign(created_at=frame.created_at.map(lambda t: time.strftime("%Y-%m-%d %H:%M", time.localtime(t))),
                         progress=[f"{s + 1}/{t}" for s, t in zip(frame.last_step, frame.total_steps)])
    cols = ["id", "algorithm", "status", "progress", "reward", "target", "group", "created_by", "created_at"]
    print(frame[cols].to_string(index=False))
    return 0


def _show_run(store, run: dict, args) -> int:
    shown = {k: v for k, v in run.items() if k not in ("recipe", "events_offset")}
    print(json.dumps(shown, indent=2, default=str))
    print("--- recipe ---\n" + run["recipe"], end="")
    return 0


def _cancel_run(store, run: dict, args) -> int:
    from workbench.runs import cancel

    cancel(run["id"], store=store)
    print(store.get_run(run["id"])["status"])
    return 0


def _delete_run(store, run: dict, args) -> int:
    from workbench.runs import delete

    delete(run["id"], store=store)
    print(f"deleted {run['id']}")
    return 0


def _print_logs(store, run: dict, follow: bool) -> int:
    """The run's metrics, one line per step (and its stdout log for local runs)."""
    from workbench.runs import TERMINAL_STATUSES, sync
    from workbench.runs.launchers.base import STDOUT_FILE

    log = Path(run["run_dir"]) / STDOUT_FILE
    if log.exists():
        print(log.read_text(errors="replace"), end="")
    printed = -1
    while True:
        frame = store.metrics([run["id"]])
        for row in frame[frame.step > printed].itertuples():
            print(f"step {row.step}: reward={getattr(row, 'reward', float('nan')):.4f}")
            printed = row.step
        if not follow or store.get_run(run["id"])["status"] in TERMINAL_STATUSES:
            return 0
        time.sleep(1.0)
        sync(store)


@_user_facing
def _cmd_collect(args) -> int:
    from workbench.runs import RunStore, sync

    store = RunStore()
    while True:
        n = sync(store)
        if args.once:
            print(f"ingested {n} rows")
            return 0
        time.sleep(args.interval)


_RUN_ACTIONS = {"show": _show_run, "logs": lambda store, run, args: _print_logs(store, run, args.follow),
                "cancel": _cancel_run, "delete": _delete_run}


def add_run_parsers(sub) -> None:
    """Register ``launch``, ``runs`` and ``collect`` on the top-level subparsers."""
    p = sub.add_parser("launch", help="start runs detached (they outlive this command), recorded in the run store")
    p.add_argument("recipe", nargs="+", help="preset names or YAML paths; several = one comparison group")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field in every recipe")
    p.add_argument("--target", default="local", help="local | ssh://HOST (from settings) | slurm")
    p.add_argument("--group", help="comparison group name (shared seed, prompts and model)")
    p.add_argument("--name", help="run name (default: the recipe name)")
    p.add_argument("--tag", action="append", default=[])
    p.add_argument("--notes", default="")
    p.add_argument("--processes", type=int, default=1, help="data-parallel processes (accelerate)")
    p.add_argument("--wait", action="store_true", help="follow until every run ends; exit 0 iff all finished")
    p.set_defaults(func=_cmd_launch)
    r = sub.add_parser("runs", help="list, show, follow, cancel or delete runs")
    r.add_argument("action", choices=["list", *_RUN_ACTIONS])
    r.add_argument("id", nargs="?")
    r.add_argument("--status")
    r.add_argument("--group")
    r.add_argument("--follow", action="store_true", help="logs: keep printing until the run ends")
    r.set_defaults(func=_cmd_runs)
    c = sub.add_parser("collect", help="ingest events of active runs into the store (the app does this itself)")
    c.add_argument("--interval", type=float, default=1.0)
    c.add_argument("--once", action="store_true")
    c.set_defaults(func=_cmd_collect)
