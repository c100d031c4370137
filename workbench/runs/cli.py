"""CLI verbs of the run layer.

    launch RECIPE [RECIPE ...] [--set k=v] [--seeds N] [--sweep FIELD=V1,V2 ...] [--target local|ssh://HOST|slurm|ray|ray://HOST:PORT]
           [--group NAME] [--name N] [--tag T] [--notes TEXT] [--processes N] [--wait]
    runs list [--status S] [--group G] | runs arms GROUP | runs show ID | runs logs ID [--follow]
    runs cancel ID | runs resume ID | runs delete ID | runs audit [--limit N] [--csv FILE]
    compare GROUP [--metric M] [--window F] [--baseline ARM]
    collect [--interval S] [--once]
    import PATH [--format F] [--config FILE] [--group G] [--arm A] [--seed S] [--name N] [--tag T] [--notes TEXT]
    db status [--url URL] | db upgrade [--url URL] | db copy --from URL --to URL [--batch N] [--runs-to DIR]

Who acts: the CLI acts as the local OS user (the passwd name of its uid; ``workbench.runs.roles.cli_principal``),
or, when WORKBENCH_TOKEN is set, as that API token's user and role (``tokens create`` issues one).
On the local store file of the workbench home it is an admin: that user can read and write the
file directly, so a lesser role would protect nothing. On a server database (``WORKBENCH_DB`` a
non-sqlite URL) the store is shared: the CLI's role is the settings' ``roles.cli_roles`` entry
for that user, member when unlisted, and the service applies the app's rules to it. What it
launches is recorded as theirs (``created_by``).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from workbench.analysis.window import DEFAULT_WINDOW_FRAC  # imports nothing: the parser stays light
from workbench.console import report as _fail  # one line `error: ...`, exit 2, as workbench.cli.main

DEFAULT_COPY_BATCH = 2000  # rows per batch of `db copy` (workbench.runs.dbtools.COPY_BATCH_ROWS; the parser stays light)

# Errors raised here reach workbench.cli.main, which prints them as one line `error: ...`, exit 2.


def _cmd_launch(args) -> int:
    """Plan every (arm, seed) run and validate each one, then launch them all (or nothing)."""
    from workbench.runs import RunStore, launch, launch_planned, parse_sweep, plan_runs, wait
    from workbench.runs.roles import cli_principal

    if args.experiment:
        experiment, planned = _experiment_plan(args)
    elif not args.recipe:
        return _fail("launch needs recipes (preset names or YAML paths) or --experiment KEY")
    else:
        planned = plan_runs(args.recipe, seeds=1 if args.seeds is None else args.seeds, sweep=parse_sweep(args.sweep),
                            overrides=args.set, target=args.target, num_processes=args.processes)
    grouped = len(planned) > 1 or bool(args.group) or bool(args.experiment)  # an experiment always has its group
    if grouped and args.name:
        return _fail("--name names one run; with several recipes, seeds or sweep values, or --experiment, "
                     "use --group")
    store = RunStore()  # opened once every input is checked: refused input leaves no store behind
    group = args.group
    if args.experiment and not group:
        from workbench.runs.experiments import next_group

        group = next_group(experiment, store.groups()["group"].tolist())
    common = dict(principal=cli_principal(), target=args.target, tags=args.tag, notes=args.notes,
                  num_processes=args.processes, store=store,
                  trust_local_imports=True)  # the CLI user's own reward modules, as Python imports them
    if grouped:
        ids = launch_planned(planned, group=group or f"group-{time.strftime('%Y%m%d-%H%M%S')}", **common)
    else:
        only = planned[0]
        ids = [launch(only.recipe, name=args.name, arm=only.arm, sweep=only.sweep, **common)]
    for run_id in ids:
        print(run_id)
    if not args.wait:
        return 0
    statuses = [wait(run_id, store=store, on_step=_progress_printer()) for run_id in ids]
    return 0 if all(s == "finished" for s in statuses) else 1


def _experiment_plan(args):
    """(experiment, planned runs) of ``--experiment KEY``: its arms x seeds as the Experiments page
    launches them (``--seeds`` may change the count; the caller puts them in the next group
    exp-KEY-n unless ``--group`` names one). Recipes, --set and --sweep are refused beside it: an
    experiment is its own settings, and what it claims holds for those."""
    from workbench.runs.experiments import experiment_plan, get_experiment

    given = [flag for flag, value in (("recipes", args.recipe), ("--set", args.set), ("--sweep", args.sweep)) if value]
    if given:
        raise ValueError(f"--experiment={args.experiment!r} takes no {' or '.join(given)}: an experiment fixes its "
                         "recipes and settings (python -m workbench launch PRESET --sweep ... to vary them)")
    experiment = get_experiment(args.experiment)
    return experiment, experiment_plan(experiment, seeds=args.seeds, target=args.target, num_processes=args.processes)


def _progress_printer():
    shown: dict[str, tuple] = {}

    def show(run) -> None:
        state = (run.status, run.last_step)
        if shown.get(run.id) != state:
            shown[run.id] = state
            reward = "" if run.reward is None else f" reward={run.reward:.3f}"
            print(f"{run.id}: {run.status} step {run.last_step + 1}/{run.total_steps}{reward}", file=sys.stderr)

    return show


def _open_store():
    """The run store, with its warnings (a read that fell back to an immutable file on a full
    disk) printed as ``warning: ...`` lines on stderr."""
    from workbench.runs import RunStore
    from workbench.runs.store import log

    if not any(isinstance(h, _WarningLines) for h in log.handlers):
        log.addHandler(_WarningLines(logging.WARNING))
    return RunStore()


class _WarningLines(logging.Handler):
    """A log record as one ``warning: ...`` line on the stderr of the moment (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"warning: {record.getMessage()}", file=sys.stderr)


def _sync_before_reading(store) -> None:
    """Collect new events before showing the store. A store that cannot be written now (disk
    full, read-only) must not hide what it already holds: one warning line, then the reading goes
    on (a command that changes a run still fails on its own write). Where the store has already
    said it reads the file as it is on disk (``immutable_cause``), that was the line."""
    from workbench.runs import sync
    from workbench.runs.store import StoreError

    try:
        sync(store)
    except StoreError as err:
        if store.immutable_cause is None:
            print(f"warning: new events not collected: {err}", file=sys.stderr)


def _cmd_runs(args) -> int:
    store = _open_store()
    _sync_before_reading(store)
    if args.action == "list":
        return _list_runs(store, args)
    if args.action == "arms":
        return _list_arms(store, args.id)
    if args.action == "audit":
        return _print_audit(store, args)
    if not args.id:
        return _fail(f"runs {args.action} needs a run ID")
    return _RUN_ACTIONS[args.action](store, store.get_run(args.id), args)


def _list_runs(store, args) -> int:
    _warn_duplicate_seeds(store)
    frame = store.list_runs(status=args.status, group=args.group)
    if frame.empty:
        print("no runs")
        return 0
    frame = frame.assign(created_at=frame.created_at.map(lambda t: time.strftime("%Y-%m-%d %H:%M", time.localtime(t))),
                         progress=[f"{s + 1}/{t}" for s, t in zip(frame.last_step, frame.total_steps)])
    cols = ["id", "arm", "seed", "algorithm", "status", "progress", "reward", "target", "group", "created_by", "created_at"]
    print(frame[cols].to_string(index=False))
    return 0


AUDIT_COLUMNS = ["at", "actor", "role", "auth", "action", "target", "detail", "address"]


def _print_audit(store, args) -> int:
    """The audit log, newest first (admins only: the CLI's principal is one on the local file; on a
    server database, only an OS user ``roles.cli_roles`` makes admin); ``--csv FILE`` writes every
    column of the entries to FILE instead (UTF-8, times as ISO 8601 UTC)."""
    import dataclasses

    import pandas as pd

    from workbench.runs.audit import audit_log
    from workbench.runs.roles import cli_principal

    entries = audit_log(cli_principal(), limit=args.limit, store=store)
    frame = pd.DataFrame([dataclasses.asdict(e) for e in entries], columns=AUDIT_COLUMNS)
    frame["at"] = pd.to_datetime(frame["at"], unit="s", utc=True).dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    if args.csv:
        from workbench.runs import RunError

        try:
            frame.to_csv(args.csv, index=False)
        except OSError as err:
            raise RunError(f"--csv={args.csv!r} cannot be written: {err.strerror or err}") from None
        print(f"{len(frame)} entries written to {args.csv}")
    elif frame.empty:
        print("no audit entries")
    else:
        print(frame[["at", "actor", "role", "action", "target", "address", "detail"]].to_string(index=False))
    return 0


def _warn_duplicate_seeds(store) -> None:
    """One warning line naming the runs that share a group, arm and seed (only an older store
    file can hold them: ``RunStore.duplicate_seeds``), so they are found before ``compare``
    refuses the group."""
    found = store.duplicate_seeds()
    if found:
        named = "; ".join(f"group {d['group']!r} arm {d['arm']!r} seed {d['seed']}: {', '.join(d['ids'])}"
                          for d in found[:5])
        print(f"warning: {len(found)} seed(s) appear in more than one run of an arm ({named}"
              f"{'; ...' if len(found) > 5 else ''}): copies, not replicates, so `compare` gives no verdict for "
              "their group; delete all but one run of each seed (`python -m workbench runs delete ID`)",
              file=sys.stderr)


def group_arms(store, group: str | None) -> dict:
    """The group's arms (``RunStore.arms``); RunError naming the groups there are if it has none."""
    from workbench.runs import RunError

    if not group:
        raise RunError("this command needs a comparison GROUP; `python -m workbench runs list` shows the groups")
    arms = store.arms(group)
    if not arms:
        known = ", ".join(store.groups()["group"].head(20)) or "(none yet)"
        raise RunError(f"group={group!r} has no runs; groups: {known}")
    return arms


def _list_arms(store, group: str | None) -> int:
    """Per arm: its seeds, then one line per run (id, seed, status, progress, last reward)."""
    for arm, runs in group_arms(store, group).items():
        seeds = ", ".join(str(r.seed) for r in runs)
        print(f"{arm}  ({len(runs)} run{'s' if len(runs) != 1 else ''}; seeds {seeds})")
        for r in runs:
            reward = "" if r.reward is None else f"  reward={r.reward:.3f}"
            print(f"  {r.id}  seed={r.seed}  {r.status}  {r.last_step + 1}/{r.total_steps}{reward}")
    return 0


def check_logged(frame, metric: str | None, group: str) -> str:
    """``metric`` when the group's long frame (``RunStore.arm_metrics``) has it; else RunError
    naming it and what the group logged (also for None: nothing logged yet)."""
    from workbench.runs import RunError

    if metric is None or metric not in frame.columns:
        logged = [c for c in frame.columns if c not in ("run_id", "arm", "seed", "step", "time")]
        raise RunError(f"metric={metric!r} is not logged by group {group!r}; logged: {', '.join(logged) or '(nothing yet)'}")
    return metric


def _cmd_compare(args) -> int:
    """The verdict table of a group: per arm mean / IQM / 95 % CI over seeds of the final-window
    score, per pair the difference with its CI, P(A > B), the verdict and the seeds needed."""
    from workbench.analysis import arm_summary, default_metric, final_window_scores, pairwise
    from workbench.runs import RunError

    store = _open_store()
    _sync_before_reading(store)
    arms = group_arms(store, args.group)
    frame = store.arm_metrics([r.id for runs in arms.values() for r in runs])
    metric = check_logged(frame, args.metric or default_metric(frame), args.group)
    scores = final_window_scores(frame, metric, args.window)
    if scores.empty:
        raise RunError(f"no run of group {args.group!r} has logged {metric!r} yet")
    by_arm = {arm: g["score"].to_numpy() for arm, g in scores.groupby("arm", sort=False)}
    if args.baseline is not None and args.baseline not in by_arm:
        raise RunError(f"--baseline={args.baseline!r} is not allowed; arms with scores: {', '.join(by_arm)}")
    print(f"{metric}: mean over the last {args.window:g} of each run's logged steps; one score per seed; 95% intervals")
    summary = arm_summary(by_arm)
    print(summary[["arm", "n", "mean", "ci_low", "ci_high", "iqm", "std", "note"]].to_string(index=False, float_format="{:.4f}".format))
    if len(by_arm) < 2:
        return 0
    pairs = pairwise(by_arm, baseline=args.baseline)
    print()
    print(pairs[["a", "b", "diff", "diff_ci_low", "diff_ci_high", "p_improvement", "seeds_needed", "verdict"]]
          .rename(columns={"p_improvement": "P(a>b)"}).to_string(index=False, float_format="{:.4f}".format))
    return 0


def _show_run(store, run, args) -> int:
    shown = {k: v for k, v in run.to_dict().items() if k not in ("recipe", "events_offset")}
    print(json.dumps(shown, indent=2, default=str))
    print("--- recipe ---\n" + run.recipe, end="")
    return 0


# The CLI acts as the local OS user (workbench.runs.roles.cli_principal): admin on the store file of
# the user's own home, which that user can change directly anyway; on a server database, its role
# from the settings (member by default), checked by the service as the app's.
def _cancel_run(store, run, args) -> int:
    from workbench.runs import cancel
    from workbench.runs.roles import cli_principal

    cancel(run.id, principal=cli_principal(), store=store)
    print(store.get_run(run.id).status)
    return 0


def _resume_run(store, run, args) -> int:
    """Start a failed / cancelled / lost run again; it continues from its newest checkpoint."""
    from workbench.runs import resume
    from workbench.runs.roles import cli_principal

    latest = resume(run.id, principal=cli_principal(), store=store)
    where = f"step {latest[0] + 1} (checkpoint {latest[1]})" if latest else "step 0 (no checkpoint yet)"
    print(f"{run.id}: {store.get_run(run.id).status}, continuing at {where}")
    return 0


def _delete_run(store, run, args) -> int:
    from workbench.runs import delete
    from workbench.runs.roles import cli_principal

    delete(run.id, principal=cli_principal(), store=store)
    print(f"deleted {run.id}")
    return 0


def _print_logs(store, run, follow: bool) -> int:
    """The run's metrics, one line per step (and its stdout log for local runs)."""
    from workbench.runs import TERMINAL_STATUSES
    from workbench.runs.launchers.base import STDOUT_FILE

    log = Path(run.run_dir) / STDOUT_FILE
    if log.exists():
        print(log.read_text(errors="replace"), end="")
    printed = -1
    while True:
        frame = store.metrics([run.id])
        for row in frame[frame.step > printed].itertuples():
            print(f"step {row.step}: reward={getattr(row, 'reward', float('nan')):.4f}")
            printed = row.step
        if not follow or store.get_run(run.id).status in TERMINAL_STATUSES:
            return 0
        time.sleep(1.0)
        _sync_before_reading(store)


def _cmd_collect(args) -> int:
    """Sync every ``--interval`` s. A pass that cannot write the store (disk full, read-only) is
    reported on stderr and retried next pass: nothing is lost, the event files keep the lines
    and the offsets did not move. ``--once`` reports it as the error it is (exit 2)."""
    from workbench.runs import sync
    from workbench.runs.store import StoreError

    store = _open_store()
    while True:
        try:
            n = sync(store)
        except StoreError as err:
            if args.once:
                raise
            print(f"warning: collect pass failed, retrying in {args.interval:g} s: {err}", file=sys.stderr, flush=True)
        else:
            if args.once:
                print(f"ingested {n} rows")
                return 0
        time.sleep(args.interval)


def _cmd_import(args) -> int:
    """Import a run made elsewhere (TRL, verl logs) as a finished run; prints its id, and its
    warnings (what could not be recovered) as ``warning: ...`` lines on stderr."""
    from workbench.runs.imports import import_run
    from workbench.runs.roles import cli_principal

    run_id, warnings = import_run(args.path, principal=cli_principal(), fmt=args.format, config=args.config,
                                  group=args.group, arm=args.arm, seed=args.seed, name=args.name, tags=args.tag,
                                  notes=args.notes, store=_open_store())
    print(run_id)
    for warning in warnings:
        print(f"warning: {run_id}: {warning}", file=sys.stderr)
    return 0


def _db_principal(*urls):
    """The CLI's principal for the server database among ``urls`` (``roles.cli_principal`` as if
    ``WORKBENCH_DB`` named it), else for the local files (admin)."""
    from workbench.runs.database import sqlite_path
    from workbench.runs.roles import SERVER_STORE_ENV, cli_principal

    server = next((url for url in urls if sqlite_path(url) is None), None)
    env = {} if server is None else {SERVER_STORE_ENV: server.render_as_string(hide_password=False)}
    return cli_principal(env=env)


_DB_OPTIONS = {"status": ("url",), "upgrade": ("url",),  # the options each takes
               "copy": ("source", "target", "batch", "runs_to")}
_DB_FLAGS = {"url": "--url", "source": "--from", "target": "--to", "batch": "--batch", "runs_to": "--runs-to"}


def _cmd_db(args) -> int:
    """``db ACTION``, after checking that only that action's options are given (and copy's all)."""
    given = [name for name, flag in _DB_FLAGS.items() if getattr(args, name) is not None and name not in
             _DB_OPTIONS[args.action] and not (name == "batch" and args.batch == DEFAULT_COPY_BATCH)]
    if given:
        return _fail(f"db {args.action} takes no {', '.join(_DB_FLAGS[n] for n in given)}; it takes: "
                     f"{', '.join(_DB_FLAGS[n] for n in _DB_OPTIONS[args.action]) or 'no options'}")
    if args.action == "copy" and not (args.source and args.target):
        return _fail("db copy needs --from URL (the store to read) and --to URL (the empty store to write)")
    return _DB_ACTIONS[args.action](args)


def _db_status(args) -> int:
    """Backend, URL (password masked), revision vs the code's head, rows per table; reads only."""
    from workbench.runs.dbtools import database_status, resolve_url

    status = database_status(resolve_url(args.url, field="--url"))
    state = ("current" if status.current else "no file yet" if not status.exists
             else "empty" if status.revision is None and not any(n is not None for n in status.rows.values())
             else "behind: run `python -m workbench db upgrade`")
    print(f"backend   {status.backend}\nurl       {status.url}\n"
          f"revision  {status.revision or '-'} (code's head {status.head}: {state})")
    for table, rows in status.rows.items():
        print(f"  {table:<12} {'-' if rows is None else rows:>10}")
    return 0


def _db_upgrade(args) -> int:
    """The migrations to head (idempotent): prints ``FROM -> TO``."""
    from workbench.runs.dbtools import resolve_url, upgrade_database

    url = resolve_url(args.url, field="--url")
    before, after = upgrade_database(url, _db_principal(url))
    print(f"{before or 'none'} -> {after}" + ("" if before != after else " (already at head)"))
    return 0


def _db_copy(args) -> int:
    """Every table of one store into an empty other one (either backend), in one transaction; with
    --runs-to, each run's directory copied to that workbench home too."""
    from workbench.runs.dbtools import copy_database, resolve_url

    source, target = resolve_url(args.source, field="--from"), resolve_url(args.target, field="--to")
    done = copy_database(source, target, _db_principal(target, source), batch_rows=args.batch, runs_to=args.runs_to)
    print(f"copied {done.source} -> {done.target} in {done.seconds:.1f} s")
    for table, rows in done.rows.items():
        print(f"  {table:<12} {rows:>10}")
    if done.runs_dir is not None:
        print(f"run directories: {done.run_dirs} ({done.run_bytes} bytes) copied to {done.runs_dir}")
    return 0


_DB_ACTIONS = {"status": _db_status, "upgrade": _db_upgrade, "copy": _db_copy}


_RUN_ACTIONS = {"show": _show_run, "logs": lambda store, run, args: _print_logs(store, run, args.follow),
                "cancel": _cancel_run, "resume": _resume_run, "delete": _delete_run}


def _cmd_tokens(args) -> None:
    """`tokens create|list|revoke`: API tokens for WORKBENCH_TOKEN (admins; workbench.runs.apitokens).
    create prints the secret once; list never shows it."""
    import datetime as dt

    from workbench.runs.apitokens import create_token, list_tokens, revoke_token
    from workbench.runs.roles import cli_principal
    from workbench.runs.tokens import TOKEN_COLUMNS, TokenError, token_row
    principal = cli_principal()
    if args.action == "create":
        if not args.user:
            raise TokenError("tokens create needs --user NAME (the verified name the app records as owner)")
        secret, record = create_token(principal, user=args.user, role=args.role, days=args.days, label=args.label)
        print(f"token {record.id} for {record.user_name} as {record.role}, expires "
              f"{dt.datetime.fromtimestamp(record.expires_at, dt.timezone.utc):%Y-%m-%d %H:%M} UTC")
        print(f"WORKBENCH_TOKEN={secret}")
        print("(shown once: it is not stored, only its hash)")
    elif args.action == "list":
        listed, now = list_tokens(principal), time.time()  # authorised before anything is printed
        print("\t".join(TOKEN_COLUMNS))
        for t in listed:
            print("\t".join(token_row(t, now)))
    else:
        if not args.id:
            raise TokenError("tokens revoke needs the token ID (see: python -m workbench tokens list)")
        revoke_token(principal, args.id)
        print(f"token {args.id} revoked")


def add_run_parsers(sub) -> None:
    """Register ``launch``, ``runs`` and ``collect`` on the top-level subparsers."""
    p = sub.add_parser("launch", help="start runs detached (they outlive this command), recorded in the run store")
    p.add_argument("recipe", nargs="*", help="preset names or YAML paths; several = one comparison group")
    p.add_argument("--experiment", metavar="KEY",
                   help="launch a canned experiment (Labs -> Experiments) instead of recipes: its arms x seeds in its "
                        "next group exp-KEY-n; then `compare GROUP --metric M` gives its verdict")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field in every recipe")
    p.add_argument("--seeds", type=int, default=None, metavar="N",
                   help="runs per arm, with seeds train.seed + 0..N-1 (paired across arms; default 1, or the "
                        "experiment's)")
    p.add_argument("--sweep", action="append", default=[], metavar="FIELD=V1,V2",
                   help="one arm per value (several --sweep: their grid), crossed with the recipes and seeds")
    p.add_argument("--target", default="local",
                   help="local | ssh://HOST (from settings) | slurm | ray (ray.address in settings) | ray://HOST:PORT "
                        "(a Ray cluster's Jobs API, the dashboard port)")
    p.add_argument("--group", help="comparison group name (shared prompts and model, paired seeds)")
    p.add_argument("--name", help="run name (default: the recipe name)")
    p.add_argument("--tag", action="append", default=[])
    p.add_argument("--notes", default="")
    p.add_argument("--processes", type=int, default=1, help="data-parallel processes (accelerate)")
    p.add_argument("--wait", action="store_true", help="follow until every run ends; exit 0 iff all finished")
    p.set_defaults(func=_cmd_launch)
    r = sub.add_parser("runs", help="list, show, follow, cancel, resume or delete runs; list a group's arms; "
                                    "the audit log (admins)")
    r.add_argument("action", choices=["list", "arms", "audit", *_RUN_ACTIONS])
    r.add_argument("id", nargs="?", help="run ID (for arms: the GROUP)")
    r.add_argument("--status")
    r.add_argument("--group")
    r.add_argument("--follow", action="store_true", help="logs: keep printing until the run ends")
    r.add_argument("--limit", type=int, default=100, help="audit: newest N entries (1-100000)")
    r.add_argument("--csv", metavar="FILE", help="audit: write the entries to FILE as CSV")
    r.set_defaults(func=_cmd_runs)
    v = sub.add_parser("compare", help="the verdict table of a group: arms over seeds, pairs with CIs and P(A>B)")
    v.add_argument("group")
    v.add_argument("--metric", help="metric to compare (default: eval/reward if logged, else reward)")
    v.add_argument("--window", type=float, default=DEFAULT_WINDOW_FRAC, help="final fraction of each run's steps that is averaged")
    v.add_argument("--baseline", help="compare every other arm with this one (default: every pair)")
    v.set_defaults(func=_cmd_compare)
    c = sub.add_parser("collect", help="ingest events of active runs into the store (the app does this itself)")
    c.add_argument("--interval", type=float, default=1.0)
    c.add_argument("--once", action="store_true")
    c.set_defaults(func=_cmd_collect)
    i = sub.add_parser("import", help="import a run made elsewhere (TRL trainer_state.json / TensorBoard events, verl "
                       "JSONL / console log) as a finished run, beside workbench runs in Compare and verdicts")
    i.add_argument("path", help="the log: a trainer_state.json, a TensorBoard event file or its folder, a verl log")
    i.add_argument("--format", help="tensorboard | trl-state | verl-jsonl | verl-console (default: recognised)")
    i.add_argument("--config", help="the training arguments: TRL args.to_json_string() JSON, verl .hydra/config.yaml")
    i.add_argument("--group", help="comparison group to join (beside its workbench runs)")
    i.add_argument("--arm", help="arm label within the group (default: the run's name)")
    i.add_argument("--seed", type=int, help="the run's seed (default: the one in its training arguments)")
    i.add_argument("--name", help="run name (default: the algorithm + '-import')")
    i.add_argument("--tag", action="append", default=[])
    i.add_argument("--notes", default="")
    i.set_defaults(func=_cmd_import)
    d = sub.add_parser("db", help="the store's database: status, upgrade to the code's schema, copy to another store "
                       "(e.g. a team's SQLite file into PostgreSQL)")
    d.add_argument("action", choices=list(_DB_ACTIONS))
    d.add_argument("--url", help="status / upgrade: the store (a URL or a SQLite file; default: WORKBENCH_DB, else "
                   "the home's runs.db)")
    d.add_argument("--from", dest="source", help="copy: the store to read (sqlite:///PATH, a path, or postgresql://...)")
    d.add_argument("--to", dest="target", help="copy: the EMPTY store to write (a new file or database)")
    d.add_argument("--batch", type=int, default=DEFAULT_COPY_BATCH, metavar="N", help="copy: rows per batch (1-1000000)")
    d.add_argument("--runs-to", dest="runs_to", metavar="DIR",
                   help="copy: also COPY each run's directory (logs, events, checkpoints) to the workbench home DIR, "
                        "as DIR/runs/RUN_ID, and point the copied rows there; the source's folders stay as they are")
    d.set_defaults(func=_cmd_db)
    t = sub.add_parser("tokens", help="API tokens (admins): create prints a secret once for WORKBENCH_TOKEN, "
                       "which makes the CLI act as that user and role on any store; list; revoke ID")
    t.add_argument("action", choices=["create", "list", "revoke"])
    t.add_argument("id", nargs="?", help="revoke: the token's id (from tokens list)")
    t.add_argument("--user", help="create: the name it acts for (as the app records it: verified email or subject)")
    t.add_argument("--role", default="member", choices=["viewer", "member", "admin"])
    t.add_argument("--days", type=int, default=30, help="create: days until it expires (1-365)")
    t.add_argument("--label", default="", help="create: what it is for, e.g. laptop")
    t.set_defaults(func=_cmd_tokens)
